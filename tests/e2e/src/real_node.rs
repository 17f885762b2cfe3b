//! A real one-node cluster (`tests/realnode.sh`: the test control plane, containerd, a
//! kubelet, kube-scheduler, kube-proxy and the product's images), started for a test and
//! stopped when dropped, even when the test panics; and what the machine looked like
//! before, to check that stopping it restored the machine.
//!
//! One node per machine (the kubelet's device-plugin socket is a fixed host path): a
//! test holds an exclusive lock on [`LOCK`] while its node runs, so tests of several
//! binaries (or people) wait for each other instead of failing.

use std::{
    fs::File,
    os::fd::AsRawFd,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use kube::{
    config::{KubeConfigOptions, Kubeconfig},
    Client, Config,
};
use serde::Deserialize;

use crate::{chart, random_u32, repo_root, workspace_bin};

/// The kubelet's root directory (tests/realnode.sh's, where the chart's hostPaths point).
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// The address of the node's pod bridge (the first of tests/realnode.sh's `POD_CIDR`),
/// which its pods reach: where a test serves what the agent's pod sends to, once the
/// first pod made the bridge.
pub const POD_GATEWAY: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 244, 0, 1);
/// The lock a node's test holds while its node runs.
pub const LOCK: &str = "/run/neuron-realnode.lock";
/// The longest a test waits for another test's node to go.
const LOCK_WAIT: Duration = Duration::from_secs(900);
/// Bounds of `up` (each of its own waits is bounded too) and `down`.
const UP_LIMIT: &str = "300";
const DOWN_LIMIT: &str = "120";
/// Sysctls the node changes (the kubelet's kernel tunables, the bridge's forwarding):
/// equal before `up` and after `down`.
pub const SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
    "net/ipv4/ip_forward",
    "vm/panic_on_oom",
    "net/ipv4/conf/all/route_localnet",
];

/// What `tests/realnode.sh up` prints as its last line.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeInfo {
    pub kubeconfig: PathBuf,
    /// Helm values pointing the chart at the local images (and the simulator's needs).
    pub values: PathBuf,
    pub images: Images,
    pub node: String,
    pub node_ip: String,
    pub kubelet_root: PathBuf,
    pub bridge: String,
    pub logs: PathBuf,
    /// Appending a fault (`KIND[:DEVICE[:ARG]]`, a line) injects it into the node's
    /// simulated Neuron driver (`xid:CODE:BUS_ID` on a GPU node).
    pub health_control: PathBuf,
    /// `neuron` or `gpu` (a GPU instance type: the fake NVML library as its driver).
    #[serde(default)]
    pub kind: String,
    /// GPU nodes: `nvidia-ml-fake-gpus`'s JSON of the node's GPUs (empty elsewhere).
    #[serde(default)]
    pub gpus: PathBuf,
    /// GPU nodes: the fake library's configuration file, re-read when it changes.
    #[serde(default)]
    pub nvml_config: PathBuf,
    /// What allocates the node's Neuron devices: `deviceplugin` or `dra`.
    #[serde(default)]
    pub allocation: String,
    pub timings: Timings,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Images {
    pub agent: String,
    pub operator: String,
    pub pause: String,
}

/// Seconds of each part of `up`.
#[derive(Debug, Clone, Deserialize)]
pub struct Timings {
    pub controlplane_s: f64,
    pub images_s: f64,
    pub node_ready_s: f64,
    pub total_s: f64,
}

/// A running node; dropping it runs `down`.
pub struct RealNode {
    pub dir: PathBuf,
    pub info: NodeInfo,
    /// The machine before `up`.
    pub before: HostState,
    stopped: bool,
    _lock: File,
}

impl RealNode {
    /// Starts a node, after any other node of this machine went.
    pub fn up() -> anyhow::Result<RealNode> {
        Self::up_as("trn1.32xlarge")
    }

    /// Starts a node of `instance_type` (a Neuron one, or a GPU one the fake NVML knows).
    pub fn up_as(instance_type: &str) -> anyhow::Result<RealNode> {
        Self::up_with(instance_type, "deviceplugin")
    }

    /// Starts a node of `instance_type` whose Neuron devices `allocation` allocates
    /// (`deviceplugin`, or `dra`: the test DRA driver).
    pub fn up_with(instance_type: &str, allocation: &str) -> anyhow::Result<RealNode> {
        let lock = lock_machine()?;
        let before = HostState::read();
        let dir = std::env::temp_dir().join(format!("neuron-realnode-{}-{:08x}", std::process::id(), random_u32()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (ok, stdout, stderr) = realnode(UP_LIMIT, "up", &dir, instance_type, allocation);
        let info = stdout.lines().last().and_then(|l| serde_json::from_str::<NodeInfo>(l).ok());
        match info {
            Some(info) if ok => Ok(RealNode { dir, info, before, stopped: false, _lock: lock }),
            _ => {
                // `up` restores the machine when it fails; a timeout may have cut it short.
                let (down_ok, down_out, down_err) = realnode(DOWN_LIMIT, "down", &dir, instance_type, allocation);
                if down_ok {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                bail!("tests/realnode.sh up failed:\n{stderr}\n(down: {down_out}{down_err})")
            }
        }
    }

    /// An admin client of the node's control plane.
    pub async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.info.kubeconfig).expect("the node's kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("a client configuration");
        Client::try_from(config).expect("a client")
    }

    /// A client of the node's API server that authenticates with `token` alone.
    pub async fn client_with_token(&self, token: &str) -> Client {
        let kubeconfig = Kubeconfig::read_from(&self.info.kubeconfig).expect("the node's kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("a client configuration");
        config.auth_info = kube::config::AuthInfo { token: Some(token.to_owned().into()), ..Default::default() };
        Client::try_from(config).expect("a client")
    }

    /// `helm ARGS… --kubeconfig <the node's>`.
    pub fn helm(&self, args: &[&str]) -> (bool, String, String) {
        let kubeconfig = self.info.kubeconfig.display().to_string();
        let mut all = args.to_vec();
        all.extend(["--kubeconfig", &kubeconfig]);
        chart::helm(&all)
    }

    /// The simulated hardware's NeuronCores per device (`host/hardware.json`).
    pub fn cores_per_device(&self) -> u32 {
        let cores = self.hardware()["cores_per_device"].as_u64();
        cores.and_then(|n| u32::try_from(n).ok()).expect("cores_per_device")
    }

    /// The simulated hardware the device plugin and DRA driver serve (`neuron-monitor-sim
    /// hardware`: devices, cores per device, EFA devices).
    pub fn hardware(&self) -> serde_json::Value {
        let path = self.dir.join("host/hardware.json");
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).expect("the node's hardware JSON")
    }

    /// The PIDs `up` started (control plane, containerd, kubelet, scheduler, kube-proxy).
    pub fn pids(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("pids")) else { return Vec::new() };
        entries
            .flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|s| s.trim().parse().ok())
            .collect()
    }

