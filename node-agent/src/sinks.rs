//! Where the node's telemetry goes.

pub mod cloudwatch;
pub mod common;
pub mod otlp;
pub mod prometheus;
