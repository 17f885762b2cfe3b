//! NVIDIA's DRA driver for GPUs: which GPU a device of its ResourceSlices stands for.
//!
//! The driver names its devices `gpu-<minor>` (whole GPUs) and `gpu-<minor>-mig-…` (MIG
//! devices); the names are read only through the slices, never parsed. A MIG device is
//! credited to the GPU it is a slice of, as the device plugin's MIG ids are.

use api::hardware::{
    NVIDIA_DRA_DRIVER, NVIDIA_DRA_INDEX, NVIDIA_DRA_PARENT_INDEX, NVIDIA_DRA_PARENT_UUID, NVIDIA_DRA_TYPE,
    NVIDIA_DRA_TYPE_GPU, NVIDIA_DRA_TYPE_MIG, NVIDIA_DRA_UUID,
};

use super::{is_attribute, Attribute, Driver};
use crate::{
    attribution::gpus::{parse_device_id, GpuRef},
    gpu::MAX_GPUS,
};

/// A GPU as a published device names it: resolved against each GPU collection as the
/// device plugin's ids are ([`GpuRef`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuDevice {
    /// `GPU-…`: the GPU, or a MIG device's parent.
    Uuid(String),
    /// `MIG-…` of a MIG device that names no parent.
    Mig(String),
    /// NVML's index (the driver's older releases).
    Index(u32),
}

impl GpuDevice {
    pub fn gpu(&self) -> GpuRef<'_> {
        match self {
            GpuDevice::Uuid(u) => GpuRef::Uuid(u),
            GpuDevice::Mig(m) => GpuRef::Mig(m),
            GpuDevice::Index(i) => GpuRef::Index(*i),
        }
    }
}

/// NVIDIA's driver: a device stands for a GPU.
pub struct Nvidia;

impl Driver for Nvidia {
    const NAME: &'static str = NVIDIA_DRA_DRIVER;
    type Device = GpuDevice;

    /// A whole GPU (`type` `gpu`, or none) by its `uuid`, else its `index`; a MIG device by
    /// its `parentUUID`, else its own `uuid`, else its `parentIndex`; any other type
    /// (a passthrough device: no GPU NVML reads here) stands for none.
    fn device(attributes: &[Attribute<'_>]) -> Option<GpuDevice> {
        let get = |name: &str| attributes.iter().find(|(key, _, _)| is_attribute(NVIDIA_DRA_DRIVER, key, name));
        let text = |name: &str| get(name).and_then(|(_, _, s)| *s);
        let index = |name: &str| {
            let i = get(name).and_then(|(_, i, _)| *i)?;
            u32::try_from(i).ok().filter(|i| *i < MAX_GPUS).map(GpuDevice::Index)
        };
        let mig = match text(NVIDIA_DRA_TYPE) {
            None | Some(NVIDIA_DRA_TYPE_GPU) => false,
            Some(NVIDIA_DRA_TYPE_MIG) => true,
            Some(_) => return None,
        };
        if mig {
            let parent = text(NVIDIA_DRA_PARENT_UUID).and_then(uuid).filter(|d| matches!(d, GpuDevice::Uuid(_)));
            parent.or_else(|| text(NVIDIA_DRA_UUID).and_then(uuid)).or_else(|| index(NVIDIA_DRA_PARENT_INDEX))
        } else {
            text(NVIDIA_DRA_UUID).and_then(uuid).or_else(|| index(NVIDIA_DRA_INDEX))
        }
    }
}

/// A `GPU-…` or `MIG-…` UUID, by the device plugin's rules (bounded, no replica).
fn uuid(text: &str) -> Option<GpuDevice> {
    let id = parse_device_id(text).filter(|id| id.replica.is_none())?;
    match id.gpu {
        GpuRef::Uuid(u) => Some(GpuDevice::Uuid(u.to_owned())),
        GpuRef::Mig(m) => Some(GpuDevice::Mig(m.to_owned())),
        GpuRef::Index(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = "GPU-0a1b2c3d-0000-1111-2222-333344445555";
    const MIG: &str = "MIG-9f8e7d6c-0000-1111-2222-333344445555";

    fn read(attributes: &[(&str, Option<i64>, Option<&str>)]) -> Option<GpuDevice> {
        Nvidia::device(attributes)
    }

    #[test]
    fn whole_gpus_and_mig_devices_stand_for_their_gpu() {
        let gpu = Some(GpuDevice::Uuid(GPU.into()));
        assert_eq!(read(&[("type", None, Some("gpu")), ("uuid", None, Some(GPU))]), gpu);
        assert_eq!(read(&[("gpu.nvidia.com/uuid", None, Some(GPU))]), gpu, "qualified, no type");
        // A MIG device: its parent, else its own UUID, else its parent's index.
        let mig = [("type", None, Some("mig")), ("uuid", None, Some(MIG)), ("parentUUID", None, Some(GPU))];
        assert_eq!(read(&mig), gpu);
        assert_eq!(read(&mig[..2]), Some(GpuDevice::Mig(MIG.into())));
        assert_eq!(read(&[("type", None, Some("mig")), ("parentIndex", Some(3), None)]), Some(GpuDevice::Index(3)));
        // Older releases: the index.
        assert_eq!(read(&[("type", None, Some("gpu")), ("index", Some(2), None)]), Some(GpuDevice::Index(2)));
    }

    #[test]
    fn devices_naming_no_gpu_stand_for_none() {
        for odd in [
            vec![("type", None, Some("vfio")), ("uuid", None, Some(GPU))],
            vec![("type", None, Some("gpu"))],
            vec![("type", None, Some("gpu")), ("uuid", None, Some("GPU-xyz"))],
            vec![("type", None, Some("gpu")), ("uuid", Some(1), None)],
            vec![("type", None, Some("gpu")), ("index", Some(64), None)],
            vec![("type", None, Some("gpu")), ("index", Some(-1), None)],
            vec![("type", None, Some("gpu")), ("uuid", None, Some("3"))],
            vec![("type", None, Some("mig")), ("parentUUID", None, Some(MIG))],
            vec![("other.example.com/uuid", None, Some(GPU))],
        ] {
            assert_eq!(read(&odd), None, "{odd:?}");
        }
        let long = format!("GPU-{}", "a".repeat(200));
        assert_eq!(read(&[("uuid", None, Some(&long))]), None);
    }
}
