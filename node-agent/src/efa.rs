//! EFA (Elastic Fabric Adapter) counters: the traffic, drops and errors of the node's EFA
//! devices ([`sysfs`]), on `/metrics` as `efa_<counter>_total` with the pod holding each
//! device (the kubelet's `vpc.amazonaws.com/efa` allocations).
//!
//! Read off the report path: a task reads the tree on a blocking thread at start, after
//! each applied report and whenever `interval` passes without one, and replaces the
//! [`SharedEfa`] table the exposition encodes. The values are the driver's, as read: a
//! driver reload starts them again from zero, which Prometheus takes as a counter reset;
//! the agent counts and logs the resets it sees, and adds no offset.

pub mod sysfs;

use std::{
    collections::BTreeMap,
    fmt,
    path::PathBuf,
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::{Duration, Instant},
};

use prometheus_client::{
    metrics::{counter::Counter, family::Family as MetricFamily, gauge::Gauge, MetricType},
    registry::Registry,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info};

use crate::{
    attribution::EfaHolders,
    processes::procfs,
    routing::SharedRouting,
    series::{Exported, Family, FamilyEncoder, Labels, Scope},
    state::{InstanceLabels, NodeState, PodRef},
    telemetry::ReasonLabel,
    timed_read::{self, TimedReads},
};
use sysfs::{Device, HeldFiles, Reading, Skip};

/// The EFA devices of the latest read, sorted by name.
pub type SharedEfa = Arc<Mutex<Vec<Device>>>;

/// `neuron_agent_efa_*`; cloning shares them.
#[derive(Clone, Default)]
pub struct EfaMetrics {
    pub failures: MetricFamily<ReasonLabel, Counter>,
    pub read_seconds: Gauge<f64, AtomicU64>,
    pub devices: Gauge,
    pub reloads: Counter,
    pub held_files: Gauge,
}

impl EfaMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = EfaMetrics::default();
        let r = registry.sub_registry_with_prefix("neuron_agent_efa");
        r.register(
            "read_failures",
            "Parts of the EFA devices' sysfs tree left out, by reason (gone, denied, too_large, malformed, bad_name, \
             limit, not_a_file, other, stuck: a read that did not return within its deadline)",
            m.failures.clone(),
        );
        r.register("read_seconds", "Time the latest read of the EFA devices' counters took", m.read_seconds.clone());
        r.register("devices", "EFA devices the latest read found", m.devices.clone());
        r.register(
            "held_files",
            "Counter files held open from one read of the EFA devices to the next (read again with one pread each)",
            m.held_files.clone(),
        );
        r.register(
            "driver_reloads",
            "Reads in which an EFA device's counters went back: the driver was reloaded and started them from zero",
            m.reloads.clone(),
        );
        m
    }
}

/// Reads the EFA devices under a sysfs root.
pub struct EfaReader {
    pub sysfs_root: PathBuf,
    pub metrics: EfaMetrics,
    /// The tree's reads, with their deadline.
    reads: TimedReads,
    /// The counter files held open between reads; taken by a read while it runs (a read
    /// stuck past its deadline keeps its own, and the next starts without any).
    held: Arc<Mutex<HeldFiles>>,
    max_held: usize,
}

impl EfaReader {
    pub fn new(sysfs_root: PathBuf, metrics: EfaMetrics) -> EfaReader {
        let max_held = held_files_bound();
        EfaReader {
            sysfs_root,
            metrics,
            reads: TimedReads::new("efa-read", timed_read::READ_DEADLINE),
            held: Arc::new(Mutex::new(HeldFiles::new(max_held))),
            max_held,
        }
    }

