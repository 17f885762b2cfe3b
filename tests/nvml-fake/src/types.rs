//! NVML's C types, return codes and constants, laid out as nvml-wrapper-sys 0.10.0's
//! bindings lay them out (the integration tests compare sizes and offsets with that crate).

use std::ffi::{c_char, c_uint, c_ulonglong, c_void, CStr};

/// `nvmlReturn_t`.
pub type Return = c_uint;
/// `nvmlDevice_t`: an opaque pointer; the fake's handles point into its own static slots.
pub type DeviceHandle = *mut c_void;
/// `nvmlEventSet_t`.
pub type EventSetHandle = *mut c_void;

pub const SUCCESS: Return = 0;
pub const ERROR_UNINITIALIZED: Return = 1;
pub const ERROR_INVALID_ARGUMENT: Return = 2;
pub const ERROR_NOT_SUPPORTED: Return = 3;
pub const ERROR_NOT_FOUND: Return = 6;
pub const ERROR_INSUFFICIENT_SIZE: Return = 7;
pub const ERROR_DRIVER_NOT_LOADED: Return = 9;
pub const ERROR_TIMEOUT: Return = 10;
pub const ERROR_GPU_IS_LOST: Return = 15;
pub const ERROR_MEMORY: Return = 20;
pub const ERROR_ARGUMENT_VERSION_MISMATCH: Return = 25;
pub const ERROR_UNKNOWN: Return = 999;

/// `nvmlEventTypeXidCriticalError`.
pub const EVENT_XID: u64 = 8;
/// What the fake says it supports: single- and double-bit ECC, P-state, Xid, clock.
pub const SUPPORTED_EVENTS: u64 = 1 | 2 | 4 | EVENT_XID | 16;

pub const FI_DEV_MEMORY_TEMP: c_uint = 82;
pub const FI_DEV_REMAPPED_COR: c_uint = 142;
pub const FI_DEV_REMAPPED_UNC: c_uint = 143;
pub const FI_DEV_REMAPPED_PENDING: c_uint = 144;
pub const FI_DEV_REMAPPED_FAILURE: c_uint = 145;
// NVLink, all links together (the error totals cover links 0–5 in NVML's own counting;
// the fake has one number per GPU).
pub const FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: c_uint = 38;
pub const FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: c_uint = 45;
pub const FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: c_uint = 52;
pub const FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: c_uint = 59;
pub const FI_DEV_NVLINK_LINK_COUNT: c_uint = 91;
pub const FI_DEV_NVLINK_THROUGHPUT_DATA_TX: c_uint = 138;
pub const FI_DEV_NVLINK_THROUGHPUT_DATA_RX: c_uint = 139;
pub const VALUE_TYPE_UNSIGNED_INT: c_uint = 1;
pub const VALUE_TYPE_UNSIGNED_LONG_LONG: c_uint = 3;

/// NVML's "no MIG instance" id in process and event records.
pub const NO_INSTANCE: c_uint = 0xFFFF_FFFF;

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlMemory_v2_t`; callers set `version` to [`MEMORY_V2_VERSION`].
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct MemoryV2 {
    pub version: c_uint,
    pub total: c_ulonglong,
    pub reserved: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// NVML's struct version: the size in the low bits, the version number from bit 24.
pub const MEMORY_V2_VERSION: c_uint = (std::mem::size_of::<MemoryV2>() as c_uint) | (2 << 24);

/// `nvmlPciInfo_t` (the layout `nvmlDeviceGetPciInfo_v3` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct PciInfo {
    pub bus_id_legacy: [c_char; 16],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_sub_system_id: c_uint,
    pub bus_id: [c_char; 32],
}

/// `nvmlProcessInfo_t` (v2 layout, what `nvmlDeviceGetComputeRunningProcesses_v3` fills).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ProcessInfo {
    pub pid: c_uint,
    pub used_gpu_memory: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct EventData {
    pub device: DeviceHandle,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

/// `nvmlValue_t`: the members the fake writes.
#[repr(C)]
#[derive(Clone, Copy)]
pub union Value {
    pub d_val: f64,
    pub ui_val: c_uint,
    pub ull_val: c_ulonglong,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessUtilizationSample {
    pub pid: c_uint,
    pub time_stamp: c_ulonglong,
    pub sm_util: c_uint,
    pub mem_util: c_uint,
    pub enc_util: c_uint,
    pub dec_util: c_uint,
}

/// `nvmlFieldValue_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct FieldValue {
    pub field_id: c_uint,
    pub scope_id: c_uint,
    pub timestamp: i64,
    pub latency_usec: i64,
    pub value_type: c_uint,
    pub nvml_return: Return,
    pub value: Value,
}

/// A C string into a fixed NVML array (cut to leave room for the NUL).
pub fn c_array<const N: usize>(s: &str) -> [c_char; N] {
    let mut out = [0 as c_char; N];
    for (slot, byte) in out.iter_mut().zip(s.bytes().take(N.saturating_sub(1))) {
        *slot = byte as c_char;
    }
    out
}

/// `nvmlErrorString`'s text for each code.
pub fn error_string(code: Return) -> &'static CStr {
    match code {
        SUCCESS => c"Success",
        ERROR_UNINITIALIZED => c"Uninitialized",
        ERROR_INVALID_ARGUMENT => c"Invalid Argument",
        ERROR_NOT_SUPPORTED => c"Not Supported",
        ERROR_NOT_FOUND => c"Not Found",
        ERROR_INSUFFICIENT_SIZE => c"Insufficient Size",
        ERROR_DRIVER_NOT_LOADED => c"Driver Not Loaded",
        ERROR_TIMEOUT => c"Timeout",
        ERROR_GPU_IS_LOST => c"GPU is lost",
        ERROR_MEMORY => c"Insufficient Memory",
        ERROR_ARGUMENT_VERSION_MISMATCH => c"Argument Version Mismatch",
        _ => c"Unknown Error",
    }
}
