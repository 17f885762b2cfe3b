//! `/metrics` of both binaries as the chart serves them, on the real control plane: HTTPS
//! with the chart's own certificate, each request's bearer token reviewed by the real API
//! server (TokenReview, SubjectAccessReview) with the chart's RBAC, scraped by a real
//! Prometheus configured as the chart's ServiceMonitors say; refusals (401, 403), plain
//! probes, and a certificate rotated on disk as the kubelet rotates a Secret.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use neuron_e2e::{
    chart::{chart_args, chart_env, documents, find, kind, one, template_as},
    free_port, http_get, https, kubectl,
    prometheus::Prometheus,
    random_u32, workspace_bin, ControlPlane, Process, TempDir,
};
use serde_norway::Value;

/// The ServiceAccount the test's Prometheus runs as, bound by the chart to its
/// metrics-reader ClusterRole (`metricsEndpoint.prometheusServiceAccounts`).
const PROMETHEUS_SA: &str = "prometheus";
/// Room for a loaded two-core machine.
const LIMIT: Duration = Duration::from_secs(60);
/// The reviews one address may cause at once (docs/security.md); then 1 a second.
const PEER_BURST: f64 = 5.0;

/// The chart rendered as release `ns` in namespace `ns` (cluster-scoped names derive from
/// the release), with the monitors and the test's Prometheus ServiceAccount bound.
fn render(ns: &str) -> Vec<Value> {
    let account = [
        format!("metricsEndpoint.prometheusServiceAccounts[0].namespace={ns}"),
        format!("metricsEndpoint.prometheusServiceAccounts[0].name={PROMETHEUS_SA}"),
    ];
    let args =
        ["--set", &account[0], "--set", &account[1], "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"];
    documents(&template_as(ns, ns, None, &args))
}

fn named<'a>(docs: &'a [Value], k: &str, suffix: &str) -> &'a Value {
    find(docs, k)
        .into_iter()
        .find(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.ends_with(suffix)))
        .unwrap_or_else(|| panic!("no {k} named *{suffix}"))
}

/// The chart's certificate Secret: (tls.crt, tls.key, ca.crt).
fn certificate(docs: &[Value]) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let secret: Secret = serde_json::from_value(serde_json::to_value(named(docs, "Secret", "-metrics-tls")).unwrap())
        .expect("the certificate Secret");
    let data = secret.data.expect("Secret data");
    let file = |name: &str| data.get(name).unwrap_or_else(|| panic!("no {name} in the Secret")).0.clone();
    (file("tls.crt"), file("tls.key"), file("ca.crt"))
}

/// Applies the chart's ServiceAccounts and RBAC (what the binaries run with).
fn apply_rbac(cp: &ControlPlane, docs: &[Value]) {
    const KINDS: [&str; 5] = ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];
    let objects: Vec<String> =
        docs.iter().filter(|d| KINDS.contains(&kind(d))).map(|d| serde_norway::to_string(d).unwrap()).collect();
    let (ok, out, err) = kubectl(cp, &["apply", "-f", "-"], Some(&objects.join("---\n")));
    assert!(ok, "applying the chart's RBAC: {out}{err}");
}

/// A binary of the chart, run as its container says, with its ports on the loopback.
struct Served {
    process: Process,
    addr: SocketAddr,
    probes: SocketAddr,
}

fn loopback() -> SocketAddr {
    format!("127.0.0.1:{}", free_port()).parse().unwrap()
}

/// The chart's flags of a binary's ports moved to the loopback, its certificate to `volume`.
fn serving_args(addr: SocketAddr, probes: SocketAddr, volume: &https::SecretVolume) -> Vec<(&'static str, String)> {
    vec![
        ("--listen", addr.to_string()),
        ("--probe-listen", probes.to_string()),
        ("--tls-cert-file", volume.path("tls.crt").display().to_string()),
        ("--tls-key-file", volume.path("tls.key").display().to_string()),
    ]
}

