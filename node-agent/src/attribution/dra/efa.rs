//! EFA devices claimed through DRA: AWS's EFA DRA driver (DRANET, driver `dra.net`,
//! DeviceClass `efa.networking.k8s.aws`) publishes each network device of the node; the
//! EFA devices carry the RDMA device's name, which is the EFA device's name under
//! `/sys/class/infiniband` (what the EFA device plugin's ids are). A claimed device
//! resolves to that name, and from there to the EFA series ([`crate::efa`]).

use std::sync::Arc;

use api::hardware::{valid_efa_device_name, EFA_DRA_DRIVER, EFA_DRA_RDMA_DEVICE};

use super::{is_attribute, Attribute, ClaimedDevice, DeviceTable, Driver, Unresolvable};
use crate::attribution::podresources::EfaAllocation;

/// What a device of DRANET's slices stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NetDevice {
    /// An RDMA device: its name under `/sys/class/infiniband`.
    Rdma(String),
    /// A network device without RDMA (an ENA interface): no EFA, so a claim of it is
    /// none of the EFA series' business, and not said to be unresolvable.
    NotRdma,
}

/// DRANET, as AWS ships it for EFA.
pub struct Efa;

impl Driver for Efa {
    const NAME: &'static str = EFA_DRA_DRIVER;
    type Device = NetDevice;

    /// `rdmaDevice` names the RDMA device; absent, the device has no RDMA; a name that
    /// cannot be a device's (empty, overlong, odd bytes) stands for nothing.
    fn device(attributes: &[Attribute<'_>]) -> Option<NetDevice> {
        let rdma = attributes.iter().find(|(key, _, _)| is_attribute(EFA_DRA_DRIVER, key, EFA_DRA_RDMA_DEVICE));
        match rdma {
            None => Some(NetDevice::NotRdma),
            Some((_, _, Some(name))) if valid_efa_device_name(name) => Some(NetDevice::Rdma((*name).to_owned())),
            Some(_) => None,
        }
    }
}

/// The claimed RDMA devices as EFA allocations carrying their claims, sorted by device,
/// and those that name no device of `table`; claims of devices without RDMA are left out.
pub fn resolve(claimed: &[ClaimedDevice], table: &DeviceTable<NetDevice>) -> (Vec<EfaAllocation>, Vec<Unresolvable>) {
    let mut allocations = Vec::new();
    let mut unresolvable = Vec::new();
    for c in claimed {
        match table.claimed(c) {
            Ok(NetDevice::Rdma(device)) => allocations.push(EfaAllocation {
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                container: c.container.clone(),
                device: device.clone(),
                claim: Some(Arc::clone(&c.claim)),
            }),
            Ok(NetDevice::NotRdma) => {}
            Err(reason) => unresolvable.push(Unresolvable::of(c, reason)),
        }
    }
    (allocations, unresolvable)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::dra::{Claim, Slice, Unresolved};

    fn read(attributes: &[(&str, Option<i64>, Option<&str>)]) -> Option<NetDevice> {
        Efa::device(attributes)
    }

    #[test]
    fn an_rdma_device_stands_for_its_infiniband_name() {
        let efa = Some(NetDevice::Rdma("rdmap16s27".into()));
        assert_eq!(read(&[("dra.net/rdmaDevice", None, Some("rdmap16s27"))]), efa);
        assert_eq!(read(&[("rdmaDevice", None, Some("rdmap16s27")), ("dra.net/rdma", None, None)]), efa, "bare");
        let ena =
            [("dra.net/ifName", None, Some("ens5")), ("dra.net/pciDevice", None, Some("Elastic Network Adapter"))];
        assert_eq!(read(&ena), Some(NetDevice::NotRdma));
        // Another domain's attribute of that name is not DRANET's.
        assert_eq!(read(&[("example.com/rdmaDevice", None, Some("rdmap16s27"))]), Some(NetDevice::NotRdma));
    }

    #[test]
    fn an_rdma_name_that_cannot_be_a_device_stands_for_nothing() {
        let long = "r".repeat(65);
        for odd in ["", "../../etc", "rdma p16", long.as_str()] {
            assert_eq!(read(&[("dra.net/rdmaDevice", None, Some(odd))]), None, "{odd:?}");
        }
        assert_eq!(read(&[("dra.net/rdmaDevice", Some(3), None)]), None, "an integer");
    }

    fn claimed(pod: &str, device: &str) -> ClaimedDevice {
        ClaimedDevice {
            namespace: "ml".into(),
            pod: pod.into(),
            container: "main".into(),
            claim: Arc::new(Claim { namespace: "ml".into(), name: format!("{pod}-efa") }),
            pool: "node-a".into(),
            device: device.into(),
            malformed: false,
        }
    }

    #[test]
    fn claims_resolve_to_efa_devices_and_claims_of_plain_nics_are_left_out() {
        let slice = Slice {
            pool: "node-a".into(),
            generation: 1,
            devices: vec![
                ("pci-0000-10-1b-0".into(), Some(NetDevice::Rdma("rdmap16s27".into()))),
                ("ens5".into(), Some(NetDevice::NotRdma)),
                ("pci-0000-20-1b-0".into(), None),
            ],
        };
        let table = DeviceTable::from_slices([&slice]);
        let claims = [
            claimed("train", "pci-0000-10-1b-0"),
            claimed("web", "ens5"),
            claimed("odd", "pci-0000-20-1b-0"),
            claimed("gone", "x"),
        ];
        let (allocations, unresolvable) = resolve(&claims, &table);
        assert_eq!(allocations.len(), 1);
        assert_eq!((allocations[0].pod.as_str(), allocations[0].device.as_str()), ("train", "rdmap16s27"));
        assert_eq!(allocations[0].claim.as_deref().map(|c| c.name.as_str()), Some("train-efa"));
        let reasons: Vec<(&str, Unresolved)> = unresolvable.iter().map(|u| (u.device.as_str(), u.reason)).collect();
        assert_eq!(reasons, vec![("pci-0000-20-1b-0", Unresolved::NoDeviceId), ("x", Unresolved::UnknownDevice)]);
    }
}
