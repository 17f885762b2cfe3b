//! The resolved machine the exported calls answer from: every GPU with every value NVML can
//! be asked for, already bounded and defaulted (config builds it, ffi reads it).

/// Xid code, PCIe and ECC values are plain numbers; the limits on them live in config.
#[derive(Debug, Clone, PartialEq)]
pub struct Machine {
    pub driver_version: String,
    pub cuda_driver_version: i32,
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Gpu {
    pub index: u32,
    pub name: String,
    pub uuid: String,
    pub pci_bus: u8,
    pub pci_device: u8,
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
    pub memory_total_mib: u64,
    pub memory_used_mib: u64,
    pub utilization_gpu: u32,
    pub utilization_memory: u32,
    pub temperature_c: u32,
    pub memory_temperature_c: Option<u32>,
    pub power_mw: u32,
    pub power_limit_mw: u32,
    pub sm_clock_mhz: u32,
    pub memory_clock_mhz: u32,
    pub video_clock_mhz: u32,
    pub pcie_generation: u32,
    pub pcie_width: u32,
    pub pcie_tx_kbps: u32,
    pub pcie_rx_kbps: u32,
    pub pcie_replay_counter: u32,
    pub throttle_reasons: u64,
    pub ecc: Ecc,
    pub remapped_rows: RemappedRows,
    pub nvlink: NvLink,
    pub lost: bool,
    pub xid: Vec<u64>,
    /// 0: the model has no MIG.
    pub max_mig_devices: u32,
    pub mig_enabled: bool,
    pub mig_instances: Vec<MigInstance>,
    pub processes: Vec<Process>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ecc {
    pub corrected_volatile: u64,
    pub uncorrected_volatile: u64,
    pub corrected_aggregate: u64,
    pub uncorrected_aggregate: u64,
}

/// NVLink of a GPU (all links together); `links` 0: none.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NvLink {
    pub links: u32,
    /// The data counters grow at these rates since the first init.
    pub tx_kib_per_second: u64,
    pub rx_kib_per_second: u64,
    pub crc_flit_errors: u64,
    pub crc_data_errors: u64,
    pub replay_errors: u64,
    pub recovery_errors: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failure: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct MigInstance {
    pub profile: String,
    pub gpu_instance_id: u32,
    pub uuid: String,
    pub name: String,
    pub memory_mib: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Process {
    pub pid: u32,
    pub used_memory_mib: u64,
    /// The MIG GPU instance the process runs in, if any.
    pub gpu_instance_id: Option<u32>,
    /// The compute instance of that GPU instance it runs in (0 unless the file says).
    pub compute_instance_id: u32,
    /// (SM, memory) percent in NVML's per-process samples; `None`: no sample.
    pub utilization: Option<(u32, u32)>,
}

impl Gpu {
    /// NVML's bus id form: `00000000:53:00.0`.
    pub fn bus_id(&self) -> String {
        format!("00000000:{:02X}:{:02X}.0", self.pci_bus, self.pci_device)
    }

    /// The legacy 16-byte form: `0000:53:00.0`.
    pub fn bus_id_legacy(&self) -> String {
        format!("0000:{:02X}:{:02X}.0", self.pci_bus, self.pci_device)
    }

    /// The processes a handle sees: all of them on the GPU, or one MIG instance's.
    pub fn processes_in(&self, mig: Option<&MigInstance>) -> Vec<Process> {
        match mig {
            None => self.processes.clone(),
            Some(m) => {
                self.processes.iter().filter(|p| p.gpu_instance_id == Some(m.gpu_instance_id)).copied().collect()
            }
        }
    }
}

/// A deterministic `8-4-4-4-12` hex UUID from a seed and some numbers (FNV-1a, twice).
pub fn uuid_from(seed: &str, parts: &[u64]) -> String {
    let hash = |salt: u64| {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ salt;
        for byte in seed.bytes().chain(parts.iter().flat_map(|p| p.to_le_bytes())) {
            h ^= u64::from(byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    };
    let hex = format!("{:016x}{:016x}", hash(1), hash(2));
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_deterministic_distinct_and_36_characters() {
        let a = uuid_from("p5.48xlarge", &[0]);
        assert_eq!(a, uuid_from("p5.48xlarge", &[0]));
        assert_ne!(a, uuid_from("p5.48xlarge", &[1]));
        assert_ne!(a, uuid_from("p4d.24xlarge", &[0]));
        assert_eq!(a.len(), 36);
        assert_eq!(a.matches('-').count(), 4);
    }
}
