//! neuron-monitor's report document as it is written on the wire (field order as
//! neuron-monitor writes it). The simulator's own types, independent of the agent's
//! report model in `api::report`, so that the simulator stays an independent check of
//! the agent's parser.

use std::collections::BTreeMap;

use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Document {
    pub neuron_runtime_data: Vec<RuntimeEntry>,
    pub system_data: SystemData,
    pub instance_info: InstanceInfo,
    pub neuron_hardware_info: HardwareInfo,
    /// Only when the configuration asks for it; at the top level, as AWS's user guide
    /// shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_k8s_info: Option<Group<K8sInfo>>,
}

#[derive(Debug, Serialize)]
pub struct K8sInfo {
    pub neuroncores_k8s_info: BTreeMap<u32, K8sEntry>,
    pub neurondevices_k8s_info: BTreeMap<u32, K8sEntry>,
}

#[derive(Debug, Clone, Serialize)]
pub struct K8sEntry {
    pub pod_name: String,
    pub namespace: String,
    pub container_name: Vec<String>,
}

/// A metric group: its data, or nothing but an `error` when collection failed.
#[derive(Debug, Serialize)]
pub struct Group<T> {
    pub period: f64,
    #[serde(flatten)]
    pub data: Option<T>,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct RuntimeEntry {
    pub pid: u32,
    pub neuron_runtime_tag: String,
    pub error: String,
    pub report: RuntimeReport,
}

#[derive(Debug, Default, Serialize)]
pub struct RuntimeReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub execution_stats: Option<Group<ExecutionStats>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_used: Option<Group<MemoryUsed>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_runtime_vcpu_usage: Option<Group<RuntimeVcpuUsage>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuroncore_counters: Option<Group<NeuroncoreCounters>>,
}

#[derive(Debug, Serialize)]
pub struct NeuroncoreCounters {
    /// Every core of the host, zeros on those the runtime does not own.
    pub neuroncores_in_use: BTreeMap<u32, CoreCounters>,
}

#[derive(Debug, Serialize)]
pub struct CoreCounters {
    pub neuroncore_utilization: f64,
    pub flops: u64,
    pub effective_flops: u64,
    /// Logical cores (trn2): their physical cores.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub v3d: Option<V3d>,
}

#[derive(Debug, Serialize)]
pub struct V3d {
    pub nc_v3: BTreeMap<u32, PhysicalCoreCounters>,
}

#[derive(Debug, Serialize)]
pub struct PhysicalCoreCounters {
    pub neuroncore_utilization: f64,
}

#[derive(Debug, Serialize)]
pub struct MemoryUsed {
    pub neuron_runtime_used_bytes: RuntimeUsedBytes,
    pub loaded_models: Vec<LoadedModel>,
}

#[derive(Debug, Serialize)]
pub struct RuntimeUsedBytes {
    pub host: u64,
    pub neuron_device: u64,
    pub usage_breakdown: UsageBreakdown,
}

