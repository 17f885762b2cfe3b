//! Neuron hardware facts shared by the operator, the agent and the simulator: the
//! device plugin's extended resources and the Neuron instance types. One table: the
//! cost estimate, the simulator and the bounds on what a report may claim all read it.

/// The Neuron device plugin's extended resources: host cores, devices, and devices
/// again under the older name.
pub const NEURONCORE_RESOURCE: &str = "aws.amazon.com/neuroncore";
pub const NEURONDEVICE_RESOURCE: &str = "aws.amazon.com/neurondevice";
pub const NEURON_RESOURCE: &str = "aws.amazon.com/neuron";
pub const NEURON_RESOURCES: [&str; 3] = [NEURONCORE_RESOURCE, NEURONDEVICE_RESOURCE, NEURON_RESOURCE];

/// The EFA device plugin's extended resource: its device ids are the EFA devices' names
/// under `/sys/class/infiniband` (`rdmap16s27`), as CloudWatch Container Insights'
/// EFA scraper also reads them.
pub const EFA_RESOURCE: &str = "vpc.amazonaws.com/efa";

/// Instance-type prefixes of the Neuron families (every type of [`INSTANCE_TYPES`]
/// starts with one; a test checks it).
pub const NEURON_INSTANCE_FAMILIES: [&str; 6] = ["inf1.", "inf2.", "trn1.", "trn1n.", "trn2.", "trn2u."];

/// Chip generation of an instance type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    Inferentia,
    Inferentia2,
    Trainium,
    Trainium2,
}

/// One EC2 instance type with Neuron devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstanceType {
    pub name: &'static str,
    pub devices: u32,
    /// Cores per device as neuron-monitor counts them: logical cores on trn2, whose
    /// default (LNC=2) pairs the 8 physical cores of a device into 4.
    pub cores_per_device: u32,
    pub vcpus: u32,
    pub memory_gib: u64,
    pub generation: Generation,
}

impl InstanceType {
    /// The table's entry for an instance type name (`node.kubernetes.io/instance-type`).
    pub fn lookup(name: &str) -> Option<&'static InstanceType> {
        INSTANCE_TYPES.iter().find(|t| t.name == name)
    }

    pub const fn cores(&self) -> u32 {
        self.devices * self.cores_per_device
    }

    /// The device holding a host core index.
    pub const fn device_of(&self, core: u32) -> u32 {
        core / self.cores_per_device
    }

    /// EFA devices the type has when every network card carries one (0: no EFA); see
    /// [`EFA_DEVICES`].
    pub fn efa_devices(&self) -> u32 {
        EFA_DEVICES.iter().find(|(name, _)| *name == self.name).map_or(0, |(_, n)| *n)
    }

    /// Physical cores grouped into each logical one (LNC), where the family has logical
    /// cores (trn2: 2 by default).
    pub const fn logical_neuroncore_config(&self) -> Option<u32> {
        match self.generation {
            Generation::Trainium2 => Some(TRN2_PHYSICAL_CORES_PER_DEVICE / self.cores_per_device),
            _ => None,
        }
    }

    /// The same instance run with `lnc` physical cores per logical one (trn2: 1 or 2).
    pub fn with_lnc(mut self, lnc: u32) -> Result<Self, String> {
        match (self.generation, lnc) {
            (Generation::Trainium2, 1 | 2) => {
                self.cores_per_device = TRN2_PHYSICAL_CORES_PER_DEVICE / lnc;
                Ok(self)
            }
            (Generation::Trainium2, _) => Err(format!("{}: logical NeuronCore config 1 or 2, not {lnc}", self.name)),
            _ => Err(format!("{} has no logical NeuronCores", self.name)),
        }
    }
}

/// NeuronCore-v3 per Trainium2 device.
const TRN2_PHYSICAL_CORES_PER_DEVICE: u32 = 8;

const fn instance(
    name: &'static str,
    devices: u32,
    cores_per_device: u32,
    vcpus: u32,
    memory_gib: u64,
    generation: Generation,
) -> InstanceType {
    InstanceType { name, devices, cores_per_device, vcpus, memory_gib, generation }
}

use Generation::{Inferentia, Inferentia2, Trainium, Trainium2};

