//! A token bucket: for log lines (a child that floods stderr, a stream of garbage or a
//! flood of connections must not flood the binaries' own logs) and for actions one
//! party could repeat at everyone's cost (restarts, a namespace's config changes).

use std::time::{Duration, Instant};

pub struct RateLimit {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
    /// Events refused since the last one allowed.
    suppressed: u64,
}

/// What to do with one event.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Log it; `suppressed_before` events were dropped since the last one logged.
    Allow {
        suppressed_before: u64,
    },
    Suppress,
}

impl RateLimit {
    pub fn new(burst: u32, per: Duration) -> Self {
        RateLimit {
            burst: f64::from(burst),
            per_second: f64::from(burst) / per.as_secs_f64().max(1e-3),
            tokens: f64::from(burst),
            last: Instant::now(),
            suppressed: 0,
        }
    }

    pub fn check(&mut self) -> Decision {
        self.check_at(Instant::now())
    }

    fn check_at(&mut self, now: Instant) -> Decision {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Decision::Allow { suppressed_before: std::mem::take(&mut self.suppressed) }
        } else {
            self.suppressed += 1;
            Decision::Suppress
        }
    }

    /// How long until an event would be allowed (zero when one would be now).
    pub fn wait(&self) -> Duration {
        self.wait_at(Instant::now())
    }

    /// Whether the bucket is full again: forgetting it now changes nothing.
    pub fn is_full(&self) -> bool {
        self.tokens_at(Instant::now()) >= self.burst
    }

    fn tokens_at(&self, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        (self.tokens + elapsed * self.per_second).min(self.burst)
    }

    fn wait_at(&self, now: Instant) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens_at(now)) / self.per_second).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_a_burst_then_refills() {
        let mut limit = RateLimit::new(3, Duration::from_secs(3));
        let t0 = limit.last;
        for _ in 0..3 {
            assert_eq!(limit.check_at(t0), Decision::Allow { suppressed_before: 0 });
        }
        assert_eq!(limit.check_at(t0), Decision::Suppress);
        assert_eq!(limit.check_at(t0), Decision::Suppress);
        assert_eq!(limit.check_at(t0 + Duration::from_secs(1)), Decision::Allow { suppressed_before: 2 });
    }

    #[test]
    fn says_how_long_until_the_next_event_is_allowed() {
        let mut limit = RateLimit::new(2, Duration::from_secs(20));
        let t0 = limit.last;
        assert_eq!(limit.wait_at(t0), Duration::ZERO);
        limit.check_at(t0);
        limit.check_at(t0);
        // One token every 10 s; 4 s of it have passed.
        let wait = limit.wait_at(t0 + Duration::from_secs(4));
        assert!(wait > Duration::from_millis(5_990) && wait < Duration::from_millis(6_010), "{wait:?}");
        assert_eq!(limit.wait_at(t0 + Duration::from_secs(10)), Duration::ZERO);
    }
}
