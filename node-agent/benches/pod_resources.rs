//! The agent on hostile pod-resources answers (issue 41, item 5): the real agent binary
//! on the real test control plane, polling the test kubelet server
//! (`tests/support/kubelet.rs`) every 500 ms, one case after the other:
//! - `baseline`: two pods holding 2 Neuron devices, 4 cores and 2 EFA devices;
//! - `ids`: one container listing 2,500,000 Neuron core ids (`0` to `511` over and over:
//!   12 MB, under the agent's 16 MiB bound on an answer);
//! - `unparseable`: 1,200,000 Neuron ids that are no index (`x0`, `x1`, …);
//! - `changing`: 200,000 such ids, different at every poll.
//!
//! First, in this process, one answer of each case decoded as the agent did before (prost
//! decodes every entry) and as it does now (`podresources::answer`, with the bounds): the
//! time and the memory the decoded answer holds (a counting allocator), beside the time
//! the test server takes to make and encode it (once for the fixed answers, at every call
//! for `changing`: part of what the agent's 2 s limit on a call waits for).
//!
//! Then the agent itself, for each case after 10 answers: its resident memory (VmRSS) and
//! its peak (VmHWM), its polls by result (`ok`, `timeout`), its log bytes per poll (the
//! `baseline` row is what a quiet poll logs) and its longest log line, and the ids it
//! counted as cut. With `BASELINE_AGENT=<an agent binary>` (an older build), that agent
//! is measured the same way first, in the same run.
//!
//! `cargo bench -p neuron-node-agent --bench pod_resources` (build the workspace's binaries
//! with `--release` first: the simulator plays neuron-monitor), or in the test profile
//! `cargo test -p neuron-node-agent --bench pod_resources -- --bench`; plain `cargo test`
//! runs each case at 1/100 of its size and checks only that the agent answered.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use neuron_e2e::{workspace_bin, ControlPlane};
use neuron_node_agent::attribution::podresources::{
    answer,
    proto::{ContainerDevices, ListPodResourcesResponse, PodResources},
    NEURON, NEURONCORE, NEURONDEVICE,
};
use neuron_test_support::{free_port, http_get, random_u32, TempDir};
use prost::Message;

// The test kubelet server (it names `super::TempDir`).
#[allow(dead_code)]
#[path = "../tests/support/kubelet.rs"]
mod kubelet;

use kubelet::{holding, holding_with_efa, PodResourcesServer};

/// The system allocator, counting the bytes this process holds.
struct Counting;

static HELD: AtomicUsize = AtomicUsize::new(0);

// SAFETY: the system allocator's, with a count beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        HELD.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        HELD.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: as the caller's contract.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What `decode` returns, its time and the bytes it holds (MB).
fn measured<T>(decode: impl FnOnce() -> T) -> (T, f64, f64) {
    let before = HELD.load(Ordering::Relaxed);
    let start = Instant::now();
    let decoded = decode();
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let held = HELD.load(Ordering::Relaxed).saturating_sub(before) as f64 / 1e6;
    (decoded, ms, held)
}

