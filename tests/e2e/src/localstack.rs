//! LocalStack for the tests (installed by `tests/tools/install.sh`): one per test binary,
//! on a free loopback port, and each test's CloudWatch namespaces in it ([`CloudWatch`]),
//! with what LocalStack stored, read back.
//!
//! LocalStack has no reset: each test works in CloudWatch namespaces of its own
//! ([`CloudWatch::namespace`]). Where it differs from CloudWatch (checked against
//! `localstack-core` 2026.3.0): it truncates fractional `Counts`, stores
//! `StorageResolution` without enforcing it, enforces none of PutMetricData's size limits,
//! matches a query's dimensions as a subset (by SQL `LIKE`, so `NeuronCore=1` also matches
//! `NeuronCore=10`), has no percentiles and answers 500 to a request missing a required
//! field. The agent's own unit tests (`node-agent/src/sinks/cloudwatch/tests.rs`) check
//! those parts of what it sends; the tests query unambiguous dimension sets and
//! cross-check every statistic against the raw datapoint listing.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{Mutex, OnceLock},
    time::{Duration, Instant},
};

use crate::{free_port, http_get, random_u32, repo_root};

// --- LocalStack -------------------------------------------------------------------------

/// The LocalStack of this test binary.
pub struct LocalStack {
    pub addr: SocketAddr,
    pub pid: u32,
    /// Its FILESYSTEM_ROOT (state, logs, `localstack.log`), removed when it stops.
    pub root: PathBuf,
    pub ready_after: Duration,
    /// Held open for the life of this process: when it closes (this process ended, a
    /// panic or a signal included), the launcher kills LocalStack's process group.
    _lifeline: Mutex<ChildStdin>,
    _child: Mutex<Child>,
}

static LOCALSTACK: OnceLock<Result<LocalStack, String>> = OnceLock::new();

/// Time LocalStack gets to answer (1-6 s here; far more on a loaded machine).
const READY_TIMEOUT: Duration = Duration::from_secs(90);