/// Starts the agent of the chart's DaemonSet (standalone on the simulator: no node) with
/// the certificate files in `volume`, acting as the agent's ServiceAccount.
fn start_agent(cp: &ControlPlane, docs: &[Value], dir: &Path, volume: &https::SecretVolume, auth: bool) -> Served {
    let pod = &one(docs, "DaemonSet")["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let (addr, probes) = (loopback(), loopback());
    let mut replaced = serving_args(addr, probes, volume);
    replaced.extend([
        ("--metrics-auth", auth.to_string()),
        ("--monitor-command", workspace_bin("neuron-monitor-sim").display().to_string()),
        ("--state-dir", dir.join("state").display().to_string()),
        ("--pod-resources-socket", dir.join("kubelet.sock").display().to_string()),
        ("--sysfs-root", dir.join("sys").display().to_string()),
        ("--log-format", "text".to_owned()),
        ("--period", "1s".to_owned()),
    ]);
    let args = chart_args(container, &replaced);
    let mut env = chart_env(container, &[("spec.nodeName", String::new())]);
    // Standalone: no node to follow; the token checks make a client of their own.
    env.retain(|(k, _)| k != "NODE_NAME");
    env.push(("NEURON_AGENT_KMSG_PATH".into(), dir.join("kmsg").display().to_string()));
    env.push(("NEURON_AGENT_PROC_ROOT".into(), dir.join("proc").display().to_string()));
    env.push(("KUBECONFIG".into(), service_account_kubeconfig(cp, docs, "DaemonSet", dir).display().to_string()));
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let process = Process::start("neuron-node-agent", &args, &env, cp);
    let served = Served { process, addr, probes };
    served.wait_ready("the agent");
    served
}

/// Starts one operator replica of the chart's Deployment with the certificate in `volume`.
fn start_operator(cp: &ControlPlane, ns: &str, docs: &[Value], dir: &Path, volume: &https::SecretVolume) -> Served {
    let container = &one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0];
    let (addr, probes) = (loopback(), loopback());
    let args = chart_args(container, &serving_args(addr, probes, volume));
    let mut env = chart_env(container, &[("metadata.namespace", ns.to_owned()), ("metadata.name", "op-0".to_owned())]);
    env.push(("NEURON_OPERATOR_LOG_FORMAT".into(), "text".into()));
    env.push(("KUBECONFIG".into(), service_account_kubeconfig(cp, docs, "Deployment", dir).display().to_string()));
    let env: Vec<(&str, String)> = env.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    let process = Process::start("neuron-operator", &args, &env, cp);
    let served = Served { process, addr, probes };
    served.wait_ready("the operator");
    served
}

/// A kubeconfig acting as the ServiceAccount of the workload of kind `workload`.
fn service_account_kubeconfig(cp: &ControlPlane, docs: &[Value], workload: &str, dir: &Path) -> PathBuf {
    let pod = &one(docs, workload)["spec"]["template"]["spec"];
    let account = pod["serviceAccountName"].as_str().unwrap();
    let namespace = one(docs, workload)["metadata"]["namespace"].as_str().unwrap();
    let path = dir.join(format!("{account}.kubeconfig"));
    cp.service_account_kubeconfig(namespace, account, None, &path).expect("a ServiceAccount kubeconfig");
    path
}

