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

/// AWS's Neuron DRA driver: its name (that of its DeviceClass too), the attribute of each
/// device it publishes in a ResourceSlice that holds the Neuron device's index (an
/// integer, in the driver's own domain: `deviceId` or `neuron.aws.com/deviceId`), and the
/// attribute that tells a device (`neuron_device`) from an UltraServer node entry
/// (`neuron_node`). Facts of the driver's attribute reference (Neuron SDK docs,
/// `deploy/eks/dra`).
pub const NEURON_DRA_DRIVER: &str = "neuron.aws.com";
pub const NEURON_DRA_DEVICE_ID: &str = "deviceId";
pub const NEURON_DRA_RESOURCE_TYPE: &str = "resourceType";
pub const NEURON_DRA_DEVICE_TYPE: &str = "neuron_device";

/// EFA on DRA: AWS's EFA DRA driver is DRANET (kubernetes-sigs/dranet, AWS's `aws-dranet`
/// chart), whose driver name is `dra.net`; the DeviceClass `efa.networking.k8s.aws` selects
/// its EFA devices. A device of its ResourceSlices names its RDMA device (the name under
/// `/sys/class/infiniband`, as the EFA device plugin's ids do) in the string attribute
/// `rdmaDevice` (qualified: `dra.net/rdmaDevice`); a network device without RDMA has none.
/// Facts of EKS's user guide ("Manage EFA devices on Amazon EKS") and DRANET's attribute
/// list.
pub const EFA_DRA_DRIVER: &str = "dra.net";
pub const EFA_DRA_DEVICE_CLASS: &str = "efa.networking.k8s.aws";
pub const EFA_DRA_RDMA_DEVICE: &str = "rdmaDevice";

/// NVIDIA's DRA driver for GPUs (k8s-dra-driver-gpu) and the attributes of the devices
/// it publishes that say which GPU one is: every device's `type` (`gpu` for a whole GPU,
/// `mig` for a MIG device; others, such as passthrough devices, are no GPU NVML reads
/// here) and `uuid` (`GPU-…`, a MIG device's `MIG-…`), a MIG device's `parentUUID`; the
/// driver's older releases also published the integer `index` (a MIG device's parent's:
/// `parentIndex`). Names in the driver's own domain, bare or qualified by it.
pub const NVIDIA_DRA_DRIVER: &str = "gpu.nvidia.com";
pub const NVIDIA_DRA_TYPE: &str = "type";
pub const NVIDIA_DRA_TYPE_GPU: &str = "gpu";
pub const NVIDIA_DRA_TYPE_MIG: &str = "mig";
pub const NVIDIA_DRA_UUID: &str = "uuid";
pub const NVIDIA_DRA_PARENT_UUID: &str = "parentUUID";
pub const NVIDIA_DRA_INDEX: &str = "index";
pub const NVIDIA_DRA_PARENT_INDEX: &str = "parentIndex";

/// The NVIDIA device plugin's extended resources: whole GPUs (and MIG instances under
/// the `single` MIG strategy), GPUs shared by time-slicing or MPS when the plugin renames
/// them, and the prefix of MIG profiles under the `mixed` strategy
/// (`nvidia.com/mig-1g.10gb`).
pub const NVIDIA_GPU_RESOURCE: &str = "nvidia.com/gpu";
pub const NVIDIA_GPU_SHARED_RESOURCE: &str = "nvidia.com/gpu.shared";
pub const NVIDIA_MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// Bytes of an EFA device name (the kernel's own bound for a device name is 64).
pub const MAX_EFA_NAME_BYTES: usize = 64;

/// An EFA device name as a label value, whether it comes from sysfs or from the kubelet's
/// allocations: `[A-Za-z0-9_.:-]`, at most [`MAX_EFA_NAME_BYTES`].
pub fn valid_efa_device_name(name: &str) -> bool {
    let ok = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-');
    !name.is_empty() && name.len() <= MAX_EFA_NAME_BYTES && name.bytes().all(ok)
}

/// Node labels that say a node has NVIDIA GPUs, with the value (or value prefix) that
/// says so: the GPU Operator's feature discovery sets `nvidia.com/gpu.present=true`; EKS
/// node groups of GPU instances carry `k8s.amazonaws.com/accelerator=nvidia-…`.
pub const NVIDIA_GPU_PRESENT_LABEL: (&str, &str) = ("nvidia.com/gpu.present", "true");
/// Node labels that carry the node's instance type (the current one first); its region's
/// are [`crate::region::REGION_LABELS`].
pub const INSTANCE_TYPE_LABELS: [&str; 2] = ["node.kubernetes.io/instance-type", "beta.kubernetes.io/instance-type"];
/// Node labels that carry the node's availability zone (the current one first).
pub const ZONE_LABELS: [&str; 2] = ["topology.kubernetes.io/zone", "failure-domain.beta.kubernetes.io/zone"];
/// The GPU Operator's feature-discovery labels: the node's physical GPUs, and the replicas
/// each is time-sliced into (its `nvidia.com/gpu` capacity is their product).
pub const NVIDIA_GPU_COUNT_LABELS: (&str, &str) = ("nvidia.com/gpu.count", "nvidia.com/gpu.replicas");
pub const EKS_ACCELERATOR_LABEL: (&str, &str) = ("k8s.amazonaws.com/accelerator", "nvidia");

