//! The `NeuronMonitorConfig` custom resource (`neuronmonitor.io/v1alpha1`, namespaced,
//! short name `nmc`).
//!
//! A config applies to the Neuron and NVIDIA GPU nodes its `nodeSelector` matches. It sees the Neuron
//! applications of pods in its own namespace; a config in the operator's namespace sees
//! every application and may also ask for the node-level (system) groups.
//!
//! Everything the API server can check is in the schema (enums, bounds, patterns, CEL
//! rules), so a bad object is refused at `kubectl apply` with the field named. What it
//! cannot check (a regex that does not compile, a selector that matches nothing) the
//! operator reports in the `Accepted` condition.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::{
    gpu_groups::GpuGroup,
    limits::{
        MAX_CLOUDWATCH_NAMESPACE_BYTES, MAX_DATUM_DIMENSIONS, MAX_ERROR_NAME_BYTES, MAX_EXTRA_LABELS,
        MAX_FAULT_THRESHOLDS, MAX_LOG_GROUP_BYTES, MAX_OTLP_ENDPOINT_BYTES, MAX_ROLLUPS, MAX_RUNTIME_ENTRIES,
        MAX_SECRET_NAME_BYTES, MAX_TAG_FILTER_BYTES, MAX_TAINT_ERRORS, MAX_THRESHOLD_COUNT,
    },
    monitor_config::{RuntimeGroup, SystemGroup},
    region::MAX_REGION_BYTES,
};

/// CEL bounds shared by every period field: a duration from 1 s to 1 h.
const PERIOD_RULE: &str = "duration(self) >= duration('1s') && duration(self) <= duration('1h')";
const PERIOD_MESSAGE: &str = "must be a duration from 1s to 1h, such as 1s, 30s or 5m";
/// A list of metric groups names each group once.
const UNIQUE_TYPES: &str = "self.all(x, self.exists_one(y, y.type == x.type))";
/// One number and one unit, as neuron-monitor reads them.
const PERIOD_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(ms|s|m|h)$";

// Several `printcolumn`s are one attribute each, as kube's derive wants them.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "neuronmonitor.io",
    version = "v1alpha1",
    kind = "NeuronMonitorConfig",
    namespaced,
    shortname = "nmc",
    category = "neuron",
    status = "NeuronMonitorConfigStatus",
    doc = "What neuron-monitor collects on Neuron nodes (and the agent on NVIDIA GPU nodes), and where the metrics go",
    printcolumn(
        name = "Matched",
        type_ = "integer",
        json_path = ".status.matchedNodes",
        description = "Nodes whose configuration carries this config"
    ),
    printcolumn(
        name = "Applied",
        type_ = "integer",
        json_path = ".status.appliedNodes",
        description = "Nodes whose agent runs this config"
    ),
    printcolumn(
        name = "Unhealthy",
        type_ = "integer",
        json_path = ".status.unhealthyNodes",
        description = "Matched nodes whose Neuron health condition is True"
    ),
    printcolumn(name = "Accepted", type_ = "string", json_path = ".status.conditions[?(@.type==\"Accepted\")].status"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct NeuronMonitorConfigSpec {
    /// Nodes this configuration applies to (a label selector). Default: every Neuron node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,

    /// Default period of every metric group. Default: 5s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub period: Option<String>,

    /// Which Neuron applications to watch (by tag) and which runtime groups to collect.
    /// Default: every application, every runtime group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_RUNTIME_ENTRIES))]
    pub runtimes: Option<Vec<RuntimeSelectorSpec>>,

    /// Node-level groups (vCPU, memory, ECC counters). Only configs in the operator's
    /// namespace may set this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_metrics: Option<SystemMetricsSpec>,

    /// Where the metrics go. Default: Prometheus only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sinks: Option<SinksSpec>,

    /// Hardware health on the matched nodes: the Node condition's type, an optional
    /// NoSchedule taint, the kernel-log look-back, a CloudWatch Logs event stream. Only
    /// configs in the operator's namespace may set this. Default: metrics, the condition
    /// `NeuronHealth` and Events on; no taint; no CloudWatch Logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSpec>,

    /// NVIDIA GPUs of the matched nodes (those with a GPU and its driver): whether the
    /// agent collects them and how often. Only configs in the operator's namespace may
    /// set this. Default: collected at the agent's `--period` (5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<GpuSpec>,
}

/// The GPU collector of the matched nodes (NVML, one read of every GPU per period).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuSpec {
    /// Collect the node's GPUs. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Period of the GPU collection. Default: the config's period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub period: Option<String>,

    /// The groups of values collected and exported (`utilization`, `memory`,
    /// `temperature`, `power`, `clocks`, `pcie`, `ecc`, `nvlink`, `processes`). Default:
    /// all of them. ECC is read for the GPUs' health whatever this says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 16))]
    pub groups: Option<Vec<GpuGroup>>,
}

