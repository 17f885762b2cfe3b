//! One served connection as the server's limits see it: the seat it holds (a permit of its
//! port and a slot of its peer's share), the signal that closes it when another client
//! needs its room ([`super::unsent`]), and what the end of it is counted as.

use std::{
    net::IpAddr,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
};

use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use super::{
    peers::{peer_key, PeerSlot},
    Port,
};

/// What a connection holds while it is served: one of its port's permits and one slot
/// of its peer's share. Dropping it gives both back.
pub struct Seat {
    pub(super) permit: OwnedSemaphorePermit,
    #[expect(dead_code, reason = "held: dropping it gives the slot back")]
    pub(super) slot: PeerSlot,
}

/// A served connection, shared by its task, its stream ([`super::io`]) and, while one of
/// its responses is unsent, the budget of those ([`super::unsent::Unsent`]).
pub struct Connection {
    id: u64,
    port: Port,
    /// [`peer_key`] of its source address.
    peer: IpAddr,
    seat: Mutex<Option<Seat>>,
    /// Cancelled when the connection is closed to make room for another.
    closing: CancellationToken,
    /// Whether it delivered a request (its header timeout is then an idle one).
    served: AtomicBool,
    /// Whether its client left a response unread past the write timeout.
    write_timed_out: AtomicBool,
}

/// Connection ids: unique in the process, as the budget of unsent bytes spans its ports.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Connection {
    pub fn new(port: Port, peer: IpAddr, seat: Seat) -> Arc<Self> {
        Arc::new(Connection {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            port,
            peer: peer_key(peer),
            seat: Mutex::new(Some(seat)),
            closing: CancellationToken::new(),
            served: AtomicBool::new(false),
            write_timed_out: AtomicBool::new(false),
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn port(&self) -> Port {
        self.port
    }

    /// Who it counts against: its source address, IPv6 by /64 ([`peer_key`]).
    pub fn peer(&self) -> IpAddr {
        self.peer
    }

    /// Its seat, for another connection: it is closed at once ([`Connection::close`]) and
    /// no longer counts against its port or peer. `None` once given or the connection ended.
    pub fn take_seat(&self) -> Option<Seat> {
        self.seat.lock().unwrap_or_else(PoisonError::into_inner).take()
    }

    /// Tells the connection's task to close it now, whatever it is doing.
    pub fn close(&self) {
        self.closing.cancel();
    }

    /// Whether [`Connection::close`] was called.
    pub fn is_closing(&self) -> bool {
        self.closing.is_cancelled()
    }

    /// Completes once [`Connection::close`] was called.
    pub fn closing(&self) -> WaitForCancellationFuture<'_> {
        self.closing.cancelled()
    }

    pub fn mark_served(&self) {
        self.served.store(true, Ordering::Relaxed);
    }

    pub fn served(&self) -> bool {
        self.served.load(Ordering::Relaxed)
    }

    pub fn mark_write_timed_out(&self) {
        self.write_timed_out.store(true, Ordering::Relaxed);
    }

    pub fn write_timed_out(&self) -> bool {
        self.write_timed_out.load(Ordering::Relaxed)
    }
}
