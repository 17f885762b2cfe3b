//! How many token reviews the API server is sent: a token bucket per peer (source
//! address, as [`crate::http::peers::peer_key`] counts connections) and one overall. A
//! flood of bogus tokens from one pod is held to its peer's rate, far below the overall
//! one, so a new scraper elsewhere still gets its first review; a flood from many
//! addresses at once can hold new tokens off until it stops, never a token decided
//! within the caches' TTLs (no review at all) nor a token allowed before: its renewal
//! (once per [`super::ALLOWED_TTL`]) skips the buckets, for [`RENEWAL_TTL`].

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use super::cache::Key;
use crate::{http::peers::peer_key, ratelimit::TokenBucket};

/// Reviews one peer may cause: a burst of 5, then 1 a second.
pub const PEER_BURST: u32 = 5;
pub const PEER_REFILL: Duration = Duration::from_secs(5);
/// Reviews in all (the peers' and requests without a known peer): a burst of 20, then
/// 10 a second (a real fleet's scrapers need about one review per scraper a minute).
pub const TOTAL_BURST: u32 = 20;
pub const TOTAL_REFILL: Duration = Duration::from_secs(2);
/// Peers whose bucket is kept; at the bound, full buckets (the same as new ones) are
/// dropped, and if none is, a new peer is refused until one refills.
pub const MAX_PEERS: usize = 4096;
/// How long a token allowed once has its renewals exempt from the buckets, and how many
/// such tokens are kept.
pub const RENEWAL_TTL: Duration = Duration::from_secs(600);
pub const RENEWAL_ENTRIES: usize = super::ALLOWED_ENTRIES;

/// Why a review was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Throttled {
    /// The peer's bucket is empty (or no room for a new peer).
    Peer { wait: Duration },
    /// The overall bucket is empty.
    Total { wait: Duration },
}

impl Throttled {
    /// The reason counted in `_auth_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Throttled::Peer { .. } => "peer_rate",
            Throttled::Total { .. } => "review_rate",
        }
    }

    /// Whole seconds until a review could be sent (`Retry-After`), at least 1.
    pub fn retry_after_secs(&self) -> u64 {
        let (Throttled::Peer { wait } | Throttled::Total { wait }) = self;
        wait.as_secs_f64().ceil().max(1.0) as u64
    }
}

pub struct ReviewBudget {
    peers: HashMap<IpAddr, TokenBucket>,
    total: TokenBucket,
    /// Keys of tokens allowed before, until when their renewals skip the buckets.
    renewals: HashMap<Key, Instant>,
}

impl ReviewBudget {
    pub fn new(now: Instant) -> Self {
        ReviewBudget {
            peers: HashMap::new(),
            total: TokenBucket::new(TOTAL_BURST, TOTAL_REFILL, now),
            renewals: HashMap::new(),
        }
    }

    /// Whether a review of `key` for a request from `peer` may be sent at `now`; when it
    /// may, it is taken from the buckets.
    pub fn admit(&mut self, key: &Key, peer: Option<IpAddr>, now: Instant) -> Result<(), Throttled> {
        if self.renewals.get(key).is_some_and(|until| *until > now) {
            return Ok(());
        }
        let peer = match peer {
            Some(ip) => Some(self.peer_bucket(peer_key(ip), now)?),
            None => None,
        };
        if let Some(bucket) = peer.and_then(|p| self.peers.get_mut(&p)) {
            if !bucket.ready(now) {
                return Err(Throttled::Peer { wait: bucket.wait(now) });
            }
        }
        if !self.total.take(now) {
            return Err(Throttled::Total { wait: self.total.wait(now) });
        }
        if let Some(bucket) = peer.and_then(|p| self.peers.get_mut(&p)) {
            bucket.take(now);
        }
        Ok(())
    }

    /// The key of `ip`'s bucket, made if need be; `Err` when there is no room for it.
    fn peer_bucket(&mut self, key: IpAddr, now: Instant) -> Result<IpAddr, Throttled> {
        if !self.peers.contains_key(&key) {
            if self.peers.len() >= MAX_PEERS {
                self.peers.retain(|_, bucket| !bucket.is_full(now));
            }
            if self.peers.len() >= MAX_PEERS {
                return Err(Throttled::Peer { wait: PEER_REFILL / PEER_BURST });
            }
            self.peers.insert(key, TokenBucket::new(PEER_BURST, PEER_REFILL, now));
        }
        Ok(key)
    }