/// Instance-type prefixes of the EC2 families with NVIDIA GPUs (P and G families; not
/// g4ad, whose GPUs are AMD's). A node can carry its type before the device plugin
/// reports its GPUs.
pub const NVIDIA_INSTANCE_FAMILIES: [&str; 16] = [
    "p3.", "p3dn.", "p4d.", "p4de.", "p5.", "p5e.", "p5en.", "p6-", "p6e-", "g4dn.", "g5.", "g5g.", "g6.", "g6e.",
    "g6f.", "gr6.",
];

/// Instance-type prefixes of the Neuron families (every type of [`INSTANCE_TYPES`]
/// starts with one; a test checks it).
pub const NEURON_INSTANCE_FAMILIES: [&str; 8] =
    ["inf1.", "inf2.", "trn1.", "trn1n.", "trn2.", "trn2u.", "trn3.", "trn3p."];

/// Chip generation of an instance type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// NeuronCore-v1.
    Inferentia,
    /// NeuronCore-v2.
    Inferentia2,
    /// NeuronCore-v2.
    Trainium,
    /// NeuronCore-v3, 8 per device, grouped into logical cores (LNC).
    Trainium2,
    /// NeuronCore-v4, 8 per device, grouped into logical cores (LNC).
    Trainium3,
}

impl Generation {
    /// The generation of `neuron_hardware_info.neuron_device_type` (`trainium2`, …).
    pub fn from_device_type(device_type: &str) -> Option<Generation> {
        match device_type.to_ascii_lowercase().as_str() {
            "inferentia" => Some(Generation::Inferentia),
            "inferentia2" => Some(Generation::Inferentia2),
            "trainium" | "trainium1" => Some(Generation::Trainium),
            "trainium2" => Some(Generation::Trainium2),
            "trainium3" => Some(Generation::Trainium3),
            _ => None,
        }
    }

    /// Physical NeuronCores per device, where the generation groups them into logical
    /// ones: 8 NeuronCore-v3 per Trainium2 ("Every Trainium2 device contains eight
    /// physical NeuronCore-v3", Neuron docs, Logical NeuronCore configuration), 8
    /// NeuronCore-v4 per Trainium3 ("A Trainium3 device contains eight NeuronCore-v4
    /// cores", Neuron docs, Trainium3 Architecture).
    pub const fn physical_cores_per_device(self) -> Option<u32> {
        match self {
            Generation::Trainium2 | Generation::Trainium3 => Some(8),
            _ => None,
        }
    }
}

/// A documented peak of one physical NeuronCore for one data type (dense, no sparsity).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PeakFlops {
    /// As the Neuron docs name it, lower case: `bf16`, `fp32`, `cfp8`, `mxfp8`, …
    pub data_type: &'static str,
    /// Floating-point operations per second of one physical core.
    pub per_core: f64,
}

const fn peak(data_type: &'static str, tflops: f64) -> PeakFlops {
    PeakFlops { data_type, per_core: tflops * 1e12 }
}

/// The documented dense peaks of one physical NeuronCore of a generation, by data type.
/// Sources (AWS Neuron documentation, Neuron architecture pages; a device's figure is
/// divided by its cores where no per-core figure is given):
/// - NeuronCore-v1: Inferentia: "Four NeuronCore-v1 cores, delivering … 64 FP16/BF16
///   TFLOPS" per chip: 16 per core.
/// - NeuronCore-v2: Inferentia2 and Trainium: two cores deliver "190 FP16/BF16/cFP8/TF32
///   TFLOPS, and 47.5 FP32 TFLOPS" per device: 95 and 23.75 per core.
/// - NeuronCore-v3 (Trainium2): "A NeuronCore-v3 Tensor Engine delivers 158 cFP8 TFLOPS,
///   and 79 BF16/FP16/TF32 TFLOPS"; FP32: "181 FP32 TFLOPS" per device of eight cores:
///   22.625 per core.
/// - NeuronCore-v4 (Trainium3): "A NeuronCore-v4 Tensor Engine delivers 315 MXFP8/MXFP4
///   TFLOPS … 79 BF16/FP16/TF32 and 20 FP32 TFLOPS".
pub const fn peak_flops(generation: Generation) -> &'static [PeakFlops] {
    const V1: [PeakFlops; 2] = [peak("bf16", 16.0), peak("fp16", 16.0)];
    const V2: [PeakFlops; 5] =
        [peak("bf16", 95.0), peak("cfp8", 95.0), peak("fp16", 95.0), peak("fp32", 23.75), peak("tf32", 95.0)];
    const V3: [PeakFlops; 5] =
        [peak("bf16", 79.0), peak("cfp8", 158.0), peak("fp16", 79.0), peak("fp32", 22.625), peak("tf32", 79.0)];
    const V4: [PeakFlops; 6] = [
        peak("bf16", 79.0),
        peak("fp16", 79.0),
        peak("fp32", 20.0),
        peak("mxfp4", 315.0),
        peak("mxfp8", 315.0),
        peak("tf32", 79.0),
    ];
    match generation {
        Generation::Inferentia => &V1,
        Generation::Inferentia2 | Generation::Trainium => &V2,
        Generation::Trainium2 => &V3,
        Generation::Trainium3 => &V4,
    }
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
    /// cores (trn2, trn3: 2 by default).
    pub const fn logical_neuroncore_config(&self) -> Option<u32> {
        match self.generation.physical_cores_per_device() {
            Some(physical) => Some(physical / self.cores_per_device),
            None => None,
        }
    }

    /// The same instance run with `lnc` physical cores per logical one (trn2, trn3: 1
    /// or 2, the only values the Neuron runtime supports).
    pub fn with_lnc(mut self, lnc: u32) -> Result<Self, String> {
        match (self.generation.physical_cores_per_device(), lnc) {
            (Some(physical), 1 | 2) => {
                self.cores_per_device = physical / lnc;
                Ok(self)
            }
            (Some(_), _) => Err(format!("{}: logical NeuronCore config 1 or 2, not {lnc}", self.name)),
            (None, _) => Err(format!("{} has no logical NeuronCores", self.name)),
        }
    }
}

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

