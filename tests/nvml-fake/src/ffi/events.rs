//! Event sets: each GPU's `xid` codes from the file are delivered once to every set that
//! registered that GPU for Xid events, in order; with none left, a wait returns TIMEOUT after
//! the caller's timeout, cut to MAX_WAIT so that tests stay fast.

use std::ffi::c_ulonglong;
use std::time::{Duration, Instant};

use super::{call, gpu_handle, guarded, physical, set_handle, set_of};
use crate::state::{EventSet, Library};
use crate::types::*;

/// The longest a wait blocks, whatever timeout the caller asks for.
pub const MAX_WAIT: Duration = Duration::from_millis(100);
/// How often a waiting call looks for a new code (the file may gain one meanwhile).
const POLL: Duration = Duration::from_millis(10);

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetSupportedEventTypes(
    device: DeviceHandle,
    event_types: *mut c_ulonglong,
) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned long long.
    let out = unsafe { event_types.as_mut() };
    super::device_value(device, out, |_| Ok(SUPPORTED_EVENTS))
}

#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetCreate(set: *mut EventSetHandle) -> Return {
    // SAFETY: NVML's contract: null or a writable handle.
    let out = unsafe { set.as_mut() };
    call(|lib| {
        super::machine(lib)?;
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        let free = lib.event_sets.iter().position(Option::is_none).ok_or(ERROR_MEMORY)?;
        lib.event_sets[free] = Some(EventSet::default());
        *out = set_handle(free);
        Ok(())
    })
}

/// Types beyond what the GPU supports are refused, as NVML does.
#[no_mangle]
pub extern "C" fn nvmlDeviceRegisterEvents(
    device: DeviceHandle,
    event_types: c_ulonglong,
    set: EventSetHandle,
) -> Return {
    call(|lib| {
        let gpu = physical(lib, device)?.gpu;
        if event_types & !SUPPORTED_EVENTS != 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let set = open_set(lib, set)?;
        set.registered[gpu] |= event_types;
        Ok(())
    })
}

fn open_set(lib: &mut Library, set: EventSetHandle) -> Result<&mut EventSet, Return> {
    let slot = set_of(set).ok_or(ERROR_INVALID_ARGUMENT)?;
    lib.event_sets.get_mut(slot).and_then(Option::as_mut).ok_or(ERROR_INVALID_ARGUMENT)
}

/// The lock is held only while looking, never while sleeping.
#[no_mangle]
pub unsafe extern "C" fn nvmlEventSetWait_v2(set: EventSetHandle, data: *mut EventData, timeout_ms: u32) -> Return {
    // SAFETY: NVML's contract: null or a writable nvmlEventData_t.
    let Some(out) = (unsafe { data.as_mut() }) else { return ERROR_INVALID_ARGUMENT };
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms)).min(MAX_WAIT);
    loop {
        match guarded(|lib| next_event(lib, set)) {
            Ok(Some(event)) => {
                *out = event;
                return SUCCESS;
            }
            Ok(None) => {}
            Err(code) => return code,
        }
        let now = Instant::now();
        if now >= deadline {
            return ERROR_TIMEOUT;
        }
        std::thread::sleep(POLL.min(deadline - now));
    }
}

/// The next Xid code this set has not delivered, on the lowest-indexed GPU that has one.
fn next_event(lib: &mut Library, set: EventSetHandle) -> Result<Option<EventData>, Return> {
    let machine = super::machine(lib)?;
    let set = open_set(lib, set)?;
    for (g, gpu) in machine.gpus.iter().enumerate() {
        if set.registered[g] & EVENT_XID == 0 {
            continue;
        }
        if let Some(&code) = gpu.xid.get(set.delivered[g]) {
            set.delivered[g] += 1;
            return Ok(Some(EventData {
                device: gpu_handle(g),
                event_type: EVENT_XID,
                event_data: code,
                gpu_instance_id: NO_INSTANCE,
                compute_instance_id: NO_INSTANCE,
            }));
        }
    }
    Ok(None)
}

#[no_mangle]
pub extern "C" fn nvmlEventSetFree(set: EventSetHandle) -> Return {
    call(|lib| {
        let slot = set_of(set).ok_or(ERROR_INVALID_ARGUMENT)?;
        match lib.event_sets.get_mut(slot) {
            Some(s @ Some(_)) => {
                *s = None;
                Ok(())
            }
            _ => Err(ERROR_INVALID_ARGUMENT),
        }
    })
}
