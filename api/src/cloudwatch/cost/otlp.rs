//! What a config's metrics cost as OpenTelemetry metrics in CloudWatch (OTLP to
//! `https://monitoring.<region>.amazonaws.com/v1/metrics`).
//!
//! # The price
//! CloudWatch bills OTel metrics per GB ingested, with no charge per metric, per request
//! or for storage (15 months included): "OTel metrics pricing and storage", CloudWatch
//! User Guide (docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/metrics-otel-pricing.html).
//! The rate, **$0.50 per GB ingested**, is the one AWS's Machine Learning blog quotes
//! for "standard CloudWatch OpenTelemetry ingestion pricing" in "Monitor and debug
//! generative AI inference with SageMaker detailed metrics and Insights dashboard on
//! CloudWatch" (2026-06-23), pointing to aws.amazon.com/cloudwatch/pricing; read on
//! 2026-11-24. The operator takes the rate from `--otlp-usd-per-gb` (chart:
//! `operator.cost.otlpUsdPerGb`), this rate by default. A GB is taken as 2^30 bytes, as
//! AWS bills data.
//!
//! # The bytes
//! The same guide says what counts: "each OTLP data point contributes its serialized
//! size", which includes the metric name, all labels (keys and values), the resource
//! attributes, and the timestamp and value. Compression does not enter: the gzip on the
//! wire is not what is billed. So the estimate is, per month,
//!
//! ```text
//! bytes = Σ over the series of a node   point_bytes(series) × flushes a month   (× nodes)
//! point_bytes = protobuf size of the Metric message carrying that one point
//!               (name, Gauge or Sum wrapper, NumberDataPoint with its attributes,
//!               start time, time and a double value)
//!             + protobuf size of the Resource attributes
//! ```
//! assuming the OTLP sink sends every series once per flush (the latest value of a
//! gauge, the running sum of a counter), that a point's attributes are the labels the
//! series has on `/metrics`, and that the resource attributes are the eight of
//! [`RESOURCE_ATTRIBUTES`]. Label values the operator cannot know are taken at the
//! lengths of [`INSTANCE_LABELS`] and [`RUNTIME_LABELS`] (typical EC2 and Kubernetes
//! names); the config's extra labels, the metric's own labels and the core and device
//! indices are counted exactly. The result is 754 bytes a point on average for a team's
//! config on a trn1.32xlarge, of which 275 are resource attributes: if CloudWatch
//! counted those once per request rather than per point, the bill would be ~36% lower.
//! A unit test checks these sizes against a protobuf encoder (prost). The OTLP
//! sink's encoder can check the assumption: its uncompressed request bytes, divided by
//! its points, against [`point_bytes`] of the same series.
//!
//! Series follow `/metrics` for the config's groups on a node with `C` cores and `D`
//! devices, one application per core as in the classic estimate: per core the
//! utilization, two FLOPS gauges and five memory gauges (and on trn2 the utilization of
//! each physical core); per application 2 memory, 1 loaded-model (2 with
//! `loadedModelInfo`), 2 vCPU, 7 process, 26 execution series; for a config of the operator's namespace also 4 ECC counters and 3 allocation
//! counts per device, 9 node series, 5 allocation counts and the documented peaks.

use std::collections::BTreeMap;

use super::{flush_seconds, Kinds, ModeCost, NodeFacts, Prices};
use crate::{
    cloudwatch::catalogue::{collected_groups, ALLOCATION_STATES, ERROR_TYPES, STATUS_TYPES},
    crd::NeuronMonitorConfigSpec,
    hardware::{Generation, InstanceType},
    monitor_config::{RuntimeGroup, SystemGroup},
    report::{DeviceEccCounters, DocumentedNames, PercentileNames},
};

use super::Mode;

/// CloudWatch OTel metrics, USD per GB ingested (the section above).
pub const DEFAULT_USD_PER_GB: f64 = 0.50;
const BYTES_PER_GB: f64 = (1u64 << 30) as f64;
const SECONDS_PER_MONTH: u64 = 30 * 24 * 3600;