/// Node condition types the kubelet writes: the health condition must never replace one.
pub const KUBELET_CONDITION_TYPES: [&str; 5] =
    ["Ready", "MemoryPressure", "DiskPressure", "PIDPressure", "NetworkUnavailable"];
/// A condition type: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// letters, digits, `-`, `_`, `.` starting and ending with a letter or digit.
pub const CONDITION_TYPE_PATTERN: &str = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// An error name as the kernel log writes it (`NEURON_HW_ERR=<NAME>`), or the agent's
/// name for a sysfs signal.
pub const ERROR_NAME_PATTERN: &str = r"^[A-Z][A-Z0-9_]{0,63}$";
/// A CloudWatch Logs group name (CreateLogGroup's characters).
pub const LOG_GROUP_PATTERN: &str = r"^[A-Za-z0-9_/.#-]+$";
/// An AWS region, as for the CloudWatch sink.
pub const REGION_PATTERN: &str = r"^[a-z]{2}(-[a-z]+)+-[0-9]+$";

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthSpec {
    /// Type of the Node condition carrying the devices' health. Default: the agent's
    /// `--health-condition-type` (`NeuronHealth`). Never one of the kubelet's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 317), regex(pattern = CONDITION_TYPE_PATTERN))]
    #[x_kube(validation = Rule::new("!(self in ['Ready', 'MemoryPressure', 'DiskPressure', 'PIDPressure', 'NetworkUnavailable'])").message("must not be a condition type the kubelet writes"))]
    pub condition_type: Option<String>,

    /// A NoSchedule taint on a node with a fatal error, so that new pods stop landing
    /// on it. Default: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taint: Option<HealthTaintSpec>,

    /// Kernel-log records this old are still taken when the agent starts (1s to 24h).
    /// Default: the agent's `--kmsg-lookback` (5m). A change applies at the next start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(LOOK_BACK_RULE).message(LOOK_BACK_MESSAGE))]
    pub kmsg_look_back: Option<String>,

    /// One JSON event per fault and per state change in CloudWatch Logs, one stream per
    /// instance. Absent: no CloudWatch Logs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logs: Option<HealthLogsSpec>,

    /// On nodes whose Neuron devices Dynamic Resource Allocation manages (driver
    /// `neuron.aws.com`): a DeviceTaintRule for each unhealthy device alone, removed when
    /// the device is healthy again. Needs the DeviceTaintRule API (Kubernetes 1.33 to 1.35
    /// with its alpha feature gates, served by default from 1.36); a config asking for it
    /// elsewhere is refused. Default: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_taints: Option<HealthDeviceTaintsSpec>,

    /// How many occurrences of an error within a window turn a device unhealthy, per error
    /// name (a kernel-log record or a counter's increase is an occurrence). An error not
    /// listed turns it unhealthy at its first occurrence. Default: none listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_FAULT_THRESHOLDS), extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["error"]))]
    pub thresholds: Option<Vec<FaultThresholdSpec>>,
}

/// What a DeviceTaintRule's taint does to the claims of the device (and their pods).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DeviceTaintEffect {
    /// Informs (Kubernetes 1.35 and later): nothing is kept off the device.
    #[serde(rename = "None")]
    Inform,
    /// New claims do not get the device; pods already on it stay.
    #[default]
    NoSchedule,
    /// As NoSchedule, and the pods already using the device are evicted.
    NoExecute,
}