impl Served {
    /// Until the probe port says ready, as the kubelet would see it.
    fn wait_ready(&self, what: &str) {
        let started = Instant::now();
        while http_get(self.probes, "/readyz").map(|r| r.0) != Some(200) {
            assert!(started.elapsed() < LIMIT, "{what}: /readyz on the probe port never answered 200");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The name the ServiceMonitor of the component `suffix` checks the certificate for.
fn server_name(docs: &[Value], suffix: &str) -> String {
    let endpoint = &named(docs, "ServiceMonitor", suffix)["spec"]["endpoints"][0];
    endpoint["tlsConfig"]["serverName"].as_str().expect("a serverName").to_owned()
}

/// The chart's agent serving HTTPS without token checks (no namespace or RBAC needed),
/// its certificate in a Secret volume of its own. Drops in field order: the process
/// first.
struct TlsAgent {
    served: Served,
    volume: https::SecretVolume,
    /// The chart rendered as a release of its own.
    release: String,
    /// tls.crt, tls.key, ca.crt it started with.
    certificate: (Vec<u8>, Vec<u8>, Vec<u8>),
    server_name: String,
    _dir: TempDir,
}

impl TlsAgent {
    fn start(cp: &ControlPlane, tag: &str) -> TlsAgent {
        let release = format!("nm-{tag}-{:08x}", random_u32());
        let docs = render(&release);
        let dir = TempDir::new(&release);
        std::fs::create_dir_all(dir.0.join("proc")).unwrap();
        let certificate = certificate(&docs);
        let (crt, key, _) = &certificate;
        let volume = https::SecretVolume::new(dir.0.join("tls"), &[("tls.crt", crt), ("tls.key", key)]).unwrap();
        let served = start_agent(cp, &docs, &dir.0, &volume, false);
        TlsAgent { served, volume, server_name: server_name(&docs, "node-agent"), release, certificate, _dir: dir }
    }

    fn addr(&self) -> SocketAddr {
        self.served.addr
    }
}

/// The value of `name` with `labels` in an exposition (0 when absent).
fn value(exposition: &str, name: &str, labels: &str) -> f64 {
    let series = if labels.is_empty() { name.to_owned() } else { format!("{name}{{{labels}}}") };
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.strip_prefix(' ')?.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_scrapes_both_binaries_over_https_with_a_token_others_are_refused() {
    let cp = ControlPlane::shared();
    cp.install_crds().await;
    let ns = cp.namespace("nm-auth").await;
    let docs = render(&ns);
    apply_rbac(cp, &docs);
    let dir = std::env::temp_dir().join(format!("neuron-e2e-auth-{:08x}", random_u32()));
    std::fs::create_dir_all(dir.join("proc")).unwrap();
    let (crt, key, _) = certificate(&docs);
    let volume = https::SecretVolume::new(dir.join("tls"), &[("tls.crt", &crt), ("tls.key", &key)]).unwrap();

    // What the chart's ServiceMonitors tell Prometheus: HTTPS, the CA of the published
    // ConfigMap, the Service's name, Prometheus's own ServiceAccount token.
    let monitor = |suffix: &str| named(&docs, "ServiceMonitor", suffix)["spec"]["endpoints"][0].clone();
    let (agent_endpoint, operator_endpoint) = (monitor("node-agent"), monitor("operator"));
    for endpoint in [&agent_endpoint, &operator_endpoint] {
        assert_eq!(endpoint["scheme"].as_str(), Some("https"));
        assert_eq!(
            endpoint["bearerTokenFile"].as_str(),
            Some("/var/run/secrets/kubernetes.io/serviceaccount/token"),
            "the ServiceAccount token"
        );
    }
    let ca_map = agent_endpoint["tlsConfig"]["ca"]["configMap"]["name"].as_str().expect("the CA ConfigMap");
    let ca_map: ConfigMap = serde_json::from_value(serde_json::to_value(named(&docs, "ConfigMap", ca_map)).unwrap())
        .expect("the CA ConfigMap");
    let ca = ca_map.data.unwrap()["ca.crt"].clone().into_bytes();
    std::fs::write(dir.join("ca.crt"), &ca).unwrap();
    let (agent_name, operator_name) = (server_name(&docs, "node-agent"), server_name(&docs, "operator"));

    let agent = start_agent(cp, &docs, &dir, &volume, true);
    let operator = start_operator(cp, &ns, &docs, &dir, &volume);

    // Prometheus as that ServiceMonitor configures it, with its ServiceAccount's token.
    let token = cp.service_account_token(&ns, PROMETHEUS_SA, &[]).await;
    std::fs::write(dir.join("token"), &token).unwrap();
    let job = |name: &str, server: &str, target: SocketAddr| {
        format!(
            "  - job_name: {name}\n    scheme: https\n    tls_config:\n      ca_file: {ca}\n      server_name: {server}\n    \
             authorization:\n      credentials_file: {token}\n    static_configs:\n      - targets: ['{target}']\n",
            ca = dir.join("ca.crt").display(),
            token = dir.join("token").display(),
        )
    };
    let scrape =
        job("neuron-node-agent", &agent_name, agent.addr) + &job("neuron-operator", &operator_name, operator.addr);
    let prometheus = Prometheus::start(&scrape).expect("prometheus");
    for (job, series) in
        [("neuron-node-agent", "neuron_agent_reports_total"), ("neuron-operator", "neuron_operator_reconciles_total")]
    {
        prometheus
            .wait_for(&format!("up{{job=\"{job}\"}}"), LIMIT, |r| (r.first().map(|s| s.1) == Some(1.0)).then_some(()))
            .unwrap_or_else(|e| panic!("{job} scraped over HTTPS: {e:#}"));
        prometheus
            .wait_for(&format!("{series}{{job=\"{job}\"}}"), LIMIT, |r| (!r.is_empty()).then_some(()))
            .unwrap_or_else(|e| panic!("{job}'s series: {e:#}"));
    }

    // The same requests by hand.
    let agent_client = https::Client::new(&ca, &agent_name).unwrap();
    let operator_client = https::Client::new(&ca, &operator_name).unwrap();
    let stranger = cp.service_account_token(&ns, "stranger", &[]).await;
    for (what, client, addr) in [("agent", &agent_client, agent.addr), ("operator", &operator_client, operator.addr)] {
        let allowed = client.get(addr, "/metrics", Some(&token)).unwrap();
        assert_eq!(allowed.status, 200, "{what}: {}", allowed.body);
        let none = client.get(addr, "/metrics", None).unwrap();
        assert_eq!(none.status, 401, "{what} without a token: {}", none.body);
        assert!(none.head.contains("www-authenticate: bearer"), "{what}: {}", none.head);
        assert!(!none.body.contains("neuron_"), "{what}: nothing of the metrics without a token");
        let garbage = client.get(addr, "/metrics", Some("not-a-kubernetes-token")).unwrap();
        assert_eq!(garbage.status, 401, "{what} with a garbage token");
        assert!(garbage.head.contains("error=\"invalid_token\""), "{what}: {}", garbage.head);
        let forbidden = client.get(addr, "/metrics", Some(&stranger)).unwrap();
        assert_eq!(forbidden.status, 403, "{what} with a token without the RBAC: {}", forbidden.body);
        assert!(forbidden.body.contains(&format!("system:serviceaccount:{ns}:stranger")), "{}", forbidden.body);
        // Plain HTTP on the metrics port is not served.
        assert_ne!(http_get(addr, "/metrics").map(|r| r.0), Some(200), "{what}: plain HTTP on the TLS port");
    }
    // The probes: plain HTTP on their own port, which serves nothing else.
    for (what, served) in [("agent", &agent), ("operator", &operator)] {
        for path in ["/healthz", "/readyz"] {
            assert_eq!(http_get(served.probes, path).map(|r| r.0), Some(200), "{what} {path}");
        }
        assert_eq!(
            http_get(served.probes, "/metrics").map(|r| r.0),
            Some(404),
            "{what}: no /metrics on the probe port"
        );
    }

    // Each decision counted: reviews by result, and Prometheus's repeated scrapes from the
    // cache.
    let exposition = agent_client.get(agent.addr, "/metrics", Some(&token)).unwrap().body;
    for result in ["allowed", "forbidden", "unauthenticated"] {
        let reviews = value(&exposition, "neuron_agent_http_auth_reviews_total", &format!("result=\"{result}\""));
        assert!(reviews >= 1.0, "{result} reviews: {reviews}\n{exposition}");
    }
    assert!(value(&exposition, "neuron_agent_http_auth_cache_hits_total", "result=\"allowed\"") >= 1.0);
    assert!(value(&exposition, "neuron_agent_http_auth_refused_total", "reason=\"no_token\"") >= 1.0);
    assert_eq!(value(&exposition, "neuron_agent_http_auth_reviews_total", "result=\"error\""), 0.0);
    let exposition = operator_client.get(operator.addr, "/metrics", Some(&token)).unwrap().body;
    assert!(value(&exposition, "neuron_operator_http_auth_reviews_total", "result=\"allowed\"") >= 1.0, "{exposition}");

    drop(prometheus);
    drop((agent, operator));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The kubelet updates a mounted Secret by swapping a `..data` link to a new directory:
/// the agent serves the new certificate without a restart, never a half-updated pair.
#[test]
fn a_certificate_rotated_on_disk_is_served_without_a_restart() {
    let mut agent = TlsAgent::start(ControlPlane::shared(), "rotate");
    let (crt_a, _, ca_a) = agent.certificate.clone();
    let server_name = agent.server_name.clone();
    let client_a = https::Client::new(&ca_a, &server_name).unwrap();
    assert_eq!(client_a.get(agent.addr(), "/metrics", None).unwrap().certificate, https::der(&crt_a).unwrap());

    // A new pair (another rendering: another CA and certificate), as cert-manager or
    // `helm upgrade` after deleting the Secret would make.
    let (crt_b, key_b, ca_b) = certificate(&render(&agent.release));
    agent.volume.publish(&[("tls.crt", &crt_b), ("tls.key", &key_b)]).unwrap();
    let client_b = https::Client::new(&ca_b, &server_name).unwrap();
    let started = Instant::now();
    let exposition = loop {
        if let Ok(answer) = client_b.get(agent.addr(), "/metrics", None) {
            if answer.certificate == https::der(&crt_b).unwrap() {
                break answer.body;
            }
        }
        assert!(started.elapsed() < LIMIT, "the rotated certificate was never served");
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("rotated certificate served {:?} after the swap", started.elapsed());
    assert!(agent.served.process.child.try_wait().unwrap().is_none(), "the same process serves it");
    assert_eq!(value(&exposition, "neuron_agent_http_tls_certificate_reloads_total", "result=\"loaded\""), 1.0);
    assert!(client_a.get(agent.addr(), "/metrics", None).is_err(), "the old CA no longer verifies the server");

    // Half-updated (the old certificate with the new key): refused and counted, the last
    // good pair still served.
    agent.volume.publish(&[("tls.crt", &crt_a), ("tls.key", &key_b)]).unwrap();
    let started = Instant::now();
    loop {
        let answer = client_b.get(agent.addr(), "/metrics", None).expect("still served");
        assert_eq!(answer.certificate, https::der(&crt_b).unwrap(), "never the half-updated pair");
        if value(&answer.body, "neuron_agent_http_tls_certificate_reloads_total", "result=\"invalid\"") == 1.0 {
            break;
        }
        assert!(started.elapsed() < LIMIT, "the half-updated pair was never counted");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The metrics port speaks HTTP/1.1 only (ALPN), and a connection that never completes
/// its handshake is closed within the header timeout and counted.
#[test]
fn the_tls_port_offers_http1_only_and_bounds_handshakes() {
    let agent = TlsAgent::start(ControlPlane::shared(), "alpn");
    let (ca, server_name) = (&agent.certificate.2, &agent.server_name);
    let both = https::Client::with_alpn(ca, server_name, &[b"h2", b"http/1.1"]).unwrap();
    assert_eq!(both.handshake(agent.addr()).unwrap(), Some(b"http/1.1".to_vec()), "HTTP/1.1 chosen over h2");
    let h2_only = https::Client::with_alpn(ca, server_name, &[b"h2"]).unwrap();
    let refused = h2_only.handshake(agent.addr()).expect_err("a client asking for h2 alone is refused");
    assert!(format!("{refused:#}").to_lowercase().contains("application"), "no_application_protocol: {refused:#}");

    // A connection that sends nothing: closed after the header timeout (5 s), counted.
    let silent = std::net::TcpStream::connect(agent.addr()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5) + Duration::from_secs(15);
    assert!(neuron_e2e::closed_by_server(&silent, deadline), "the silent connection was closed");
    let client = https::Client::new(ca, server_name).unwrap();
    let exposition = client.get(agent.addr(), "/metrics", None).unwrap().body;
    assert!(value(&exposition, "neuron_agent_http_tls_handshake_failures_total", "reason=\"timeout\"") >= 1.0);
    assert!(
        value(&exposition, "neuron_agent_http_tls_handshake_failures_total", "reason=\"error\"") >= 1.0,
        "the h2 refusal"
    );
}

/// TokenReviews the API server has received (its `apiserver_request_total` for the
/// resource `tokenreviews`, every verb and code).
fn token_reviews_received(cp: &ControlPlane) -> f64 {
    let (ok, out, err) = kubectl(cp, &["get", "--raw", "/metrics"], None);
    assert!(ok, "the API server's metrics: {err}");
    out.lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"tokenreviews\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The attack report's fault 6: one agent sent ~1,180 TokenReviews a second for a flood
/// of bogus tokens (35,527 in 30 s). Now a flood from one address (127.0.0.2) gets the
/// reviews of its peer's budget (a burst of 5, then 1 a second) and 429s beyond, counted,
/// while a new valid token from another address (127.0.0.1) is reviewed and served
/// during the flood.
#[test]
fn a_flood_of_bogus_tokens_from_one_address_gets_a_bounded_review_rate_and_a_new_scraper_gets_in() {
    const FLOOD: Duration = Duration::from_secs(10);
    const THREADS: usize = 4;
    let cp = ControlPlane::shared();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ns = runtime.block_on(async {
        cp.install_crds().await;
        cp.namespace("nm-flood").await
    });
    let docs = render(&ns);
    apply_rbac(cp, &docs);
    let dir = TempDir::new("auth-flood");
    std::fs::create_dir_all(dir.0.join("proc")).unwrap();
    let (crt, key, ca) = certificate(&docs);
    let volume = https::SecretVolume::new(dir.0.join("tls"), &[("tls.crt", &crt), ("tls.key", &key)]).unwrap();
    let agent = start_agent(cp, &docs, &dir.0, &volume, true);
    let client = https::Client::new(&ca, &server_name(&docs, "node-agent")).unwrap();
    let token = runtime.block_on(cp.service_account_token(&ns, PROMETHEUS_SA, &[]));
    let (attacker, scraper): (std::net::IpAddr, std::net::IpAddr) =
        ("127.0.0.2".parse().unwrap(), "127.0.0.1".parse().unwrap());

    let received_before = token_reviews_received(cp);
    let started = Instant::now();
    let flood: Vec<_> = (0..THREADS)
        .map(|t| {
            let (client, addr) = (client.clone(), agent.addr);
            std::thread::spawn(move || {
                let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
                let mut i = 0u64;
                while started.elapsed() < FLOOD {
                    i += 1;
                    let bogus = format!("bogus-{t}-{i}-{:08x}", random_u32());
                    if let Ok(answer) = client.get_from(Some(attacker), addr, "/metrics", Some(&bogus)) {
                        *statuses.entry(answer.status).or_default() += 1;
                    }
                }
                statuses
            })
        })
        .collect();
    // A scraper whose token the agent has never seen, in the middle of the flood.
    std::thread::sleep(FLOOD / 2);
    let scraped = client.get_from(Some(scraper), agent.addr, "/metrics", Some(&token)).unwrap();
    let mut statuses = std::collections::BTreeMap::<u16, u32>::new();
    for thread in flood {
        for (status, n) in thread.join().unwrap() {
            *statuses.entry(status).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    let received = token_reviews_received(cp) - received_before;
    let exposition = client.get_from(Some(scraper), agent.addr, "/metrics", Some(&token)).unwrap().body;
    let sent: f64 = ["allowed", "forbidden", "unauthenticated", "error"]
        .iter()
        .map(|r| value(&exposition, "neuron_agent_http_auth_reviews_total", &format!("result=\"{r}\"")))
        .sum();
    let throttled = value(&exposition, "neuron_agent_http_auth_refused_total", "reason=\"peer_rate\"");
    let requests: u32 = statuses.values().sum();
    println!(
        "flood of {requests} bogus-token requests from 127.0.0.2 in {elapsed:?} ({:.0}/s): answers {statuses:?}; \
         reviews sent by the agent {sent} ({:.1}/s), TokenReviews received by the API server {received}",
        f64::from(requests) / elapsed.as_secs_f64(),
        sent / elapsed.as_secs_f64()
    );

    assert_eq!(scraped.status, 200, "the new scraper during the flood: {}", scraped.body);
    // The peer's budget over the flood, the scraper's one review, a second of slack for
    // the clock.
    let bound = PEER_BURST + elapsed.as_secs_f64().ceil() + 2.0;
    assert!(sent <= bound, "reviews sent: {sent} > {bound}");
    assert!(f64::from(requests) > 2.0 * bound, "a flood, not a trickle: {requests}");
    assert!(throttled >= f64::from(requests) - bound, "429s counted: {throttled} of {requests}");
    assert!(statuses.get(&429).copied().unwrap_or(0) > 0, "{statuses:?}");
    // The API server counts every TokenReview, this test's other tests' too (a few).
    assert!(received <= bound + 20.0, "TokenReviews received by the API server: {received}");
}

/// A CA and a certificate it signs for `names` (what the CloudWatch Observability add-on
/// makes: Secret amazon-cloudwatch-observability-agent-cert), by the openssl command:
/// (ca.crt, tls.crt, tls.key) in `dir`.
fn openssl_ca_and_certificate(dir: &Path, names: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(&[&["req", "-x509"][..], &ec, &["-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=agent-ca", "-days", "2"]]
        .concat());
    run(&[&["req"][..], &ec, &["-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=agent"]].concat());
    let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
    std::fs::write(dir.join("san.ext"), format!("subjectAltName={}\n", sans.join(","))).unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    (dir.join("ca.crt"), dir.join("tls.crt"), dir.join("tls.key"))
}

/// The "scraper that sends no token": the CloudWatch Observability add-on scrapes
/// `https://neuron-monitor-service.amazon-cloudwatch.svc:8000/metrics` with its own CA
/// and no token. The chart's `cloudwatchAddon` serves it on a port of its own with the
/// add-on's certificate; a real Prometheus with the add-on's scrape configuration (HTTPS,
/// `ca_file`, no credentials, its metric filter) scrapes the agent, while the main port
/// still refuses a request without a token.
#[test]
fn the_cloudwatch_addon_scrape_configuration_scrapes_the_token_free_port() {
    const SERVICE: &str = "neuron-monitor-service.amazon-cloudwatch.svc";
    let cp = ControlPlane::shared();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let ns = runtime.block_on(async {
        cp.install_crds().await;
        cp.namespace("nm-cwaddon").await
    });
    let set = ["cloudwatchAddon.enabled=true".to_owned(), "cloudwatchAddon.secretName=addon-cert".to_owned()];
    let args = ["--set", &set[0], "--set", &set[1], "--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"];
    let docs = documents(&template_as(&ns, &ns, None, &args));
    apply_rbac(cp, &docs);
    let services = find(&docs, "Service");
    let discovered = services
        .iter()
        .find(|s| s["metadata"]["name"] == "neuron-monitor-service")
        .expect("the Service the add-on discovers");
    assert_eq!(discovered["metadata"]["namespace"].as_str(), Some("amazon-cloudwatch"));
    assert_eq!(discovered["metadata"]["labels"]["k8s-app"].as_str(), Some("neuron-monitor-service"));
    assert_eq!(discovered["spec"]["ports"][0]["port"].as_i64(), Some(8000));

    let dir = TempDir::new("cw-addon");
    std::fs::create_dir_all(dir.0.join("proc")).unwrap();
    let (crt, key, ca) = certificate(&docs);
    let volume = https::SecretVolume::new(dir.0.join("tls"), &[("tls.crt", &crt), ("tls.key", &key)]).unwrap();
    let addon_dir = dir.0.join("addon");
    std::fs::create_dir_all(&addon_dir).unwrap();
    let (addon_ca, addon_crt, addon_key) = openssl_ca_and_certificate(&addon_dir, &["neuron-monitor-service", SERVICE]);
    let tokenless = loopback();
    // The chart's DaemonSet with the add-on's port, certificate paths on this machine.
    let container = &one(&docs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0];
    let args = strings_of(&container["args"]);
    assert!(args.iter().any(|a| a == "--tokenless-listen=0.0.0.0:8000"), "{args:?}");
    let mut docs = docs.clone();
    let args = &mut docs.iter_mut().find(|d| kind(d) == "DaemonSet").unwrap()["spec"]["template"]["spec"]["containers"]
        [0]["args"];
    for arg in args.as_sequence_mut().unwrap() {
        let text = arg.as_str().unwrap().to_owned();
        let replaced = if text.starts_with("--tokenless-listen=") {
            format!("--tokenless-listen={tokenless}")
        } else if text.starts_with("--tokenless-tls-cert-file=") {
            format!("--tokenless-tls-cert-file={}", addon_crt.display())
        } else if text.starts_with("--tokenless-tls-key-file=") {
            format!("--tokenless-tls-key-file={}", addon_key.display())
        } else {
            text
        };
        *arg = Value::String(replaced);
    }
    let agent = start_agent(cp, &docs, &dir.0, &volume, true);

    // The add-on's scrape configuration (amazon-cloudwatch-agent's Neuron scraper):
    // HTTPS, its CA file, no credentials, its metric filter. It reaches the Service by
    // name; here the certificate is checked for that name (server_name) on the loopback.
    let scrape = format!(
        "  - job_name: containerInsightsNeuronMonitorScraper\n    scheme: https\n    metrics_path: /metrics\n    \
         tls_config:\n      ca_file: {}\n      server_name: {SERVICE}\n      insecure_skip_verify: false\n    \
         static_configs:\n      - targets: ['{tokenless}']\n    metric_relabel_configs:\n      - source_labels: \
         [__name__]\n        regex: 'neuron.*|system_.*|execution_.*|hardware_ecc_.*'\n        action: keep\n",
        addon_ca.display()
    );
    let prometheus = Prometheus::start(&scrape).expect("prometheus");
    prometheus
        .wait_for("up{job=\"containerInsightsNeuronMonitorScraper\"}", LIMIT, |r| {
            (r.first().map(|s| s.1) == Some(1.0)).then_some(())
        })
        .unwrap_or_else(|e| panic!("the add-on's configuration scrapes the agent: {e:#}"));
    let series = prometheus
        .wait_for("count({job=\"containerInsightsNeuronMonitorScraper\",__name__=~\"neuron.*\"})", LIMIT, |r| {
            r.first().map(|s| s.1).filter(|n| *n > 0.0)
        })
        .unwrap_or_else(|e| panic!("the add-on's series: {e:#}"));
    println!("the add-on's scrape configuration took {series} neuron* series from the token-free port");

    // The token-free port: /metrics alone, with the add-on's certificate; the main port
    // still wants a token.
    let addon = https::Client::new(&std::fs::read(&addon_ca).unwrap(), SERVICE).unwrap();
    assert_eq!(addon.get(tokenless, "/metrics", None).unwrap().status, 200);
    assert_eq!(addon.get(tokenless, "/healthz", None).unwrap().status, 404, "nothing but /metrics");
    let main = https::Client::new(&ca, &server_name(&docs, "node-agent")).unwrap();
    assert_eq!(main.get(agent.addr, "/metrics", None).unwrap().status, 401, "the main port without a token");
    drop(prometheus);
}

fn strings_of(value: &Value) -> Vec<String> {
    value.as_sequence().into_iter().flatten().filter_map(|v| v.as_str().map(str::to_owned)).collect()
}
