//! Connections held per peer, so that no single client takes every slot of a port: a
//! pod that opens connections and never finishes them fills its own share, and the
//! scrapers and the kubelet, each another peer, still get in.
//!
//! A peer is a source address ([`peer_key`]): an IPv4 address, or the /64 of an IPv6
//! one (what one host is usually given; a pod can take any address of it).

use std::{
    collections::HashMap,
    net::{IpAddr, Ipv6Addr},
    sync::{Arc, Mutex},
};

/// Who a connection counts against: its source address, IPv6 by /64, an IPv4-mapped
/// IPv6 address as the IPv4 address it is.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// The connections each peer holds on one port (only peers holding some are kept, so
/// the map is bounded by the port's connection cap).
pub struct Peers {
    limit: u32,
    held: Mutex<HashMap<IpAddr, u32>>,
}

/// One connection of a peer; dropping it gives the slot back.
pub struct PeerSlot {
    peers: Arc<Peers>,
    key: IpAddr,
}

impl Peers {
    /// At most `limit` connections per peer (0 is taken as 1).
    pub fn new(limit: u32) -> Arc<Self> {
        Arc::new(Peers { limit: limit.max(1), held: Mutex::new(HashMap::new()) })
    }

    /// A slot for a connection from `ip`, or `None` when that peer holds its limit.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let key = peer_key(ip);
        let mut held = self.held.lock().ok()?;
        let count = held.entry(key).or_insert(0);
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(PeerSlot { peers: self.clone(), key })
    }

    /// Connections `ip`'s peer holds now.
    pub fn held(&self, ip: IpAddr) -> u32 {
        self.held.lock().ok().and_then(|h| h.get(&peer_key(ip)).copied()).unwrap_or(0)
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        if let Ok(mut held) = self.peers.held.lock() {
            if let Some(count) = held.get_mut(&self.key) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    held.remove(&self.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_peer_gets_its_limit_and_others_still_get_in() {
        let peers = Peers::new(2);
        let a: Vec<PeerSlot> = (0..2).filter_map(|_| peers.try_take(ip("127.0.0.2"))).collect();
        assert_eq!(a.len(), 2);
        assert!(peers.try_take(ip("127.0.0.2")).is_none(), "a third from the same peer");
        let b = peers.try_take(ip("127.0.0.1"));
        assert!(b.is_some(), "another peer gets in");
        drop(a);
        assert_eq!(peers.held(ip("127.0.0.2")), 0, "slots given back");
        assert!(peers.try_take(ip("127.0.0.2")).is_some());
        drop(b);
        assert!(peers.held.lock().unwrap().len() <= 1, "peers holding nothing are forgotten");
    }

    #[test]
    fn ipv6_peers_are_counted_by_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(peer_key(ip("2001:db8:1:2:aaaa::1")), peer_key(ip("2001:db8:1:2:bbbb::9")));
        assert_ne!(peer_key(ip("2001:db8:1:2::1")), peer_key(ip("2001:db8:1:3::1")));
        assert_eq!(peer_key(ip("::ffff:10.0.0.7")), ip("10.0.0.7"));
        let peers = Peers::new(1);
        let _held = peers.try_take(ip("::ffff:10.0.0.7")).unwrap();
        assert!(peers.try_take(ip("10.0.0.7")).is_none(), "the same peer either way");
    }
}
