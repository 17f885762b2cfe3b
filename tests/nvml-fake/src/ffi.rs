//! The exported NVML functions (C ABI) and what they share: the guard that turns a panic into
//! `NVML_ERROR_UNKNOWN` and locks the state, the handles, and the checks of the caller's
//! pointers. Every pointer argument follows NVML's contract (null, or valid for what the
//! function writes or reads); each export turns its pointers into references once, in one
//! small `unsafe` block, and the rest is safe code.
//!
//! Library-wide calls here; device queries in `device`, MIG in `mig`, event sets in `events`.

mod device;
mod events;
mod mig;

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use crate::config::{MAX_GPUS, MAX_MIG_DEVICES};
use crate::machine::{Gpu, Machine, MigInstance};
use crate::state::{self, InitError, Library, MAX_EVENT_SETS};
use crate::types::*;

/// The memory the handles point into: GPUs, then MIG devices, then event sets. A handle is
/// only ever compared with this range, never read through.
static SLOTS: [u8; SLOT_COUNT] = [0; SLOT_COUNT];
const MIG_BASE: usize = MAX_GPUS;
const SET_BASE: usize = MIG_BASE + MAX_GPUS * MAX_MIG_DEVICES;
const SLOT_COUNT: usize = SET_BASE + MAX_EVENT_SETS;

fn slot_handle(slot: usize) -> *mut std::ffi::c_void {
    SLOTS.as_ptr().wrapping_add(slot) as *mut std::ffi::c_void
}

fn slot_of(handle: *const std::ffi::c_void) -> Option<usize> {
    let offset = (handle as usize).checked_sub(SLOTS.as_ptr() as usize)?;
    (offset < SLOT_COUNT).then_some(offset)
}

fn gpu_handle(gpu: usize) -> DeviceHandle {
    slot_handle(gpu)
}

fn mig_handle(gpu: usize, instance: usize) -> DeviceHandle {
    slot_handle(MIG_BASE + gpu * MAX_MIG_DEVICES + instance)
}

fn set_handle(set: usize) -> EventSetHandle {
    slot_handle(SET_BASE + set)
}

fn set_of(handle: EventSetHandle) -> Option<usize> {
    slot_of(handle).and_then(|s| s.checked_sub(SET_BASE))
}

/// Runs one call on the locked state; a panic becomes `NVML_ERROR_UNKNOWN`.
fn guarded<T>(f: impl FnOnce(&mut Library) -> Result<T, Return>) -> Result<T, Return> {
    catch_unwind(AssertUnwindSafe(|| f(&mut state::lock()))).unwrap_or(Err(ERROR_UNKNOWN))
}

fn call(f: impl FnOnce(&mut Library) -> Result<(), Return>) -> Return {
    match guarded(f) {
        Ok(()) => SUCCESS,
        Err(code) => code,
    }
}

fn machine(lib: &mut Library) -> Result<Arc<Machine>, Return> {
    lib.machine().ok_or(ERROR_UNINITIALIZED)
}

/// A device handle resolved against the machine as it is now.
struct Target {
    machine: Arc<Machine>,
    gpu: usize,
    mig: Option<usize>,
}

impl Target {
    fn gpu(&self) -> &Gpu {
        &self.machine.gpus[self.gpu]
    }

    fn mig(&self) -> Option<&MigInstance> {
        self.mig.map(|m| &self.gpu().mig_instances[m])
    }
}

/// The GPU or MIG device behind a handle; a lost GPU answers every call with GPU_IS_LOST.
fn resolve(lib: &mut Library, device: DeviceHandle) -> Result<Target, Return> {
    let machine = machine(lib)?;
    let slot = slot_of(device).ok_or(ERROR_INVALID_ARGUMENT)?;
    let (gpu, mig) = match slot {
        s if s < MIG_BASE => (s, None),
        s if s < SET_BASE => ((s - MIG_BASE) / MAX_MIG_DEVICES, Some((s - MIG_BASE) % MAX_MIG_DEVICES)),
        _ => return Err(ERROR_INVALID_ARGUMENT),
    };
    let g = machine.gpus.get(gpu).ok_or(ERROR_INVALID_ARGUMENT)?;
    if g.lost {
        return Err(ERROR_GPU_IS_LOST);
    }
    if mig.is_some_and(|m| !g.mig_enabled || m >= g.mig_instances.len()) {
        return Err(ERROR_INVALID_ARGUMENT);
    }
    Ok(Target { machine, gpu, mig })
}

