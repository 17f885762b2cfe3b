//! The families of a sink's scope as OpenTelemetry metrics: one resource for the node
//! and one per pod (OpenTelemetry's semantic conventions), each family one metric named
//! as on `/metrics`, each series one data point whose attributes are its `/metrics`
//! labels. Counters are cumulative monotonic sums with a stable start time per series,
//! gauges and info metrics gauges.

use std::{
    collections::{hash_map::DefaultHasher, HashMap},
    convert::Infallible,
    fmt,
    hash::{Hash, Hasher},
    time::{SystemTime, UNIX_EPOCH},
};

use opentelemetry_proto::tonic::{
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        metric::Data, number_data_point, AggregationTemporality, Gauge, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use prometheus_client::metrics::MetricType;

use crate::{
    series::{Family, FamilyEncoder},
    state::{InstanceLabels, PodRef},
};

/// Labels CloudWatch's OTLP endpoint stores per data point: a point carries at most this
/// many attributes, its resource's included.
pub const MAX_ATTRIBUTES: usize = 150;
/// `service.name` of every resource: Prometheus' OTLP receiver makes it the `job` label,
/// the job name the chart's scrape configurations give the agent.
pub const SERVICE_NAME: &str = "neuron-node-agent";

/// What names the node in every resource.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    /// `k8s.node.name`, and `service.instance.id` (else the instance id).
    pub node_name: Option<String>,
    /// `k8s.cluster.name`.
    pub cluster_name: Option<String>,
    /// `cloud.platform`: `aws_eks` (on a Kubernetes node), `aws_ecs`, `aws_ec2`.
    pub platform: &'static str,
}

/// Nanoseconds since the Unix epoch.
pub fn unix_nanos(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_nanos().min(u128::from(u64::MAX)) as u64).unwrap_or(0)
}

fn text(key: &str, value: impl Into<String>) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(any_value::Value::StringValue(value.into())) }),
        ..Default::default()
    }
}

/// The node's resource attributes (those with a value).
pub fn node_resource(identity: &Identity, instance: &InstanceLabels) -> Vec<KeyValue> {
    let some = |v: &str| (!v.is_empty()).then(|| v.to_owned());
    let instance_id = identity.node_name.clone().or_else(|| some(&instance.instance_id));
    [
        ("service.name", Some(SERVICE_NAME.to_owned())),
        ("service.version", Some(env!("CARGO_PKG_VERSION").to_owned())),
        ("service.instance.id", instance_id),
        ("cloud.provider", Some("aws".to_owned())),
        ("cloud.platform", some(identity.platform)),
        ("cloud.region", some(&instance.region)),
        ("cloud.availability_zone", some(&instance.availability_zone)),
        ("host.id", some(&instance.instance_id)),
        ("host.type", some(&instance.instance_type)),
        ("host.image.id", some(&instance.ami_id)),
        ("k8s.cluster.name", identity.cluster_name.clone().filter(|c| !c.is_empty())),
        ("k8s.node.name", identity.node_name.clone().filter(|n| !n.is_empty())),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some(text(key, value?)))
    .collect()
}

/// The attributes a pod's resource adds to the node's.
fn pod_resource(pod: &PodKey) -> Vec<KeyValue> {
    let (namespace, name, container) = pod;
    let mut attributes = vec![text("k8s.namespace.name", namespace.as_str()), text("k8s.pod.name", name.as_str())];
    if !container.is_empty() {
        attributes.push(text("k8s.container.name", container.as_str()));
    }
    attributes
}

/// Attributes a pod's resource adds at most.
const POD_ATTRIBUTES: usize = 3;

/// A pod's resource: namespace, name, container.
type PodKey = (String, String, String);

/// When each counter series started counting: the agent's start for what it counted
/// before the sink's first snapshot, else the snapshot before the one that first saw it
/// (or saw it go down: a restarted running sum).
#[derive(Debug)]
pub struct StartTimes {
    /// Series → (start, last value, generation last seen).
    series: HashMap<u64, (u64, f64, u64)>,
    agent_started: u64,
    previous: Option<u64>,
    generation: u64,
}

impl StartTimes {
    pub fn new(agent_started: SystemTime) -> Self {
        StartTimes { series: HashMap::new(), agent_started: unix_nanos(agent_started), previous: None, generation: 0 }
    }

    fn start_of(&mut self, series: u64, value: f64) -> u64 {
        let since = self.previous.unwrap_or(self.agent_started);
        let generation = self.generation;
        let entry = self.series.entry(series).or_insert((since, value, generation));
        if value < entry.1 {
            entry.0 = since;
        }
        entry.1 = value;
        entry.2 = generation;
        entry.0
    }

