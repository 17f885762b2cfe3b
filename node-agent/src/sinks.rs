//! Where the node's telemetry goes.

pub mod cloudwatch;
pub mod otlp;
pub mod prometheus;
pub mod queue;