impl DeviceTaintEffect {
    /// The value of the taint's `effect`.
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceTaintEffect::Inform => "None",
            DeviceTaintEffect::NoSchedule => "NoSchedule",
            DeviceTaintEffect::NoExecute => "NoExecute",
        }
    }
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthDeviceTaintsSpec {
    /// Publish a DeviceTaintRule for each unhealthy device. Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// The taint's effect: `None` (to inform; Kubernetes 1.35 and later), `NoSchedule` or
    /// `NoExecute`. Default: NoSchedule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<DeviceTaintEffect>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FaultThresholdSpec {
    /// The error name (`NEURON_HW_ERR` names, or the agent's names for counted sysfs
    /// signals such as EXECUTION_HARDWARE_ERROR).
    #[schemars(length(max = MAX_ERROR_NAME_BYTES), regex(pattern = ERROR_NAME_PATTERN))]
    #[x_kube(validation = Rule::new(NOT_A_STATE_RULE).message("is a state, not an error that occurs: it turns the device unhealthy while it lasts"))]
    pub error: String,

    /// Occurrences within `window` that turn the device unhealthy (1 to 100).
    #[schemars(range(min = 1, max = MAX_THRESHOLD_COUNT))]
    pub count: u32,

    /// The window the occurrences are counted in (1s to 24h), such as 10m.
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(LOOK_BACK_RULE).message(WINDOW_MESSAGE))]
    pub window: String,
}

const WINDOW_MESSAGE: &str = "must be a duration from 1s to 24h, such as 10m";
/// The names of [`crate::node_config::STATE_ERRORS`], as CEL sees them.
const NOT_A_STATE_RULE: &str = "!(self in ['DEVICE_STATE_INVALID', 'UNHEALTHY_COMPONENT'])";

const LOOK_BACK_RULE: &str = "duration(self) >= duration('1s') && duration(self) <= duration('24h')";
const LOOK_BACK_MESSAGE: &str = "must be a duration from 1s to 24h, such as 5m";

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthTaintSpec {
    /// Taint nodes with a fatal error. Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// The error names that taint (`NEURON_HW_ERR` names, or the agent's names for sysfs
    /// signals such as DEVICE_STATE_INVALID). Default: SRAM_UNCORRECTABLE_ERROR,
    /// NC_UNCORRECTABLE_ERROR, HBM_UNCORRECTABLE_ERROR, DMA_ERROR, HANG_ON_COLLECTIVES.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_TAINT_ERRORS), extend("x-kubernetes-list-type" = "set"), inner(length(max = MAX_ERROR_NAME_BYTES), regex(pattern = ERROR_NAME_PATTERN)))]
    pub errors: Option<Vec<String>>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HealthLogsSpec {
    /// Log group. Default: /aws/neuron/hardware-events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_LOG_GROUP_BYTES), regex(pattern = LOG_GROUP_PATTERN))]
    #[x_kube(validation = Rule::new("!self.startsWith('aws/')").message("log groups starting with aws/ are reserved for AWS services"))]
    pub group: Option<String>,

    /// AWS region. Default: the node's own region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_REGION_BYTES), regex(pattern = REGION_PATTERN))]
    pub region: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSelectorSpec {
    /// Regular expression matched against the application's tag (`NEURON_PROCESS_TAG`,
    /// or its PID). Default: every application.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_TAG_FILTER_BYTES))]
    pub tag_filter: Option<String>,

    /// Period of this entry's groups. Default: the config's period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub period: Option<String>,

    /// Runtime metric groups to collect.
    #[schemars(length(min = 1, max = 4))]
    #[x_kube(validation = Rule::new(UNIQUE_TYPES).message("each metric group may appear once"))]
    pub metrics: Vec<RuntimeMetricGroup>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SystemMetricsSpec {
    /// Period of the system groups. Default: the config's period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub period: Option<String>,

    /// System metric groups to collect.
    #[schemars(length(min = 1, max = 3))]
    #[x_kube(validation = Rule::new(UNIQUE_TYPES).message("each metric group may appear once"))]
    pub metrics: Vec<SystemMetricGroup>,
}

/// One runtime metric group, optionally with its own period.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeMetricGroup {
    #[serde(rename = "type")]
    pub kind: RuntimeGroup,

    /// Period of this group. Default: the entry's period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub period: Option<String>,
}

/// One system metric group, optionally with its own period.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SystemMetricGroup {
    #[serde(rename = "type")]
    pub kind: SystemGroup,

    /// Period of this group. Default: the system metrics' period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub period: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SinksSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusSinkSpec>,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cloudwatch: Option<CloudWatchSinkSpec>,

    /// OpenTelemetry metrics over OTLP/HTTP: CloudWatch's OTLP endpoint (the default) or
    /// any OTLP receiver, with the names and labels of `/metrics`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpSinkSpec>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PrometheusSinkSpec {
    /// Export this config's metrics on the agents' /metrics. Default: true.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// Labels added to every series of this config's applications.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("maxProperties" = MAX_EXTRA_LABELS))]
    #[x_kube(validation = Rule::new("self.all(k, k.matches('^[a-zA-Z_][a-zA-Z0-9_]{0,62}$') && !(k in ['job', 'instance', 'node', 'agent_pod', 'mode', 'instance_name', 'instance_id', 'instance_type', 'availability_zone', 'region', 'subnet_id', 'runtime_tag', 'namespace', 'pod', 'container', 'neuroncore', 'physical_neuroncore', 'memory_location', 'usage_type', 'error_type', 'status_type', 'percentile', 'event_type', 'neuron_device_index', 'ecs_task_arn', 'ecs_task_family', 'ecs_container']))").message("label names must be Prometheus label names and not one the metrics already use"))]
    #[x_kube(validation = Rule::new("self.all(k, size(self[k]) <= 128)").message("label values are at most 128 characters"))]
    pub extra_labels: Option<BTreeMap<String, String>>,

    /// Also export `neuron_runtime_loaded_model_info`: a series for each model an
    /// application has loaded (up to 32 per application), on `/metrics` and through the
    /// OTLP sink. On a node of many applications this family is the larger part of the
    /// page (half of a 32-application trn1n.32xlarge's). Default: false (the count of
    /// models by state, `neuron_runtime_loaded_models`, is always exported).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loaded_model_info: Option<bool>,
}

impl PrometheusSinkSpec {
    /// Whether the config's applications get `neuron_runtime_loaded_model_info` on
    /// `/metrics` and through the OTLP sink (which sends the families of `/metrics`):
    /// asked for, and Prometheus not turned off.
    pub fn exports_model_info(&self) -> bool {
        self.enabled != Some(false) && self.loaded_model_info == Some(true)
    }
}

/// A CloudWatch dimension the agent can fill in.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Dimension {
    ClusterName,
    NodeName,
    InstanceId,
    InstanceType,
    AmiId,
    AvailabilityZone,
    NeuronCore,
    NeuronDevice,
    RuntimeTag,
    Namespace,
    PodName,
    /// The container's name: the pod's container on Kubernetes, the task definition's
    /// container on ECS.
    ContainerName,
    /// On ECS: the task's ARN.
    TaskArn,
    /// On ECS: the task definition's family.
    TaskDefinitionFamily,
}