    /// Ends a snapshot taken at `now`: series it did not see are forgotten (a series that
    /// comes back starts again).
    fn end_snapshot(&mut self, now: u64) {
        let generation = self.generation;
        self.series.retain(|_, (_, _, seen)| *seen == generation);
        self.previous = Some(now);
        self.generation += 1;
    }

    /// Series whose start is known.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// Families in, resources out.
pub struct OtlpEncoder<'a> {
    now: u64,
    starts: &'a mut StartTimes,
    /// Attributes of the node's resource.
    node_attributes: usize,
    node: Vec<Metric>,
    pods: Vec<(PodKey, Vec<Metric>)>,
    pod_index: HashMap<PodKey, usize>,
    /// Attributes left off points beyond [`MAX_ATTRIBUTES`].
    pub attributes_dropped: u64,
}

impl<'a> OtlpEncoder<'a> {
    /// A snapshot at `now`, whose node resource has `node_attributes` attributes.
    pub fn new(now: SystemTime, node_attributes: usize, starts: &'a mut StartTimes) -> Self {
        OtlpEncoder {
            now: unix_nanos(now),
            starts,
            node_attributes,
            node: Vec::new(),
            pods: Vec::new(),
            pod_index: HashMap::new(),
            attributes_dropped: 0,
        }
    }

    /// The resources: the node's (given its attributes), then each pod's, in the order the
    /// families first named them.
    pub fn finish(self, node: Vec<KeyValue>) -> Vec<ResourceMetrics> {
        self.starts.end_snapshot(self.now);
        let resource = |attributes: Vec<KeyValue>, metrics: Vec<Metric>| ResourceMetrics {
            resource: Some(Resource { attributes, ..Default::default() }),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SERVICE_NAME.to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                metrics,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        };
        let mut out = Vec::with_capacity(1 + self.pods.len());
        if !self.node.is_empty() {
            out.push(resource(node.clone(), self.node));
        }
        for (pod, metrics) in self.pods {
            let mut attributes = node.clone();
            attributes.extend(pod_resource(&pod));
            out.push(resource(attributes, metrics));
        }
        out
    }

    /// The metrics of a pod's resource, or of the node's.
    fn metrics_of(&mut self, pod: Option<&PodRef>) -> &mut Vec<Metric> {
        let Some(pod) = pod else { return &mut self.node };
        let key = (pod.namespace.clone(), pod.pod.clone(), pod.container.clone());
        let index = match self.pod_index.get(&key) {
            Some(i) => *i,
            None => {
                self.pods.push((key.clone(), Vec::new()));
                self.pod_index.insert(key, self.pods.len() - 1);
                self.pods.len() - 1
            }
        };
        &mut self.pods[index].1
    }
}

impl FamilyEncoder for OtlpEncoder<'_> {
    fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error> {
        let name = family.classic_name();
        let counter = matches!(family.kind(), MetricType::Counter);
        for (labels, value) in family.series() {
            let pod = labels.pod();
            let room = MAX_ATTRIBUTES
                - self.node_attributes.min(MAX_ATTRIBUTES)
                - if pod.is_some() { POD_ATTRIBUTES } else { 0 };
            let mut attributes = Vec::with_capacity(16);
            let mut dropped = 0u64;
            let _ = labels.try_for_each(|key, value| {
                if attributes.len() < room {
                    attributes.push(text(key, value.to_string()));
                } else {
                    dropped += 1;
                }
                Ok::<(), Infallible>(())
            });
            self.attributes_dropped += dropped;
            let start = if counter {
                let mut hasher = DefaultHasher::new();
                name.hash(&mut hasher);
                for kv in &attributes {
                    kv.key.hash(&mut hasher);
                    if let Some(any_value::Value::StringValue(v)) = kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                        v.hash(&mut hasher);
                    }
                }
                self.starts.start_of(hasher.finish(), *value)
            } else {
                0
            };
            let point = NumberDataPoint {
                attributes,
                start_time_unix_nano: start,
                time_unix_nano: self.now,
                value: Some(number_data_point::Value::AsDouble(*value)),
                ..Default::default()
            };
            let metrics = self.metrics_of(pod);
            if metrics.last().is_none_or(|m| m.name != name) {
                let data = if counter {
                    Data::Sum(Sum {
                        data_points: Vec::new(),
                        aggregation_temporality: AggregationTemporality::Cumulative as i32,
                        is_monotonic: true,
                    })
                } else {
                    Data::Gauge(Gauge { data_points: Vec::new() })
                };
                metrics.push(Metric {
                    name: name.clone(),
                    description: family.help().to_owned(),
                    data: Some(data),
                    ..Default::default()
                });
            }
            match metrics.last_mut().and_then(|m| m.data.as_mut()) {
                Some(Data::Sum(sum)) => sum.data_points.push(point),
                Some(Data::Gauge(gauge)) => gauge.data_points.push(point),
                _ => {}
            }
        }
        Ok(())
    }
}
