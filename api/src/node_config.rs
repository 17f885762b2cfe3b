//! What the operator renders for one node and the node agent runs: the merged
//! neuron-monitor configuration, plus the routing table that says which
//! NeuronMonitorConfig gets which applications, groups and sinks.
//!
//! It travels in the ConfigMap `neuron-monitor-node-<node>` of the operator's
//! namespace, under [`NODE_CONFIG_KEY`], with its [`content_hash`] in the
//! [`CONFIG_HASH_ANNOTATION`]. The agent acknowledges what it runs by writing that hash
//! to [`APPLIED_HASH_ANNOTATION`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::hash::content_hash;
use crate::{
    crd::{CloudWatchSinkSpec, DeviceTaintEffect, OtlpSinkSpec},
    duration::Period,
    gpu_groups::GpuGroups,
    monitor_config::{MonitorConfig, RuntimeGroup, SystemGroup},
};

pub const NODE_CONFIG_KEY: &str = "node-config.json";
pub const CONFIG_HASH_ANNOTATION: &str = "neuronmonitor.io/config-hash";
pub const APPLIED_HASH_ANNOTATION: &str = "neuronmonitor.io/applied-hash";
/// Label (value `"true"`) on every node ConfigMap, so the operator can select them.
pub const MANAGED_LABEL: &str = "neuronmonitor.io/node-config";
/// Annotation naming the node a ConfigMap is for (node names can be too long for a label).
pub const NODE_ANNOTATION: &str = crate::names::NODE_ANNOTATION;
/// The merged neuron-monitor configuration alone, for people reading the ConfigMap.
pub const MONITOR_CONFIG_KEY: &str = "neuron-monitor.json";
const CONFIGMAP_PREFIX: &str = "neuron-monitor-node-";

/// The name of a node's ConfigMap. Node names are DNS subdomains (≤ 253 characters);
/// the longest ones are shortened with a hash so the name stays valid.
pub fn configmap_name(node: &str) -> String {
    let name = format!("{CONFIGMAP_PREFIX}{node}");
    if name.len() <= 253 {
        return name;
    }
    let hash = content_hash(node.as_bytes());
    format!("{}-{hash}", &name[..253 - hash.len() - 1].trim_end_matches(['.', '-']))
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeConfig {
    /// Given to neuron-monitor: the union of every route's groups, each at its shortest
    /// period, for the union of their applications.
    pub monitor: MonitorConfig,
    /// One route per NeuronMonitorConfig that applies to the node, sorted by config.
    pub routes: Vec<Route>,
    /// The hardware-health settings of one config of the operator's namespace (the first
    /// in [`ValidConfig::precedes`] order that has a `health` section); `None`: the
    /// agent's flags, no taint, no CloudWatch Logs. Absent from the JSON when `None`, so
    /// configurations without it keep their content hash.
    ///
    /// [`ValidConfig::precedes`]: crate::validate::ValidConfig::precedes
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<NodeHealth>,
    /// The GPU collector, as the configs of the operator's namespace with a `gpu` section
    /// ask for it together ([`NodeGpu::merge`]); `None`: the agent's defaults (on, at its
    /// `--period`). Absent from the JSON when `None`, so configurations without it keep
    /// their content hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<NodeGpu>,
}

/// What the agent's GPU collector does on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpu {
    /// Off: no NVML read, no GPU series.
    pub enabled: bool,
    /// The collection's period.
    pub period: Period,
    /// What is collected of each GPU; every group unless a config names fewer. Absent
    /// from the JSON when every group, so configurations without it keep their hash.
    #[serde(default, skip_serializing_if = "GpuGroups::is_all")]
    pub groups: GpuGroups,
}

