//! A fake `libnvidia-ml.so.1` for tests: the NVML functions the node agent's GPU collector
//! calls (through the `nvml-wrapper` crate), with NVML's C ABI and struct layouts, answered
//! from the YAML file named by `FAKE_NVML_CONFIG` (see the README for the keys and faults).
//!
//! catalogue (instance types) → config (the file) → machine (the resolved GPUs) → state (the
//! locked library state, re-reading the file) → ffi::{device, mig, events} (the exports,
//! over the C layouts in types).

pub mod catalogue;
pub mod config;
// The exports are unsafe only for their pointers, all under NVML's one contract (ffi's doc).
#[allow(clippy::missing_safety_doc, non_snake_case)]
#[deny(unsafe_op_in_unsafe_fn)]
pub mod ffi;
pub mod machine;
pub mod state;
pub mod types;