/// Labels of every series whose values the operator cannot know, with the length taken
/// for each value: an EC2 Name tag, `i-` + 17 hex digits, `trn1n.32xlarge`,
/// `us-east-1a`, `us-east-1`, `subnet-` + 17 hex digits.
pub const INSTANCE_LABELS: [(&str, usize); 6] = [
    ("instance_name", 24),
    ("instance_id", 19),
    ("instance_type", 14),
    ("availability_zone", 10),
    ("region", 9),
    ("subnet_id", 24),
];
/// Labels of an application's series: its tag, and its pod's namespace, name (a
/// Deployment's pod: name, ReplicaSet hash, 5 characters) and container.
pub const RUNTIME_LABELS: [(&str, usize); 4] = [("runtime_tag", 24), ("namespace", 16), ("pod", 48), ("container", 16)];
/// OpenTelemetry resource attributes of every point (semantic conventions), with the
/// length taken for each value.
pub const RESOURCE_ATTRIBUTES: [(&str, usize); 8] = [
    ("service.name", 17),
    ("k8s.node.name", 28),
    ("cloud.provider", 3),
    ("cloud.platform", 7),
    ("cloud.region", 9),
    ("cloud.availability_zone", 10),
    ("host.id", 19),
    ("host.type", 14),
];

/// What one series of a family belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Per {
    /// A core held by an application (label `neuroncore`).
    Core,
    /// A physical core of a held logical one (`neuroncore`, `physical_neuroncore`).
    PhysicalCore,
    Application,
    /// A device of the node (`neuron_device_index`).
    Device,
    Node,
}

/// Which group a family comes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Runtime(RuntimeGroup),
    System(SystemGroup),
    /// Every config of the operator's namespace (instance and hardware info).
    NodeInfo,
}

/// One metric family of `/metrics`.
struct Family {
    name: &'static str,
    counter: bool,
    per: Per,
    source: Source,
    /// The family's own labels, each with its values (a series per combination).
    labels: &'static [(&'static str, &'static [&'static str])],
}

const fn family(
    name: &'static str,
    counter: bool,
    per: Per,
    source: Source,
    labels: &'static [(&'static str, &'static [&'static str])],
) -> Family {
    Family { name, counter, per, source, labels }
}

const MEMORY_NONE: &[(&str, &[&str])] = &[("memory_location", &["None"])];
const USER_SYSTEM: [&str; 2] = ["user", "system"];

/// The family of one series per loaded model: exported only for configs that ask
/// (`sinks.prometheus.loadedModelInfo`).
const MODEL_INFO: &str = "neuron_runtime_loaded_model_info";

