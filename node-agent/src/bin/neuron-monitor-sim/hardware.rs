//! The simulated host: what an EC2 Inferentia/Trainium instance type carries, and the
//! two objects neuron-monitor always writes about it (`instance_info`,
//! `neuron_hardware_info`).

use anyhow::{bail, Result};

use crate::document::{HardwareInfo, InstanceInfo};

const GIB: u64 = 1 << 30;

/// Chip generation: decides which optional `neuron_hardware_info` fields are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// Older releases on inf1 write only the two counts.
    Inferentia,
    Inferentia2,
    Trainium,
    Trainium2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceType {
    pub name: &'static str,
    pub devices: u32,
    /// Cores per device as neuron-monitor counts them (logical cores on trn2).
    pub cores_per_device: u32,
    pub vcpus: u32,
    pub memory_bytes: u64,
    pub generation: Generation,
}

macro_rules! instance {
    ($name:literal, $devices:literal x $cores:literal, $vcpus:literal vcpu, $mem:literal GiB, $gen:ident) => {
        InstanceType {
            name: $name,
            devices: $devices,
            cores_per_device: $cores,
            vcpus: $vcpus,
            memory_bytes: $mem * GIB,
            generation: Generation::$gen,
        }
    };
}

/// The instance types of the reference's hardware table, with their EC2 vCPU and memory.
pub const INSTANCE_TYPES: [InstanceType; 12] = [
    instance!("inf1.xlarge", 1 x 4, 4 vcpu, 8 GiB, Inferentia),
    instance!("inf1.2xlarge", 1 x 4, 8 vcpu, 16 GiB, Inferentia),
    instance!("inf1.6xlarge", 4 x 4, 24 vcpu, 48 GiB, Inferentia),
    instance!("inf1.24xlarge", 16 x 4, 96 vcpu, 192 GiB, Inferentia),
    instance!("inf2.xlarge", 1 x 2, 4 vcpu, 16 GiB, Inferentia2),
    instance!("inf2.8xlarge", 1 x 2, 32 vcpu, 128 GiB, Inferentia2),
    instance!("inf2.24xlarge", 6 x 2, 96 vcpu, 384 GiB, Inferentia2),
    instance!("inf2.48xlarge", 12 x 2, 192 vcpu, 768 GiB, Inferentia2),
    instance!("trn1.2xlarge", 1 x 2, 8 vcpu, 32 GiB, Trainium),
    instance!("trn1.32xlarge", 16 x 2, 128 vcpu, 512 GiB, Trainium),
    instance!("trn1n.32xlarge", 16 x 2, 128 vcpu, 512 GiB, Trainium),
    instance!("trn2.48xlarge", 16 x 4, 192 vcpu, 2048 GiB, Trainium2),
];

impl InstanceType {
    pub fn lookup(name: &str) -> Result<InstanceType> {
        match INSTANCE_TYPES.iter().find(|t| t.name == name) {
            Some(t) => Ok(*t),
            None => {
                let known: Vec<&str> = INSTANCE_TYPES.iter().map(|t| t.name).collect();
                bail!("unknown instance type {name:?}; known types: {}", known.join(", "))
            }
        }
    }

    pub fn core_count(&self) -> u32 {
        self.devices * self.cores_per_device
    }

    /// The device holding a host core index.
    pub fn device_of(&self, core: u32) -> u32 {
        core / self.cores_per_device
    }

    pub fn hardware_info(&self) -> HardwareInfo {
        let (device_type, version, memory, logical) = match self.generation {
            Generation::Inferentia => {
                return HardwareInfo {
                    neuron_device_count: self.devices,
                    neuroncore_per_device_count: self.cores_per_device,
                    error: String::new(),
                    ..HardwareInfo::default()
                }
            }
            Generation::Inferentia2 => ("inferentia2", "v2", 32 * GIB, None),
            Generation::Trainium => ("trainium", "v2", 32 * GIB, None),
            // trn2 groups two physical cores into one logical core by default (8 → 4).
            Generation::Trainium2 => ("trainium2", "v3", 96 * GIB, Some(2)),
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
    pub fn instance_info(&self, region: &str) -> InstanceInfo {
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

/// FNV-1a: a stable hash (std's hasher is not guaranteed stable across releases).
pub fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_reference() {
        let shape = |n: &str| {
            let t = InstanceType::lookup(n).unwrap();
            (t.devices, t.cores_per_device, t.vcpus)
        };
        assert_eq!(shape("inf1.xlarge"), (1, 4, 4));
        assert_eq!(shape("inf1.24xlarge"), (16, 4, 96));
        assert_eq!(shape("inf2.xlarge"), (1, 2, 4));
        assert_eq!(shape("inf2.48xlarge"), (12, 2, 192));
        assert_eq!(shape("trn1.2xlarge"), (1, 2, 8));
        assert_eq!(shape("trn1.32xlarge"), (16, 2, 128));
        assert_eq!(shape("trn1n.32xlarge"), (16, 2, 128));
        assert_eq!(shape("trn2.48xlarge"), (16, 4, 192));
    }

    #[test]
    fn unknown_type_lists_the_known_ones() {
        let err = InstanceType::lookup("p4d.24xlarge").unwrap_err().to_string();
        assert!(err.contains("p4d.24xlarge"), "{err}");
        assert!(err.contains("trn1.2xlarge") && err.contains("inf2.48xlarge"), "{err}");
    }

    #[test]
    fn newer_types_describe_their_devices() {
        let inf1 = InstanceType::lookup("inf1.xlarge").unwrap().hardware_info();
        assert_eq!(inf1.neuron_device_type, None);
        let trn2 = InstanceType::lookup("trn2.48xlarge").unwrap().hardware_info();
        assert_eq!(trn2.neuron_device_type.as_deref(), Some("trainium2"));
        assert_eq!(trn2.logical_neuroncore_config, Some(2));
        let inf2 = InstanceType::lookup("inf2.xlarge").unwrap().hardware_info();
        assert_eq!(inf2.neuron_device_type.as_deref(), Some("inferentia2"));
    }

    #[test]
    fn instance_info_is_deterministic_and_plausible() {
        let t = InstanceType::lookup("trn1.32xlarge").unwrap();
        let a = t.instance_info("us-west-2");
        assert_eq!(a, t.instance_info("us-west-2"));
        assert!(a.instance_id.starts_with("i-sim"));
        assert_eq!(a.instance_availability_zone, "us-west-2a");
        assert_eq!(a.instance_availability_zone_id, "usw2-az1");
        assert_eq!(region_code("ap-northeast-1"), "apne1");
        assert_eq!(region_code("eu-central-1"), "euc1");
    }
}
