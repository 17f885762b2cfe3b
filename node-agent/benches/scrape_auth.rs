//! What HTTPS and token checks cost a `/metrics` scrape: one agent state (the 32-runtime
//! trn1n.32xlarge report), served at once by the service crate as the agent serves it —
//! plain HTTP on one port, HTTPS with a token reviewed by the real test API server on
//! another — and scraped by a client on the loopback:
//! - `keep_alive/plain` vs `keep_alive/https_token`: a scrape on an open connection, the
//!   token's review cached (what a scraper pays within the cache's minute);
//! - `new_connection/plain` vs `new_connection/https_token`: connect (+ TLS handshake)
//!   and the first scrape on it (what Prometheus pays per scrape when its interval is
//!   longer than the agent's 5 s keep-alive).
//!
//! Before criterion runs, a timing loop scrapes plain and HTTPS in turns and prints the
//! median of each and the ratio HTTPS/plain, measured in the same run (the target: within
//! 2× for `keep_alive`).
//!
//! Needs the test tools (the control plane): `. tests/tools/env.sh`, then
//! `cargo bench -p neuron-node-agent --bench scrape_auth`.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::{BodyExt, Empty};
use hyper::{body::Bytes, client::conn::http1::SendRequest};
use hyper_util::rt::TokioIo;
use neuron_e2e::ControlPlane;
use neuron_node_agent::{
    http::{self, HttpState},
    pipeline::Pipeline,
    sinks::prometheus::Exposition,
    state::NodeState,
    telemetry::AgentMetrics,
};
use neuron_test_support::TRN1N_32;
use prometheus_client::registry::Registry;
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};
use service::{
    auth::{AuthMetrics, AuthOptions, MetricsAuth},
    http::{ConnectionMetrics, Limits, Settings},
    tls::CertificateFiles,
};
use support::compact_fixture;
use tokio::{net::TcpStream, runtime::Runtime};
use tokio_util::sync::CancellationToken;

mod support;

const TESTDATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../service/testdata");
/// Timed scrapes per case in the ratio loop.
const SAMPLES: usize = 200;

struct Bench {
    runtime: Runtime,
    plain: SocketAddr,
    https: SocketAddr,
    tls: tokio_rustls::TlsConnector,
    token: String,
    shutdown: CancellationToken,
}

fn setup() -> Bench {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let (plain, https, token, shutdown) = runtime.block_on(async {
        // The agent's state after the largest recorded report.
        let mut registry = Registry::default();
        let metrics = AgentMetrics::register(&mut registry);
        let state = Arc::new(Mutex::new(NodeState::default()));
        let pipeline = Arc::new(Pipeline::new(state.clone(), metrics));
        assert!(pipeline.handle_line(compact_fixture(TRN1N_32).as_bytes()));
        let exposition = Exposition::new(registry, state, Default::default(), Default::default());
        let http_state = Arc::new(HttpState { exposition, pipeline, gpu_only: None, health: Default::default() });

        // A scraper allowed to get /metrics, and the token the kubelet would mount for it.
        let ns = cp.namespace("bench-auth").await;
        let reader = format!("{ns}-reader");
        let rbac = format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {{name: {reader}}}\nrules:\n\
             - nonResourceURLs: [/metrics]\n  verbs: [get]\n---\n\
             apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {{name: {reader}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {reader}}}\n\
             subjects: [{{kind: ServiceAccount, name: scraper, namespace: {ns}}}]\n"
        );
        let token = cp.service_account_token(&ns, "scraper", &[]).await;
        let (ok, out, err) = neuron_e2e::kubectl(cp, &["apply", "-f", "-"], Some(&rbac));
        assert!(ok, "{out}{err}");

        let shutdown = CancellationToken::new();
        let limits = Limits {
            header_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(10),
            max_connections: 64,
            max_connections_per_peer: 64,
            max_unsent_bytes: 32 << 20,
            max_unsent_bytes_per_peer: 8 << 20,
            send_buffer_bytes: 128 << 10,
        };
        let loopback = |port: u16| -> SocketAddr { ([127, 0, 0, 1], port).into() };
        let (plain, https) = (loopback(neuron_e2e::free_port()), loopback(neuron_e2e::free_port()));
        let plain_settings = Settings { listen: plain, probe_listen: None, tls: None, tokenless: None, limits };
        let tls =
            CertificateFiles { cert: format!("{TESTDATA}/a.crt").into(), key: format!("{TESTDATA}/a.key").into() };
        let https_settings = Settings { listen: https, probe_listen: None, tls: Some(tls), tokenless: None, limits };
        let auth = MetricsAuth::new(cp.client().await, AuthOptions::default(), AuthMetrics::default());
        let routes = || http::routes(http_state.clone());
        service::http::start(plain_settings, routes(), None, ConnectionMetrics::default(), shutdown.clone())
            .await
            .expect("plain server");
        service::http::start(https_settings, routes(), Some(auth), ConnectionMetrics::default(), shutdown.clone())
            .await
            .expect("HTTPS server");
        (plain, https, token, shutdown)
    });
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(format!("{TESTDATA}/a.crt")).expect("the test certificate");
    roots.add(CertificateDer::from_pem_slice(&ca).expect("PEM")).expect("a root");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config));
    Bench { runtime, plain, https, tls, token, shutdown }
}