/// A physical GPU's handle; MIG devices do not answer the whole-GPU queries.
fn physical(lib: &mut Library, device: DeviceHandle) -> Result<Target, Return> {
    let target = resolve(lib, device)?;
    if target.mig.is_some() {
        return Err(ERROR_NOT_SUPPORTED);
    }
    Ok(target)
}

/// Writes one value of a physical GPU to the caller's pointer.
fn device_value<T>(device: DeviceHandle, out: Option<&mut T>, f: impl FnOnce(&Target) -> Result<T, Return>) -> Return {
    call(|lib| {
        let target = physical(lib, device)?;
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        *out = f(&target)?;
        Ok(())
    })
}

/// Copies a string with its NUL into the caller's buffer, or says it is too small.
fn write_str(buf: Option<&mut [c_char]>, s: &str) -> Result<(), Return> {
    let buf = buf.ok_or(ERROR_INVALID_ARGUMENT)?;
    if buf.len() <= s.len() {
        return Err(ERROR_INSUFFICIENT_SIZE);
    }
    for (slot, byte) in buf.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *slot = byte as c_char;
    }
    Ok(())
}

/// The caller's buffer of `len` elements.
///
/// # Safety
/// `p` is null or valid for writes of `len` elements (NVML's contract).
unsafe fn out_slice<'a, T>(p: *mut T, len: c_uint) -> Option<&'a mut [T]> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, and the caller promises `len` writable elements.
    Some(unsafe { std::slice::from_raw_parts_mut(p, len as usize) })
}

/// The caller's NUL-terminated string.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string (NVML's contract).
unsafe fn in_str<'a>(p: *const c_char) -> Option<&'a str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null and NUL-terminated, as the caller promises.
    unsafe { CStr::from_ptr(p) }.to_str().ok()
}

#[no_mangle]
pub extern "C" fn nvmlInit_v2() -> Return {
    call(|lib| {
        lib.init().map_err(|e| match e {
            InitError::NoConfig => ERROR_DRIVER_NOT_LOADED,
            InitError::BadConfig => ERROR_UNKNOWN,
        })
    })
}

/// The flags (no GPUs, no attach) change nothing here.
#[no_mangle]
pub extern "C" fn nvmlInitWithFlags(_flags: c_uint) -> Return {
    nvmlInit_v2()
}

#[no_mangle]
pub extern "C" fn nvmlShutdown() -> Return {
    call(|lib| if lib.shutdown() { Ok(()) } else { Err(ERROR_UNINITIALIZED) })
}

#[no_mangle]
pub extern "C" fn nvmlErrorString(result: Return) -> *const c_char {
    error_string(result).as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) -> Return {
    // SAFETY: NVML's contract: `version` is null or holds `length` bytes.
    let buf = unsafe { out_slice(version, length) };
    call(|lib| write_str(buf, &machine(lib)?.driver_version))
}

