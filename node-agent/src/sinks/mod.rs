//! Where the node's telemetry goes.

pub mod prometheus;
