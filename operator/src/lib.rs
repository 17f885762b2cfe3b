//! The operator's logic. In the order the data flows:
//!
//! - [`nodes`]: which Nodes are Neuron nodes, and what the cost estimate knows of them.
//! - [`validate`]: a NeuronMonitorConfig checked once per pass (selector, tag filters,
//!   sinks, size) into what rendering needs.
//! - [`render`]: every node's configs merged into its node configuration, within each
//!   node's budget.
//! - [`controller`]: the watches, the level-triggered pass that writes the ConfigMaps, and
//!   the status and Events users read.
//! - [`leader`]: one writer among replicas (a Lease); [`telemetry`]: the operator's own
//!   metrics; [`crdgen`]: the CRD YAML.
//!
//! `nodes`, `validate` and `render` are pure (no I/O).

pub mod controller;
pub mod crdgen;
pub mod leader;
pub mod nodes;
pub mod render;
pub mod telemetry;
pub mod validate;
