//! The node agent: runs neuron-monitor, turns its reports into the node's telemetry and
//! exports it.
//!
//! Data flows `monitor` (child process, line framing) → `pipeline` (parse one report)
//! → `state` (what the node looks like now) → `attribution` (pid/core → pod) → `sinks`
//! (Prometheus).

pub mod attribution;
pub mod config;
pub mod http;
pub mod monitor;
pub mod pipeline;
pub mod ratelimit;
pub mod routing;
pub mod sinks;
pub mod state;
pub mod telemetry;

#[cfg(test)]
pub(crate) mod testdata {
    /// A recorded neuron-monitor report from the project's shared fixtures.
    pub fn fixture(name: &str) -> String {
        let dir = std::env::var("NEURON_FIXTURES").unwrap_or_else(|_| {
            concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/neuron-monitor").to_owned()
        });
        let path = format!("{dir}/{name}");
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"))
    }

    pub const IDLE_INF1: &str = "inf1.xlarge-idle-1runtime.json";
    pub const TRN1_ERRORS: &str = "trn1.2xlarge-1runtime-errors.json";
    pub const TRN1N_32: &str = "trn1n.32xlarge-32runtimes.json";
}