/// The families of `/metrics` (node-agent/src/sinks/prometheus.rs), by group.
const FAMILIES: [Family; 36] = {
    use Per::*;
    use RuntimeGroup as R;
    use Source::*;
    use SystemGroup as S;
    let counters = Runtime(R::NeuroncoreCounters);
    let memory = Runtime(R::MemoryUsed);
    let vcpu = Runtime(R::NeuronRuntimeVcpuUsage);
    let stats = Runtime(R::ExecutionStats);
    let memory_info = System(S::MemoryInfo);
    [
        family("neuroncore_utilization_ratio", false, Core, counters, &[]),
        family("neuroncore_physical_utilization_ratio", false, PhysicalCore, counters, &[]),
        family("neuroncore_flops", false, Core, counters, &[]),
        family("neuroncore_effective_flops", false, Core, counters, &[]),
        family("neuroncore_memory_usage_constants", false, Core, memory, MEMORY_NONE),
        family("neuroncore_memory_usage_model_code", false, Core, memory, MEMORY_NONE),
        family("neuroncore_memory_usage_model_shared_scratchpad", false, Core, memory, MEMORY_NONE),
        family("neuroncore_memory_usage_runtime_memory", false, Core, memory, MEMORY_NONE),
        family("neuroncore_memory_usage_tensors", false, Core, memory, MEMORY_NONE),
        family(
            "neuron_runtime_memory_used_bytes",
            false,
            Application,
            memory,
            &[("memory_location", &["host", "neuron_device"])],
        ),
        // A runtime with one model, running: its count by state and (when the config asks)
        // its info series (the name at a typical length, a five-digit model_id).
        family("neuron_runtime_loaded_models", false, Application, memory, &[("state", &["running"])]),
        family(
            MODEL_INFO,
            false,
            Application,
            memory,
            &[("model_name", &["model-0123456789abcdef.neff"]), ("running", &["true"]), ("model_id", &["10001"])],
        ),
        family("neuron_runtime_vcpu_usage_ratio", false, Application, vcpu, &[("usage_type", &USER_SYSTEM)]),
        family("neuron_process_cpu_seconds_total", true, Application, vcpu, &[("mode", &USER_SYSTEM)]),
        family("neuron_process_resident_memory_bytes", false, Application, vcpu, &[]),
        family("neuron_process_threads", false, Application, vcpu, &[]),
        family("neuron_process_open_fds", false, Application, vcpu, &[]),
        family("neuron_process_io_read_bytes_total", true, Application, vcpu, &[]),
        family("neuron_process_io_write_bytes_total", true, Application, vcpu, &[]),
        family("execution_errors_total", true, Application, stats, &[("error_type", &ERROR_TYPES)]),
        family("execution_status_total", true, Application, stats, &[("status_type", &STATUS_TYPES)]),
        family("execution_latency_seconds", false, Application, stats, &[("percentile", PercentileNames::NAMES)]),
        family(
            "execution_device_latency_seconds",
            false,
            Application,
            stats,
            &[("percentile", PercentileNames::NAMES)],
        ),
        family(
            "hardware_ecc_events_total",
            true,
            Device,
            System(S::NeuronHwCounters),
            &[("event_type", &DeviceEccCounters::KINDS)],
        ),
        family("system_vcpu_count", false, Node, System(S::VcpuUsage), &[]),
        family("system_vcpu_usage_ratio", false, Node, System(S::VcpuUsage), &[("usage_type", &USER_SYSTEM)]),
        family("system_memory_total_bytes", false, Node, memory_info, &[]),
        family("system_memory_used_bytes", false, Node, memory_info, &[]),
        family("system_swap_total_bytes", false, Node, memory_info, &[]),
        family("system_swap_used_bytes", false, Node, memory_info, &[]),
        family("instance_info", false, Node, NodeInfo, &[]),
        family(
            "neuron_hardware_info",
            false,
            Node,
            NodeInfo,
            &[("neuron_device_count", &["16"]), ("neuroncore_per_device_count", &["2"])],
        ),
        // On Kubernetes, once the kubelet says what can be allocated.
        family("neuron_node_neuroncores", false, Node, NodeInfo, &[("state", &ALLOCATION_STATES)]),
        family("neuron_node_neuron_devices", false, Node, NodeInfo, &[("state", &["allocatable", "allocated"])]),
        family("neuron_device_neuroncores", false, Device, NodeInfo, &[("state", &ALLOCATION_STATES)]),
        // The documented peaks of a Trainium (NeuronCore-v2) core.
        family(
            "neuroncore_peak_flops",
            false,
            Node,
            NodeInfo,
            &[("data_type", &["bf16", "cfp8", "fp16", "fp32", "tf32"])],
        ),
    ]
};

/// The names of the `/metrics` families the estimate counts (a test of the agent checks
/// that it counts every family the agent serves).
pub fn family_names() -> impl Iterator<Item = &'static str> {
    FAMILIES.iter().map(|f| f.name)
}

/// Series and billed bytes of one flush on one node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flush {
    pub series: u64,
    pub bytes: u64,
}

