//! Where the node's telemetry goes.

pub mod cloudwatch;
pub mod prometheus;
pub mod queue;
