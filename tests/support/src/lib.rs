//! What the workspace's tests and benchmarks share, with nothing but std so that any
//! crate can take it as a dev-dependency:
//! - [`fixture_path`], [`fixture`]: the recorded inputs in `tests/fixtures` (where each
//!   came from is in its README);
//! - [`TempDir`]: a directory of its own, removed on drop;
//! - [`http_get`]: a minimal HTTP/1.1 GET on loopback; [`free_port`], [`random_u32`],
//!   [`child_pids`].

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::{Path, PathBuf},
    time::Duration,
};

/// The idle inf1.xlarge report: one runtime, every system group.
pub const IDLE_INF1: &str = "neuron-monitor/inf1.xlarge-idle-1runtime.json";
/// The trn1.2xlarge report of a runtime with execution errors and latencies.
pub const TRN1_ERRORS: &str = "neuron-monitor/trn1.2xlarge-1runtime-errors.json";
/// The trn1n.32xlarge report of 32 runtimes, a line of ~1 MB.
pub const TRN1N_32: &str = "neuron-monitor/trn1n.32xlarge-32runtimes.json";
/// The folder of the Prometheus Operator's CRDs (ServiceMonitor, PodMonitor, PrometheusRule).
pub const PROMETHEUS_OPERATOR_CRDS: &str = "crds";

const REPORTS: &str = "neuron-monitor/";

/// The path of the fixture `rel` below `tests/fixtures` (e.g. [`TRN1N_32`]). The
/// environment variable `NEURON_FIXTURES` names another folder of neuron-monitor reports
/// to read instead of `tests/fixtures/neuron-monitor`.
pub fn fixture_path(rel: &str) -> PathBuf {
    match (rel.strip_prefix(REPORTS), std::env::var_os("NEURON_FIXTURES")) {
        (Some(report), Some(dir)) => PathBuf::from(dir).join(report),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(rel),
    }
}

/// The text of the fixture `rel` (see [`fixture_path`]); panics naming the path when it
/// cannot be read.
pub fn fixture(rel: &str) -> String {
    let path = fixture_path(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {}: {e}", path.display()))
}

/// A directory of its own under the system's temporary directory, removed on drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory whose name starts with `neuron-test-{tag}`.
    pub fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("neuron-test-{tag}-{}-{:08x}", std::process::id(), random_u32()));
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        TempDir(path)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Writes `contents` to the file at `rel`, creating its directories; returns its path.
    pub fn write(&self, rel: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("create {}: {e}", parent.display()));
        }
        std::fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The PIDs of the children of process `pid`, started by any of its threads, sorted.
pub fn child_pids(pid: u32) -> Vec<u32> {
    let mut pids: Vec<u32> = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for task in tasks.flatten() {
            if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                pids.extend(text.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The time process `pid`'s live threads have run (`schedstat`, in nanoseconds, unlike the
/// clock ticks of `stat`) and the times they gave up the CPU to wait (voluntary switches:
/// its wake-ups).
pub fn thread_run_time(pid: u32) -> (std::time::Duration, u64) {
    let (mut ns, mut waits) = (0u64, 0u64);
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
        let schedstat = std::fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
        ns += schedstat.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let switches = status.lines().find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"));
        waits += switches.and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0);
    }
    (std::time::Duration::from_nanos(ns), waits)
}

/// A random number from the OS, for unique names.
pub fn random_u32() -> u32 {
    let mut bytes = [0u8; 4];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        let _ = f.read_exact(&mut bytes);
    }
    u32::from_ne_bytes(bytes) ^ std::process::id()
}

/// A free TCP port on the loopback interface.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// A minimal HTTP/1.1 GET on loopback, enough for the project's endpoints, LocalStack's
/// and Prometheus': (status, body, de-chunked), or `None` when nothing answers.
pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    http_get_on(stream, addr, path)
}

/// As [`http_get`], on a connection already open to `addr`.
pub fn http_get_on(mut stream: TcpStream, addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Some((status, if chunked { dechunk(body) } else { body.to_owned() }))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(size) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if size == 0 || rest.len() < size {
            break;
        }
        out.push_str(&rest[..size]);
        body = rest[size..].trim_start_matches("\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_fixture_is_in_the_repository() {
        for rel in [IDLE_INF1, TRN1_ERRORS, TRN1N_32] {
            assert!(fixture(rel).starts_with('{'), "{rel}");
        }
        let crds = fixture_path(PROMETHEUS_OPERATOR_CRDS).canonicalize().unwrap();
        assert_eq!(std::fs::read_dir(&crds).unwrap().count(), 3, "{}", crds.display());
        // The workspace's root (this crate is tests/support).
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
        assert!(crds.starts_with(&root), "{} is outside {}", crds.display(), root.display());
    }

    #[test]
    fn a_temp_dir_is_gone_after_drop() {
        let dir = TempDir::new("support");
        let file = dir.write("a/b.txt", "x");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "x");
        let path = dir.path().to_owned();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn a_child_process_is_listed() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let listed = child_pids(std::process::id()).contains(&child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(listed);
    }

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"), "abcde");
        assert_eq!(dechunk("zz\r\nabc"), "");
    }
}
