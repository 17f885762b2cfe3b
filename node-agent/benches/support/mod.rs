//! What the agent's benches share.
#![allow(clippy::mod_module_files)] // cargo would build a benches/support.rs as a bench of its own

/// A recorded report of the repository's fixtures (`neuron_test_support::TRN1N_32`, ...),
/// compacted to one line as neuron-monitor writes it.
pub fn compact_fixture(rel: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(&neuron_test_support::fixture(rel)).expect("fixture is JSON");
    serde_json::to_string(&value).expect("re-encode")
}
