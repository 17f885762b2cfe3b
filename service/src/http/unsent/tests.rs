use std::time::Duration;

use tokio::sync::Semaphore;

use super::*;
use crate::http::peers::Peers;

fn connection(port: Port, peer: &str) -> Arc<Connection> {
    let ip: IpAddr = peer.parse().unwrap();
    let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
    let slot = Peers::new(1).try_take(ip).unwrap();
    Connection::new(port, ip, Seat { permit, slot })
}

fn budget(max_bytes: u64, max_bytes_per_peer: u64) -> (Arc<Unsent>, ConnectionMetrics) {
    let metrics = ConnectionMetrics::default();
    (Unsent::new(UnsentLimits { max_bytes, max_bytes_per_peer }, metrics.clone()), metrics)
}

fn evicted(metrics: &ConnectionMetrics, reason: &'static str) -> u64 {
    metrics.evicted.get_or_create(&RefusalLabels { port: "main", reason }).get()
}

#[test]
fn the_victim_is_the_longest_waiting_response_of_the_peer_holding_the_most() {
    let t0 = Instant::now();
    let (a1, a2, b) =
        (connection(Port::Main, "127.0.0.2"), connection(Port::Main, "127.0.0.2"), connection(Port::Main, "127.0.0.3"));
    let mut state = State::default();
    state.add(&a1, 100, t0 + Duration::from_millis(10));
    state.add(&b, 150, t0);
    state.add(&a2, 100, t0 + Duration::from_millis(20));
    // b waits longest, but 127.0.0.2 holds more (200 bytes).
    assert_eq!(state.victim(None, |_| true), Some(a1.id()));
    assert_eq!(state.victim(Some(a1.id()), |_| true), Some(a2.id()));
    assert_eq!(state.victim(None, |c| c.peer() == b.peer()), Some(b.id()));
    state.remove(a1.id());
    assert_eq!((state.total, state.peer_bytes(a1.peer())), (250, 100));
}

#[test]
fn a_peer_over_its_share_closes_its_own_connections_not_others() {
    let (unsent, metrics) = budget(1_000, 300);
    let (a1, a2, b) =
        (connection(Port::Main, "127.0.0.2"), connection(Port::Main, "127.0.0.2"), connection(Port::Main, "127.0.0.3"));
    assert!(unsent.charge(&b, 200));
    assert!(unsent.charge(&a1, 200));
    assert!(unsent.charge(&a2, 200), "room made, not refused");
    assert!(a1.is_closing(), "the peer's own unread response gave way");
    assert!(!b.is_closing() && !a2.is_closing());
    assert_eq!(unsent.total(), 400);
    assert_eq!(metrics.unsent_bytes.get(), 400);
    assert_eq!(evicted(&metrics, "peer_unsent_bytes"), 1);
}

#[test]
fn over_the_budget_the_peer_holding_the_most_gives_way() {
    let (unsent, metrics) = budget(500, 400);
    let b = connection(Port::Main, "127.0.0.3");
    let (a1, a2) = (connection(Port::Main, "127.0.0.2"), connection(Port::Main, "127.0.0.2"));
    assert!(unsent.charge(&b, 100));
    assert!(unsent.charge(&a1, 200));
    assert!(unsent.charge(&a2, 200));
    let scraper = connection(Port::Main, "127.0.0.3");
    assert!(unsent.charge(&scraper, 100));
    assert!(!b.is_closing(), "the peer holding less keeps its response, though older");
    assert_eq!([a1.is_closing(), a2.is_closing()], [true, false], "the biggest holder's longest-waiting one");
    assert_eq!(unsent.total(), 400);
    assert_eq!(evicted(&metrics, "unsent_bytes"), 1);
}

#[test]
fn a_response_over_the_share_is_taken_alone_and_one_over_the_budget_refused() {
    let (unsent, metrics) = budget(1_000, 300);
    let (a, b) = (connection(Port::Main, "127.0.0.2"), connection(Port::Main, "127.0.0.2"));
    assert!(unsent.charge(&a, 100));
    assert!(unsent.charge(&b, 301), "a page that outgrew the share is still served");
    assert!(a.is_closing(), "alone: the peer's other response gave way");
    assert_eq!(unsent.total(), 301);
    let c = connection(Port::Main, "127.0.0.3");
    assert!(!unsent.charge(&c, 1_001));
    assert!(!b.is_closing(), "nothing closed for a response that cannot fit");
    assert_eq!(unsent.total(), 301);
    let refused = metrics.responses_refused.get_or_create(&RefusalLabels { port: "main", reason: "unsent_bytes" });
    assert_eq!(refused.get(), 1);
    unsent.release(b.id());
    assert_eq!((unsent.total(), metrics.unsent_bytes.get()), (0, 0), "written: given back");
}

#[test]
fn a_new_connection_takes_the_seat_of_an_unread_response_on_its_port() {
    let (unsent, metrics) = budget(1_000, 1_000);
    let (stalled, other_port) = (connection(Port::Main, "127.0.0.2"), connection(Port::Tokenless, "127.0.0.2"));
    assert!(unsent.charge(&stalled, 100));
    assert!(unsent.charge(&other_port, 100));
    assert!(unsent.displace(Port::Main, Some("127.0.0.3".parse().unwrap())).is_none(), "another peer's is not taken");
    assert!(unsent.displace(Port::Probes, None).is_none(), "nor another port's");
    assert!(unsent.displace(Port::Main, Some("127.0.0.2".parse().unwrap())).is_some());
    assert!(stalled.is_closing() && stalled.take_seat().is_none(), "closed, its seat given");
    assert!(!other_port.is_closing());
    assert_eq!(unsent.total(), 100);
    assert_eq!(evicted(&metrics, "peer_cap"), 1);
    assert!(unsent.displace(Port::Main, None).is_none(), "none left");
}