impl NodeGpu {
    /// Several configs' settings on one node: on when any of them is, at the shortest
    /// period of those that are on (as neuron-monitor's groups take the shortest period
    /// any config asks for), with every group any of those names; off only when all of
    /// them are. The order does not matter. `None` when none is given.
    pub fn merge(settings: impl IntoIterator<Item = NodeGpu>) -> Option<NodeGpu> {
        settings.into_iter().reduce(|a, b| match (a.enabled, b.enabled) {
            (true, false) => a,
            (false, true) => b,
            (both, _) => NodeGpu { enabled: both, period: a.period.min(b.period), groups: a.groups.union(b.groups) },
        })
    }
}

/// What the agent does with the devices' health, as one config asked (defaults resolved,
/// except those the agent's flags give).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealth {
    /// `namespace/name` of the config these settings come from.
    pub config: String,
    /// The Node condition's type; `None`: the agent's `--health-condition-type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_type: Option<String>,
    /// The NoSchedule taint; `None`: no taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint: Option<NodeTaint>,
    /// The kernel-log look-back at start-up; `None`: the agent's `--kmsg-lookback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kmsg_look_back: Option<Period>,
    /// The CloudWatch Logs event stream; `None`: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<LogDestination>,
    /// A DeviceTaintRule per unhealthy DRA-managed device; `None`: off. Absent from the
    /// JSON when `None`, so configurations without it keep their content hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_taints: Option<NodeDeviceTaints>,
    /// Occurrences within a window that turn a device unhealthy, per error name (sorted
    /// by name, each once); an error not listed: its first occurrence. Absent from the
    /// JSON when empty, so configurations without thresholds keep their content hash.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds: Vec<FaultThreshold>,
}

/// The DeviceTaintRules of the node's unhealthy devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeDeviceTaints {
    pub effect: DeviceTaintEffect,
}

/// `count` occurrences of `error` within `window` turn a device unhealthy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FaultThreshold {
    pub error: String,
    pub count: u32,
    pub window: Period,
}

/// The error names of states rather than occurrences (a device state, an unhealthy
/// component): they last as long as the driver says so, and take no threshold.
pub const STATE_ERRORS: [&str; 2] = ["DEVICE_STATE_INVALID", "UNHEALTHY_COMPONENT"];

/// The error names that taint the node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTaint {
    /// Sorted, without duplicates.
    #[serde(default = "default_taint_errors")]
    pub errors: Vec<String>,
}

impl Default for NodeTaint {
    fn default() -> Self {
        NodeTaint { errors: default_taint_errors() }
    }
}

/// The errors that taint by default: the fatal `NEURON_HW_ERR` names (those AWS's
/// node-problem-detector configuration treats as permanent; the instance is replaced).
pub const DEFAULT_TAINT_ERRORS: [&str; 5] = [
    "DMA_ERROR",
    "HANG_ON_COLLECTIVES",
    "HBM_UNCORRECTABLE_ERROR",
    "NC_UNCORRECTABLE_ERROR",
    "SRAM_UNCORRECTABLE_ERROR",
];

fn default_taint_errors() -> Vec<String> {
    DEFAULT_TAINT_ERRORS.map(str::to_owned).to_vec()
}

/// The health condition's type when neither a config nor the agent's flag sets one.
pub const DEFAULT_CONDITION_TYPE: &str = "NeuronHealth";

/// The default CloudWatch Logs group of the hardware events.
pub const DEFAULT_LOG_GROUP: &str = "/aws/neuron/hardware-events";

/// Where the hardware events go in CloudWatch Logs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogDestination {
    pub group: String,
    /// `None`: the node's own region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

impl LogDestination {
    /// The field that is not valid, if one is not (a destination from the agent's flags
    /// or a hand-written node configuration has not been through admission).
    pub fn check(&self) -> Result<(), &'static str> {
        if crate::cloudwatch::logs::check_log_group(&self.group).is_err() {
            return Err("group");
        }
        match &self.region {
            Some(r) if !crate::region::valid_region(r) => Err("region"),
            _ => Ok(()),
        }
    }
}

