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
