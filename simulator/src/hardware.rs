//! The simulated host: an instance type of `api`'s table, and the two objects
//! neuron-monitor always writes about it (`instance_info`, `neuron_hardware_info`).

use anyhow::{bail, Result};
pub use api::hardware::InstanceType;
use api::hardware::{Generation, INSTANCE_TYPES};
use api::hash::fnv1a;

use crate::wire::{HardwareInfo, InstanceInfo};

const GIB: u64 = 1 << 30;

/// The instance type named `name`, or an error listing the known ones.
pub fn lookup(name: &str) -> Result<InstanceType> {
    match InstanceType::lookup(name) {
        Some(t) => Ok(*t),
        None => {
            let known: Vec<&str> = INSTANCE_TYPES.iter().map(|t| t.name).collect();
            bail!("unknown instance type {name:?}; known types: {}", known.join(", "))
        }
    }
}

/// What neuron-monitor writes about the simulated host.
pub trait HostDocuments {
    fn hardware_info(&self) -> HardwareInfo;
    fn instance_info(&self, region: &str) -> InstanceInfo;
    fn memory_bytes(&self) -> u64;
}

impl HostDocuments for InstanceType {
    fn hardware_info(&self) -> HardwareInfo {
        let (device_type, version, memory, logical) = match self.generation {
            Generation::Inferentia => {
                return HardwareInfo {
                    neuron_device_count: self.devices,
                    neuroncore_per_device_count: self.cores_per_device,
                    error: String::new(),
                    ..HardwareInfo::default()
                }
            }
            // Device memory, as neuron-monitor reports it.
            Generation::Inferentia2 => ("inferentia2", "v2", 32 * GIB, None),
            Generation::Trainium => ("trainium", "v2", 32 * GIB, None),
            // trn2 groups two physical cores into one logical core by default (8 → 4).
            Generation::Trainium2 => ("trainium2", "v3", 96 * GIB, self.logical_neuroncore_config()),
            // Trainium3: NeuronCore-v4, 144 GiB of device memory (Neuron docs).
            Generation::Trainium3 => ("trainium3", "v4", 144 * GIB, self.logical_neuroncore_config()),
        };
        HardwareInfo {
            neuron_device_count: self.devices,
            neuroncore_per_device_count: self.cores_per_device,
            error: String::new(),
            neuron_device_type: Some(device_type.to_owned()),
            neuron_device_version: Some(version.to_owned()),
            neuroncore_version: Some(version.to_owned()),
            neuron_device_memory_size: Some(memory),
            logical_neuroncore_config: logical,
        }
    }

    /// Plausible, deterministic identity of the simulated instance.
    fn instance_info(&self, region: &str) -> InstanceInfo {
        let seed = fnv1a(format!("{}/{region}", self.name).as_bytes());
        InstanceInfo {
            instance_name: String::new(),
            instance_id: format!("i-sim{:012x}", seed & 0xffff_ffff_ffff),
            instance_type: self.name.to_owned(),
            instance_availability_zone: format!("{region}a"),
            instance_availability_zone_id: format!("{}-az1", region_code(region)),
            instance_region: region.to_owned(),
            ami_id: format!("ami-0{:016x}", fnv1a(&seed.to_le_bytes())),
            subnet_id: format!("subnet-0{:016x}", seed.rotate_left(17)),
            error: String::new(),
        }
    }

    fn memory_bytes(&self) -> u64 {
        self.memory_gib * GIB
    }
}

/// `us-west-2` → `usw2`, `ap-northeast-1` → `apne1`: the prefix of AWS zone ids.
fn region_code(region: &str) -> String {
    let mut code = String::new();
    for part in region.split('-') {
        let short = match part {
            "northeast" => "ne",
            "northwest" => "nw",
            "southeast" => "se",
            "southwest" => "sw",
            _ if part.chars().all(|c| c.is_ascii_digit()) => part,
            _ if code.is_empty() => part,
            _ => part.get(..1).unwrap_or(""),
        };
        code.push_str(short);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_type_lists_the_known_ones() {
        let err = lookup("p4d.24xlarge").unwrap_err().to_string();
        assert!(err.contains("p4d.24xlarge"), "{err}");
        assert!(err.contains("trn1.2xlarge") && err.contains("inf2.48xlarge"), "{err}");
    }

    #[test]
    fn newer_types_describe_their_devices() {
        let inf1 = lookup("inf1.xlarge").unwrap().hardware_info();
        assert_eq!(inf1.neuron_device_type, None);
        let trn2 = lookup("trn2.48xlarge").unwrap().hardware_info();
        assert_eq!(trn2.neuron_device_type.as_deref(), Some("trainium2"));
        assert_eq!(trn2.logical_neuroncore_config, Some(2));
        let inf2 = lookup("inf2.xlarge").unwrap().hardware_info();
        assert_eq!(inf2.neuron_device_type.as_deref(), Some("inferentia2"));
        let trn3 = lookup("trn3.48xlarge").unwrap().hardware_info();
        assert_eq!(trn3.neuron_device_type.as_deref(), Some("trainium3"));
        assert_eq!((trn3.neuroncore_per_device_count, trn3.logical_neuroncore_config), (4, Some(2)));
    }

    #[test]
    fn instance_info_is_deterministic_and_plausible() {
        let t = lookup("trn1.32xlarge").unwrap();
        let a = t.instance_info("us-west-2");
        assert_eq!(a, t.instance_info("us-west-2"));
        assert!(a.instance_id.starts_with("i-sim"));
        assert_eq!(a.instance_availability_zone, "us-west-2a");
        assert_eq!(a.instance_availability_zone_id, "usw2-az1");
        assert_eq!(region_code("ap-northeast-1"), "apne1");
        assert_eq!(region_code("eu-central-1"), "euc1");
    }
}
