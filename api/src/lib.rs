//! Types and rules shared by the operator, the node agent and the simulator. No I/O lives
//! here. In the order the data flows:
//!
//! - [`crd`]: the NeuronMonitorConfig resource users apply (spec, status, schema rules).
//! - [`hardware`]: the Neuron instance types and the device plugin's resources.
//! - [`duration`]: the `"500ms"` / `"5s"` / `"2m"` strings neuron-monitor uses.
//! - [`monitor_config`]: the neuron-monitor configuration file (`neuron-monitor -c FILE`).
//! - [`device_taints`]: the DeviceTaintRules the agent publishes for unhealthy DRA devices.
//! - [`node_config`]: what the operator renders for one node (the monitor configuration and
//!   the routes), its ConfigMap's names and the content hash.
//! - [`report`]: one NDJSON document that neuron-monitor writes per refresh.
//! - [`names`]: the field managers and default names both binaries use.
//! - [`limits`]: the largest inputs the operator and the agent accept.
//! - [`region`]: AWS regions and their partitions.
//! - [`cloudwatch`]: the CloudWatch metric catalogue, the sink rules, the cost estimate of
//!   each mode (classic, Container Insights, OTLP).
//! - [`otlp`]: the OTLP sink's rules (destination, flush interval, headers from a Secret).
//! - [`tenancy`]: the cluster operator's policy of what each namespace's configs may
//!   target (CloudWatch namespaces, regions, OTLP endpoints) and cost.
//! - [`validate`]: a NeuronMonitorConfig checked (selector, tag filters, sinks, size) into
//!   what rendering needs; [`render`]: every node's configs merged into its node
//!   configuration, within each node's budget. The operator renders the fleet with them,
//!   the agent its own node when it runs without Kubernetes: one set of rules.
//! - [`tag_filter`]: what a tag filter means (neuron-monitor's Go semantics) and costs.
//! - [`hash`]: the content hash; [`yaml_nesting`]: how deeply a YAML text nests, checked
//!   before it is parsed.
//!
//! The resource and what is derived from it (`crd`, `node_config`, `cloudwatch`, `otlp`,
//! `validate`, `render`, `tenancy`) need
//! kube and schemars: they come with the `crd` feature, so that the simulator, which reads
//! only the monitor configuration and writes reports, builds without them.

#[cfg(feature = "crd")]
pub mod cloudwatch;
#[cfg(feature = "crd")]
pub mod crd;
pub mod device_taints;
pub mod duration;
pub mod gpu_groups;
pub mod hardware;
pub mod hash;
pub mod limits;
pub mod monitor_config;
pub mod names;
#[cfg(feature = "crd")]
pub mod node_config;
#[cfg(feature = "crd")]
pub mod otlp;
pub mod region;
#[cfg(feature = "crd")]
pub mod render;
pub mod report;
#[cfg(feature = "tag-filter")]
pub mod tag_filter;
#[cfg(feature = "crd")]
pub mod tenancy;
#[cfg(feature = "crd")]
pub mod validate;
pub mod yaml_nesting;
