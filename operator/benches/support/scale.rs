//! A synthetic cluster for the rendering benchmark and `examples/render_scale.rs`:
//! Neuron nodes with ~10 labels across a few instance types, zones and node groups,
//! and configs spread over ~100 namespaces (~20% with node selectors, some with
//! expressions, a few pinned to single hosts, a few in the operator's namespace).
//! Deterministic: a fixed-seed generator, no dependency.

use std::collections::BTreeMap;

use api::crd::NeuronMonitorConfig;
use serde_json::{json, Value};

pub const OPERATOR_NS: &str = "neuron-monitor";

/// A node as rendering takes it: name and labels.
pub type NodeLabels = (String, BTreeMap<String, String>);

const TYPES: [&str; 5] = ["inf2.xlarge", "inf2.48xlarge", "trn1.32xlarge", "trn1n.32xlarge", "trn2.48xlarge"];
const ZONES: [&str; 3] = ["us-east-1a", "us-east-1b", "us-east-1c"];
const CAPACITY: [&str; 2] = ["ON_DEMAND", "SPOT"];
const TEAMS: [&str; 8] = ["search", "ads", "llm", "vision", "speech", "recsys", "infra", "research"];
const PERIODS: [&str; 6] = ["1s", "2s", "5s", "10s", "30s", "1m"];
const RUNTIME_GROUPS: [&str; 4] =
    ["neuroncore_counters", "memory_used", "neuron_runtime_vcpu_usage", "execution_stats"];

/// xorshift64*: enough variety, the same on every run.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

pub fn host(i: usize) -> String {
    format!("ip-10-{}-{}-{}.ec2.internal", i / 65536 % 256, i / 256 % 256, i % 256)
}