/// One answer of each case decoded by prost (before) and with the bounds (now).
fn decoding(cases: &[(&'static str, Answer)]) {
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "case", "answer MB", "server ms", "prost ms", "prost MB", "bounded ms", "bounded MB"
    );
    for (name, answer) in cases {
        let (bytes, server_ms, _) =
            measured(|| ListPodResourcesResponse { pod_resources: answer.first() }.encode_to_vec());
        let size = bytes.len() as f64 / 1e6;
        let (prost, prost_ms, prost_mb) = measured(|| ListPodResourcesResponse::decode(&bytes[..]).expect("prost"));
        drop(prost);
        let message = bytes::Bytes::from(bytes);
        let (bounded, ms, mb) =
            measured(|| answer::decode::<ListPodResourcesResponse>(message.clone()).expect("bounded"));
        drop(bounded);
        println!("{name:<12} {size:>10.1} {server_ms:>10.0} {prost_ms:>10.0} {prost_mb:>10.1} {ms:>10.0} {mb:>10.2}");
    }
    println!();
}

/// Answers read before a case is measured.
const POLLS: u64 = 10;
const LIMIT: Duration = Duration::from_secs(180);

/// What the test kubelet answers in a case.
enum Answer {
    /// The same at every call (encoded once).
    Fixed(Vec<PodResources>),
    /// Made for each call, from its number.
    PerCall(Box<dyn Fn(u64) -> Vec<PodResources> + Send + Sync>),
}

impl Answer {
    fn first(&self) -> Vec<PodResources> {
        match self {
            Answer::Fixed(pods) => pods.clone(),
            Answer::PerCall(answer) => answer(0),
        }
    }

    fn serve(self, kubelet: &PodResourcesServer) {
        match self {
            Answer::Fixed(pods) => kubelet.set(pods),
            Answer::PerCall(answer) => kubelet.set_per_call(answer),
        }
    }
}

/// A container of pod `flood` listing `ids` of `resource`.
fn flood(resource: &str, ids: Vec<String>) -> PodResources {
    let mut pod = holding("bench", "flood", "main", resource, &[]);
    pod.containers[0].devices = vec![ContainerDevices { resource_name: resource.to_owned(), device_ids: ids }];
    pod
}

fn real() -> Vec<PodResources> {
    vec![
        holding_with_efa("bench", "train", "main", (NEURONDEVICE, &[0, 1]), &["rdmap16s27", "rdmap32s27"]),
        holding("bench", "serve", "srv", NEURONCORE, &[4, 5, 6, 7]),
    ]
}

/// The cases, their sizes divided by `scale`.
fn cases(scale: usize) -> Vec<(&'static str, Answer)> {
    let with_real = |extra: PodResources| {
        let mut pods = real();
        pods.push(extra);
        pods
    };
    let ids = flood(NEURONCORE, (0..2_500_000 / scale).map(|i| (i % 512).to_string()).collect());
    let unparseable = flood(NEURON, (0..1_200_000 / scale).map(|i| format!("x{i}")).collect());
    let changing = 200_000 / scale;
    vec![
        ("baseline", Answer::Fixed(real())),
        ("ids", Answer::Fixed(with_real(ids))),
        ("unparseable", Answer::Fixed(with_real(unparseable))),
        (
            "changing",
            Answer::PerCall(Box::new(move |call| {
                with_real(flood(NEURON, (0..changing).map(|i| format!("x{call}-{i}")).collect()))
            })),
        ),
    ]
}

/// `VmRSS` and `VmHWM` of `pid`, in MiB.
fn memory(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |key: &str| {
        let line = status.lines().find(|l| l.starts_with(key)).unwrap_or_default();
        line.split_whitespace().nth(1).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// The sum of the samples of `name` (with `label` when given) on the agent's page.
fn metric(addr: SocketAddr, name: &str, label: Option<&str>) -> f64 {
    let Some((_, page)) = http_get(addr, "/metrics") else { return 0.0 };
    let ours = |l: &&str| l.starts_with(name) && label.is_none_or(|label| l.contains(label));
    // `+ 0.0`: an empty sum is -0.
    page.lines().filter(ours).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum::<f64>() + 0.0
}

struct Running {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_agent(agent: &Path, cp: &ControlPlane, node: &str, socket: &Path, dir: &Path, log: &Path) -> Running {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
    let child = Command::new(agent)
        .arg(format!("--listen={addr}"))
        .arg(format!("--state-dir={}", dir.join("state").display()))
        .arg(format!("--monitor-command={}", workspace_bin("neuron-monitor-sim").display()))
        .arg("--monitor-arg=--instance-type=trn1.32xlarge")
        .arg(format!("--node-name={node}"))
        .arg(format!("--pod-resources-socket={}", socket.display()))
        .arg("--pod-resources-interval=500ms")
        .arg(format!("--proc-root={}", dir.join("proc").display()))
        .env("KUBECONFIG", &cp.kubeconfig)
        .env("NEURON_AGENT_LOG", "info")
        .env("NEURON_AGENT_KMSG_PATH", dir.join("no-kmsg"))
        .env("NEURON_AGENT_SYSFS_ROOT", dir.join("no-sysfs"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("the agent's log"))
        .spawn()
        .expect("start the agent");
    let running = Running { child, addr };
    wait("the agent's HTTP endpoint", || http_get(addr, "/healthz").map(|_| ()));
    running
}

fn wait<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = check() {
            return value;
        }
        assert!(start.elapsed() < LIMIT, "{what}: not within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let scale = if bench { 1 } else { 100 };
    decoding(&cases(scale));
    let cp = ControlPlane::shared();
    let mut agents = Vec::new();
    if let Some(baseline) = std::env::var_os("BASELINE_AGENT") {
        agents.push(("baseline", std::path::PathBuf::from(baseline)));
    }
    agents.push(("new", std::path::PathBuf::from(env!("CARGO_BIN_EXE_neuron-node-agent"))));
    println!(
        "{:<9} {:<12} {:>10} {:>8} {:>9} {:>4} {:>8} {:>11} {:>12} {:>10}",
        "agent", "case", "answer MB", "RSS MiB", "peak MiB", "ok", "timeout", "log B/poll", "longest line", "ids cut"
    );
    for (label, binary) in &agents {
        for (name, answer) in cases(scale) {
            measure_agent(cp, binary, label, name, answer, bench);
        }
    }
}

/// One case of the agent `binary` (named `label`): its figures after [`POLLS`] answers.
fn measure_agent(cp: &ControlPlane, binary: &Path, label: &str, name: &str, answer: Answer, bench: bool) {
    let size = ListPodResourcesResponse { pod_resources: answer.first() }.encoded_len() as f64 / 1e6;
    let dir = TempDir::new("bench-pod-resources");
    let node = format!("bench-pod-resources-{:08x}", random_u32());
    let kubelet = PodResourcesServer::start(&dir.path().join("kubelet.sock"));
    answer.serve(&kubelet);
    let log = dir.path().join("agent.log");
    let agent = start_agent(binary, cp, &node, &kubelet.socket, dir.path(), &log);
    wait("10 answers", || (kubelet.calls.load(Ordering::Relaxed) >= POLLS).then_some(()));
    // The last call's answer read (or timed out) before the figures are taken.
    wait("the last answer taken", || {
        let done = metric(agent.addr, "neuron_agent_kubelet_requests_total", None);
        (done >= POLLS as f64 - 1.0).then_some(())
    });
    let polls = kubelet.calls.load(Ordering::Relaxed);
    let (rss, peak) = memory(agent.child.id());
    let ok = metric(agent.addr, "neuron_agent_kubelet_requests_total", Some("result=\"ok\""));
    let timeout = metric(agent.addr, "neuron_agent_kubelet_requests_total", Some("result=\"timeout\""));
    let cut = metric(agent.addr, "neuron_agent_kubelet_entries_cut_total", None);
    let text = std::fs::read(&log).unwrap_or_default();
    let longest = text.split(|b| *b == b'\n').map(<[u8]>::len).max().unwrap_or(0);
    println!(
        "{label:<9} {name:<12} {size:>10.1} {rss:>8.0} {peak:>9.0} {ok:>4} {timeout:>8} {:>11} {longest:>12} {cut:>10}",
        text.len() as u64 / polls,
    );
    if !bench {
        assert!(ok + timeout >= 1.0, "{label} {name}: the agent read no answer");
    }
}