/// The Neuron instance types (the reference's hardware table), with their EC2 vCPUs and memory.
pub const INSTANCE_TYPES: [InstanceType; 13] = [
    instance("inf1.xlarge", 1, 4, 4, 8, Inferentia),
    instance("inf1.2xlarge", 1, 4, 8, 16, Inferentia),
    instance("inf1.6xlarge", 4, 4, 24, 48, Inferentia),
    instance("inf1.24xlarge", 16, 4, 96, 192, Inferentia),
    instance("inf2.xlarge", 1, 2, 4, 16, Inferentia2),
    instance("inf2.8xlarge", 1, 2, 32, 128, Inferentia2),
    instance("inf2.24xlarge", 6, 2, 96, 384, Inferentia2),
    instance("inf2.48xlarge", 12, 2, 192, 768, Inferentia2),
    instance("trn1.2xlarge", 1, 2, 8, 32, Trainium),
    instance("trn1.32xlarge", 16, 2, 128, 512, Trainium),
    instance("trn1n.32xlarge", 16, 2, 128, 512, Trainium),
    instance("trn2.48xlarge", 16, 4, 192, 2048, Trainium2),
    instance("trn2u.48xlarge", 16, 4, 192, 2048, Trainium2),
];

/// EFA devices of the Neuron types that have EFA, one per network card: trn1.32xlarge 8 and
/// trn1n.32xlarge 16 (Neuron SDK documentation, "How to prepare trn1.32xlarge for
/// multi-node execution"); trn2.48xlarge and trn2u.48xlarge 16 (EC2's network
/// specifications: 16 network cards, one EFA each, 3.2 Tbps); inf1.24xlarge 1 (EC2's list
/// of EFA instance types, which AWS's EFA device plugin chart copies). No inf2 type and no
/// smaller inf1 or trn1 type is on that list.
pub const EFA_DEVICES: [(&str, u32); 5] =
    [("inf1.24xlarge", 1), ("trn1.32xlarge", 8), ("trn1n.32xlarge", 16), ("trn2.48xlarge", 16), ("trn2u.48xlarge", 16)];

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
        assert_eq!(shape("trn2u.48xlarge"), (16, 4, 192));
        assert_eq!(InstanceType::lookup("p4d.24xlarge"), None);
    }

    #[test]
    fn every_type_is_of_a_listed_family() {
        for t in INSTANCE_TYPES {
            assert!(NEURON_INSTANCE_FAMILIES.iter().any(|f| t.name.starts_with(f)), "{}", t.name);
        }
    }

    #[test]
    fn every_type_is_within_what_a_report_may_claim() {
        use crate::limits::{MAX_NEURONCORES, MAX_NEURONCORES_PER_DEVICE, MAX_NEURON_DEVICES};
        for t in INSTANCE_TYPES {
            // Physical cores: up to twice the logical ones (LNC=2).
            let physical_per_device = t.cores_per_device * 2;
            assert!(t.devices <= MAX_NEURON_DEVICES, "{}", t.name);
            assert!(physical_per_device <= MAX_NEURONCORES_PER_DEVICE, "{}", t.name);
            assert!(t.devices * physical_per_device <= MAX_NEURONCORES, "{}", t.name);
        }
    }

    #[test]
    fn efa_counts_name_types_of_the_table() {
        for (name, count) in EFA_DEVICES {
            assert!(InstanceType::lookup(name).is_some(), "{name}");
            // One per network card: 32 on the EC2 type with the most (p5).
            assert!((1..=32).contains(&count), "{name}");
        }
        let efa = |n: &str| InstanceType::lookup(n).unwrap().efa_devices();
        assert_eq!((efa("trn1.32xlarge"), efa("trn1n.32xlarge"), efa("trn2.48xlarge")), (8, 16, 16));
        assert_eq!((efa("trn1.2xlarge"), efa("inf2.48xlarge")), (0, 0));
    }

    #[test]
    fn names_are_unique() {
        let mut names: Vec<&str> = INSTANCE_TYPES.iter().map(|t| t.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), INSTANCE_TYPES.len());
    }

    #[test]
    fn trn2_runs_with_one_or_two_physical_cores_per_logical_one() {
        let trn2 = *InstanceType::lookup("trn2.48xlarge").unwrap();
        assert_eq!((trn2.cores(), trn2.logical_neuroncore_config()), (64, Some(2)));
        let lnc1 = trn2.with_lnc(1).unwrap();
        assert_eq!((lnc1.cores(), lnc1.logical_neuroncore_config()), (128, Some(1)));
        assert_eq!(trn2.with_lnc(2).unwrap(), trn2);
        assert!(trn2.with_lnc(4).is_err());
        assert!(InstanceType::lookup("trn1.32xlarge").unwrap().with_lnc(1).is_err());
        assert_eq!(InstanceType::lookup("trn1.32xlarge").unwrap().logical_neuroncore_config(), None);
    }
}