    /// The last lines of the node's logs, for a failed assertion's message.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        for name in ["kubelet.log", "containerd.log", "kube-scheduler.log", "kube-proxy.log", "dradriver.log"] {
            let text = std::fs::read_to_string(self.info.logs.join(name)).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out += &format!("--- {name} (last lines)\n{}\n", lines[lines.len().saturating_sub(15)..].join("\n"));
        }
        out
    }

    /// Stops the node and restores the machine; returns how long it took.
    pub fn down(&mut self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        self.stopped = true;
        let (ok, stdout, stderr) = realnode(DOWN_LIMIT, "down", &self.dir, "", "");
        if !ok {
            bail!("tests/realnode.sh down failed (state kept in {}):\n{stdout}{stderr}", self.dir.display());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        Ok(started.elapsed())
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if !self.stopped {
            if let Err(e) = self.down() {
                eprintln!("{e:#}");
            }
        }
    }
}

/// `timeout LIMIT tests/realnode.sh VERB DIR`: (success, stdout, stderr). The images are
/// made of the binaries of this test's own target directory.
fn realnode(limit: &str, verb: &str, dir: &Path, instance_type: &str, allocation: &str) -> (bool, String, String) {
    let bin_dir = workspace_bin("neuron-node-agent").parent().map(Path::to_path_buf).unwrap_or_default();
    let mut command = Command::new("timeout");
    command
        .args(["--kill-after=10", limit])
        .arg(repo_root().join("tests/realnode.sh"))
        .arg(verb)
        .arg(dir)
        .env("REALNODE_BIN_DIR", bin_dir);
    if !instance_type.is_empty() {
        command.env("REALNODE_INSTANCE_TYPE", instance_type);
    }
    if !allocation.is_empty() {
        command.env("REALNODE_ALLOCATION", allocation);
    }
    chart::run(command)
}

/// Waits for the machine's node lock; the lock goes with the returned file.
fn lock_machine() -> anyhow::Result<File> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(LOCK)
        .with_context(|| format!("opening {LOCK}"))?;
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock on a descriptor this function owns; no memory is involved.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok(file);
        }
        if Instant::now() >= deadline {
            bail!("another real node held {LOCK} for {LOCK_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What of the machine a node changes, read before `up` and after `down`.
#[derive(Debug, PartialEq, Eq)]
pub struct HostState {
    pub sysctls: Vec<(String, String)>,
    pub kubelet_root_exists: bool,
}

impl HostState {
    pub fn read() -> HostState {
        let sysctls = SYSCTLS
            .iter()
            .map(|s| {
                let value = std::fs::read_to_string(Path::new("/proc/sys").join(s)).unwrap_or_default();
                ((*s).to_owned(), value.trim().to_owned())
            })
            .collect();
        HostState { sysctls, kubelet_root_exists: Path::new(KUBELET_ROOT).exists() }
    }
}

/// What a stopped node left behind, one line each: its processes, mounts under the
/// kubelet's root, DIR or /run/netns, its bridge, KUBE-* iptables chains, kubepods
/// cgroups.
pub fn leftovers(info: &NodeInfo, dir: &Path, pids: &[u32]) -> Vec<String> {
    let mut left = Vec::new();
    for pid in pids {
        // A zombie has exited; init reaps it a moment later.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let state = stat.rsplit_once(") ").and_then(|(_, rest)| rest.chars().next());
        if state.is_some_and(|s| s != 'Z') {
            left.push(format!("process {pid}"));
        }
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for mount in mountinfo.lines().filter_map(|l| l.split(' ').nth(4)) {
        let ours =
            [info.kubelet_root.as_path(), dir, Path::new("/run/netns")].iter().any(|p| Path::new(mount).starts_with(p));
        if ours {
            left.push(format!("mount {mount}"));
        }
    }
    if Path::new("/sys/class/net").join(&info.bridge).exists() {
        left.push(format!("bridge {}", info.bridge));
    }
    for save in ["iptables-save", "ip6tables-save"] {
        let (_, rules, _) = chart::run({
            let mut c = Command::new(save);
            c.arg("-c");
            c
        });
        left.extend(rules.lines().filter(|l| l.contains("KUBE-")).map(|l| format!("{save}: {l}")));
    }
    for entry in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        for name in ["kubepods", "kubepods.slice", "k8s.io"] {
            let path = entry.path().join(name);
            if path.exists() {
                left.push(format!("cgroup {}", path.display()));
            }
        }
    }
    left
}
