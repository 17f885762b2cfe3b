//! The simulator as a fake Neuron driver for the health tests: a sysfs tree, a kernel
//! log and a control file that injects faults (`neuron-monitor-sim --sysfs-root --kmsg
//! --health-control`). Killed when dropped.

use std::{
    io::Write,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::Duration,
};

use super::{sim, Agent, TempDir};

const WAIT: Duration = Duration::from_secs(20);

/// The simulator as a fake driver (its reports go nowhere): a sysfs tree, a kernel log
/// and a control file that injects faults.
pub struct FakeDriver {
    child: Child,
    dir: TempDir,
}

impl FakeDriver {
    pub fn start(instance_type: &str) -> FakeDriver {
        let dir = TempDir::new("health");
        let child = Command::new(sim())
            .arg(format!("--instance-type={instance_type}"))
            .arg("--sysfs-root")
            .arg(dir.0.join("sys"))
            .arg("--kmsg")
            .arg(dir.0.join("kmsg"))
            .arg("--health-control")
            .arg(dir.0.join("control"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the simulator");
        let driver = FakeDriver { child, dir };
        let version = driver.sys().join("module/neuron/version");
        let start = std::time::Instant::now();
        while !version.exists() {
            assert!(start.elapsed() < WAIT, "the simulator wrote no tree");
            std::thread::sleep(Duration::from_millis(20));
        }
        driver
    }

    pub fn sys(&self) -> PathBuf {
        self.dir.0.join("sys")
    }

    pub fn kmsg(&self) -> PathBuf {
        self.dir.0.join("kmsg")
    }

    /// Injects faults (`KIND[:DEVICE[:ARG]]`) through the control file.
    pub fn inject(&self, faults: &[&str]) {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.0.join("control"))
            .expect("control file");
        for fault in faults {
            writeln!(file, "{fault}").expect("write the control file");
        }
    }

    /// Appends a raw kernel-log record.
    pub fn record(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(self.kmsg()).expect("kmsg");
        writeln!(file, "{line}").expect("append a kernel record");
    }

    /// The agent's health flags for this driver, with quick re-reads for the tests.
    pub fn agent_args(&self) -> Vec<String> {
        let (sys, kmsg) = (self.sys(), self.kmsg());
        vec![
            "--sysfs-root".into(),
            sys.display().to_string(),
            "--kmsg-path".into(),
            kmsg.display().to_string(),
            "--health-interval".into(),
            "200ms".into(),
            "--heartbeat-timeout".into(),
            "3s".into(),
            "--period".into(),
            "500ms".into(),
        ]
    }
}

impl Drop for FakeDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the agent reads the kernel log as it is written: a record appended before
/// that is read as history, judged by the look-back (a line without a header, or a record
/// stamped long ago, is skipped there).
pub fn wait_kmsg_live(agent: &Agent) {
    agent.wait_for("the kernel log followed live", WAIT, |m| {
        (m.value("neuron_agent_health_source_up", &[("source", "kmsg")])? == 1.0).then_some(())
    });
}

/// Appends to the kernel-log file `kmsg` a record `<prefix>,<seq>,<now>,-;<text>`,
/// stamped with the time since boot so that the reader takes it whether it reads it as
/// history (look-back) or as new (the GPU tests' kernel log, which no fake driver writes).
pub fn append_kmsg_record(kmsg: &std::path::Path, prefix: u32, seq: u64, text: &str) {
    let uptime = std::fs::read_to_string("/proc/uptime").expect("/proc/uptime");
    let secs: f64 = uptime.split_whitespace().next().and_then(|s| s.parse().ok()).expect("uptime");
    let usec = (secs * 1e6) as u64;
    let mut file = std::fs::OpenOptions::new().append(true).open(kmsg).expect("kmsg");
    writeln!(file, "{prefix},{seq},{usec},-;{text}").expect("append a record");
}

/// Waits until the agent has read a fault's core counter (`error`: hw_nc_ue_error,
/// hw_dma_abort_error, …) from the tree. The agent tells a driver reload by the counters
/// going down, so a test reloads only after this: a real driver wakes the reader at the
/// fault (sysfs_notify), the fake tree's regular files cannot.
pub fn wait_for_core_counter(agent: &Agent, device: &str, core: &str, error: &str) {
    let labels = [("neuron_device_index", device), ("neuroncore", core), ("error", error)];
    agent.wait_for("the fault's counter read from the tree", WAIT, |m| {
        m.find("neuroncore_hardware_errors_total", &labels).first().filter(|s| s.value >= 1.0).map(|_| ())
    });
}
