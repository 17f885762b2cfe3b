//! What the agent's benches share.
#![allow(clippy::mod_module_files)] // cargo would build a benches/support.rs as a bench of its own

/// A recorded report of the shared fixtures, compacted to one line as neuron-monitor
/// writes it.
pub fn compact_fixture(name: &str) -> String {
    let dir = std::env::var("NEURON_FIXTURES")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/neuron-monitor").to_owned());
    let path = format!("{dir}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"));
    let value: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    serde_json::to_string(&value).expect("re-encode")
}
