//! The operator's logic. In the order the data flows:
//!
//! - [`nodes`]: which Nodes are Neuron nodes, and what the cost estimate knows of them.
//! - `api::validate`: a NeuronMonitorConfig checked once per pass (selector, tag filters,
//!   sinks, size, series) into what rendering needs.
//! - `api::tenancy`, `api::cloudwatch::cost`: what its namespace may target and cost, on
//!   its matched nodes (the controller's `admission`, with the policy its `policy` reads).
//! - `api::render`: every node's configs merged into its node configuration, within each
//!   node's budget (in `api`, as the agent renders its own node with it without Kubernetes).
//! - [`controller`]: the watches, the level-triggered pass that writes the ConfigMaps, and
//!   the status and Events users read; [`headers`]: the configs' OTLP headers mirrored
//!   for the agents.
//! - [`leader`]: one writer among replicas (a Lease); [`telemetry`]: the operator's own
//!   metrics; [`crdgen`]: the CRD YAML.
//!
//! `nodes` is pure (no I/O), like `api`. The modules import one way: `controller` uses
//! `headers`, `nodes` and `telemetry`; what both the controller and the headers mirror
//! need lives here, at the root.

/// Field manager of everything the operator writes (server-side apply).
pub const MANAGER: &str = api::names::OPERATOR_MANAGER;

pub mod controller;
pub mod crdgen;
pub mod headers;
pub mod leader;
pub mod nodes;
pub mod telemetry;
