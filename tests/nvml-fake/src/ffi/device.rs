//! The per-device queries: identity, utilization, memory, thermals, power, clocks, PCIe,
//! ECC, throttle reasons, processes and field values.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong};

use super::{call, device_value, out_slice, physical, resolve, write_str, Target};
use crate::machine::Gpu;
use crate::types::*;

const MIB: u64 = 1024 * 1024;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetIndex(device: DeviceHandle, index: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { index.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().index))
}

/// The minor number (`/dev/nvidiaN`) is the index on the instance types here.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMinorNumber(device: DeviceHandle, minor_number: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { minor_number.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().index))
}

/// A MIG device answers with its own `MIG-` UUID.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUUID(device: DeviceHandle, uuid: *mut c_char, length: c_uint) -> Return {
    // SAFETY: NVML's contract: `uuid` is null or holds `length` bytes.
    let buf = unsafe { out_slice(uuid, length) };
    call(|lib| {
        let t = resolve(lib, device)?;
        write_str(buf, t.mig().map_or(&t.gpu().uuid, |m| &m.uuid))
    })
}

/// A MIG device answers "<model> MIG <profile>".
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetName(device: DeviceHandle, name: *mut c_char, length: c_uint) -> Return {
    // SAFETY: NVML's contract: `name` is null or holds `length` bytes.
    let buf = unsafe { out_slice(name, length) };
    call(|lib| {
        let t = resolve(lib, device)?;
        write_str(buf, t.mig().map_or(&t.gpu().name, |m| &m.name))
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPciInfo_v3(device: DeviceHandle, pci: *mut PciInfo) -> Return {
    // SAFETY: NVML's contract: null or a writable nvmlPciInfo_t.
    let out = unsafe { pci.as_mut() };
    device_value(device, out, |t| Ok(pci_info(t.gpu())))
}

fn pci_info(gpu: &Gpu) -> PciInfo {
    PciInfo {
        bus_id_legacy: c_array(&gpu.bus_id_legacy()),
        domain: 0,
        bus: c_uint::from(gpu.pci_bus),
        device: c_uint::from(gpu.pci_device),
        pci_device_id: gpu.pci_device_id,
        pci_sub_system_id: gpu.pci_subsystem_id,
        bus_id: c_array(&gpu.bus_id()),
    }
}

/// Not supported on a MIG-enabled GPU, as NVML documents.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(device: DeviceHandle, utilization: *mut Utilization) -> Return {
    // SAFETY: NVML's contract: null or a writable nvmlUtilization_t.
    let out = unsafe { utilization.as_mut() };
    device_value(device, out, |t| {
        let gpu = t.gpu();
        if gpu.mig_enabled {
            return Err(ERROR_NOT_SUPPORTED);
        }
        Ok(Utilization { gpu: gpu.utilization_gpu, memory: gpu.utilization_memory })
    })
}

/// Used memory is the configured value or the processes' sum, whichever is larger; nothing
/// is reserved, so total = used + free. A MIG device answers for its own slice.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(device: DeviceHandle, memory: *mut MemoryV2) -> Return {
    // SAFETY: NVML's contract: null or a writable nvmlMemory_v2_t.
    let out = unsafe { memory.as_mut() };
    call(|lib| {
        let t = resolve(lib, device)?;
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        if out.version != MEMORY_V2_VERSION {
            return Err(ERROR_ARGUMENT_VERSION_MISMATCH);
        }
        *out = memory_of(&t);
        Ok(())
    })
}

fn memory_of(t: &Target) -> MemoryV2 {
    let gpu = t.gpu();
    let total_mib = t.mig().map_or(gpu.memory_total_mib, |m| m.memory_mib);
    let processes_mib: u64 = gpu.processes_in(t.mig()).iter().map(|p| p.used_memory_mib).sum();
    let configured = if t.mig.is_some() { 0 } else { gpu.memory_used_mib };
    let used_mib = configured.max(processes_mib).min(total_mib);
    MemoryV2 {
        version: MEMORY_V2_VERSION,
        total: total_mib * MIB,
        reserved: 0,
        free: (total_mib - used_mib) * MIB,
        used: used_mib * MIB,
    }
}

/// Only the GPU sensor (0) exists.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTemperature(device: DeviceHandle, sensor: c_uint, temp: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { temp.as_mut() };
    device_value(device, out, |t| if sensor == 0 { Ok(t.gpu().temperature_c) } else { Err(ERROR_INVALID_ARGUMENT) })
}

