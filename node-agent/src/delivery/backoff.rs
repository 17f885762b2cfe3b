//! The retry timing the senders share (CloudWatch metrics, OTLP, CloudWatch Logs): one
//! rule for how long a failed request waits, below every sink that retries.

use std::time::Duration;

/// Retry timing of failed requests.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Delay before retry `attempt` (0-based): exponential, capped, and jittered over its
    /// upper half so that agents throttled together do not retry together.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << attempt.min(20)).min(self.max);
        let half = exp / 2;
        half + Duration::from_nanos(fastrand::u64(0..=half.as_nanos().min(u128::from(u64::MAX)) as u64))
    }
}
