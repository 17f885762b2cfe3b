//! Review decisions by token digest, allowed and refused apart, each with its time to
//! live and its bound on entries.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::Refusal;

/// SHA-256 of a token: what the cache keeps instead of the token.
pub type Key = [u8; 32];

pub fn key(token: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(digest.as_ref());
    key
}

/// What the API server decided of a token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    /// Authenticated as `user`, not allowed to get /metrics.
    Forbidden {
        user: String,
    },
    /// Not authenticated (unknown, expired, wrong audience, revoked).
    Unauthenticated,
}

impl Decision {
    /// The metrics' `result` label.
    pub fn result(&self) -> &'static str {
        match self {
            Decision::Allowed => "allowed",
            Decision::Forbidden { .. } => "forbidden",
            Decision::Unauthenticated => "unauthenticated",
        }
    }

    pub fn into_result(self) -> Result<(), Refusal> {
        match self {
            Decision::Allowed => Ok(()),
            Decision::Forbidden { user } => Err(Refusal::Forbidden { user }),
            Decision::Unauthenticated => Err(Refusal::Unauthenticated { reason: "invalid_token" }),
        }
    }
}

pub struct ReviewCache {
    allowed: Entries,
    denied: Entries,
}

impl ReviewCache {
    pub fn new(allowed: usize, denied: usize) -> Self {
        ReviewCache { allowed: Entries::new(allowed), denied: Entries::new(denied) }
    }

    /// The decision on `key` if one is still valid at `now`.
    pub fn get(&mut self, key: &Key, now: Instant) -> Option<Decision> {
        self.allowed.get(key, now).or_else(|| self.denied.get(key, now))
    }

    /// Keeps `decision` until `now + ttl`, in the allowed or the refused entries.
    pub fn insert(&mut self, key: Key, decision: Decision, now: Instant, ttl: Duration) {
        let (into, other) = match decision {
            Decision::Allowed => (&mut self.allowed, &mut self.denied),
            _ => (&mut self.denied, &mut self.allowed),
        };
        other.map.remove(&key);
        into.insert(key, decision, now + ttl, now);
    }

    pub fn len(&self) -> usize {
        self.allowed.map.len() + self.denied.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

struct Entries {
    map: HashMap<Key, (Decision, Instant)>,
    capacity: usize,
}

impl Entries {
    fn new(capacity: usize) -> Self {
        Entries { map: HashMap::new(), capacity }
    }

    fn get(&mut self, key: &Key, now: Instant) -> Option<Decision> {
        let (decision, expires) = self.map.get(key)?;
        if *expires > now {
            return Some(decision.clone());
        }
        self.map.remove(key);
        None
    }

    /// At capacity, the expired entries go, else the one that would expire first.
    fn insert(&mut self, key: Key, decision: Decision, expires: Instant, now: Instant) {
        if self.capacity == 0 {
            return;
        }
        if self.map.len() >= self.capacity && !self.map.contains_key(&key) {
            self.map.retain(|_, (_, expires)| *expires > now);
            if self.map.len() >= self.capacity {
                let soonest = self.map.iter().min_by_key(|(_, (_, expires))| *expires).map(|(k, _)| *k);
                if let Some(soonest) = soonest {
                    self.map.remove(&soonest);
                }
            }
        }
        self.map.insert(key, (decision, expires));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(10);

    fn forbidden() -> Decision {
        Decision::Forbidden { user: "system:serviceaccount:team:scraper".to_owned() }
    }

    #[test]
    fn keys_are_digests_of_the_token() {
        assert_eq!(key("a"), key("a"));
        assert_ne!(key("a"), key("b"));
        // SHA-256("abc"), FIPS 180-2's example.
        assert_eq!(key("abc")[..4], [0xba, 0x78, 0x16, 0xbf]);
    }

    #[test]
    fn a_decision_lives_for_its_ttl() {
        let mut cache = ReviewCache::new(4, 4);
        let t0 = Instant::now();
        cache.insert(key("ok"), Decision::Allowed, t0, Duration::from_secs(60));
        cache.insert(key("bad"), Decision::Unauthenticated, t0, TTL);
        assert_eq!(cache.get(&key("ok"), t0 + TTL), Some(Decision::Allowed));
        assert_eq!(cache.get(&key("bad"), t0 + TTL - Duration::from_millis(1)), Some(Decision::Unauthenticated));
        assert_eq!(cache.get(&key("bad"), t0 + TTL), None, "expired");
        assert_eq!(cache.get(&key("ok"), t0 + Duration::from_secs(60)), None, "expired");
        assert!(cache.is_empty(), "expired entries are removed when met");
        assert_eq!(cache.get(&key("never"), t0), None);
    }

    #[test]
    fn refused_tokens_cannot_push_out_allowed_ones() {
        let mut cache = ReviewCache::new(2, 3);
        let t0 = Instant::now();
        cache.insert(key("prometheus"), Decision::Allowed, t0, Duration::from_secs(60));
        for i in 0..100 {
            cache.insert(key(&format!("garbage-{i}")), Decision::Unauthenticated, t0, TTL);
        }
        assert_eq!(cache.len(), 4, "one allowed, three refused at most");
        assert_eq!(cache.get(&key("prometheus"), t0), Some(Decision::Allowed));
        assert_eq!(cache.get(&key("garbage-99"), t0), Some(Decision::Unauthenticated), "the latest is kept");
    }

    #[test]
    fn at_capacity_the_expired_then_the_soonest_to_expire_go() {
        let mut cache = ReviewCache::new(2, 2);
        let t0 = Instant::now();
        cache.insert(key("a"), forbidden(), t0, Duration::from_secs(5));
        cache.insert(key("b"), forbidden(), t0, Duration::from_secs(20));
        // "a" expired by t0 + 6 s: it goes, "b" stays.
        cache.insert(key("c"), forbidden(), t0 + Duration::from_secs(6), TTL);
        let now = t0 + Duration::from_secs(6);
        assert_eq!((cache.get(&key("a"), now), cache.get(&key("b"), now).is_some()), (None, true));
        // Nothing expired: "c" (until 16 s) goes before "b" (20 s).
        cache.insert(key("d"), forbidden(), now, TTL);
        assert_eq!(cache.get(&key("c"), now), None);
        assert!(cache.get(&key("b"), now).is_some() && cache.get(&key("d"), now).is_some());
    }

    #[test]
    fn a_new_decision_replaces_the_old_one() {
        let mut cache = ReviewCache::new(2, 2);
        let t0 = Instant::now();
        cache.insert(key("t"), forbidden(), t0, TTL);
        // The RoleBinding was added: the next review allows.
        cache.insert(key("t"), Decision::Allowed, t0 + TTL, Duration::from_secs(60));
        assert_eq!(cache.get(&key("t"), t0 + TTL), Some(Decision::Allowed));
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn decisions_map_to_answers() {
        assert_eq!(Decision::Allowed.into_result(), Ok(()));
        assert_eq!(
            forbidden().into_result(),
            Err(Refusal::Forbidden { user: "system:serviceaccount:team:scraper".to_owned() })
        );
        assert!(matches!(Decision::Unauthenticated.into_result(), Err(Refusal::Unauthenticated { .. })));
        assert_eq!(
            [Decision::Allowed.result(), forbidden().result(), Decision::Unauthenticated.result()],
            ["allowed", "forbidden", "unauthenticated"]
        );
    }
}
