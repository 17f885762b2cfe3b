//! The bytes of responses the server has produced and not yet handed to the kernel, over
//! every connection of every port of the process, within a budget, and each peer (a
//! source address, [`super::peers::peer_key`]) within a share of it.
//!
//! A client that sends `GET /metrics` and never reads leaves its page in the server's
//! memory until the write timeout closes its connection. A response is counted from the
//! moment the route answers it until the connection has written it whole (its stream's
//! flush, [`super::io`]); a connection has at most one such response, as hyper takes a
//! connection's next request (a pipelined one included) only once the last response is
//! written. A page shared by several responses (the agent's `bytes::Bytes`) is counted
//! for each: the bound is on the worst case.
//!
//! When a response does not fit, room is made, not refused: the connections of the peer
//! holding the most unsent bytes are closed, the one waiting longest first (within the
//! peer's share: that peer's own). A client that reads takes its response in
//! milliseconds, so the ones closed are those that do not read: they exhaust the budget
//! for themselves, and a scraper (even one behind the same address) is served. The same
//! rule gives a new connection the seat of a connection whose response waits unread when
//! its peer or its port holds every seat ([`Unsent::displace`]). A response larger than
//! the peer's share is taken alone (a page that outgrew the share is still served); only
//! one larger than the whole budget is refused (503).

use std::{
    cmp::Reverse,
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Instant,
};

use tracing::warn;

use super::{
    connection::{Connection, Seat},
    logged, ConnectionMetrics, Port, RefusalLabels, LOG_EVERY,
};
use crate::ratelimit::RateLimit;

/// The budget's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsentLimits {
    /// Over every connection of the process.
    pub max_bytes: u64,
    /// Over the connections of one peer.
    pub max_bytes_per_peer: u64,
}

/// Why a connection was closed for another (the `reason` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Room {
    /// A response of the same peer did not fit in the peer's share.
    PeerUnsentBytes,
    /// A response did not fit in the budget.
    UnsentBytes,
    /// A new connection of the same peer found the peer's seats taken.
    PeerCap,
    /// A new connection found its port's seats taken.
    ConnectionCap,
}

impl Room {
    pub fn label(self) -> &'static str {
        match self {
            Room::PeerUnsentBytes => "peer_unsent_bytes",
            Room::UnsentBytes => "unsent_bytes",
            Room::PeerCap => "peer_cap",
            Room::ConnectionCap => "connection_cap",
        }
    }
}

/// The budget, shared by the ports of one server.
pub struct Unsent {
    limits: UnsentLimits,
    state: Mutex<State>,
    metrics: ConnectionMetrics,
    log: Mutex<RateLimit>,
}

/// A connection's unsent response.
struct Pending {
    connection: Arc<Connection>,
    bytes: u64,
    since: Instant,
}

#[derive(Default)]
struct State {
    total: u64,
    by_peer: HashMap<IpAddr, u64>,
    /// By connection id.
    pending: HashMap<u64, Pending>,
}

impl State {
    fn peer_bytes(&self, peer: IpAddr) -> u64 {
        self.by_peer.get(&peer).copied().unwrap_or(0)
    }

    fn add(&mut self, connection: &Arc<Connection>, bytes: u64, now: Instant) {
        self.total += bytes;
        *self.by_peer.entry(connection.peer()).or_insert(0) += bytes;
        let pending = self.pending.entry(connection.id()).or_insert(Pending {
            connection: connection.clone(),
            bytes: 0,
            since: now,
        });
        pending.bytes += bytes;
    }

    fn remove(&mut self, id: u64) -> Option<Pending> {
        let pending = self.pending.remove(&id)?;
        self.total = self.total.saturating_sub(pending.bytes);
        let peer = pending.connection.peer();
        if let Some(held) = self.by_peer.get_mut(&peer) {
            *held = held.saturating_sub(pending.bytes);
            if *held == 0 {
                self.by_peer.remove(&peer);
            }
        }
        Some(pending)
    }

    /// The connection to close for room among those `matching`, `except` aside: of the
    /// peer holding the most unsent bytes, the one waiting longest.
    fn victim(&self, except: Option<u64>, matching: impl Fn(&Connection) -> bool) -> Option<u64> {
        self.pending
            .iter()
            .filter(|(id, p)| Some(**id) != except && matching(&p.connection))
            .max_by_key(|(_, p)| (self.peer_bytes(p.connection.peer()), Reverse(p.since)))
            .map(|(id, _)| *id)
    }

