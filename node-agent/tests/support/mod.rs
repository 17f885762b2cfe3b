//! Runs the real agent binary (with the simulator as neuron-monitor) and reads its
//! endpoints over plain HTTP. Processes are killed when their handle drops, so a failed
//! test leaves nothing running.

#![allow(dead_code)] // each test binary uses a different part
#![allow(clippy::mod_module_files)] // cargo would build a tests/support.rs as a test of its own

pub mod api_outage;
pub mod blackhole;
pub mod cloudwatch;
pub mod driver;
pub mod kubelet;
pub mod node_config;

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

pub const AGENT: &str = env!("CARGO_BIN_EXE_neuron-node-agent");

/// The simulator binary. It is a crate of its own, so cargo does not build it for these
/// tests: `cargo build --workspace --bins` (as tests/run.sh does) first.
pub fn sim() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| neuron_e2e::workspace_bin("neuron-monitor-sim").display().to_string())
}
/// The argument that makes the agent binary a monitor group guard.
pub const GUARD_ARG: &str = neuron_node_agent::monitor::group::GUARD_ARG;

// The common test support (the fixtures are read from `neuron_test_support` directly).
pub use neuron_test_support::{child_pids, free_port, http_get, TempDir};

/// A running agent.
pub struct Agent {
    pub child: Child,
    pub addr: SocketAddr,
    pub state_dir: TempDir,
}

impl Agent {
    /// Starts the agent on the simulator with `sim_args` and the extra agent `args`.
    pub fn start(sim_args: &[&str], args: &[&str]) -> Agent {
        Self::start_with(sim(), sim_args, args)
    }

    pub fn start_with(monitor: &str, monitor_args: &[&str], args: &[&str]) -> Agent {
        Self::start_with_env(monitor, monitor_args, args, &[])
    }

    /// As [`Agent::start_with`], with extra environment variables (e.g. `KUBECONFIG`).
    pub fn start_with_env(
        monitor: &str,
        monitor_args: &[&str],
        args: &[&str],
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Agent {
        Self::start_configured(monitor, monitor_args, args, |command, _| {
            for (key, value) in env {
                command.env(key, value);
            }
        })
    }

    /// Starts the agent; `configure` adds to its command (it gets the state directory,
    /// e.g. to write a node configuration file there).
    pub fn start_configured(
        monitor: &str,
        monitor_args: &[&str],
        args: &[&str],
        configure: impl FnOnce(&mut Command, &std::path::Path),
    ) -> Agent {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let state_dir = TempDir::new("agent");
        let mut command = Command::new(AGENT);
        command
            .arg("--monitor-command")
            .arg(monitor)
            .arg("--listen")
            .arg(addr.to_string())
            .arg("--state-dir")
            .arg(&state_dir.0)
            .args(args)
            .env("NEURON_AGENT_LOG", "info")
            // Hermetic by default: not this host's kernel log and sysfs (a flag overrides).
            .env("NEURON_AGENT_KMSG_PATH", state_dir.0.join("no-kmsg"))
            .env("NEURON_AGENT_SYSFS_ROOT", state_dir.0.join("no-sysfs"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for arg in monitor_args {
            command.arg(format!("--monitor-arg={arg}"));
        }
        configure(&mut command, &state_dir.0);
        let child = command.spawn().expect("start the agent");
        let agent = Agent { child, addr, state_dir };
        agent.wait_until("the HTTP endpoint answers", Duration::from_secs(20), |a| a.get("/healthz").is_some());
        agent
    }

    /// GET `path`; `None` when nothing answers.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.addr, path)
    }

    pub fn metrics(&self) -> Metrics {
        let (status, body) = self.get("/metrics").expect("GET /metrics");
        assert_eq!(status, 200, "{body}");
        Metrics::parse(&body)
    }

    /// Polls `check` every 50 ms until it holds, or panics after `limit`.
    pub fn wait_until(&self, what: &str, limit: Duration, check: impl Fn(&Agent) -> bool) {
        let start = Instant::now();
        while start.elapsed() < limit {
            if check(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out after {limit:?} waiting until {what}");
    }

    /// Polls the metrics until `check` returns `Some`, then returns it.
    pub fn wait_for<T>(&self, what: &str, limit: Duration, check: impl Fn(&Metrics) -> Option<T>) -> T {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < limit {
            if let Some((200, body)) = self.get("/metrics") {
                let metrics = Metrics::parse(&body);
                if let Some(found) = check(&metrics) {
                    return found;
                }
                last = Some(body);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("timed out after {limit:?} waiting for {what}; last /metrics:\n{}", last.unwrap_or_default());
    }

    /// PIDs of the agent's child processes running neuron-monitor (not its group guards).
    pub fn children(&self) -> Vec<u32> {
        let mut pids = self.all_children();
        pids.retain(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !String::from_utf8_lossy(&cmdline).contains(GUARD_ARG)
        });
        pids
    }

    /// PIDs of every child process of the agent.
    pub fn all_children(&self) -> Vec<u32> {
        child_pids(self.child.id())
    }

    pub fn signal(&self, signal: &str) {
        let status =
            Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status().expect("run kill");
        assert!(status.success());
    }

    /// Sends SIGTERM and waits up to `limit` for the agent's exit status.
    pub fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal("TERM");
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(start.elapsed() < limit, "the agent did not exit within {limit:?} of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process is alive (and not a zombie).
pub fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'),
        Err(_) => false,
    }
}

/// One sample of the exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// A parsed exposition (classic text format).
#[derive(Debug, Clone)]
pub struct Metrics {
    pub samples: Vec<Sample>,
    pub text: String,
}

impl Metrics {
    pub fn parse(text: &str) -> Metrics {
        let samples = text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| parse_sample(l).unwrap_or_else(|| panic!("unparsable sample line {l:?}")))
            .collect();
        Metrics { samples, text: text.to_owned() }
    }

    /// Samples of `name` whose labels include every `(key, value)` of `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<&Sample> {
        self.samples
            .iter()
            .filter(|s| s.name == name && labels.iter().all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v)))
            .collect()
    }

    /// The value of the one sample matching, if exactly one does.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        match self.find(name, labels).as_slice() {
            [one] => Some(one.value),
            _ => None,
        }
    }

    /// Sum over the matching samples (0 when none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.find(name, labels).iter().map(|s| s.value).sum()
    }
}

