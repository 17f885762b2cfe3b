//! The cost of the EFA counters per report period, on a fake tree of a trn2.48xlarge's
//! 16 EFA devices laid out as the kernel's (relative links, the 22 port counters and 12
//! device counters of a recent driver, 544 files):
//! - `baseline/read_files`: `std::fs::read` of the same 544 files by their paths, the
//!   floor of any reader; the other numbers read as ratios to it;
//! - `read_16`: one read of the tree by the agent's reader (listings, links, bounds,
//!   parsing), what the agent pays after each report, off the report path; its counter
//!   files held open from the read before, as a sysfs tree's stay;
//! - `read_16_reopened`: the same, each file opened for the read (as every file a writer
//!   replaced since the read before is);
//! - `read_none`: the same on a node without EFA (no `class/infiniband`);
//! - `render_16`: the EFA series of one `/metrics` scrape, every device held by a pod.
//!
//! Run: `cargo bench -p neuron-node-agent --bench efa`.

use std::{
    os::unix::fs::symlink,
    path::Path,
    sync::{Arc, Mutex},
};

use criterion::{criterion_group, criterion_main, Criterion};
use neuron_node_agent::{
    efa::{encode_efa, sysfs, EfaMetrics, EfaReader},
    routing::Routing,
    series::{Exported, FamilyEncoder, Scope},
    sinks::prometheus::{Exposition, Format},
    state::{InstanceLabels, NodeState, PodRef},
};
use neuron_test_support::TempDir;
use prometheus_client::registry::Registry;

const PORT_COUNTERS: [&str; 22] = [
    "tx_bytes",
    "tx_pkts",
    "rx_bytes",
    "rx_pkts",
    "rx_drops",
    "send_bytes",
    "send_wrs",
    "recv_bytes",
    "recv_wrs",
    "rdma_read_wrs",
    "rdma_read_bytes",
    "rdma_read_wr_err",
    "rdma_read_resp_bytes",
    "rdma_write_wrs",
    "rdma_write_bytes",
    "rdma_write_wr_err",
    "rdma_write_recv_bytes",
    "retrans_bytes",
    "retrans_pkts",
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
];
const DEVICE_COUNTERS: [&str; 12] = [
    "submitted_cmds",
    "completed_cmds",
    "cmds_err",
    "no_completion_cmds",
    "keep_alive_rcvd",
    "alloc_pd_err",
    "create_qp_err",
    "create_cq_err",
    "reg_mr_err",
    "alloc_ucontext_err",
    "create_ah_err",
    "mmap_err",
];
const DEVICES: usize = 16;

/// Writes the tree; returns the counter files' paths.
fn efa_tree(root: &Path) -> Vec<std::path::PathBuf> {
    let class = root.join(sysfs::INFINIBAND_DIR);
    std::fs::create_dir_all(&class).expect("class dir");
    std::fs::create_dir_all(root.join("bus/pci/drivers/efa")).expect("driver dir");
    let mut files = Vec::new();
    for k in 0..DEVICES {
        let (name, pci) = (format!("rdmap{}s27", 16 + 8 * k), format!("0000:{:02x}:1b.0", 16 + 8 * k));
        let function = root.join("devices/pci0000:00").join(&pci);
        let dev = function.join("infiniband").join(&name);
        for (dir, counters) in
            [(dev.join("ports/1/hw_counters"), &PORT_COUNTERS[..]), (dev.join("hw_counters"), &DEVICE_COUNTERS[..])]
        {
            std::fs::create_dir_all(&dir).expect("counters dir");
            for (i, counter) in counters.iter().enumerate() {
                let path = dir.join(counter);
                std::fs::write(&path, format!("{}\n", 1_234_567_890_123u64 * i as u64)).expect("counter");
                files.push(path);
            }
        }
        symlink("../../../bus/pci/drivers/efa", function.join("driver")).expect("driver link");
        symlink(format!("../../../{pci}"), dev.join("device")).expect("device link");
        symlink(format!("../../devices/pci0000:00/{pci}/infiniband/{name}"), class.join(&name)).expect("class link");
    }
    files
}

/// The EFA series of the devices, as one scrape encodes them.
struct Efa(Vec<sysfs::Device>, Vec<(String, Arc<PodRef>)>, Routing);

impl Exported for Efa {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), std::fmt::Error> {
        encode_efa(&self.0, &InstanceLabels::default(), &self.1, Scope::Exposition(&self.2), encoder)
    }
}

fn efa(c: &mut Criterion) {
    let tree = TempDir::new("bench-efa");
    let root = tree.path().to_owned();
    let files = efa_tree(&root);
    // The reader answers an async caller, as the agent's: on a runtime of one thread here.
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().expect("runtime");
    let mut reader = EfaReader::new(root.clone(), EfaMetrics::register(&mut Registry::default()));
    let reading = rt.block_on(reader.read());
    assert_eq!(reading.devices.len(), DEVICES);
    assert!(reading.devices.iter().all(|d| d.counters.len() == 12 && d.ports[0].counters.len() == 22));
    assert_eq!(reading.skipped, [0; 9]);

    let mut group = c.benchmark_group("efa");
    group.bench_function("baseline/read_files", |b| {
        b.iter(|| files.iter().map(|f| std::fs::read(f).expect("read").len()).sum::<usize>())
    });
    group.bench_function("read_16", |b| b.iter(|| rt.block_on(reader.read())));
    group.bench_function("read_16_reopened", |b| b.iter(|| sysfs::read(&root)));
    let mut none = EfaReader::new(root.join("none"), EfaMetrics::register(&mut Registry::default()));
    group.bench_function("read_none", |b| b.iter(|| rt.block_on(none.read())));

    let holders: Vec<(String, Arc<PodRef>)> = reading
        .devices
        .iter()
        .map(|d| {
            let pod = PodRef {
                namespace: "team".into(),
                pod: format!("worker-{}", d.name),
                owner: "worker".into(),
                container: "main".into(),
                labels: vec![],
            };
            (d.name.clone(), Arc::new(pod))
        })
        .collect();
    let state = Arc::new(Mutex::new(NodeState::default()));
    let mut exposition = Exposition::new(Registry::default(), state, Default::default(), Default::default());
    exposition.export(Box::new(Efa(reading.devices, holders, Routing::default())));
    group.bench_function("render_16", |b| b.iter(|| exposition.render(Format::OpenMetrics).expect("render")));
    group.finish();
}

criterion_group!(benches, efa);
criterion_main!(benches);