    /// `key` was allowed at `now`: its renewals skip the buckets for [`RENEWAL_TTL`].
    pub fn allowed(&mut self, key: Key, now: Instant) {
        if self.renewals.len() >= RENEWAL_ENTRIES && !self.renewals.contains_key(&key) {
            self.renewals.retain(|_, until| *until > now);
            if self.renewals.len() >= RENEWAL_ENTRIES {
                let soonest = self.renewals.iter().min_by_key(|(_, until)| **until).map(|(k, _)| *k);
                if let Some(soonest) = soonest {
                    self.renewals.remove(&soonest);
                }
            }
        }
        self.renewals.insert(key, now + RENEWAL_TTL);
    }

    /// `key` was refused (revoked, expired): its next reviews count like any.
    pub fn refused(&mut self, key: &Key) {
        self.renewals.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::cache::key;

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn a_flooding_peer_gets_its_own_rate_and_another_peer_still_gets_reviews() {
        let t0 = Instant::now();
        let mut budget = ReviewBudget::new(t0);
        let flood = |budget: &mut ReviewBudget, at: Instant, n: usize| {
            (0..n).filter(|i| budget.admit(&key(&format!("bogus-{i}")), ip("127.0.0.2"), at).is_ok()).count()
        };
        assert_eq!(flood(&mut budget, t0, 1000), PEER_BURST as usize, "the burst, then nothing");
        assert!(matches!(budget.admit(&key("x"), ip("127.0.0.2"), t0), Err(Throttled::Peer { .. })));
        // Ten seconds later: ten more (1 a second).
        let mut sent = PEER_BURST as usize;
        for s in 1..=10 {
            sent += flood(&mut budget, t0 + Duration::from_secs(s), 1000);
        }
        assert_eq!(sent, PEER_BURST as usize + 10);
        assert!(budget.admit(&key("scraper"), ip("127.0.0.1"), t0 + Duration::from_secs(10)).is_ok(), "another peer");
    }

    #[test]
    fn the_overall_bucket_bounds_many_peers_and_renewals_skip_the_buckets() {
        let t0 = Instant::now();
        let mut budget = ReviewBudget::new(t0);
        budget.allowed(key("prometheus"), t0);
        let admitted = (0..100u8)
            .filter(|i| budget.admit(&key(&format!("bogus-{i}")), ip(&format!("10.0.0.{i}")), t0).is_ok())
            .count();
        assert_eq!(admitted, TOTAL_BURST as usize);
        let refused = budget.admit(&key("new"), ip("10.0.1.1"), t0).unwrap_err();
        assert_eq!((refused.reason(), refused.retry_after_secs()), ("review_rate", 1));
        assert!(budget.admit(&key("prometheus"), ip("10.0.1.1"), t0).is_ok(), "a token allowed before");
        budget.refused(&key("prometheus"));
        assert!(budget.admit(&key("prometheus"), ip("10.0.1.1"), t0).is_err(), "revoked: counted like any");
        assert!(budget.admit(&key("x"), None, t0 + TOTAL_REFILL).is_ok(), "refilled");
    }

    #[test]
    fn peers_and_renewals_are_bounded() {
        let t0 = Instant::now();
        let mut budget = ReviewBudget::new(t0);
        for i in 0..MAX_PEERS as u32 {
            budget.total = TokenBucket::new(TOTAL_BURST, TOTAL_REFILL, t0);
            let peer = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            assert!(budget.admit(&key("t"), Some(peer), t0).is_ok());
        }
        assert_eq!(budget.peers.len(), MAX_PEERS);
        let newcomer = ip("192.0.2.1");
        assert_eq!(budget.admit(&key("t"), newcomer, t0).unwrap_err().reason(), "peer_rate", "no room yet");
        assert!(budget.admit(&key("t"), newcomer, t0 + PEER_REFILL).is_ok(), "refilled buckets make room");
        assert!(budget.peers.len() <= MAX_PEERS);
        for i in 0..RENEWAL_ENTRIES + 10 {
            budget.allowed(key(&format!("ok-{i}")), t0 + Duration::from_millis(i as u64));
        }
        assert_eq!(budget.renewals.len(), RENEWAL_ENTRIES);
        assert!(!budget.renewals.contains_key(&key("ok-0")), "the soonest to expire went");
    }
}