    /// Reads the tree within the read deadline (a file whose read does not return is
    /// skipped, as `stuck`); counts what was left out and times the read.
    pub async fn read(&mut self) -> Reading {
        let started = Instant::now();
        let (root, held, max_held) = (self.sysfs_root.clone(), self.held.clone(), self.max_held);
        let (reading, missed) = self
            .reads
            .run_around_stuck_async(move |watch| {
                let lock = || held.lock().unwrap_or_else(|p| p.into_inner());
                let mut files = std::mem::replace(&mut *lock(), HeldFiles::new(max_held));
                let reading = sysfs::read_watched(&root, watch, &mut files);
                *lock() = files;
                reading
            })
            .await;
        let mut reading = reading.unwrap_or_default();
        reading.skipped[Skip::Stuck as usize] += missed.len() as u64;
        self.metrics.read_seconds.set(started.elapsed().as_secs_f64());
        self.metrics.devices.set(reading.devices.len() as i64);
        self.metrics.held_files.set(self.held.lock().unwrap_or_else(|p| p.into_inner()).count() as i64);
        for (why, n) in Skip::ALL.iter().zip(reading.skipped).filter(|(_, n)| *n > 0) {
            self.metrics.failures.get_or_create(&ReasonLabel { reason: why.as_str() }).inc_by(n);
            // Each read would say it again: debug level only, the counter tells.
            debug!(reason = why.as_str(), count = n, "parts of the EFA sysfs tree left out");
        }
        reading
    }
}

/// Descriptors an EFA reader holds open: as many as a read may take, within its share of
/// those the process may open.
fn held_files_bound() -> usize {
    procfs::held_files_share().min(sysfs::MAX_EFA_COUNTERS)
}

