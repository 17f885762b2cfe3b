//! A fake EFA: the instance type's EFA devices under the sysfs root, laid out as the
//! kernel's (`class/infiniband/<dev>` a relative link to the PCI function's
//! `infiniband/<dev>`, whose `device` links back to the function, whose `driver` links to
//! `bus/pci/drivers/efa`), with the port's and the device's `hw_counters` files.
//!
//! The counters advance every second with the simulated applications' activity: EFA
//! device `k` of `E` carries the traffic of the Neuron devices `d` with `d × E / D = k`
//! (`D` devices), 200 MiB/s sent per fully busy NeuronCore. Every other counter follows
//! from the bytes sent and received, so the tree is deterministic. Trainium2 also has the
//! counters of newer drivers (RDMA write, retransmissions). A file is written only when
//! its value changed, in place as the kernel's counters change (same file: a reader may
//! hold it open), the new value over the old one: a counter only grows, so its text never
//! gets shorter (a read racing the write could see the two values' digits mixed, a window
//! of nanoseconds; sysfs has none). A value that would (none here) replaces the file
//! atomically instead. A
//! simulator started on an existing tree
//! (the agent restarts neuron-monitor) continues its counters: only a driver reload
//! would start them from zero.

use std::{
    collections::BTreeMap,
    fs::OpenOptions,
    os::unix::fs::{symlink, FileExt},
    path::{Path, PathBuf},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use api::hardware::Generation;

use crate::{driver::write_atomic, hardware::InstanceType, scenario::App};

/// How often the counters advance.
const EVERY: Duration = Duration::from_secs(1);
/// Bytes sent per second per fully busy NeuronCore.
const BYTES_PER_BUSY_CORE: f64 = 200.0 * 1024.0 * 1024.0;
/// Bytes per packet (EFA's MTU is about 8 KiB).
const PACKET_BYTES: u64 = 8192;

/// The name of EFA device `k` (real names read like `rdmap16s27`: PCI bus 16, slot 27).
pub fn device_name(k: usize) -> String {
    format!("rdmap{}s27", 16 + 8 * k)
}

fn pci_function(k: usize) -> String {
    format!("0000:{:02x}:1b.0", 16 + 8 * k)
}

/// Busy NeuronCores (utilization / 100, summed) each EFA device carries the traffic of.
pub fn loads(instance: &InstanceType, apps: &[App], efa_devices: usize) -> Vec<f64> {
    let mut loads = vec![0.0; efa_devices];
    if instance.devices == 0 || instance.cores_per_device == 0 {
        return loads;
    }
    for app in apps {
        for core in &app.cores {
            let device = (core / instance.cores_per_device) as usize;
            if let Some(load) = loads.get_mut(device * efa_devices / instance.devices as usize) {
                *load += app.util;
            }
        }
    }
    loads.iter().map(|percent| percent / 100.0).collect()
}

/// The port counters, from the bytes sent and received since the driver loaded.
fn port_counters(tx: u64, rx: u64, newer: bool) -> Vec<(&'static str, u64)> {
    let (tx_pkts, rx_pkts) = (tx.div_ceil(PACKET_BYTES), rx.div_ceil(PACKET_BYTES));
    let mut counters = vec![
        ("tx_bytes", tx),
        ("tx_pkts", tx_pkts),
        ("rx_bytes", rx),
        ("rx_pkts", rx_pkts),
        ("rx_drops", rx_pkts / 100_000),
        ("send_bytes", tx / 16),
        ("send_wrs", tx / 16 / 4096),
        ("recv_bytes", rx / 16),
        ("recv_wrs", rx / 16 / 4096),
        ("rdma_read_bytes", tx / 2),
        ("rdma_read_wrs", tx / 2 / (256 * 1024)),
        ("rdma_read_wr_err", 0),
        ("rdma_read_resp_bytes", rx / 2),
    ];
    if newer {
        let retrans_pkts = tx_pkts / 50_000;
        counters.extend([
            ("rdma_write_bytes", tx / 4),
            ("rdma_write_wrs", tx / 4 / (256 * 1024)),
            ("rdma_write_wr_err", 0),
            ("rdma_write_recv_bytes", rx / 4),
            ("retrans_bytes", retrans_pkts * PACKET_BYTES),
            ("retrans_pkts", retrans_pkts),
            ("retrans_timeout_events", 0),
            ("unresponsive_remote_events", 0),
            ("impaired_remote_conn_events", 0),
        ]);
    }
    counters
}

/// The device counters, from the seconds since the driver loaded.
fn device_counters(seconds: u64) -> [(&'static str, u64); 12] {
    let cmds = 64 + seconds / 10;
    [
        ("submitted_cmds", cmds),
        ("completed_cmds", cmds),
        ("cmds_err", 0),
        ("no_completion_cmds", 0),
        ("keep_alive_rcvd", seconds),
        ("alloc_pd_err", 0),
        ("create_qp_err", 0),
        ("create_cq_err", 0),
        ("reg_mr_err", 0),
        ("alloc_ucontext_err", 0),
        ("create_ah_err", 0),
        ("mmap_err", 0),
    ]
}

struct Device {
    /// `devices/…/infiniband/<name>`.
    dir: PathBuf,
    load: f64,
    tx: u64,
    rx: u64,
}

/// The fake EFA devices.
pub struct FakeEfa {
    devices: Vec<Device>,
    newer: bool,
    seconds: u64,
    /// What each file holds, to write only changes.
    written: BTreeMap<PathBuf, u64>,
}

impl FakeEfa {
    /// Lays out `loads.len()` devices under `root`, their counters where an existing tree
    /// left them, else at zero.
    pub fn new(instance: &InstanceType, root: &Path, loads: Vec<f64>) -> Result<FakeEfa> {
        let driver = root.join("bus/pci/drivers/efa");
        std::fs::create_dir_all(&driver).with_context(|| format!("creating {}", driver.display()))?;
        let class = root.join("class/infiniband");
        std::fs::create_dir_all(&class).with_context(|| format!("creating {}", class.display()))?;
        let mut devices = Vec::with_capacity(loads.len());
        for (k, load) in loads.into_iter().enumerate() {
            let (name, pci) = (device_name(k), pci_function(k));
            let function = root.join("devices/pci0000:00").join(&pci);
            let dir = function.join("infiniband").join(&name);
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let links = [
                (PathBuf::from("../../../bus/pci/drivers/efa"), function.join("driver")),
                (PathBuf::from(format!("../../../{pci}")), dir.join("device")),
                (PathBuf::from(format!("../../devices/pci0000:00/{pci}/infiniband/{name}")), class.join(&name)),
            ];
            for (target, link) in links {
                if std::fs::symlink_metadata(&link).is_err() {
                    symlink(&target, &link).with_context(|| format!("linking {}", link.display()))?;
                }
            }
            let port = dir.join("ports/1/hw_counters");
            let (tx, rx) = (existing(&port.join("tx_bytes")), existing(&port.join("rx_bytes")));
            devices.push(Device { dir, load, tx, rx });
        }
        let seconds = devices.first().map_or(0, |d| existing(&d.dir.join("hw_counters/keep_alive_rcvd")));
        let mut efa =
            FakeEfa { devices, newer: instance.generation == Generation::Trainium2, seconds, written: BTreeMap::new() };
        efa.write()?;
        Ok(efa)
    }

    /// One second of traffic.
    fn advance(&mut self) {
        self.seconds += 1;
        for d in &mut self.devices {
            let sent = (d.load * BYTES_PER_BUSY_CORE) as u64;
            d.tx += sent;
            // Collectives are symmetric: about as much comes in as goes out.
            d.rx += sent / 50 * 49;
        }
    }

    fn write(&mut self) -> Result<()> {
        let device_counters = device_counters(self.seconds);
        for d in &self.devices {
            let port = d.dir.join("ports/1/hw_counters");
            let files = port_counters(d.tx, d.rx, self.newer)
                .into_iter()
                .map(|(name, value)| (port.join(name), value))
                .chain(device_counters.iter().map(|(name, value)| (d.dir.join("hw_counters").join(name), *value)));
            for (path, value) in files {
                let before = self.written.get(&path).copied();
                if before != Some(value) {
                    write_counter(&path, before, value)?;
                    self.written.insert(path, value);
                }
            }
        }
        Ok(())
    }

    /// Advances the counters every second; returns only on an error.
    pub fn run(mut self) -> Result<()> {
        let mut next = Instant::now();
        loop {
            next += EVERY;
            sleep(next.saturating_duration_since(Instant::now()));
            self.advance();
            self.write()?;
        }
    }
}

/// Writes `value` over `before` in place when it is no lower (its text is then no
/// shorter, so no reader ever sees an empty file or a stale tail), else replaces the file.
fn write_counter(path: &Path, before: Option<u64>, value: u64) -> Result<()> {
    let text = format!("{value}\n");
    if before.is_none_or(|b| value < b) {
        return write_atomic(path, &text);
    }
    let file = OpenOptions::new().write(true).open(path).with_context(|| format!("opening {}", path.display()))?;
    file.write_all_at(text.as_bytes(), 0).with_context(|| format!("writing {}", path.display()))
}

/// The value a file of an existing tree holds; 0 without one.
fn existing(path: &Path) -> u64 {
    std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{parse_app_spec, Scenario};

    fn read(path: PathBuf) -> String {
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    #[test]
    fn traffic_goes_to_the_efa_devices_of_the_busy_neuron_devices() {
        let trn1 = crate::hardware::lookup("trn1.32xlarge").unwrap();
        let specs =
            vec![parse_app_spec("tag=a,cores=0-2,util=80").unwrap(), parse_app_spec("tag=b,cores=31,util=50").unwrap()];
        let scenario = Scenario::new(trn1, "us-west-2".into(), specs, vec![], None).unwrap();
        // 16 devices of 2 cores, 8 EFA devices: EFA 0 carries devices 0 and 1 (cores 0-3).
        let loads = loads(&trn1, &scenario.apps, 8);
        assert_eq!(loads, vec![2.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5]);
        assert_eq!(super::loads(&trn1, &scenario.apps, 0), Vec::<f64>::new());
    }

    #[test]
    fn writes_the_tree_as_the_kernel_lays_it_out_and_advances_it() {
        let dir = std::env::temp_dir().join(format!("sim-efa-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let trn2 = crate::hardware::lookup("trn2.48xlarge").unwrap();
        let mut efa = FakeEfa::new(&trn2, &dir, vec![1.0, 0.0]).unwrap();
        let class = dir.join("class/infiniband");
        let dev = class.join("rdmap16s27");
        // Through the links, as a reader sees them.
        assert_eq!(std::fs::read_link(dev.join("device/driver")).unwrap().file_name().unwrap(), "efa");
        assert!(std::fs::canonicalize(dev.join("device/driver"))
            .unwrap()
            .starts_with(std::fs::canonicalize(&dir).unwrap()));
        assert_eq!(read(dev.join("ports/1/hw_counters/tx_bytes")), "0\n");
        assert_eq!(read(dev.join("hw_counters/keep_alive_rcvd")), "0\n");
        assert!(dev.join("ports/1/hw_counters/rdma_write_bytes").exists(), "trn2 has the newer counters");
        efa.advance();
        efa.advance();
        efa.write().unwrap();
        let tx = 2 * 200 * 1024 * 1024;
        assert_eq!(read(dev.join("ports/1/hw_counters/tx_bytes")), format!("{tx}\n"));
        assert_eq!(read(dev.join("ports/1/hw_counters/rx_bytes")), format!("{}\n", 2 * (tx / 2 / 50 * 49)));
        assert_eq!(read(dev.join("ports/1/hw_counters/tx_pkts")), format!("{}\n", tx / 8192));
        assert_eq!(read(class.join("rdmap24s27/ports/1/hw_counters/tx_bytes")), "0\n");
        assert_eq!(read(class.join("rdmap24s27/hw_counters/keep_alive_rcvd")), "2\n");
        // Laid out again over an existing tree (a restarted simulator): the counters go on.
        let again = FakeEfa::new(&trn2, &dir, vec![0.0]).unwrap();
        assert_eq!((again.devices[0].tx, again.seconds), (tx, 2));
        assert_eq!(read(dev.join("ports/1/hw_counters/tx_bytes")), format!("{tx}\n"));
        let trn1 = crate::hardware::lookup("trn1.32xlarge").unwrap();
        let older = port_counters(10, 10, trn1.generation == Generation::Trainium2);
        assert!(older.iter().all(|(name, _)| !name.starts_with("rdma_write")));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
