//! ConfigMaps written that the cache may not show yet. A pass decides what to write from
//! the watch cache; the next pass (woken by the agents' acknowledgements of the first
//! ConfigMaps) can start before the watch has delivered the last writes of the previous
//! one, and would write them again: 22 of 1,000 nodes in the fleet benchmark. A write
//! is taken as landed while the cache still shows the version it replaced, for a while.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

/// How long a write is trusted over a cache that does not show it (the watch delivers
/// within a second; this bounds how long a ConfigMap deleted by hand in that second
/// stays missing: until the first pass after it).
const TRUSTED_FOR: Duration = Duration::from_secs(30);

struct Written {
    hash: String,
    /// The resourceVersion the cache showed when the write was made (`None`: absent).
    replaced: Option<String>,
    at: Instant,
}

/// Writes of this replica, by ConfigMap name.
#[derive(Default)]
pub(super) struct PendingWrites(Mutex<HashMap<String, Written>>);

impl PendingWrites {
    /// Whether `hash` was written to `name` and the cache, at `cached_version`, does not
    /// show that write yet.
    pub(super) fn is_pending(&self, name: &str, hash: &str, cached_version: Option<&str>) -> bool {
        let mut writes = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match writes.get(name) {
            Some(w) if w.hash == hash && w.replaced.as_deref() == cached_version && w.at.elapsed() < TRUSTED_FOR => {
                true
            }
            Some(_) => {
                // The cache moved on (or the write is old): it is the truth again.
                writes.remove(name);
                false
            }
            None => false,
        }
    }

    pub(super) fn wrote(&self, name: &str, hash: &str, replaced: Option<&str>) {
        let written = Written { hash: hash.to_owned(), replaced: replaced.map(str::to_owned), at: Instant::now() };
        self.0.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_owned(), written);
    }

    /// Forgets a ConfigMap whose cached content is the one wanted.
    pub(super) fn seen(&self, name: &str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).remove(name);
    }

    /// Forgets writes too old to trust (nodes that went away meanwhile).
    pub(super) fn expire(&self) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).retain(|_, w| w.at.elapsed() < TRUSTED_FOR);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_is_pending_until_the_cache_moves_on() {
        let p = PendingWrites::default();
        assert!(!p.is_pending("cm", "h2", Some("10")), "nothing written");
        p.wrote("cm", "h2", Some("10"));
        assert!(p.is_pending("cm", "h2", Some("10")), "the cache still shows version 10");
        assert!(!p.is_pending("cm", "h3", Some("10")), "another content is wanted now");
        p.wrote("cm", "h2", Some("10"));
        // The cache shows a later version (ours, or someone's change): it decides.
        assert!(!p.is_pending("cm", "h2", Some("11")));
        assert!(!p.is_pending("cm", "h2", Some("10")), "forgotten once the cache moved on");
    }

    #[test]
    fn a_created_configmap_is_pending_while_the_cache_has_none() {
        let p = PendingWrites::default();
        p.wrote("cm", "h1", None);
        assert!(p.is_pending("cm", "h1", None));
        p.seen("cm");
        assert!(!p.is_pending("cm", "h1", None));
        p.wrote("cm", "h1", None);
        p.expire();
        assert!(p.is_pending("cm", "h1", None), "a fresh write outlives expire()");
    }
}