/// Metric names as CloudWatch users of Neuron already see them (Container Insights).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
pub enum CloudWatchMetric {
    NeuroncoreUtilization,
    NeuroncoreMemoryUsageConstants,
    NeuroncoreMemoryUsageModelCode,
    NeuroncoreMemoryUsageModelSharedScratchpad,
    NeuroncoreMemoryUsageRuntimeMemory,
    NeuroncoreMemoryUsageTensors,
    NeurondeviceRuntimeMemoryUsedBytes,
    NeuronExecutionErrors,
    NeuronExecutionStatus,
    NeuronExecutionLatency,
    NeurondeviceHwEccEvents,
    /// 1 while the device has a fatal hardware fault, 0 while it is healthy; nothing
    /// while its health is unknown (an alarm treats missing data as it chooses).
    NeurondeviceUnhealthy,
    /// The node's NeuronCores by allocation state (`State`: allocatable, allocated,
    /// allocated_idle), from what the kubelet says (device plugin and DRA alike).
    NeuronNodeNeuroncores,
    /// The NeuronCores allocated to each pod the config sees, by state (`State`:
    /// allocated, allocated_idle), device plugin and DRA alike. Sent only where
    /// `metrics` lists it: a series per pod.
    NeuronPodNeuroncores,
}

/// The variants of [`CloudWatchMetric`]: the most a `metrics` list holds.
pub const CLOUDWATCH_METRICS: usize = 14;