/// What a config's metrics cost as OTel metrics on `nodes`, flushed every
/// `flush_interval` (default 60 s).
pub fn estimate(
    spec: &NeuronMonitorConfigSpec,
    sees_node_level: bool,
    nodes: &Kinds,
    flush_interval: Option<&str>,
    prices: &Prices,
) -> ModeCost {
    let flushes = SECONDS_PER_MONTH / flush_seconds(flush_interval);
    // Nodes that differ only by zone send the same: each shape is counted once.
    let mut shapes: Vec<((u32, u64, u64), Flush)> = Vec::new();
    let (series, bytes) = nodes.iter().fold((0u64, 0u64), |(series, bytes), &(node, count)| {
        let shape = (node.cores, node.devices(), physical_per_logical(node));
        let flush = match shapes.iter().find(|(s, _)| *s == shape) {
            Some((_, flush)) => *flush,
            None => {
                let flush = per_flush(spec, sees_node_level, node);
                shapes.push((shape, flush));
                flush
            }
        };
        (
            series.saturating_add(flush.series.saturating_mul(count)),
            bytes.saturating_add(flush.bytes.saturating_mul(flushes).saturating_mul(count)),
        )
    });
    let monthly_usd = bytes as f64 / BYTES_PER_GB * prices.otlp_usd_per_gb;
    ModeCost { mode: Mode::Otlp, series, requests: 0, bytes, monthly_usd }
}

/// The families a config collects; the loaded models' info series only when it asks
/// for them.
fn collected(spec: &NeuronMonitorConfigSpec, sees_node_level: bool) -> impl Iterator<Item = &'static Family> {
    let (runtime_groups, system_groups) = collected_groups(spec, sees_node_level);
    let model_info = spec.sinks.as_ref().and_then(|s| s.prometheus.as_ref()).is_some_and(|p| p.exports_model_info());
    FAMILIES.iter().filter(move |f| match f.source {
        _ if f.name == MODEL_INFO => model_info,
        Source::Runtime(g) => runtime_groups.contains(&g),
        Source::System(g) => system_groups.contains(&g),
        Source::NodeInfo => sees_node_level,
    })
}

/// Series of a family on a node.
fn entities(f: &Family, node: &NodeFacts) -> u64 {
    let cores = u64::from(node.cores);
    match f.per {
        Per::Core | Per::Application => cores,
        Per::PhysicalCore => cores * physical_per_logical(node),
        Per::Device => node.devices(),
        Per::Node => 1,
    }
}

/// The series a config sends from one node in one flush.
pub fn series(spec: &NeuronMonitorConfigSpec, sees_node_level: bool, node: &NodeFacts) -> u64 {
    collected(spec, sees_node_level)
        .map(|f| entities(f, node) * f.labels.iter().map(|(_, values)| values.len() as u64).product::<u64>())
        .sum()
}

/// The series a config sends from one node in one flush, and their billed bytes, point
/// by point.
pub fn per_flush(spec: &NeuronMonitorConfigSpec, sees_node_level: bool, node: &NodeFacts) -> Flush {
    let labels = |set: &[(&str, usize)]| set.iter().map(|(k, v)| key_value(k.len() as u64, *v as u64)).sum::<u64>();
    let extra: u64 = spec
        .sinks
        .as_ref()
        .and_then(|s| s.prometheus.as_ref())
        .and_then(|p| p.extra_labels.as_ref())
        .into_iter()
        .flatten()
        .map(|(k, v)| key_value(k.len() as u64, v.len() as u64))
        .sum();
    let instance = labels(&INSTANCE_LABELS);
    let application = instance + labels(&RUNTIME_LABELS) + extra;
    let physical = physical_per_logical(node).max(1);
    let index = |key: &str, i: u64| key_value(key.len() as u64, digits(i));
    let mut flush = Flush::default();
    for f in collected(spec, sees_node_level) {
        // The label bytes of the family's series on this node, with how many have them
        // (indices of as many digits take as many bytes).
        let n = entities(f, node);
        let mut entities: BTreeMap<u64, u64> = BTreeMap::new();
        let mut add = |bytes: u64, count: u64| *entities.entry(bytes).or_default() += count;
        match f.per {
            Per::Core => (0..n).for_each(|c| add(application + index("neuroncore", c), 1)),
            Per::PhysicalCore => (0..n).for_each(|p| {
                add(application + index("neuroncore", p / physical) + index("physical_neuroncore", p), 1)
            }),
            Per::Application => add(application, n),
            Per::Device => (0..n).for_each(|d| add(instance + index("neuron_device_index", d), 1)),
            Per::Node => add(instance, 1),
        }
        for own in combinations(f.labels) {
            for (&labels, &count) in &entities {
                flush.series += count;
                flush.bytes += count * point_bytes(f.name, f.counter, labels + own);
            }
        }
    }
    flush
}

