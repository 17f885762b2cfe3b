//! MIG: the mode, the device count and the MIG device handles of a GPU (A100 and H100 have
//! MIG; the others answer NOT_SUPPORTED, as on the real models).

use std::ffi::c_uint;

use super::{call, gpu_handle, mig_handle, physical, resolve};
use crate::types::*;

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    device: DeviceHandle,
    current_mode: *mut c_uint,
    pending_mode: *mut c_uint,
) -> Return {
    // SAFETY: NVML's contract: each is null or a writable unsigned int.
    let (current, pending) = unsafe { (current_mode.as_mut(), pending_mode.as_mut()) };
    call(|lib| {
        let t = physical(lib, device)?;
        let gpu = t.gpu();
        if gpu.max_mig_devices == 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let (current, pending) = current.zip(pending).ok_or(ERROR_INVALID_ARGUMENT)?;
        *current = c_uint::from(gpu.mig_enabled);
        *pending = c_uint::from(gpu.mig_enabled);
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(device: DeviceHandle, count: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { count.as_mut() };
    call(|lib| {
        let t = physical(lib, device)?;
        match t.gpu().max_mig_devices {
            0 => Err(ERROR_NOT_SUPPORTED),
            max => {
                *out.ok_or(ERROR_INVALID_ARGUMENT)? = max;
                Ok(())
            }
        }
    })
}

/// The MIG device at `index` (in the order of the file's `mig.instances`).
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    device: DeviceHandle,
    index: c_uint,
    mig_device: *mut DeviceHandle,
) -> Return {
    // SAFETY: NVML's contract: null or a writable handle.
    let out = unsafe { mig_device.as_mut() };
    call(|lib| {
        let t = physical(lib, device)?;
        let gpu = t.gpu();
        if gpu.max_mig_devices == 0 {
            return Err(ERROR_NOT_SUPPORTED);
        }
        let out = out.ok_or(ERROR_INVALID_ARGUMENT)?;
        let index = index as usize;
        if index >= gpu.max_mig_devices as usize {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        if !gpu.mig_enabled || index >= gpu.mig_instances.len() {
            return Err(ERROR_NOT_FOUND);
        }
        *out = mig_handle(t.gpu, index);
        Ok(())
    })
}

/// A MIG device's GPU instance id; a whole GPU has none.
#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(device: DeviceHandle, id: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { id.as_mut() };
    call(|lib| {
        let t = resolve(lib, device)?;
        let mig = t.mig().ok_or(ERROR_NOT_SUPPORTED)?;
        *out.ok_or(ERROR_INVALID_ARGUMENT)? = mig.gpu_instance_id;
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceIsMigDeviceHandle(device: DeviceHandle, is_mig_device: *mut c_uint) -> Return {
    // SAFETY: NVML's contract: null or a writable unsigned int.
    let out = unsafe { is_mig_device.as_mut() };
    call(|lib| {
        let t = resolve(lib, device)?;
        *out.ok_or(ERROR_INVALID_ARGUMENT)? = c_uint::from(t.mig.is_some());
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(
    mig_device: DeviceHandle,
    device: *mut DeviceHandle,
) -> Return {
    // SAFETY: NVML's contract: null or a writable handle.
    let out = unsafe { device.as_mut() };
    call(|lib| {
        let t = resolve(lib, mig_device)?;
        if t.mig.is_none() {
            return Err(ERROR_INVALID_ARGUMENT);
        }
        *out.ok_or(ERROR_INVALID_ARGUMENT)? = gpu_handle(t.gpu);
        Ok(())
    })
}