/// How a CloudWatch sink names what it publishes.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CloudWatchNaming {
    /// This project's metrics (`metrics`), under `dimensions` and `rollups`.
    #[default]
    Classic,
    /// The names, units and dimension sets of CloudWatch Container Insights' Neuron
    /// metrics (`node_…`, `pod_…`, `container_…`), so its dashboards and alarms work on
    /// this data. Fixed: `dimensions`, `rollups` and `metrics` do not apply.
    ContainerInsights,
}

/// With Container Insights naming, the dimension sets and metrics are Container
/// Insights' own: a list of ours would be silently meaningless, so it is refused.
const INSIGHTS_FIXED: &str = "Container Insights naming publishes its own metrics and dimension sets";

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.naming) || self.naming != 'ContainerInsights' || !has(self.dimensions)").message(INSIGHTS_FIXED).field_path(".dimensions"))]
#[x_kube(validation = Rule::new("!has(self.naming) || self.naming != 'ContainerInsights' || !has(self.rollups)").message(INSIGHTS_FIXED).field_path(".rollups"))]
#[x_kube(validation = Rule::new("!has(self.naming) || self.naming != 'ContainerInsights' || !has(self.metrics)").message(INSIGHTS_FIXED).field_path(".metrics"))]
pub struct CloudWatchSinkSpec {
    /// CloudWatch namespace of the metrics, e.g. `TeamA/Neuron` (`ContainerInsights` for
    /// Container Insights' own dashboards).
    #[schemars(length(min = 1, max = MAX_CLOUDWATCH_NAMESPACE_BYTES), regex(pattern = r"^[A-Za-z0-9._/#: -]+$"))]
    #[x_kube(validation = Rule::new("!self.startsWith('AWS/')").message("namespaces starting with AWS/ are reserved for AWS services"))]
    pub namespace: String,

    /// AWS region. Default: the node's own region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_REGION_BYTES), regex(pattern = REGION_PATTERN))]
    pub region: Option<String>,

    /// Names, units and dimension sets: `Classic` (default) or `ContainerInsights`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub naming: Option<CloudWatchNaming>,

    /// Dimensions of every metric. Default: ClusterName, NodeName, NeuronCore,
    /// NeuronDevice, Namespace, PodName, ContainerName.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_DATUM_DIMENSIONS), extend("x-kubernetes-list-type" = "set"))]
    pub dimensions: Option<Vec<Dimension>>,

    /// Coarser dimension sets under which every metric is also published (as the
    /// CloudWatch agent's aggregation dimensions), e.g. `[[ClusterName], [ClusterName, Namespace]]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "rollups_schema")]
    pub rollups: Option<Vec<Vec<Dimension>>>,

    /// Metrics to publish. Default: all of them but `neuron_pod_neuroncores` (a series per
    /// pod), which is sent only where listed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = CLOUDWATCH_METRICS), extend("x-kubernetes-list-type" = "set"))]
    pub metrics: Option<Vec<CloudWatchMetric>>,

    /// Storage resolution in seconds: 1 (high resolution) or 60. Default: 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 1 || self == 60").message("storage resolution is 1 or 60 seconds"))]
    pub storage_resolution: Option<i32>,

    /// How often collected samples are sent. Default: 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub flush_interval: Option<String>,
}

/// At most [`MAX_ROLLUPS`] roll-ups, each a set of distinct dimensions. Sets (`x-kubernetes-list-type:
/// set`) rather than a CEL uniqueness rule: a rule over nested lists exceeds the API
/// server's cost budget.
fn rollups_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let dimension = generator.subschema_for::<Dimension>();
    schemars::json_schema!({
        "type": "array",
        "nullable": true,
        "maxItems": MAX_ROLLUPS,
        "items": {
            "type": "array",
            "maxItems": 12,
            "x-kubernetes-list-type": "set",
            "items": dimension,
        },
    })
}