/// NVML's own version: "12." and the driver version, as NVML 12 prints it.
#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetNVMLVersion(version: *mut c_char, length: c_uint) -> Return {
    // SAFETY: NVML's contract: `version` is null or holds `length` bytes.
    let buf = unsafe { out_slice(version, length) };
    call(|lib| write_str(buf, &format!("12.{}", machine(lib)?.driver_version)))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlSystemGetCudaDriverVersion_v2(cuda_driver_version: *mut c_int) -> Return {
    // SAFETY: NVML's contract: null or a writable int.
    let out = unsafe { cuda_driver_version.as_mut() };
    call(|lib| {
        let version = machine(lib)?.cuda_driver_version;
        *out.ok_or(ERROR_INVALID_ARGUMENT)? = version;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(device_count: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { device_count.as_mut() };
    call(|lib| {
        let count = machine(lib)?.gpus.len() as c_uint;
        *out.ok_or(ERROR_INVALID_ARGUMENT)? = count;
        Ok(())
    })
}

/// Writes the handle of a GPU found by `find`; a lost GPU has no handle (as on a real node).
fn handle_of(device: Option<&mut DeviceHandle>, find: impl FnOnce(&Machine) -> Result<DeviceHandle, Return>) -> Return {
    call(|lib| {
        let machine = machine(lib)?;
        let out = device.ok_or(ERROR_INVALID_ARGUMENT)?;
        let handle = find(&machine)?;
        if let Some(slot) = slot_of(handle) {
            let gpu = if slot < MIG_BASE { slot } else { (slot - MIG_BASE) / MAX_MIG_DEVICES };
            if machine.gpus.get(gpu).is_some_and(|g| g.lost) {
                return Err(ERROR_GPU_IS_LOST);
            }
        }
        *out = handle;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut DeviceHandle) -> Return {
    // SAFETY: NVML's contract: null or a writable handle.
    let out = unsafe { device.as_mut() };
    handle_of(out, |m| {
        let index = index as usize;
        if index < m.gpus.len() {
            Ok(gpu_handle(index))
        } else {
            Err(ERROR_INVALID_ARGUMENT)
        }
    })
}

/// GPU UUIDs and MIG device UUIDs both resolve, as in NVML.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut DeviceHandle) -> Return {
    // SAFETY: NVML's contract: `uuid` null or NUL-terminated, `device` null or writable.
    let (uuid, out) = unsafe { (in_str(uuid), device.as_mut()) };
    handle_of(out, |m| {
        let uuid = uuid.ok_or(ERROR_INVALID_ARGUMENT)?;
        for (g, gpu) in m.gpus.iter().enumerate() {
            if gpu.uuid == uuid {
                return Ok(gpu_handle(g));
            }
            if let Some(i) = gpu.mig_instances.iter().position(|mi| gpu.mig_enabled && mi.uuid == uuid) {
                return Ok(mig_handle(g, i));
            }
        }
        Err(ERROR_NOT_FOUND)
    })
}

/// Either bus id form (`00000000:53:00.0` or `0000:53:00.0`), any case.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetHandleByPciBusId_v2(
    pci_bus_id: *const c_char,
    device: *mut DeviceHandle,
) -> Return {
    // SAFETY: NVML's contract: `pci_bus_id` null or NUL-terminated, `device` null or writable.
    let (bus_id, out) = unsafe { (in_str(pci_bus_id), device.as_mut()) };
    handle_of(out, |m| {
        let wanted = parse_bus_id(bus_id.ok_or(ERROR_INVALID_ARGUMENT)?).ok_or(ERROR_INVALID_ARGUMENT)?;
        let found = m.gpus.iter().position(|g| (0, g.pci_bus, g.pci_device) == wanted);
        found.map(gpu_handle).ok_or(ERROR_NOT_FOUND)
    })
}

/// (domain, bus, device) of `domain:bus:device.function`.
fn parse_bus_id(s: &str) -> Option<(u32, u8, u8)> {
    let mut parts = s.trim().split(':');
    let domain = u32::from_str_radix(parts.next()?, 16).ok()?;
    let bus = u8::from_str_radix(parts.next()?, 16).ok()?;
    let (device, _function) = parts.next()?.split_once('.')?;
    let device = u8::from_str_radix(device, 16).ok()?;
    parts.next().is_none().then_some((domain, bus, device))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_both_forms_and_refuse_garbage() {
        assert_eq!(parse_bus_id("00000000:53:00.0"), Some((0, 0x53, 0)));
        assert_eq!(parse_bus_id("0000:a0:1d.0"), Some((0, 0xA0, 0x1D)));
        assert_eq!(parse_bus_id("53:00.0"), None);
        assert_eq!(parse_bus_id("0000:53:00.0:1"), None);
        assert_eq!(parse_bus_id("0000:zz:00.0"), None);
    }

    #[test]
    fn handles_round_trip_and_foreign_pointers_are_not_handles() {
        assert_eq!(slot_of(gpu_handle(3)), Some(3));
        assert_eq!(slot_of(mig_handle(2, 5)), Some(MIG_BASE + 2 * MAX_MIG_DEVICES + 5));
        assert_eq!(set_of(set_handle(7)), Some(7));
        assert_eq!(set_of(gpu_handle(0)), None);
        let elsewhere = 0u8;
        assert_eq!(slot_of(std::ptr::from_ref(&elsewhere).cast()), None);
        assert_eq!(slot_of(std::ptr::null()), None);
    }

    #[test]
    fn a_panic_becomes_unknown_and_later_calls_still_answer() {
        let panicked = call(|_| panic!("a bug in a call"));
        assert_eq!(panicked, ERROR_UNKNOWN);
        assert_eq!(call(|_| Ok(())), SUCCESS, "the state is usable after the panic");
    }

    #[test]
    fn short_buffers_are_refused_and_strings_end_with_nul() {
        let mut small = [1 as c_char; 4];
        assert_eq!(write_str(Some(&mut small), "abcd"), Err(ERROR_INSUFFICIENT_SIZE));
        let mut fits = [1 as c_char; 5];
        assert_eq!(write_str(Some(&mut fits), "abcd"), Ok(()));
        assert_eq!(fits[4], 0);
        assert_eq!(write_str(None, "a"), Err(ERROR_INVALID_ARGUMENT));
    }
}