fn parse_sample(line: &str) -> Option<Sample> {
    let (name, rest) = match line.find('{') {
        Some(i) => (&line[..i], &line[i + 1..]),
        None => {
            let (name, value) = line.split_once(' ')?;
            return Some(Sample { name: name.to_owned(), labels: BTreeMap::new(), value: value.trim().parse().ok()? });
        }
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.char_indices().peekable();
    let mut end = None;
    while let Some((i, c)) = chars.next() {
        if c == '}' {
            end = Some(i);
            break;
        }
        if c == ',' || c == ' ' {
            continue;
        }
        let key_start = i;
        let mut key_end = i;
        for (j, c) in chars.by_ref() {
            if c == '=' {
                key_end = j;
                break;
            }
        }
        let key = rest[key_start..key_end].to_owned();
        chars.next(); // opening quote
        let mut value = String::new();
        while let Some((_, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => return None,
                },
                '"' => break,
                other => value.push(other),
            }
        }
        labels.insert(key, value);
    }
    let value = rest[end? + 1..].split_whitespace().next()?.parse().ok()?;
    Some(Sample { name: name.to_owned(), labels, value })
}

pub use neuron_e2e::tool;

/// promtool's one expected complaint: the compatibility name `system_vcpu_count`
/// (AWS's dashboards query it) ends in `_count` without being a histogram or summary.
pub const ACCEPTED_LINT: &str =
    "system_vcpu_count non-histogram and non-summary metrics should not have \"_count\" suffix";

/// What `promtool check metrics` says of an exposition, a complaint a line.
pub fn promtool_complaints(exposition: &str) -> Vec<String> {
    use std::io::Write;
    let mut child = Command::new(tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().expect("stdin").write_all(exposition.as_bytes()).expect("write to promtool");
    let output = child.wait_with_output().expect("promtool output");
    let report = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    report.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

/// A real Prometheus server scraping `targets` every second (the e2e crate's launcher).
pub struct Prometheus(neuron_e2e::prometheus::Prometheus);

impl Prometheus {
    pub fn start(targets: &[SocketAddr]) -> Prometheus {
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let scrape = format!(
            "  - job_name: neuron-node-agent\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        Prometheus(neuron_e2e::prometheus::Prometheus::start(&scrape).unwrap_or_else(|e| panic!("{e:#}")))
    }

    /// Runs an instant query; returns the result vector as (labels, value).
    pub fn query(&self, promql: &str) -> Vec<(BTreeMap<String, String>, f64)> {
        self.0.query(promql).unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// Polls `promql` until `check` accepts the result, or panics after `limit`.
    pub fn wait_for<T>(
        &self,
        promql: &str,
        limit: Duration,
        check: impl Fn(&[(BTreeMap<String, String>, f64)]) -> Option<T>,
    ) -> T {
        self.0.wait_for(promql, limit, check).unwrap_or_else(|e| panic!("{e:#}"))
    }
}