impl Bench {
    /// A new HTTP/1.1 connection, over TLS for the HTTPS port.
    async fn connect(&self, https: bool) -> SendRequest<Empty<Bytes>> {
        let addr = if https { self.https } else { self.plain };
        let tcp = TcpStream::connect(addr).await.expect("connect");
        tcp.set_nodelay(true).expect("nodelay");
        let sender = if https {
            let name = ServerName::try_from("localhost").expect("a name");
            let stream = self.tls.connect(name, tcp).await.expect("TLS handshake");
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.expect("h1");
            tokio::spawn(connection);
            sender
        } else {
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await.expect("h1");
            tokio::spawn(connection);
            sender
        };
        sender
    }

    /// One scrape (the token sent on the HTTPS port); returns the body's length.
    async fn scrape(&self, sender: &mut SendRequest<Empty<Bytes>>, https: bool) -> usize {
        let mut request = hyper::Request::get("/metrics").header("host", "localhost");
        if https {
            request = request.header("authorization", format!("Bearer {}", self.token));
        }
        // The connection takes the next request once it has finished the last one.
        sender.ready().await.expect("the connection is open");
        let response = sender.send_request(request.body(Empty::new()).expect("request")).await.expect("response");
        assert_eq!(response.status(), 200, "the scrape is served");
        response.into_body().collect().await.expect("body").to_bytes().len()
    }

    fn keep_alive(&self, https: bool) -> impl FnMut() -> usize + '_ {
        let mut sender = self.runtime.block_on(self.connect(https));
        move || self.runtime.block_on(self.scrape(&mut sender, https))
    }

    fn new_connection(&self, https: bool) -> impl FnMut() -> usize + '_ {
        move || {
            self.runtime.block_on(async {
                let mut sender = self.connect(https).await;
                self.scrape(&mut sender, https).await
            })
        }
    }
}

/// Medians of `plain` and `https`, timed in turns so that a change of the machine's load
/// weighs on both alike.
fn medians(mut plain: impl FnMut() -> usize, mut https: impl FnMut() -> usize) -> (Duration, Duration) {
    let time = |scrape: &mut dyn FnMut() -> usize| {
        let started = Instant::now();
        std::hint::black_box(scrape());
        started.elapsed()
    };
    let (mut plain_times, mut https_times): (Vec<Duration>, Vec<Duration>) =
        (0..SAMPLES).map(|_| (time(&mut plain), time(&mut https))).unzip();
    plain_times.sort_unstable();
    https_times.sort_unstable();
    (plain_times[SAMPLES / 2], https_times[SAMPLES / 2])
}

fn scrapes(c: &mut Criterion) {
    let bench = setup();
    // The first scrape with the token reviews it (TokenReview, SubjectAccessReview); the
    // rest are decided from the cache.
    let body = bench.keep_alive(true)();
    println!("exposition: {body} bytes");
    for (case, (plain, https)) in [
        ("keep_alive", medians(bench.keep_alive(false), bench.keep_alive(true))),
        ("new_connection", medians(bench.new_connection(false), bench.new_connection(true))),
    ] {
        println!(
            "{case}: plain {plain:?}, https + token {https:?}, ratio {:.2} (median of {SAMPLES})",
            https.as_secs_f64() / plain.as_secs_f64()
        );
    }
    let mut group = c.benchmark_group("scrape");
    let mut plain = bench.keep_alive(false);
    group.bench_function("keep_alive/plain", |b| b.iter(&mut plain));
    let mut https = bench.keep_alive(true);
    group.bench_function("keep_alive/https_token", |b| b.iter(&mut https));
    let mut plain = bench.new_connection(false);
    group.bench_function("new_connection/plain", |b| b.iter(&mut plain));
    let mut https = bench.new_connection(true);
    group.bench_function("new_connection/https_token", |b| b.iter(&mut https));
    group.finish();
    bench.shutdown.cancel();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30).measurement_time(Duration::from_secs(5));
    targets = scrapes
}
criterion_main!(benches);