    /// Closes `matching` connections for room until `fits`; false when none is left.
    fn make_room(
        &mut self,
        except: Option<u64>,
        matching: impl Fn(&Connection) -> bool,
        fits: impl Fn(&State) -> bool,
        evicted: &mut Vec<Arc<Connection>>,
    ) -> bool {
        while !fits(self) {
            match self.victim(except, &matching).and_then(|id| self.remove(id)) {
                Some(pending) => evicted.push(pending.connection),
                None => return false,
            }
        }
        true
    }
}

impl Unsent {
    pub fn new(limits: UnsentLimits, metrics: ConnectionMetrics) -> Arc<Self> {
        Arc::new(Unsent {
            limits,
            state: Mutex::new(State::default()),
            metrics,
            log: Mutex::new(RateLimit::new(1, LOG_EVERY)),
        })
    }

    /// Counts `bytes` of `connection`'s response as unsent, closing other connections for
    /// room as the module says. A response over the peer's share by itself is taken once
    /// the peer holds nothing else (a page that outgrew the share is still served). False
    /// (nothing counted) when it alone is over the budget.
    pub fn charge(&self, connection: &Arc<Connection>, bytes: u64) -> bool {
        let UnsentLimits { max_bytes, max_bytes_per_peer } = self.limits;
        let (id, peer) = (connection.id(), connection.peer());
        let mut for_peer = Vec::new();
        let mut for_budget = Vec::new();
        let admitted = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let peer_fits = |s: &State| {
                let held = s.peer_bytes(peer);
                held == 0 || held + bytes <= max_bytes_per_peer
            };
            let admitted = bytes <= max_bytes
                && state.make_room(Some(id), |c| c.peer() == peer, peer_fits, &mut for_peer)
                && state.make_room(Some(id), |_| true, |s| s.total + bytes <= max_bytes, &mut for_budget);
            if admitted {
                state.add(connection, bytes, Instant::now());
            }
            self.metrics.unsent_bytes.set(gauge_value(state.total));
            admitted
        };
        for closed in for_peer {
            self.evict(&closed, Room::PeerUnsentBytes);
        }
        for closed in for_budget {
            self.evict(&closed, Room::UnsentBytes);
        }
        if !admitted {
            self.refused(connection, bytes);
        }
        admitted
    }

    /// Counts (and logs, throttled) a response refused for being over the budget alone.
    fn refused(&self, connection: &Connection, bytes: u64) {
        let port = connection.port().name();
        let labels = RefusalLabels { port, reason: Room::UnsentBytes.label() };
        self.metrics.responses_refused.get_or_create(&labels).inc();
        if let Some(count) = self.log.lock().ok().and_then(|mut l| logged(&mut l)) {
            warn!(
                port,
                bytes,
                max_unsent_bytes = self.limits.max_bytes,
                count,
                "HTTP responses larger than --http-max-unsent-bytes answered 503 instead: raise it"
            );
        }
    }

    /// The response of connection `id` is written (or the connection ended).
    pub fn release(&self, id: u64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.remove(id).is_some() {
            self.metrics.unsent_bytes.set(gauge_value(state.total));
        }
    }

    /// The seat of a connection on `port` (of `peer`, when given) whose response waits
    /// unread, chosen as for room; that connection is closed. `None` when there is none.
    pub fn displace(&self, port: Port, peer: Option<IpAddr>) -> Option<Seat> {
        let victim = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let matching = |c: &Connection| c.port() == port && peer.is_none_or(|p| c.peer() == p);
            let victim = state.victim(None, matching).and_then(|id| state.remove(id));
            self.metrics.unsent_bytes.set(gauge_value(state.total));
            victim?
        };
        let seat = victim.connection.take_seat();
        self.evict(&victim.connection, if peer.is_some() { Room::PeerCap } else { Room::ConnectionCap });
        seat
    }

    /// Bytes counted now.
    pub fn total(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).total
    }

    fn evict(&self, connection: &Connection, room: Room) {
        connection.close();
        let port = connection.port().name();
        self.metrics.evicted.get_or_create(&RefusalLabels { port, reason: room.label() }).inc();
        if let Some(count) = self.log.lock().ok().and_then(|mut l| logged(&mut l)) {
            let UnsentLimits { max_bytes, max_bytes_per_peer } = self.limits;
            warn!(
                port,
                reason = room.label(),
                peer = %connection.peer(),
                max_unsent_bytes = max_bytes,
                max_unsent_bytes_per_peer = max_bytes_per_peer,
                count,
                "closed HTTP connections whose responses went unread, to make room for others (the peer is the latest one)"
            );
        }
    }
}

fn gauge_value(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
