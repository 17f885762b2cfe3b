//! The names the binaries write under and look for, each written once: the field managers
//! of their writes to the API and the default name of the Secret that carries the OTLP
//! sinks' headers (the operator writes it, the agent reads it).

/// The operator's name where it signs its writes: the field manager of its writes
/// (ConfigMaps, statuses, the headers Secret) and the reporting controller of its Events.
pub const OPERATOR_MANAGER: &str = "neuron-operator";

/// Field manager of the node agent's writes (its Node's taints, its ConfigMap's status).
pub const AGENT_MANAGER: &str = "neuron-node-agent";

/// The Secret the operator mirrors the configs' OTLP headers into and the agent reads them
/// from, unless `--otlp-headers-secret` names another (the chart passes its own).
pub const OTLP_HEADERS_SECRET: &str = "neuron-monitor-otlp-headers";

/// The key of the agent's taints: its Node's NoSchedule taint and the taint of its
/// DeviceTaintRules; the value names the error.
pub const TAINT_KEY: &str = "neuronmonitor.io/hardware-error";

/// The annotation naming the node an object is for, in full (node names can be too long
/// for a label): on the node ConfigMaps (the operator's) and the DeviceTaintRules (the
/// agent's).
pub const NODE_ANNOTATION: &str = "neuronmonitor.io/node";