use Generation::{Inferentia, Inferentia2, Trainium, Trainium2, Trainium3};

/// The Neuron instance types (the reference's hardware table), with their EC2 vCPUs and
/// memory. Logical-core families at their default LNC=2 (4 logical cores per device).
///
/// trn3, from what the Neuron documentation says (Amazon EC2 Trn3 Architecture; Trainium3
/// Architecture): a Trn3 Gen1 UltraServer is "four servers with 16 Trainium3 devices per
/// server" with 768 vCPUs and 8,192 GiB of host memory (192 and 2,048 per server), each
/// device eight NeuronCore-v4. The documentation names no instance types; the Neuron
/// driver's source (aws-neuron-driver, v4/neuron_dhal_v4.c) names trn3.48xlarge and
/// trn3p.48xlarge (UltraServer) with 16-device maps, a 48xlarge being 192 vCPUs: the
/// Gen1 server. LNC=2 as on trn2 (the docs say LNC applies to Trn3, 1 or 2, without
/// naming its default). Left out: trn3e.24xlarge (a 4-device map in the driver; its
/// vCPUs and memory are documented nowhere reachable) and the Gen2 server (4 devices,
/// 64 vCPUs, 768 GiB), whose instance type is not documented.
pub const INSTANCE_TYPES: [InstanceType; 15] = [
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
    instance("trn3.48xlarge", 16, 4, 192, 2048, Trainium3),
    instance("trn3p.48xlarge", 16, 4, 192, 2048, Trainium3),
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
        assert_eq!(shape("trn3.48xlarge"), (16, 4, 192));
        assert_eq!(shape("trn3p.48xlarge"), (16, 4, 192));
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

    #[test]
    fn trn3_has_eight_physical_cores_per_device_grouped_like_trn2() {
        let trn3 = *InstanceType::lookup("trn3.48xlarge").unwrap();
        assert_eq!((trn3.cores(), trn3.logical_neuroncore_config()), (64, Some(2)));
        assert_eq!(trn3.with_lnc(1).unwrap().cores(), 128);
        assert!(trn3.with_lnc(3).is_err());
    }

    #[test]
    fn device_types_name_their_generation() {
        assert_eq!(Generation::from_device_type("trainium2"), Some(Trainium2));
        assert_eq!(Generation::from_device_type("Trainium3"), Some(Trainium3));
        assert_eq!(Generation::from_device_type("inferentia2"), Some(Inferentia2));
        assert_eq!(Generation::from_device_type("gpu"), None);
    }

    #[test]
    fn peaks_are_the_documented_per_core_figures() {
        let tflops = |g, t: &str| peak_flops(g).iter().find(|p| p.data_type == t).map(|p| p.per_core / 1e12);
        // Trainium device: 190 BF16 and 47.5 FP32 TFLOPS over two NeuronCore-v2.
        assert_eq!(tflops(Trainium, "bf16"), Some(95.0));
        assert_eq!(tflops(Inferentia2, "fp32"), Some(23.75));
        assert_eq!(tflops(Trainium2, "cfp8"), Some(158.0));
        assert_eq!(tflops(Trainium2, "fp32"), Some(181.0 / 8.0));
        assert_eq!(tflops(Trainium3, "mxfp8"), Some(315.0));
        assert_eq!(tflops(Inferentia, "bf16"), Some(16.0));
        assert_eq!(tflops(Inferentia, "fp32"), None, "not documented: not exported");
        for g in [Inferentia, Inferentia2, Trainium, Trainium2, Trainium3] {
            let mut types: Vec<&str> = peak_flops(g).iter().map(|p| p.data_type).collect();
            types.dedup();
            assert_eq!(types.len(), peak_flops(g).len(), "one peak per data type");
        }
    }
}
