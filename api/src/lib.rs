//! Types shared by the operator and the node agent. No I/O lives here.
//!
//! - [`duration`]: the `"500ms"` / `"5s"` / `"2m"` strings neuron-monitor uses.
//! - [`monitor_config`]: the neuron-monitor configuration file (`neuron-monitor -c FILE`).
//! - [`report`]: one NDJSON document that neuron-monitor writes per refresh.
//! - [`limits`]: the largest inputs the operator and the agent accept.
//! - [`cloudwatch_cost`]: the CloudWatch metric catalogue and the cost estimate of a config.

pub mod cloudwatch_cost;
pub mod crd;
pub mod duration;
pub mod limits;
pub mod monitor_config;
pub mod node_config;
pub mod report;