/// An OTLP/HTTP metrics sink (protobuf, gzip). Without `endpoint` it sends to
/// CloudWatch's OTLP endpoint of `region` (`https://monitoring.<region>.amazonaws.com/v1/metrics`),
/// signed with the node's AWS identity; with `endpoint`, to that receiver (an
/// OpenTelemetry or ADOT collector, …), with the headers of `headersSecret`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.endpoint) || !has(self.region)").message("region applies to CloudWatch's OTLP endpoint only: set endpoint or region, not both").field_path(".region"))]
#[x_kube(validation = Rule::new("!has(self.headersSecret) || has(self.endpoint)").message("CloudWatch's OTLP endpoint is signed with the node's AWS identity: headers apply to an endpoint only").field_path(".headersSecret"))]
pub struct OtlpSinkSpec {
    /// URL of an OTLP/HTTP metrics receiver, e.g.
    /// `http://otel-collector.observability:4318/v1/metrics`. Default: CloudWatch's OTLP
    /// endpoint of `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_OTLP_ENDPOINT_BYTES), regex(pattern = OTLP_ENDPOINT_PATTERN))]
    pub endpoint: Option<String>,

    /// AWS region of CloudWatch's OTLP endpoint. Default: the node's own region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_REGION_BYTES), regex(pattern = REGION_PATTERN))]
    pub region: Option<String>,

    /// A Secret of this config's namespace whose keys and values are HTTP headers sent
    /// with every request to `endpoint` (e.g. `Authorization`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headers_secret: Option<SecretReference>,

    /// How often collected points are sent. Default: 60s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16), regex(pattern = PERIOD_PATTERN))]
    #[x_kube(validation = Rule::new(PERIOD_RULE).message(PERIOD_MESSAGE))]
    pub flush_interval: Option<String>,
}

/// An http or https URL without user information, query or fragment.
pub const OTLP_ENDPOINT_PATTERN: &str = r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$";

/// A Secret in the config's own namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    #[schemars(length(min = 1, max = MAX_SECRET_NAME_BYTES), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NeuronMonitorConfigStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Accepted`: the spec is valid, within the cluster's tenancy policy, fits the
    /// limits on every node it matches, and is rendered (reasons: Valid, InvalidSpec,
    /// TooLarge, NamespaceLimit, NodeLimit, TooManyLabels, TooManySeries, OutsidePolicy,
    /// CostCeiling, Unsupported, NoMatchingNodes). `Ready`: every matched node runs it (Applied,
    /// Applying, WriteFailed, NotAccepted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,

    /// Nodes this config applies to whose configuration (ConfigMap) carries it: written,
    /// not just rendered.
    #[serde(default)]
    pub matched_nodes: i32,

    /// Matched nodes whose agent acknowledged the current configuration.
    #[serde(default)]
    pub applied_nodes: i32,

    /// Distinct CloudWatch metrics (name + dimension values) this config's CloudWatch
    /// sink creates across its matched nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cloud_watch_metrics: Option<i64>,

    /// What this config's sinks cost CloudWatch a month as configured, in USD: its
    /// CloudWatch sink (metrics and requests) plus its OTLP sink to CloudWatch (bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_monthly_cost_usd: Option<String>,

    /// What this config's metrics would cost in each way CloudWatch takes them, and the
    /// cheapest, for a config with a CloudWatch or OTLP sink.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimated_cost: Option<EstimatedCost>,

    /// Matched nodes (of `matchedNodes`) whose Neuron health condition is True: a device
    /// has a fault.
    #[serde(default)]
    pub unhealthy_nodes: i32,
}

/// A config's metrics priced in each mode, on its matched nodes.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EstimatedCost {
    /// The cheapest mode: Classic, ContainerInsights or Otlp.
    pub cheapest_mode: String,
    /// CloudWatch custom metrics with this project's names (per metric-month and request).
    pub classic: ModeCost,
    /// CloudWatch custom metrics with Container Insights' names and dimension sets.
    pub container_insights: ModeCost,
    /// OpenTelemetry metrics through CloudWatch's OTLP endpoint (per GB ingested).
    pub otlp: ModeCost,
}

/// What a config's metrics cost in one mode.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModeCost {
    /// Distinct series: CloudWatch metrics (name + dimension values) or OTLP series
    /// (name + labels).
    pub series: i64,
    /// PutMetricData requests a month (the classic modes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_month: Option<i64>,
    /// Bytes billed a month (OTLP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_per_month: Option<i64>,
    /// USD a month, e.g. `"12.34"`.
    pub monthly_usd: String,
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_schema_refuses_a_threshold_for_every_state() {
        for state in crate::node_config::STATE_ERRORS {
            assert!(super::NOT_A_STATE_RULE.contains(&format!("'{state}'")), "{state}");
        }
    }
}