/// What one NeuronMonitorConfig receives on this node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// `namespace/name` of the NeuronMonitorConfig.
    pub config: String,
    /// Only applications of pods in this namespace; `None`: every application (a config
    /// in the operator's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Applications (by tag) and their runtime groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runtimes: Vec<RouteRuntimes>,
    /// Node-level groups (only for configs in the operator's namespace).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_groups: Vec<SystemGroup>,
    /// Prometheus export; `None` when disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusRoute>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloudwatch: Option<CloudWatchSinkSpec>,
    /// The OTLP sink, as the config gives it (the agent checks it with
    /// [`OtlpSettings::check`](crate::otlp::OtlpSettings::check)); absent from the JSON
    /// when `None`, so routes without it keep their content hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpSinkSpec>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteRuntimes {
    /// Regular expression on the application tag; `None`: every application.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_filter: Option<String>,
    pub groups: Vec<RuntimeGroup>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusRoute {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra_labels: BTreeMap<String, String>,
    /// `neuron_runtime_loaded_model_info` of the route's applications; absent from the
    /// JSON when off, so routes without it keep their content hash.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub loaded_model_info: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu_groups::GpuGroup;

    #[test]
    fn configmap_names_stay_valid() {
        assert_eq!(configmap_name("ip-10-0-1-5.ec2.internal"), "neuron-monitor-node-ip-10-0-1-5.ec2.internal");
        let long = "a".repeat(253);
        let name = configmap_name(&long);
        assert_eq!(name.len(), 253);
        assert_ne!(name, configmap_name(&format!("{}b", "a".repeat(252))));
    }

    #[test]
    fn gpu_settings_merge_on_when_any_is_at_the_shortest_period_of_those_on() {
        let on = |s| NodeGpu { enabled: true, period: Period::from_secs(s), groups: GpuGroups::ALL };
        let off = |s| NodeGpu { enabled: false, period: Period::from_secs(s), groups: GpuGroups::ALL };
        assert_eq!(NodeGpu::merge([]), None);
        assert_eq!(NodeGpu::merge([on(10), on(2), on(30)]), Some(on(2)));
        assert_eq!(NodeGpu::merge([off(1), on(10), off(2)]), Some(on(10)));
        assert_eq!(NodeGpu::merge([off(3), off(2)]), Some(off(2)));
        assert_eq!(NodeGpu::merge([on(10), off(1)]), NodeGpu::merge([off(1), on(10)]));
    }

    #[test]
    fn gpu_groups_merge_as_the_union_of_the_configs_that_are_on() {
        let with = |enabled, groups: &[GpuGroup]| NodeGpu {
            enabled,
            period: Period::from_secs(5),
            groups: groups.iter().copied().collect(),
        };
        let merged = NodeGpu::merge([
            with(true, &[GpuGroup::Utilization]),
            with(false, &[GpuGroup::Nvlink]),
            with(true, &[GpuGroup::Memory]),
        ]);
        assert_eq!(merged, Some(with(true, &[GpuGroup::Utilization, GpuGroup::Memory])));
        // Named groups travel; every group (the default) is left out.
        let json = serde_json::to_string(&with(true, &[GpuGroup::Pcie])).unwrap();
        assert!(json.contains(r#""groups":["pcie"]"#), "{json}");
        let all = serde_json::to_string(&with(true, &GpuGroup::ALL)).unwrap();
        assert!(!all.contains("groups"), "{all}");
    }

    #[test]
    fn a_node_configuration_without_gpu_settings_has_no_gpu_key() {
        let json = serde_json::to_string(&NodeConfig::default()).unwrap();
        assert!(!json.contains("gpu"), "{json}");
        let with: NodeConfig =
            serde_json::from_str(r#"{"monitor":{},"routes":[],"gpu":{"enabled":false,"period":"30s"}}"#).unwrap();
        assert_eq!(with.gpu, Some(NodeGpu { enabled: false, period: Period::from_secs(30), groups: GpuGroups::ALL }));
    }

    #[test]
    fn hash_is_stable() {
        assert_eq!(content_hash(b""), "cbf29ce484222325");
        assert_eq!(content_hash(b"a"), "af63dc4c8601ec8c");
    }
}
