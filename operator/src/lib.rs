//! The operator's logic. `validate`, `render` and `nodes` are pure (no I/O): a
//! NeuronMonitorConfig checked once, merged per node into the rendered node
//! configuration, and which Nodes are Neuron nodes.

pub mod nodes;
pub mod render;
pub mod validate;
