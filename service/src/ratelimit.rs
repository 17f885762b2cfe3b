//! Token buckets: [`RateLimit`] for log lines (a child that floods stderr, a stream of
//! garbage or a flood of connections must not flood the binaries' own logs) and for
//! actions one party could repeat at everyone's cost (restarts, a namespace's config
//! changes), and the [`TokenBucket`] under it, which also bounds the token reviews sent
//! to the API server.

use std::time::{Duration, Instant};

/// `burst` tokens at most, refilled at `burst` per `per`.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    burst: f64,
    per_second: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn new(burst: u32, per: Duration, now: Instant) -> Self {
        TokenBucket {
            burst: f64::from(burst),
            per_second: f64::from(burst) / per.as_secs_f64().max(1e-3),
            tokens: f64::from(burst),
            last: now,
        }
    }

    /// Whether a token is there at `now` (refilling first), without taking it.
    pub fn ready(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = self.last.max(now);
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        self.tokens >= 1.0
    }

    /// Takes a token if one is there at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let ready = self.ready(now);
        if ready {
            self.tokens -= 1.0;
        }
        ready
    }

    /// Whether the bucket has refilled completely by `now`: it is then the same as a new one.
    pub fn is_full(&mut self, now: Instant) -> bool {
        self.ready(now);
        self.tokens >= self.burst
    }

    /// Time until the next token from `now`.
    pub fn wait(&mut self, now: Instant) -> Duration {
        if self.ready(now) {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((1.0 - self.tokens) / self.per_second)
    }
}

pub struct RateLimit {
    bucket: TokenBucket,
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
        RateLimit { bucket: TokenBucket::new(burst, per, Instant::now()), suppressed: 0 }
    }

    pub fn check(&mut self) -> Decision {
        self.check_at(Instant::now())
    }

    fn check_at(&mut self, now: Instant) -> Decision {
        if self.bucket.take(now) {
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
        // A copy: looking refills nothing of the real bucket.
        self.bucket.clone().is_full(Instant::now())
    }

    fn wait_at(&self, now: Instant) -> Duration {
        self.bucket.clone().wait(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_a_burst_then_refills() {
        let mut limit = RateLimit::new(3, Duration::from_secs(3));
        let t0 = limit.bucket.last;
        for _ in 0..3 {
            assert_eq!(limit.check_at(t0), Decision::Allow { suppressed_before: 0 });
        }
        assert_eq!(limit.check_at(t0), Decision::Suppress);
        assert_eq!(limit.check_at(t0), Decision::Suppress);
        assert_eq!(limit.check_at(t0 + Duration::from_secs(1)), Decision::Allow { suppressed_before: 2 });
    }

    #[test]
    fn a_bucket_tells_readiness_without_taking_and_when_it_refills() {
        let t0 = Instant::now();
        let mut bucket = TokenBucket::new(2, Duration::from_secs(2), t0);
        assert!(bucket.is_full(t0));
        assert!(bucket.ready(t0) && bucket.ready(t0), "looking takes nothing");
        assert!(bucket.take(t0) && bucket.take(t0));
        assert!(!bucket.take(t0), "empty");
        assert_eq!(bucket.wait(t0), Duration::from_secs(1));
        assert!(bucket.take(t0 + Duration::from_secs(1)));
        assert!(!bucket.is_full(t0 + Duration::from_secs(2)));
        assert!(bucket.is_full(t0 + Duration::from_secs(3)));
        // A clock read earlier than the last one takes nothing back.
        assert!(bucket.ready(t0));
    }

    #[test]
    fn says_how_long_until_the_next_event_is_allowed() {
        let mut limit = RateLimit::new(2, Duration::from_secs(20));
        let t0 = limit.bucket.last;
        assert_eq!(limit.wait_at(t0), Duration::ZERO);
        limit.check_at(t0);
        limit.check_at(t0);
        // One token every 10 s; 4 s of it have passed.
        let wait = limit.wait_at(t0 + Duration::from_secs(4));
        assert!(wait > Duration::from_millis(5_990) && wait < Duration::from_millis(6_010), "{wait:?}");
        assert_eq!(limit.wait_at(t0 + Duration::from_secs(10)), Duration::ZERO);
    }
}
