//! What hardware health adds to the agent's work, on a fake trn2.48xlarge driver tree
//! (16 devices, 4 cores each, every file of driver 2.30.2):
//! - `report/parse_and_update` vs `report/parse_and_update_with_health_readers`: the
//!   report path (the 32-runtime trn1n.32xlarge report) alone, and while a thread reads
//!   the whole tree and folds it into the health model 100 times a second (100× the
//!   default `--health-interval` of 10 s): the report path shares nothing with it;
//! - `sysfs/read_node` and `sysfs/read_and_apply`: one read of the tree (the reader's
//!   cost per interval or notification);
//! - `render/without_health` vs `render/with_health`: one `/metrics` scrape;
//! - the Node Events' bookkeeping on that tree's 81 faults (every core 1 of the 16
//!   devices failing each of its 5 counters, and one kernel record): the Events a return
//!   of the API server writes under the cap (`MAX_PENDING_HEALTH_EVENTS`), the persisted
//!   state's bytes without and with the list of faults whose Event is written, and one
//!   pass of the node reporter's look for Events to write.
//!
//! Before criterion, a plain timing loop prints each pair as a ratio (with / without).
//!
//! Run: `cargo bench -p neuron-node-agent --bench health`.

use std::{
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use api::report::Report;
use criterion::{criterion_group, criterion_main, Criterion};
use neuron_node_agent::{
    health::{
        kmsg::kernel_event,
        metrics::HealthCollector,
        model::{HealthModel, Persisted},
        sysfs::read_node,
    },
    sinks::prometheus::{Exposition, Format},
    state::NodeState,
};
use neuron_test_support::{TempDir, TRN1N_32};
use prometheus_client::registry::Registry;
use support::compact_fixture;

mod support;

/// A driver tree like the simulator's for a trn2.48xlarge.
fn fake_tree() -> TempDir {
    let root = TempDir::new("bench-sysfs");
    let write = |rel: String, text: &str| {
        root.write(rel, text);
    };
    write("module/neuron/version".into(), "2.30.2.0\n");
    for d in 0..16 {
        let dir = format!("devices/virtual/neuron_device/neuron{d}");
        write(format!("{dir}/core_count"), "4");
        write(format!("{dir}/reset"), "1\n");
        write(format!("{dir}/info/serial_number"), "19fcda00f5ff6eb9\n");
        for f in ["mem_ecc_uncorrected", "mem_ecc_repairable_uncorrected", "mem_ecc_corrected", "sram_ecc_uncorrected"]
        {
            write(format!("{dir}/stats/hardware/{f}"), "0\n");
        }
        write(format!("{dir}/stats/hardware/sram_ecc_corrected"), "0\n");
        for f in ["hbm_ecc_err_count", "repairable_hbm_ecc_err_count", "sram_ecc_err_count", "hw_error_event"] {
            write(format!("{dir}/stats/hardware/health_status/{f}"), "0\n");
        }
        write(format!("{dir}/stats/hardware/health_status/unhealthy_components"), "\n");
        write(format!("{dir}/stats/hardware/health_status/healthcheck_heartbeat"), "42\n");
        write(format!("{dir}/stats/power/utilization"), "POWER_STATUS_VALID,1732000000,12.50,61.75,38.20\n");
        for c in 0..4 {
            for name in [
                "hw_hbm_ue_error",
                "hw_nc_ue_error",
                "hw_dma_abort_error",
                "hw_collectives_error",
                "hw_repairable_hbm_ue_error",
            ] {
                write(format!("{dir}/neuron_core{c}/stats/status/{name}/total"), if c == 1 { "1\n" } else { "0\n" });
            }
        }
    }
    root
}

fn model_of(root: &Path) -> HealthModel {
    let mut model = HealthModel::new("bench".to_owned(), Duration::from_secs(60));
    model.apply_reading(read_node(root), 1, Instant::now());
    let record = kernel_event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=3 nc-id=0 action=TERMINATE_INSTANCE");
    model.apply_events(record.into_iter().map(|e| (Some(1), e)).collect(), Some(1), 2);
    model
}

/// Mean time of `f` over `iterations`, after a warm-up.
fn time(iterations: u32, mut f: impl FnMut()) -> Duration {
    for _ in 0..iterations / 10 {
        f();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        f();
    }
    start.elapsed() / iterations
}

/// Reads the tree into the model every 10 ms until dropped.
struct BusyReaders {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyReaders {
    fn start(root: PathBuf, model: Arc<Mutex<HealthModel>>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                let reading = read_node(&root);
                model.lock().expect("model").apply_reading(reading, 3, Instant::now());
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        BusyReaders { stop, thread: Some(thread) }
    }
}

impl Drop for BusyReaders {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn exposition(state: &Arc<Mutex<NodeState>>, health: Option<&Arc<Mutex<HealthModel>>>) -> Exposition {
    let mut exposition = Exposition::new(Registry::default(), state.clone(), Default::default(), Default::default());
    if let Some(health) = health {
        exposition.export(Box::new(HealthCollector {
            health: health.clone(),
            state: state.clone(),
            devices: None,
            gpu_hostname: None,
            neuron: true,
        }));
    }
    exposition
}

fn health(c: &mut Criterion) {
    let line = compact_fixture(TRN1N_32);
    let tree = fake_tree();
    let root = tree.path().to_owned();
    let model = Arc::new(Mutex::new(model_of(&root)));
    let mut node = NodeState::default();
    node.apply(&Report::parse(&line).expect("parse"));
    let state = Arc::new(Mutex::new(node));
    let (plain, with_health) = (exposition(&state, None), exposition(&state, Some(&model)));

    // Ratios first, from one process (`cargo test --all-targets` runs benches once,
    // unoptimized: no table then).
    if std::env::args().any(|a| a == "--bench") {
        print_ratios(&line, &root, &model, &plain, &with_health);
    }

    let mut group = c.benchmark_group("health");
    let (mut scratch, mut buffer) = (NodeState::default(), String::new());
    group.bench_function("report/parse_and_update", |b| {
        b.iter(|| scratch.apply(&Report::parse_reusing(&line, &mut buffer).expect("parse")))
    });
    {
        let _readers = BusyReaders::start(root.clone(), model.clone());
        group.bench_function("report/parse_and_update_with_health_readers", |b| {
            b.iter(|| scratch.apply(&Report::parse_reusing(&line, &mut buffer).expect("parse")))
        });
    }
    group.bench_function("sysfs/read_node", |b| b.iter(|| read_node(&root)));
    let mut fold = model_of(&root);
    group
        .bench_function("sysfs/read_and_apply", |b| b.iter(|| fold.apply_reading(read_node(&root), 3, Instant::now())));
    group.bench_function("render/without_health", |b| b.iter(|| plain.render(Format::Classic).expect("render")));
    group.bench_function("render/with_health", |b| b.iter(|| with_health.render(Format::Classic).expect("render")));
    group.finish();
}

fn print_ratios(
    line: &str,
    root: &Path,
    model: &Arc<Mutex<HealthModel>>,
    plain: &Exposition,
    with_health: &Exposition,
) {
    let (mut scratch, mut buffer) = (NodeState::default(), String::new());
    let mut report = || scratch.apply(&Report::parse_reusing(line, &mut buffer).expect("parse"));
    let alone = time(300, &mut report);
    let busy = {
        let _readers = BusyReaders::start(root.to_owned(), model.clone());
        time(300, &mut report)
    };
    let read = time(200, || drop(read_node(root)));
    let render_plain = time(300, || drop(plain.render(Format::Classic).expect("render")));
    let render_health = time(300, || drop(with_health.render(Format::Classic).expect("render")));
    println!("report path: {alone:?} alone, {busy:?} with the tree read every 10 ms: ratio {:.3}", ratio(busy, alone));
    println!(
        "one read of the 16-device tree: {read:?} ({:.4} % of a core at the default 10 s interval)",
        read.as_secs_f64() / 10.0 * 100.0
    );
    println!(
        "/metrics render: {render_plain:?} without health, {render_health:?} with: ratio {:.3}",
        ratio(render_health, render_plain)
    );
    print_event_figures(root);
}

fn print_event_figures(root: &Path) {
    let mut model = model_of(root);
    let faults = model.persisted().devices.iter().map(|d| d.reasons.len()).sum::<usize>();
    let (reloads, pending) = model.unannounced();
    let (written, dropped) = (pending.len(), model.events_dropped.get());
    let without_list = serde_json::to_vec(&Persisted { announced: None, ..model.persisted() }).expect("json").len();
    for (key, _) in pending {
        model.announce(key, reloads);
    }
    let with_list = serde_json::to_vec(&model.persisted()).expect("json").len();
    let pass = time(300, || drop(model.unannounced()));
    println!(
        "Node Events of {faults} faults after an outage: {written} written, {dropped} dropped (the cap); persisted \
         state {without_list} bytes without the list of written Events, {with_list} with it; one look for Events to \
         write: {pass:?}"
    );
}

fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64().max(1e-12)
}

criterion_group!(benches, health);
criterion_main!(benches);