/// The bytes of the family's own labels in each combination of their values.
fn combinations(labels: &[(&str, &[&str])]) -> Vec<u64> {
    labels.iter().fold(vec![0], |acc, (key, values)| {
        acc.iter()
            .flat_map(|bytes| values.iter().map(move |v| bytes + key_value(key.len() as u64, v.len() as u64)))
            .collect()
    })
}

/// Physical cores of each logical one on this node: on trn2 with logical cores (LNC=2,
/// 4 logical per device), 2; elsewhere there is no physical-core series.
fn physical_per_logical(node: &NodeFacts) -> u64 {
    let trn2 = node
        .instance_type
        .as_deref()
        .and_then(InstanceType::lookup)
        .is_some_and(|t| t.generation == Generation::Trainium2);
    if !trn2 || node.cores == 0 {
        return 0;
    }
    (8 * node.devices() / u64::from(node.cores)).max(1)
}

fn digits(mut n: u64) -> u64 {
    let mut d = 1;
    while n >= 10 {
        n /= 10;
        d += 1;
    }
    d
}

/// Bytes of a base-128 varint.
fn varint(mut n: u64) -> u64 {
    let mut bytes = 1;
    while n >= 0x80 {
        n >>= 7;
        bytes += 1;
    }
    bytes
}

/// A length-delimited field (field number below 16: a one-byte tag) with `body` bytes.
fn field(body: u64) -> u64 {
    1 + varint(body) + body
}

/// A `KeyValue` in a repeated `attributes` field: `key` (string), `value` (AnyValue
/// with a `string_value`).
pub fn key_value(key: u64, value: u64) -> u64 {
    field(field(key) + field(field(value)))
}