#[derive(Debug, Serialize)]
pub struct UsageBreakdown {
    pub host: HostMemory,
    pub neuroncore_memory_usage: BTreeMap<u32, CoreMemory>,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct HostMemory {
    pub application_memory: u64,
    pub constants: u64,
    pub dma_buffers: u64,
    pub tensors: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct CoreMemory {
    pub constants: u64,
    pub model_code: u64,
    pub model_shared_scratchpad: u64,
    pub runtime_memory: u64,
    pub tensors: u64,
}

impl CoreMemory {
    pub fn total(&self) -> u64 {
        self.constants + self.model_code + self.model_shared_scratchpad + self.runtime_memory + self.tensors
    }
}

#[derive(Debug, Serialize)]
pub struct LoadedModel {
    pub name: String,
    pub uuid: String,
    pub model_id: u64,
    pub is_running: bool,
    pub subgraphs: BTreeMap<String, Subgraph>,
}

#[derive(Debug, Serialize)]
pub struct Subgraph {
    pub memory_used_bytes: SubgraphMemory,
    /// Runtime-local: counts within the runtime's own cores, not a host index.
    pub neuroncore_index: u32,
    pub neuron_device_index: u32,
}

#[derive(Debug, Serialize)]
pub struct SubgraphMemory {
    pub host: u64,
    pub neuron_device: u64,
    pub usage_breakdown: SubgraphBreakdown,
}

#[derive(Debug, Serialize)]
pub struct SubgraphBreakdown {
    pub host: HostMemory,
    pub neuron_device: DeviceMemory,
}

#[derive(Debug, Serialize)]
pub struct DeviceMemory {
    pub constants: u64,
    pub model_code: u64,
    pub runtime_memory: u64,
    pub tensors: u64,
}

#[derive(Debug, Serialize)]
pub struct RuntimeVcpuUsage {
    pub vcpu_usage: UserSystem,
}

#[derive(Debug, Serialize)]
pub struct UserSystem {
    pub user: f64,
    pub system: f64,
}

#[derive(Debug, Serialize)]
pub struct ExecutionStats {
    pub error_summary: ErrorSummary,
    pub execution_summary: ExecutionSummary,
    pub latency_stats: LatencyStats,
}

#[derive(Debug, Default, Serialize)]
pub struct ErrorSummary {
    pub generic: u64,
    pub numerical: u64,
    pub transient: u64,
    pub model: u64,
    pub runtime: u64,
    pub hardware: u64,
    /// Error types beyond the six documented ones (a newer neuron-monitor's).
    #[serde(flatten)]
    pub other: BTreeMap<String, u64>,
}

#[derive(Debug, Default, Serialize)]
pub struct ExecutionSummary {
    pub completed: u64,
    pub completed_with_err: u64,
    pub completed_with_num_err: u64,
    pub timed_out: u64,
    pub incorrect_input: u64,
    pub failed_to_queue: u64,
}

#[derive(Debug, Serialize)]
pub struct LatencyStats {
    /// null when nothing completed in the period.
    pub total_latency: Option<Percentiles>,
    pub device_latency: Option<Percentiles>,
}

/// Seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    pub p0: f64,
    pub p1: f64,
    pub p25: f64,
    pub p50: f64,
    pub p75: f64,
    pub p99: f64,
    pub p100: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct SystemData {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_info: Option<Group<MemoryInfo>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_hw_counters: Option<Group<HwCounters>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vcpu_usage: Option<Group<SystemVcpuUsage>>,
}

#[derive(Debug, Serialize)]
pub struct MemoryInfo {
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub swap_total_bytes: u64,
    pub swap_used_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct HwCounters {
    pub neuron_devices: Vec<DeviceEcc>,
}

#[derive(Debug, Serialize)]
pub struct DeviceEcc {
    pub neuron_device_index: u32,
    pub mem_ecc_corrected: u64,
    pub mem_ecc_uncorrected: u64,
    pub sram_ecc_uncorrected: u64,
    pub sram_ecc_corrected: u64,
}

#[derive(Debug, Serialize)]
pub struct SystemVcpuUsage {
    pub average_usage: CpuUsage,
    pub usage_data: BTreeMap<u32, CpuUsage>,
    pub context_switch_count: u64,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUsage {
    pub user: f64,
    pub nice: f64,
    pub system: f64,
    pub idle: f64,
    pub io_wait: f64,
    pub irq: f64,
    pub soft_irq: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct InstanceInfo {
    pub instance_name: String,
    pub instance_id: String,
    pub instance_type: String,
    pub instance_availability_zone: String,
    pub instance_availability_zone_id: String,
    pub instance_region: String,
    pub ami_id: String,
    pub subnet_id: String,
    pub error: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct HardwareInfo {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_device_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_device_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuroncore_version: Option<String>,
    pub neuron_device_count: u32,
    pub neuroncore_per_device_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub neuron_device_memory_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logical_neuroncore_config: Option<u32>,
    pub error: String,
}
