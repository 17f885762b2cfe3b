//! The GPU models and the EC2 instance types the fake can pretend to be: what NVML reports
//! on them (model name, framebuffer, power limit, clocks, PCIe link, PCI ids and bus
//! addresses). The names and framebuffer sizes are what `nvidia-smi` prints on those
//! instances; clocks, limits and idle values are the models' published maxima or plausible
//! idle readings, not measurements.

/// One GPU model as NVML describes it.
#[derive(Debug)]
pub struct Model {
    pub name: &'static str,
    pub memory_mib: u64,
    pub power_limit_w: u32,
    pub idle_power_w: u32,
    pub max_sm_clock_mhz: u32,
    pub max_memory_clock_mhz: u32,
    pub video_clock_mhz: u32,
    pub pcie_generation: u32,
    pub pcie_width: u32,
    /// NVML's `pciDeviceId`: device id in the high half, vendor (0x10DE) in the low half.
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    /// HBM parts report a memory temperature; GDDR6 parts (A10G, L4) do not.
    pub memory_temperature_c: Option<u32>,
    /// How many MIG devices the model can be split into; 0: no MIG.
    pub max_mig_devices: u32,
    /// NVLinks of the SXM parts (H100: 18, A100: 12); the PCIe cards have none.
    pub nvlinks: u32,
}

/// One instance type: its model and the PCI (bus, device) of each GPU, in NVML's index order.
#[derive(Debug)]
pub struct InstanceType {
    pub name: &'static str,
    pub model: &'static Model,
    pub pci_slots: &'static [(u8, u8)],
}

const H100_SXM5_80GB: Model = Model {
    name: "NVIDIA H100 80GB HBM3",
    memory_mib: 81559,
    power_limit_w: 700,
    idle_power_w: 70,
    max_sm_clock_mhz: 1980,
    max_memory_clock_mhz: 2619,
    video_clock_mhz: 1545,
    pcie_generation: 5,
    pcie_width: 16,
    pci_device_id: 0x2330_10DE,
    pci_subsystem_id: 0x16C1_10DE,
    memory_temperature_c: Some(30),
    max_mig_devices: 7,
    nvlinks: 18,
};

const A100_SXM4_40GB: Model = Model {
    name: "NVIDIA A100-SXM4-40GB",
    memory_mib: 40960,
    power_limit_w: 400,
    idle_power_w: 55,
    max_sm_clock_mhz: 1410,
    max_memory_clock_mhz: 1215,
    video_clock_mhz: 1275,
    pcie_generation: 4,
    pcie_width: 16,
    pci_device_id: 0x20B0_10DE,
    pci_subsystem_id: 0x134F_10DE,
    memory_temperature_c: Some(32),
    max_mig_devices: 7,
    nvlinks: 12,
};

const A10G: Model = Model {
    name: "NVIDIA A10G",
    memory_mib: 23028,
    power_limit_w: 300,
    idle_power_w: 25,
    max_sm_clock_mhz: 1710,
    max_memory_clock_mhz: 6251,
    video_clock_mhz: 1530,
    pcie_generation: 4,
    pcie_width: 16,
    pci_device_id: 0x2237_10DE,
    pci_subsystem_id: 0x152F_10DE,
    memory_temperature_c: None,
    max_mig_devices: 0,
    nvlinks: 0,
};

const L4: Model = Model {
    name: "NVIDIA L4",
    memory_mib: 23034,
    power_limit_w: 72,
    idle_power_w: 16,
    max_sm_clock_mhz: 2040,
    max_memory_clock_mhz: 6251,
    video_clock_mhz: 1770,
    pcie_generation: 4,
    pcie_width: 16,
    pci_device_id: 0x27B8_10DE,
    pci_subsystem_id: 0x16CA_10DE,
    memory_temperature_c: None,
    max_mig_devices: 0,
    nvlinks: 0,
};

/// Every instance type the fake knows, by its EC2 name.
pub const INSTANCE_TYPES: &[InstanceType] = &[
    InstanceType {
        name: "p5.48xlarge",
        model: &H100_SXM5_80GB,
        pci_slots: &[(0x53, 0), (0x64, 0), (0x75, 0), (0x86, 0), (0x97, 0), (0xA8, 0), (0xB9, 0), (0xCA, 0)],
    },
    InstanceType {
        name: "p4d.24xlarge",
        model: &A100_SXM4_40GB,
        pci_slots: &[
            (0x10, 0x1C),
            (0x10, 0x1D),
            (0x20, 0x1C),
            (0x20, 0x1D),
            (0x90, 0x1C),
            (0x90, 0x1D),
            (0xA0, 0x1C),
            (0xA0, 0x1D),
        ],
    },
    InstanceType { name: "g5.xlarge", model: &A10G, pci_slots: &[(0x00, 0x1E)] },
    InstanceType {
        name: "g5.12xlarge",
        model: &A10G,
        pci_slots: &[(0x00, 0x1B), (0x00, 0x1C), (0x00, 0x1D), (0x00, 0x1E)],
    },
    InstanceType { name: "g6.xlarge", model: &L4, pci_slots: &[(0x31, 0x00)] },
];

/// The instance type of that name, if the fake knows it.
pub fn instance_type(name: &str) -> Option<&'static InstanceType> {
    INSTANCE_TYPES.iter().find(|t| t.name == name)
}

/// The known names, for an error message.
pub fn known_names() -> String {
    INSTANCE_TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_instance_type_has_distinct_pci_slots() {
        for t in INSTANCE_TYPES {
            let mut slots = t.pci_slots.to_vec();
            slots.sort_unstable();
            slots.dedup();
            assert_eq!(slots.len(), t.pci_slots.len(), "{}", t.name);
        }
    }

    #[test]
    fn names_are_found_and_unknown_names_are_not() {
        assert_eq!(instance_type("p5.48xlarge").map(|t| t.pci_slots.len()), Some(8));
        assert_eq!(instance_type("g5.12xlarge").map(|t| t.model.name), Some("NVIDIA A10G"));
        assert!(instance_type("p5.48XLARGE").is_none());
        assert!(known_names().contains("g6.xlarge"));
    }
}