impl LocalStack {
    /// LocalStack, started on first use and shared by the tests of this binary.
    pub fn shared() -> &'static LocalStack {
        match LOCALSTACK.get_or_init(|| Self::start().map_err(|e| e.to_string())) {
            Ok(ls) => ls,
            Err(e) => panic!("LocalStack did not start: {e}"),
        }
    }

    fn tools_dir() -> PathBuf {
        std::env::var_os("NEURON_TOOLS_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/tools"))
    }

    fn start() -> Result<LocalStack, String> {
        let home = Self::tools_dir().join("localstack");
        let python = home.join("venv/bin/python");
        let static_libs = home.join("static/usr/lib/localstack");
        if !python.is_file() || !static_libs.is_dir() {
            return Err(format!("{} is not installed: run tests/tools/install.sh", home.display()));
        }
        let launcher = repo_root().join("tests/tools/localstack_launcher.py");
        // A port taken between free_port() and LocalStack's bind: try another.
        let mut last_error = String::new();
        for _ in 0..3 {
            let root = std::env::temp_dir().join(format!(
                "neuron-test-localstack-{}-{:08x}",
                std::process::id(),
                random_u32()
            ));
            // The service catalogue prebuilt by the installer: without it each start
            // builds it (seconds, and ~370 MB more RSS).
            let lib = root.join("usr/lib");
            std::fs::create_dir_all(&lib).map_err(|e| format!("{}: {e}", lib.display()))?;
            std::os::unix::fs::symlink(&static_libs, lib.join("localstack")).map_err(|e| e.to_string())?;
            let log_path = root.join("localstack.log");
            let log = std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut command = Command::new(&python);
            command
                .arg(&launcher)
                // Nothing of the caller's environment: LocalStack reads hundreds of variables.
                .env_clear()
                .env("PATH", std::env::var_os("PATH").unwrap_or_default())
                .env("HOME", &root)
                .env("OVERRIDE_IN_DOCKER", "0") // this machine has /.dockerenv
                .env("SERVICES", "cloudwatch,logs")
                .env("EAGER_SERVICE_LOADING", "1") // ready = both (and the raw listing) served
                .env("GATEWAY_LISTEN", addr.to_string())
                .env("DNS_ADDRESS", "0") // else a DNS server on 0.0.0.0:53
                .env("DISABLE_EVENTS", "1")
                .env("LOCALSTACK_TELEMETRY", "0")
                .env("SKIP_SSL_CERT_DOWNLOAD", "1")
                .env("FILESYSTEM_ROOT", &root)
                .env("XDG_CACHE_HOME", root.join("cache"))
                .env("NEURON_LOCALSTACK_REMOVE_ON_EXIT", &root)
                .stdin(Stdio::piped())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log);
            std::os::unix::process::CommandExt::process_group(&mut command, 0);
            let started = Instant::now();
            let mut child = command.spawn().map_err(|e| format!("{}: {e}", python.display()))?;
            let lifeline = child.stdin.take().ok_or("no stdin")?;
            let pid = child.id();
            let log_tail = || {
                let text = std::fs::read_to_string(&log_path).unwrap_or_default();
                let lines: Vec<&str> = text.lines().collect();
                lines[lines.len().saturating_sub(30)..].join("\n")
            };
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last_error =
                        format!("LocalStack (pid {pid}) exited with {status} before it was ready:\n{}", log_tail());
                    let _ = std::fs::remove_dir_all(&root);
                    break;
                }
                if services_running(addr) {
                    let ready_after = started.elapsed();
                    eprintln!(
                        "LocalStack (pid {pid}) ready on {addr} in {ready_after:.1?}; log {}",
                        log_path.display()
                    );
                    return Ok(LocalStack {
                        addr,
                        pid,
                        root,
                        ready_after,
                        _lifeline: Mutex::new(lifeline),
                        _child: Mutex::new(child),
                    });
                }
                if started.elapsed() > READY_TIMEOUT {
                    // Closing its stdin makes the launcher kill it and remove its root.
                    drop(lifeline);
                    let _ = child.wait();
                    return Err(format!("LocalStack (pid {pid}) not ready within {READY_TIMEOUT:?}:\n{}", log_tail()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Err(last_error)
    }
}

/// LocalStack's health endpoint says CloudWatch and CloudWatch Logs are running.
fn services_running(addr: SocketAddr) -> bool {
    let Some((200, body)) = http_get(addr, "/_localstack/health") else { return false };
    serde_json::from_str::<serde_json::Value>(&body)
        .ok()
        .is_some_and(|health| ["cloudwatch", "logs"].iter().all(|s| health["services"][s] == "running"))
}

/// One datapoint as LocalStack stored it: a datum's values expanded by their counts, one
/// row each, stamped with the datum's timestamp in whole seconds. (Statistic sets are not
/// listed: the tests' datums all carry values.)
#[derive(Clone, Debug, PartialEq)]
pub struct StoredValue {
    pub namespace: String,
    pub name: String,
    pub dimensions: BTreeMap<String, String>,
    pub value: f64,
    pub timestamp: i64,
}

impl StoredValue {
    /// The datum it came from: the agent sends one datum per metric per flush, and two
    /// flushes of a sink are at least a second apart.
    pub fn datum(&self) -> (&str, &str, &BTreeMap<String, String>, i64) {
        (&self.namespace, &self.name, &self.dimensions, self.timestamp)
    }
}

/// One test's part of the shared LocalStack: CloudWatch namespaces of its own.
pub struct CloudWatch {
    addr: SocketAddr,
    tag: String,
}

impl CloudWatch {
    pub fn start() -> CloudWatch {
        CloudWatch { addr: LocalStack::shared().addr, tag: format!("t{:08x}", random_u32()) }
    }

    /// LocalStack's endpoint.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// This test's CloudWatch namespace `name` (`<name>/<test tag>`).
    pub fn namespace(&self, name: &str) -> String {
        format!("{name}/{}", self.tag)
    }

    /// Whether `namespace` is one of this test's.
    pub fn owns(&self, namespace: &str) -> bool {
        namespace.strip_suffix(&self.tag).is_some_and(|n| n.ends_with('/'))
    }

    /// Every datapoint stored in this test's namespaces (`GET /_aws/cloudwatch/metrics/raw`).
    pub fn stored(&self) -> Vec<StoredValue> {
        let (status, body) = http_get(self.addr, "/_aws/cloudwatch/metrics/raw").expect("LocalStack answers");
        assert_eq!(status, 200, "raw metrics: {body}");
        let listing: serde_json::Value = serde_json::from_str(&body).expect("raw metrics JSON");
        let rows = listing["metrics"].as_array().expect("raw metrics: a `metrics` array");
        rows.iter()
            .filter(|row| row["ns"].as_str().is_some_and(|ns| self.owns(ns)))
            .map(|row| StoredValue {
                namespace: row["ns"].as_str().unwrap_or_default().to_owned(),
                name: row["n"].as_str().unwrap_or_default().to_owned(),
                // "Name=Value\tName=Value\t", or null without dimensions.
                dimensions: row["d"]
                    .as_str()
                    .unwrap_or_default()
                    .split('\t')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(n, v)| (n.to_owned(), v.to_owned()))
                    .collect(),
                value: row["v"].as_f64().unwrap_or_else(|| panic!("raw metrics: value of {row}")),
                timestamp: row["t"].as_i64().unwrap_or_else(|| panic!("raw metrics: timestamp of {row}")),
            })
            .collect()
    }
}