/// Billed bytes of one point of `name` with `attributes` bytes of encoded attributes:
/// the `Metric` as an entry of `ScopeMetrics.metrics` (name; `Gauge`, or `Sum` with its
/// temporality and monotonic flag, holding one `NumberDataPoint` with its attributes,
/// start time, time and double value, 9 bytes each), and the `Resource` with its
/// attributes as the field of `ResourceMetrics`.
pub fn point_bytes(name: &str, counter: bool, attributes: u64) -> u64 {
    let point = field(attributes + 3 * 9);
    let data = field(point + if counter { 4 } else { 0 });
    let metric = field(field(name.len() as u64) + data);
    let resource: u64 = RESOURCE_ATTRIBUTES.iter().map(|(k, v)| key_value(k.len() as u64, *v as u64)).sum();
    metric + field(resource)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{OtlpSinkSpec, PrometheusSinkSpec, SinksSpec};

    /// OTLP's messages (opentelemetry-proto's metrics/v1, resource/v1, common/v1), the
    /// fields the estimate counts, with their numbers and types.
    mod proto {
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct AnyValue {
            #[prost(string, optional, tag = "1")]
            pub string_value: Option<String>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct KeyValue {
            #[prost(string, tag = "1")]
            pub key: String,
            #[prost(message, optional, tag = "2")]
            pub value: Option<AnyValue>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct NumberDataPoint {
            #[prost(message, repeated, tag = "7")]
            pub attributes: Vec<KeyValue>,
            #[prost(fixed64, tag = "2")]
            pub start_time_unix_nano: u64,
            #[prost(fixed64, tag = "3")]
            pub time_unix_nano: u64,
            #[prost(double, optional, tag = "4")]
            pub as_double: Option<f64>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Gauge {
            #[prost(message, repeated, tag = "1")]
            pub data_points: Vec<NumberDataPoint>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Sum {
            #[prost(message, repeated, tag = "1")]
            pub data_points: Vec<NumberDataPoint>,
            #[prost(int32, tag = "2")]
            pub aggregation_temporality: i32,
            #[prost(bool, tag = "3")]
            pub is_monotonic: bool,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Metric {
            #[prost(string, tag = "1")]
            pub name: String,
            #[prost(message, optional, tag = "5")]
            pub gauge: Option<Gauge>,
            #[prost(message, optional, tag = "7")]
            pub sum: Option<Sum>,
        }
        #[derive(Clone, PartialEq, prost::Message)]
        pub struct Resource {
            #[prost(message, repeated, tag = "1")]
            pub attributes: Vec<KeyValue>,
        }
    }

    fn kv(key: &str, value: &str) -> proto::KeyValue {
        proto::KeyValue { key: key.into(), value: Some(proto::AnyValue { string_value: Some(value.into()) }) }
    }

    /// What a real encoder makes of one point: the Metric as entry 2 of ScopeMetrics,
    /// the Resource as field 1 of ResourceMetrics.
    fn encoded(name: &str, counter: bool, attributes: Vec<proto::KeyValue>) -> u64 {
        use prost::encoding::message::encoded_len;
        let point = proto::NumberDataPoint {
            attributes,
            start_time_unix_nano: 1_764_000_000_000_000_000,
            time_unix_nano: 1_764_000_060_000_000_000,
            as_double: Some(0.25),
        };
        let metric = proto::Metric {
            name: name.into(),
            gauge: (!counter).then(|| proto::Gauge { data_points: vec![point.clone()] }),
            sum: counter.then(|| proto::Sum {
                data_points: vec![point],
                aggregation_temporality: 2,
                is_monotonic: true,
            }),
        };
        let resource =
            proto::Resource { attributes: RESOURCE_ATTRIBUTES.iter().map(|(k, n)| kv(k, &"r".repeat(*n))).collect() };
        (encoded_len(2, &metric) + encoded_len(1, &resource)) as u64
    }

    #[test]
    fn point_sizes_are_what_a_protobuf_encoder_writes() {
        let labels: Vec<(String, String)> = INSTANCE_LABELS
            .iter()
            .chain(&RUNTIME_LABELS)
            .map(|(k, n)| (k.to_string(), "v".repeat(*n)))
            .chain([("neuroncore".to_owned(), "17".to_owned()), ("team".to_owned(), "x".repeat(200))])
            .collect();
        for (name, counter) in [("neuroncore_utilization_ratio", false), ("execution_errors_total", true)] {
            for take in [0, 1, 6, labels.len()] {
                let attributes: u64 =
                    labels.iter().take(take).map(|(k, v)| key_value(k.len() as u64, v.len() as u64)).sum();
                let real = encoded(name, counter, labels.iter().take(take).map(|(k, v)| kv(k, v)).collect());
                assert_eq!(point_bytes(name, counter, attributes), real, "{name} with {take} labels");
            }
        }
    }

    fn otlp_config(extra_labels: &[(&str, &str)]) -> NeuronMonitorConfigSpec {
        NeuronMonitorConfigSpec {
            sinks: Some(SinksSpec {
                otlp: Some(OtlpSinkSpec::default()),
                prometheus: Some(PrometheusSinkSpec {
                    enabled: None,
                    extra_labels: Some(extra_labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                    loaded_model_info: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn series_follow_the_groups_and_the_node() {
        let trn1 = NodeFacts::from_instance_type("trn1.32xlarge").unwrap();
        let config = otlp_config(&[]);
        // Per core 1 + 2 + 5, per application 2 + 1 + 2 + 7 + 26.
        assert_eq!(series(&config, false, &trn1), 32 * 8 + 32 * 38);
        // The operator's namespace adds 4 ECC counters and 3 allocation counts per device,
        // 9 node series, 5 allocation counts and the 5 documented peaks of a NeuronCore-v2.
        assert_eq!(series(&config, true, &trn1) - series(&config, false, &trn1), (4 + 3) * 16 + 9 + 5 + 5);
        // trn2 with logical cores (64, LNC=2): each physical core's utilization too.
        let trn2 = NodeFacts::from_instance_type("trn2.48xlarge").unwrap();
        assert_eq!(series(&config, false, &trn2), 64 * (8 + 2) + 64 * 38);
        // The largest node: the figures of limits::MAX_SERIES_PER_CONFIG_PER_NODE's doc.
        let largest = crate::cloudwatch::cost::largest_node();
        assert_eq!(series(&config, false, &largest), 6_016);
        assert_eq!(series(&with_model_info(&config, Some(true)), false, &largest), 6_144);
        // per_flush counts the same series.
        assert_eq!(per_flush(&config, true, &trn1).series, series(&config, true, &trn1));
        // Fewer groups, fewer series.
        let mut counters = config.clone();
        counters.runtimes = Some(vec![crate::crd::RuntimeSelectorSpec {
            tag_filter: None,
            period: None,
            metrics: vec![crate::crd::RuntimeMetricGroup { kind: RuntimeGroup::NeuroncoreCounters, period: None }],
        }]);
        assert_eq!(series(&counters, false, &trn1), 32 * 3);
    }

    fn with_model_info(config: &NeuronMonitorConfigSpec, on: Option<bool>) -> NeuronMonitorConfigSpec {
        let mut config = config.clone();
        let sinks = config.sinks.get_or_insert_with(Default::default);
        sinks.prometheus.get_or_insert_with(Default::default).loaded_model_info = on;
        config
    }

    /// One info series per application, counted only when the config asks for it and
    /// Prometheus (whose families the OTLP sink sends) is on.
    #[test]
    fn the_loaded_models_info_series_count_only_when_asked_for() {
        let trn1 = NodeFacts::from_instance_type("trn1.32xlarge").unwrap();
        let off = otlp_config(&[]);
        let on = with_model_info(&off, Some(true));
        assert_eq!(series(&on, false, &trn1) - series(&off, false, &trn1), 32);
        assert_eq!(series(&with_model_info(&off, Some(false)), false, &trn1), series(&off, false, &trn1));
        let flush = |c: &NeuronMonitorConfigSpec| per_flush(c, false, &trn1);
        assert!(flush(&on).bytes > flush(&off).bytes, "{:?} {:?}", flush(&on), flush(&off));
        let mut disabled = on.clone();
        disabled.sinks.as_mut().unwrap().prometheus.as_mut().unwrap().enabled = Some(false);
        assert_eq!(series(&disabled, false, &trn1), series(&off, false, &trn1));
    }

    #[test]
    fn bytes_a_month_follow_points_labels_and_the_flush_interval() {
        let trn1 = NodeFacts::from_instance_type("trn1.32xlarge").unwrap();
        let prices = Prices::default();
        let flush = per_flush(&otlp_config(&[]), false, &trn1);
        let per_point = flush.bytes / flush.series;
        let resource: u64 = RESOURCE_ATTRIBUTES.iter().map(|(k, v)| key_value(k.len() as u64, *v as u64)).sum();
        println!("{per_point} bytes a point, {resource} of resource attributes");
        assert!((650..=800).contains(&per_point), "{per_point}");
        assert!((250..=320).contains(&resource), "{resource}");
        let minute =
            estimate(&otlp_config(&[]), false, &crate::cloudwatch::cost::kinds(&[&trn1, &trn1]), None, &prices);
        assert_eq!(minute.bytes, 2 * flush.bytes * 43_200);
        assert!((minute.monthly_usd - minute.bytes as f64 / (1u64 << 30) as f64 * 0.5).abs() < 1e-9);
        let ten_seconds = estimate(&otlp_config(&[]), false, &vec![(&trn1, 1)], Some("10s"), &prices);
        assert_eq!(ten_seconds.bytes, flush.bytes * 259_200);
        // An extra label of 10 + 10 bytes adds 24 bytes to every application's point.
        let labelled = per_flush(&otlp_config(&[("team_label", "inference")]), false, &trn1);
        assert_eq!(labelled.bytes - flush.bytes, flush.series * key_value(10, 9));
    }
}