/// Reads the EFA counters at start, after each applied report and after `interval`
/// without one, until `shutdown`.
pub async fn follow(
    mut reader: EfaReader,
    mut applied: watch::Receiver<u64>,
    interval: Duration,
    table: SharedEfa,
    shutdown: CancellationToken,
) {
    let mut found: Option<Vec<String>> = None;
    loop {
        // On the reader's own thread, within its deadline.
        let reading = reader.read().await;
        let names: Vec<String> = reading.devices.iter().map(|d| d.name.clone()).collect();
        if found.as_ref() != Some(&names) {
            let class = reader.sysfs_root.join(sysfs::INFINIBAND_DIR);
            if names.is_empty() {
                info!(path = %class.display(), other_rdma_devices = reading.other_devices, "no EFA device");
            } else {
                info!(path = %class.display(), devices = ?names, "reading the counters of the EFA devices");
            }
            found = Some(names);
        }
        {
            let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
            for device in &reading.devices {
                let before = table.binary_search_by(|d| d.name.cmp(&device.name)).ok().map(|i| &table[i]);
                if before.is_some_and(|before| device.went_back_from(before)) {
                    reader.metrics.reloads.inc();
                    info!(device = %device.name, "EFA counters went back: the driver was reloaded (a counter reset)");
                }
            }
            *table = reading.devices;
        }
        // Reports that arrive during a read wake this loop once: one read per report at most.
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = applied.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// What the EFA series are encoded from: the latest read and who holds each device;
/// cloning shares them. The exposition and the OTLP sinks encode the same.
#[derive(Clone, Default)]
pub struct EfaSource {
    pub table: SharedEfa,
    /// With pod attribution: who holds each device.
    pub holders: Option<EfaHolders>,
}

impl EfaSource {
    /// The EFA families `scope` takes (see [`encode_efa`]). Takes the holders' and the
    /// table's locks, one at a time: call it without the node state's.
    pub fn encode(
        &self,
        instance: &InstanceLabels,
        scope: Scope<'_>,
        encoder: &mut dyn FamilyEncoder,
    ) -> Result<(), fmt::Error> {
        let holders = self.holders.as_ref().map(EfaHolders::current).unwrap_or_else(|| Arc::from([]));
        let table = self.table.lock().unwrap_or_else(|p| p.into_inner());
        encode_efa(&table, instance, &holders, scope, encoder)
    }
}

/// Encodes the EFA table on each scrape.
pub struct EfaCollector {
    pub source: EfaSource,
    /// For the instance labels.
    pub state: Arc<Mutex<NodeState>>,
    pub routing: SharedRouting,
}

impl Exported for EfaCollector {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
        let instance = self.state.lock().unwrap_or_else(|p| p.into_inner()).instance.clone();
        let routing = self.routing.current();
        self.source.encode(&instance, Scope::Exposition(&routing), encoder)
    }
}

/// `efa_<counter>_total` for every counter of every device `scope` sees: a device held
/// by a pod goes where the pod's namespace is seen (the pod's labels on its series), a
/// device no pod holds where the operator namespace's is (`/metrics`, and the OTLP sink
/// of the operator namespace's config). Port counters carry `port`; device counters do
/// not.
pub fn encode_efa(
    devices: &[Device],
    instance: &InstanceLabels,
    holders: &[(String, Arc<PodRef>)],
    scope: Scope<'_>,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    // Series by counter name: one family per name, its device and port series together.
    let mut families: BTreeMap<&str, Family<'_>> = BTreeMap::new();
    let family = |counter: &str| Family::new(format!("efa_{counter}"), help(counter), MetricType::Counter);
    for device in devices {
        let pod = holders.binary_search_by(|(d, _)| d.as_str().cmp(&device.name)).ok().map(|i| &*holders[i].1);
        if !scope.sees(pod.map(|p| p.namespace.as_str())) {
            continue;
        }
        let labels = || Labels::held_by(instance, pod).text("efa_device", &device.name);
        for c in &device.counters {
            families.entry(&c.name).or_insert_with(|| family(&c.name)).push(labels(), Some(c.value as f64));
        }
        for port in &device.ports {
            for c in &port.counters {
                let labels = labels().number("port", port.number);
                families.entry(&c.name).or_insert_with(|| family(&c.name)).push(labels, Some(c.value as f64));
            }
        }
    }
    families.into_values().try_for_each(|f| f.write(encoder))
}

/// What a counter of the `efa` driver counts (its `hw_counters` file of the same name).
fn help(counter: &str) -> &'static str {
    match counter {
        "tx_bytes" => "Bytes the EFA device sent (hw_counters/tx_bytes)",
        "tx_pkts" => "Packets the EFA device sent (hw_counters/tx_pkts)",
        "rx_bytes" => "Bytes the EFA device received (hw_counters/rx_bytes)",
        "rx_pkts" => "Packets the EFA device received (hw_counters/rx_pkts)",
        "rx_drops" => "Received packets the EFA device dropped (hw_counters/rx_drops)",
        "send_bytes" | "send_wrs" => "Send operations posted on the EFA device: bytes, work requests (hw_counters)",
        "recv_bytes" | "recv_wrs" => {
            "Receive operations completed on the EFA device: bytes, work requests (hw_counters)"
        }
        "rdma_read_wrs" | "rdma_read_bytes" => "RDMA reads the EFA device issued: work requests, bytes (hw_counters)",
        "rdma_read_wr_err" => "RDMA read work requests that failed (hw_counters/rdma_read_wr_err)",
        "rdma_read_resp_bytes" => "Bytes the EFA device sent answering remote RDMA reads (hw_counters)",
        "rdma_write_wrs" | "rdma_write_bytes" => {
            "RDMA writes the EFA device issued: work requests, bytes (hw_counters)"
        }
        "rdma_write_wr_err" => "RDMA write work requests that failed (hw_counters/rdma_write_wr_err)",
        "rdma_write_recv_bytes" => "Bytes remote RDMA writes put into this host's memory (hw_counters)",
        "retrans_bytes" | "retrans_pkts" => "Bytes, packets the EFA device sent again (hw_counters)",
        "retrans_timeout_events" => "Retransmission timeouts of the EFA device (hw_counters)",
        "unresponsive_remote_events" | "impaired_remote_conn_events" => {
            "Remote peers the EFA device found unresponsive / impaired (hw_counters)"
        }
        "submitted_cmds" | "completed_cmds" | "no_completion_cmds" => {
            "Admin commands of the EFA device: submitted, completed, never completed (hw_counters)"
        }
        "cmds_err" => "Admin commands of the EFA device that failed (hw_counters/cmds_err)",
        "keep_alive_rcvd" => "Keep-alive events the EFA device received from its firmware (hw_counters)",
        c if c.ends_with("_err") => "Failed verbs operations of the EFA device, by kind (hw_counters)",
        _ => "A counter of the EFA device (its hw_counters file of the same name)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        routing::Routing,
        sinks::prometheus::{render_families, Format},
    };
    use api::node_config::{NodeConfig, PrometheusRoute, Route, RouteRuntimes};
    use sysfs::{Counter, Port};

    fn device(name: &str, tx: u64) -> Device {
        Device {
            name: name.into(),
            counters: vec![Counter { name: "cmds_err".into(), value: 2 }],
            ports: vec![Port {
                number: 1,
                counters: vec![
                    Counter { name: "rx_drops".into(), value: 0 },
                    Counter { name: "tx_bytes".into(), value: tx },
                ],
            }],
        }
    }

    fn pod(namespace: &str, name: &str) -> Arc<PodRef> {
        Arc::new(PodRef {
            namespace: namespace.into(),
            pod: name.into(),
            owner: name.into(),
            container: "main".into(),
            labels: vec![("label_app".into(), name.into())],
        })
    }

    struct Table(Vec<Device>, Vec<(String, Arc<PodRef>)>, Routing);

    impl fmt::Debug for Table {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Table")
        }
    }

    impl Exported for Table {
        fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
            let instance = InstanceLabels { instance_type: "trn1.32xlarge".into(), ..InstanceLabels::default() };
            encode_efa(&self.0, &instance, &self.1, Scope::Exposition(&self.2), encoder)
        }
    }

    fn render(table: Table) -> String {
        render_families(&table, Format::Classic)
    }

    fn team_route(namespace: &str) -> Route {
        Route {
            config: format!("{namespace}/c"),
            namespace: Some(namespace.into()),
            runtimes: vec![RouteRuntimes { tag_filter: None, groups: vec![] }],
            prometheus: Some(PrometheusRoute::default()),
            ..Route::default()
        }
    }

    #[test]
    fn each_counter_is_a_family_with_the_device_its_port_and_its_pod() {
        let devices = vec![device("rdmap16s27", 1024), device("rdmap32s27", 7)];
        let text = render(Table(devices, vec![("rdmap16s27".into(), pod("a", "train"))], Routing::default()));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines.contains(&"# TYPE efa_tx_bytes_total counter"), "{text}");
        assert!(lines.contains(&"# HELP efa_tx_bytes_total Bytes the EFA device sent (hw_counters/tx_bytes)"));
        let sample = |needle: &str| lines.iter().filter(|l| l.contains(needle)).copied().collect::<Vec<_>>();
        let tx = sample("efa_tx_bytes_total{");
        assert_eq!(tx.len(), 2);
        assert!(tx[0].contains(r#"namespace="a",pod="train",container="main",label_app="train""#), "{}", tx[0]);
        assert!(tx[0].ends_with(r#"efa_device="rdmap16s27",port="1"} 1024.0"#), "{}", tx[0]);
        assert!(!tx[1].contains("namespace=") && tx[1].ends_with(r#"efa_device="rdmap32s27",port="1"} 7.0"#));
        // Device counters: no port label.
        let cmds = sample("efa_cmds_err_total{");
        assert_eq!(cmds.len(), 2);
        assert!(cmds.iter().all(|l| !l.contains("port=") && l.ends_with("} 2.0")), "{cmds:?}");
        assert!(tx[0].contains(r#"instance_type="trn1.32xlarge""#));
    }

    #[test]
    fn a_team_sees_the_devices_of_its_pods_only() {
        let devices = vec![device("rdmap16s27", 1), device("rdmap32s27", 2), device("rdmap48s27", 3)];
        let holders = vec![("rdmap16s27".into(), pod("a", "train")), ("rdmap32s27".into(), pod("b", "other"))];
        let config = NodeConfig { monitor: Default::default(), routes: vec![team_route("a")], health: None, gpu: None };
        let text = render(Table(devices, holders, Routing::compile(&config).unwrap()));
        let tx: Vec<&str> = text.lines().filter(|l| l.starts_with("efa_tx_bytes_total{")).collect();
        assert_eq!(tx.len(), 1, "{text}");
        assert!(tx[0].contains(r#"efa_device="rdmap16s27""#));
    }

    /// (family, device, namespace) of each series `route`'s sink sends.
    fn sent_by(route: &Route, devices: &[Device], holders: &[(String, Arc<PodRef>)]) -> Vec<(String, String, String)> {
        struct Sent(Vec<(String, String, String)>);
        impl FamilyEncoder for Sent {
            fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error> {
                for (labels, _) in family.series() {
                    let (mut device, mut namespace) = (String::new(), String::new());
                    labels.try_for_each(|key, value| {
                        match key {
                            "efa_device" => device = value.to_string(),
                            "namespace" => namespace = value.to_string(),
                            _ => {}
                        }
                        Ok::<(), fmt::Error>(())
                    })?;
                    self.0.push((family.classic_name(), device, namespace));
                }
                Ok(())
            }
        }
        let config = NodeConfig { monitor: Default::default(), routes: vec![route.clone()], health: None, gpu: None };
        let routing = Routing::compile(&config).unwrap();
        let selection = &routing.otlp_routes().next().unwrap().1;
        let mut sent = Sent(Vec::new());
        encode_efa(devices, &InstanceLabels::default(), holders, Scope::Route(route, selection), &mut sent).unwrap();
        sent.0
    }

    #[test]
    fn a_sink_sends_what_its_namespace_sees_of_the_devices() {
        let devices = vec![device("rdmap16s27", 1), device("rdmap32s27", 2), device("rdmap48s27", 3)];
        let holders = vec![("rdmap16s27".into(), pod("a", "train")), ("rdmap32s27".into(), pod("b", "other"))];
        let otlp =
            Some(api::crd::OtlpSinkSpec { endpoint: Some("http://127.0.0.1:4318".into()), ..Default::default() });
        let team = Route { otlp: otlp.clone(), ..team_route("a") };
        let sent = sent_by(&team, &devices, &holders);
        // Its pod's device: three counters, with the pod's namespace.
        assert_eq!(sent.len(), 3, "{sent:?}");
        assert!(sent.iter().all(|(_, d, ns)| d == "rdmap16s27" && ns == "a"), "{sent:?}");
        assert!(sent.iter().any(|(name, _, _)| name == "efa_tx_bytes_total"));
        // The operator namespace's: every device, the unheld one without a pod.
        let ops = Route { config: "neuron-monitor/all".into(), namespace: None, ..team };
        let sent = sent_by(&ops, &devices, &holders);
        assert_eq!(sent.len(), 9, "{sent:?}");
        assert!(sent.iter().any(|(_, d, ns)| d == "rdmap48s27" && ns.is_empty()));
        assert!(sent.iter().any(|(_, d, ns)| d == "rdmap32s27" && ns == "b"));
    }

    /// Issue 24 (smaller): the largest table the reader's bounds allow — every counter
    /// name at its 64-byte bound, every device held by a pod — and its scrape size.
    /// `cargo test -p neuron-node-agent --lib -- efa::tests::the_largest_table --nocapture`
    #[test]
    fn the_largest_table_scrapes_small() {
        let per_device = sysfs::MAX_EFA_COUNTERS / sysfs::MAX_EFA_DEVICES;
        let name = |c: usize| format!("c{c:03}_{}", "x".repeat(sysfs::MAX_NAME_BYTES - 5));
        let devices: Vec<Device> = (0..sysfs::MAX_EFA_DEVICES)
            .map(|d| Device {
                name: format!("rdmap{d:03}s27"),
                counters: (0..per_device).map(|c| Counter { name: name(c).into(), value: u64::MAX }).collect(),
                ports: vec![],
            })
            .collect();
        let holders = devices.iter().map(|d| (d.name.clone(), pod("team-a", "train"))).collect();
        let text = render(Table(devices, holders, Routing::default()));
        let series = text.lines().filter(|l| !l.starts_with('#')).count();
        assert_eq!(series, sysfs::MAX_EFA_COUNTERS);
        eprintln!("largest EFA table: {series} series, {} bytes", text.len());
        assert!(text.len() < 2 << 20, "{} bytes", text.len());
    }

    #[test]
    fn no_device_no_family() {
        assert_eq!(render(Table(vec![], vec![], Routing::default())), "");
        // A device without counters neither.
        let bare = Device { name: "rdmap16s27".into(), counters: vec![], ports: vec![] };
        assert_eq!(render(Table(vec![bare], vec![], Routing::default())), "");
    }

    #[test]
    fn every_known_counter_has_its_own_help() {
        for counter in ["tx_bytes", "rx_drops", "rdma_read_wr_err", "cmds_err", "alloc_pd_err", "retrans_pkts"] {
            assert_ne!(help(counter), help("some_future_counter"), "{counter}");
        }
    }
}
