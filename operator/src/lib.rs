//! The operator's logic. `validate`, `render` and `nodes` are pure (no I/O): a
//! NeuronMonitorConfig checked once, merged per node into the rendered node
//! configuration, and which Nodes are Neuron nodes.

pub mod controller;
pub mod crdgen;
pub mod leader;
pub mod nodes;
pub mod render;
pub mod telemetry;
pub mod validate;
