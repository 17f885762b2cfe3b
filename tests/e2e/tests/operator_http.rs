//! The operator's HTTP server on the real control plane, under connections that never
//! finish a request: they are closed after the header timeout while `/healthz` keeps
//! answering, and the closes are counted.
//!
//! The limit is set through the environment, so that a binary without it still starts
//! (and fails on its behaviour, not on an unknown flag).

use std::{
    io::Write,
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use neuron_e2e::{closed_by_server, free_port, http_get, ControlPlane, Process};

/// The operator's default time limit for a request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Room on top of a timeout for a loaded two-core machine.
const MARGIN: Duration = Duration::from_secs(10);
const HELD: usize = 200;

fn counter(exposition: &str, name_and_labels: &str) -> f64 {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(name_and_labels)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn half_sent_requests_are_closed_after_the_header_timeout_while_healthz_answers() {
    let cp = ControlPlane::shared();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let namespace = runtime.block_on(async {
        cp.install_crds().await;
        cp.namespace("nm-http").await
    });
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let args = vec!["--namespace".to_owned(), namespace, "--listen".to_owned(), addr.to_string()];
    // Caps above the connections held here: this test is about the timeout alone.
    let env = [
        ("NEURON_OPERATOR_LOG", "info".to_owned()),
        ("NEURON_OPERATOR_HTTP_MAX_CONNECTIONS", "1000".to_owned()),
        ("NEURON_OPERATOR_HTTP_MAX_CONNECTIONS_PER_PEER", "1000".to_owned()),
    ];
    let _operator = Process::start("neuron-operator", &args, &env, cp);
    let start = Instant::now();
    while http_get(addr, "/healthz").map(|r| r.0) != Some(200) {
        assert!(start.elapsed() < Duration::from_secs(30), "the operator's /healthz never answered");
        std::thread::sleep(Duration::from_millis(100));
    }

    let opened = Instant::now();
    let held: Vec<TcpStream> = (0..HELD)
        .map(|_| {
            let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
            stream.write_all(b"GET /metr").expect("half a request line");
            stream
        })
        .collect();
    assert_eq!(http_get(addr, "/healthz").map(|r| r.0), Some(200), "/healthz answers while {HELD} connections hold");

    let deadline = opened + HEADER_TIMEOUT + MARGIN;
    let still_open = held.iter().filter(|s| !closed_by_server(s, deadline)).count();
    assert_eq!(still_open, 0, "connections still open {:?} after they were opened", opened.elapsed());

    // The server counts a connection just after closing it: the last may lag the close.
    let counted = Instant::now();
    let (exposition, timed_out) = loop {
        let (status, exposition) = http_get(addr, "/metrics").expect("GET /metrics");
        assert_eq!(status, 200);
        let timed_out = counter(&exposition, "neuron_operator_http_connections_timed_out_total{phase=\"header\"}");
        if timed_out >= HELD as f64 || counted.elapsed() > Duration::from_secs(5) {
            break (exposition, timed_out);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(timed_out >= HELD as f64, "timed-out connections counted: {timed_out}\n{exposition}");
    assert_eq!(counter(&exposition, "neuron_operator_http_connections_refused_total"), 0.0);
}