/// `count` nodes, each in a node group (instance type × zone × capacity type), most
/// dedicated to a team.
pub fn nodes(count: usize, rng: &mut Rng) -> Vec<NodeLabels> {
    (0..count)
        .map(|i| {
            let t = *rng.pick(&TYPES);
            let zone = *rng.pick(&ZONES);
            let capacity = if rng.chance(20) { CAPACITY[1] } else { CAPACITY[0] };
            let group = format!("ng-{}-{}-{}", t.replace('.', "-"), zone, capacity.to_lowercase());
            let name = host(i);
            let mut labels: BTreeMap<String, String> = [
                ("kubernetes.io/hostname", name.as_str()),
                ("kubernetes.io/arch", "amd64"),
                ("kubernetes.io/os", "linux"),
                ("node.kubernetes.io/instance-type", t),
                ("topology.kubernetes.io/zone", zone),
                ("topology.kubernetes.io/region", "us-east-1"),
                ("eks.amazonaws.com/nodegroup", group.as_str()),
                ("eks.amazonaws.com/capacityType", capacity),
                ("neuron.amazonaws.com/neuron-device", "true"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            // Node groups are dedicated to a team, keyed by their type and zone.
            let team = TEAMS[(TYPES.iter().position(|x| *x == t).unwrap_or(0) * 3
                + ZONES.iter().position(|z| *z == zone).unwrap_or(0))
                % TEAMS.len()];
            labels.insert("team".into(), team.into());
            (name, labels)
        })
        .collect()
}

fn selector(rng: &mut Rng, node_count: usize) -> Value {
    match rng.below(8) {
        0 => json!({"matchLabels": {"node.kubernetes.io/instance-type": rng.pick(&TYPES)}}),
        1 => json!({"matchLabels": {"topology.kubernetes.io/zone": rng.pick(&ZONES)}}),
        2 => json!({"matchLabels": {"team": rng.pick(&TEAMS)}}),
        3 => json!({"matchExpressions": [
            {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": [rng.pick(&TYPES), rng.pick(&TYPES)]},
            {"key": "eks.amazonaws.com/capacityType", "operator": "NotIn", "values": ["SPOT"]}
        ]}),
        4 => json!({"matchLabels": {"team": rng.pick(&TEAMS)},
                    "matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": [rng.pick(&ZONES)]}]}),
        5 => json!({"matchExpressions": [{"key": "team", "operator": "Exists"},
                                         {"key": "node-role.kubernetes.io/debug", "operator": "DoesNotExist"}]}),
        6 => {
            json!({"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "NotIn", "values": [rng.pick(&ZONES)]}]})
        }
        // Pinned to a few hosts (someone debugging): many distinct node signatures.
        _ => {
            let hosts: Vec<String> = (0..3).map(|_| host(rng.below(node_count))).collect();
            json!({"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": hosts}]})
        }
    }
}

fn runtimes(rng: &mut Rng, namespace: &str) -> Option<Value> {
    if rng.chance(40) {
        return None;
    }
    let entries: Vec<Value> = (0..1 + rng.below(3))
        .map(|e| {
            let mut groups: Vec<&str> = RUNTIME_GROUPS.iter().copied().filter(|_| rng.chance(60)).collect();
            if groups.is_empty() {
                groups.push(RUNTIME_GROUPS[e % 4]);
            }
            let metrics: Vec<Value> =
                groups
                    .iter()
                    .map(|g| {
                        if rng.chance(20) {
                            json!({"type": g, "period": rng.pick(&PERIODS)})
                        } else {
                            json!({"type": g})
                        }
                    })
                    .collect();
            let mut entry = json!({"metrics": metrics});
            if rng.chance(80) {
                entry["tagFilter"] = json!(match rng.below(3) {
                    0 => format!("^{namespace}-serve-[0-9]+$"),
                    1 => format!("^{namespace}-(train|finetune)-"),
                    _ => "(?i)(bert|llama|mistral)".to_owned(),
                });
            }
            if rng.chance(30) {
                entry["period"] = json!(rng.pick(&PERIODS));
            }
            entry
        })
        .collect();
    Some(json!(entries))
}

/// `count` configs over `namespaces` team namespaces, plus `operator_configs` in the
/// operator's namespace.
pub fn configs(
    count: usize,
    namespaces: usize,
    operator_configs: usize,
    node_count: usize,
    rng: &mut Rng,
) -> Vec<NeuronMonitorConfig> {
    (0..count + operator_configs)
        .map(|i| {
            let cluster_wide = i >= count;
            let namespace = if cluster_wide { OPERATOR_NS.to_owned() } else { format!("team-{:03}", i % namespaces) };
            let mut spec = json!({});
            if rng.chance(50) {
                spec["period"] = json!(rng.pick(&PERIODS));
            }
            if rng.chance(20) {
                spec["nodeSelector"] = selector(rng, node_count);
            }
            if let Some(r) = runtimes(rng, &namespace) {
                spec["runtimes"] = r;
            }
            if cluster_wide && rng.chance(50) {
                spec["systemMetrics"] = json!({"period": rng.pick(&PERIODS), "metrics": [{"type": "vcpu_usage"}, {"type": "neuron_hw_counters", "period": "1m"}]});
            }
            let mut sinks = json!({});
            if rng.chance(30) {
                sinks["prometheus"] = json!({"extraLabels": {"team": namespace, "cost_center": format!("cc-{}", i % 37), "env": "prod"}});
            } else if rng.chance(5) {
                sinks["prometheus"] = json!({"enabled": false});
            }
            if rng.chance(30) {
                sinks["cloudwatch"] = json!({
                    "namespace": format!("{namespace}/Neuron"),
                    "dimensions": ["ClusterName", "NodeName", "NeuronCore", "Namespace", "PodName"],
                    "rollups": [["ClusterName"], ["ClusterName", "Namespace"]],
                    "metrics": ["neuroncore_utilization", "neuron_execution_errors", "neuron_execution_latency"],
                    "storageResolution": 60,
                    "flushInterval": "60s"
                });
            }
            spec["sinks"] = sinks;
            let mut config = NeuronMonitorConfig::new(&format!("nmc-{i:04}"), serde_json::from_value(spec).unwrap());
            config.metadata.namespace = Some(namespace);
            config
        })
        .collect()
}

/// The benchmark's case: 5,000 nodes, 500 configs over 100 namespaces (5 of them in the
/// operator's namespace).
pub fn cluster() -> (Vec<NodeLabels>, Vec<NeuronMonitorConfig>) {
    let mut rng = Rng::new(0x5eed);
    let nodes = nodes(5_000, &mut rng);
    let configs = configs(495, 100, 5, nodes.len(), &mut rng);
    (nodes, configs)
}