/// Milliwatts.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(device: DeviceHandle, power: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { power.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().power_mw))
}

/// Milliwatts.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetEnforcedPowerLimit(device: DeviceHandle, limit: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { limit.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().power_limit_mw))
}

/// Millijoules since the first init: the current power for the time since, so it only grows.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(device: DeviceHandle, energy: *mut c_ulonglong) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned long long.
    let out = unsafe { energy.as_mut() };
    call(|lib| {
        let uptime_ms = lib.uptime_ms();
        let t = physical(lib, device)?;
        *out.ok_or(ERROR_INVALID_ARGUMENT)? = u64::from(t.gpu().power_mw).saturating_mul(uptime_ms) / 1000;
        Ok(())
    })
}

/// Graphics (0) and SM (1) run at the SM clock; memory (2); video (3).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetClockInfo(
    device: DeviceHandle,
    clock_type: c_uint,
    clock: *mut c_uint,
) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { clock.as_mut() };
    device_value(device, out, |t| {
        let gpu = t.gpu();
        match clock_type {
            0 | 1 => Ok(gpu.sm_clock_mhz),
            2 => Ok(gpu.memory_clock_mhz),
            3 => Ok(gpu.video_clock_mhz),
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkGeneration(device: DeviceHandle, link_gen: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { link_gen.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().pcie_generation))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrPcieLinkWidth(device: DeviceHandle, link_width: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { link_width.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().pcie_width))
}

/// KB/s; TX (0) or RX (1).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieThroughput(
    device: DeviceHandle,
    counter: c_uint,
    value: *mut c_uint,
) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { value.as_mut() };
    device_value(device, out, |t| match counter {
        0 => Ok(t.gpu().pcie_tx_kbps),
        1 => Ok(t.gpu().pcie_rx_kbps),
        _ => Err(ERROR_INVALID_ARGUMENT),
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetPcieReplayCounter(device: DeviceHandle, value: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { value.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().pcie_replay_counter))
}

/// Error type corrected (0) / uncorrected (1); counter volatile (0) / aggregate (1).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetTotalEccErrors(
    device: DeviceHandle,
    error_type: c_uint,
    counter_type: c_uint,
    ecc_counts: *mut c_ulonglong,
) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned long long.
    let out = unsafe { ecc_counts.as_mut() };
    device_value(device, out, |t| {
        let ecc = t.gpu().ecc;
        match (error_type, counter_type) {
            (0, 0) => Ok(ecc.corrected_volatile),
            (1, 0) => Ok(ecc.uncorrected_volatile),
            (0, 1) => Ok(ecc.corrected_aggregate),
            (1, 1) => Ok(ecc.uncorrected_aggregate),
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCurrentClocksThrottleReasons(
    device: DeviceHandle,
    reasons: *mut c_ulonglong,
) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned long long.
    let out = unsafe { reasons.as_mut() };
    device_value(device, out, |t| Ok(t.gpu().throttle_reasons))
}

/// NVML's two-step protocol: a count too small (0 with a null array, first) gets
/// INSUFFICIENT_SIZE and the count needed; then the entries. A MIG device lists its own.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    device: DeviceHandle,
    info_count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> Return {
    // SAFETY: NVML's contract: `info_count` is null or writable; `infos` is null or holds
    // `*info_count` entries.
    let Some(count) = (unsafe { info_count.as_mut() }) else { return ERROR_INVALID_ARGUMENT };
    // SAFETY: as above; the slice is only made once the count is read.
    let out = unsafe { out_slice(infos, *count) };
    call(|lib| {
        let t = resolve(lib, device)?;
        let processes = t.gpu().processes_in(t.mig());
        let capacity = *count as usize;
        *count = processes.len() as c_uint;
        if processes.is_empty() {
            return Ok(());
        }
        if capacity < processes.len() {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        for (slot, p) in out.iter_mut().zip(&processes) {
            *slot = ProcessInfo {
                pid: p.pid,
                used_gpu_memory: p.used_memory_mib * MIB,
                gpu_instance_id: p.gpu_instance_id.unwrap_or(NO_INSTANCE),
                compute_instance_id: if p.gpu_instance_id.is_some() { p.compute_instance_id } else { NO_INSTANCE },
            };
        }
        Ok(())
    })
}

/// The per-process samples of the processes with a utilization, stamped now (so each is
/// newer than any timestamp the caller saw before); NOT_FOUND when there is none, as
/// NVML answers a GPU without samples. Same two-step protocol as the process list.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    device: DeviceHandle,
    utilization: *mut ProcessUtilizationSample,
    sample_count: *mut c_uint,
    _last_seen_time_stamp: c_ulonglong,
) -> Return {
    // SAFETY: NVML's contract: `sample_count` is null or writable; `utilization` is null or
    // holds `*sample_count` entries.
    let Some(count) = (unsafe { sample_count.as_mut() }) else { return ERROR_INVALID_ARGUMENT };
    // SAFETY: as above; the slice is only made once the count is read.
    let out = unsafe { out_slice(utilization, *count) };
    call(|lib| {
        let t = physical(lib, device)?;
        let sampled: Vec<_> = t.gpu().processes.iter().filter_map(|p| Some((p.pid, p.utilization?))).collect();
        let capacity = *count as usize;
        *count = sampled.len() as c_uint;
        if sampled.is_empty() {
            return Err(ERROR_NOT_FOUND);
        }
        if capacity < sampled.len() {
            return Err(ERROR_INSUFFICIENT_SIZE);
        }
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        for (slot, (pid, (sm, mem))) in out.iter_mut().zip(sampled) {
            *slot =
                ProcessUtilizationSample { pid, time_stamp: now_us, sm_util: sm, mem_util: mem, ..Default::default() };
        }
        Ok(())
    })
}

/// Fills each entry the caller named by field id; an id the fake does not know, or a value
/// the model lacks (memory temperature on GDDR6), gets NOT_SUPPORTED in its own entry.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    device: DeviceHandle,
    values_count: c_int,
    values: *mut FieldValue,
) -> Return {
    let Ok(count) = c_uint::try_from(values_count) else { return ERROR_INVALID_ARGUMENT };
    // SAFETY: NVML's contract: `values` is null or holds `values_count` entries.
    let out = unsafe { out_slice(values, count) };
    call(|lib| {
        let uptime_ms = lib.uptime_ms();
        let t = physical(lib, device)?;
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        let now_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
        for entry in out.iter_mut() {
            entry.timestamp = now_us;
            entry.latency_usec = 0;
            match field_value(t.gpu(), entry.field_id, uptime_ms) {
                Some(Field::Uint(v)) => {
                    entry.value_type = VALUE_TYPE_UNSIGNED_INT;
                    entry.value = Value { ui_val: v };
                    entry.nvml_return = SUCCESS;
                }
                Some(Field::Ulonglong(v)) => {
                    entry.value_type = VALUE_TYPE_UNSIGNED_LONG_LONG;
                    entry.value = Value { ull_val: v };
                    entry.nvml_return = SUCCESS;
                }
                None => entry.nvml_return = ERROR_NOT_SUPPORTED,
            }
        }
        Ok(())
    })
}

/// A field's value in the type NVML gives it.
enum Field {
    Uint(c_uint),
    Ulonglong(u64),
}

/// The fields the fake knows. The NVLink ones only on a GPU with links; the data
/// counters grow at their rates since the first init, as the energy counter does.
fn field_value(gpu: &Gpu, field_id: c_uint, uptime_ms: u64) -> Option<Field> {
    let rows = gpu.remapped_rows;
    let link = gpu.nvlink;
    let links = |v: u64| (link.links > 0).then_some(Field::Ulonglong(v));
    let grown = |per_second: u64| per_second.saturating_mul(uptime_ms) / 1000;
    match field_id {
        FI_DEV_MEMORY_TEMP => gpu.memory_temperature_c.map(Field::Uint),
        FI_DEV_REMAPPED_COR => Some(Field::Uint(rows.correctable)),
        FI_DEV_REMAPPED_UNC => Some(Field::Uint(rows.uncorrectable)),
        FI_DEV_REMAPPED_PENDING => Some(Field::Uint(c_uint::from(rows.pending))),
        FI_DEV_REMAPPED_FAILURE => Some(Field::Uint(c_uint::from(rows.failure))),
        // NVML answers the link count on every GPU (0 on a PCIe card).
        FI_DEV_NVLINK_LINK_COUNT => Some(Field::Uint(link.links)),
        FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL => links(link.crc_flit_errors),
        FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL => links(link.crc_data_errors),
        FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL => links(link.replay_errors),
        FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL => links(link.recovery_errors),
        FI_DEV_NVLINK_THROUGHPUT_DATA_TX => links(grown(link.tx_kib_per_second)),
        FI_DEV_NVLINK_THROUGHPUT_DATA_RX => links(grown(link.rx_kib_per_second)),
        _ => None,
    }
}
