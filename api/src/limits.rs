//! Limits shared by the operator and the node agent: the largest input either trusts
//! before it sizes an allocation, a label or a request. Each limit is documented in the
//! README, and what it refuses is counted in the binary's own metrics.

// --- neuron-monitor reports, as the node agent reads them ----------------------------
// Real hardware (the reference's table): at most 16 devices (inf1.24xlarge, trn1/trn2)
// and 8 physical cores per device (trn2), 128 cores on the largest node. The limits
// leave room for hardware to come while keeping every per-core or per-device allocation,
// and every exposition, small. Values beyond them come from a broken or hostile
// monitor, never from a node.

/// Neuron devices a report may declare (`neuron_hardware_info.neuron_device_count`);
/// device indices (ECC counters) must be below it.
pub const MAX_NEURON_DEVICES: u32 = 64;

/// NeuronCores per device a report may declare (`neuroncore_per_device_count`).
pub const MAX_NEURONCORES_PER_DEVICE: u32 = 16;

/// NeuronCores of one node: the declared devices × cores per device must not exceed it,
/// and every core index of a report must be below it. 4× trn2's 128 physical cores.
pub const MAX_NEURONCORES: u32 = 512;

/// Runtime entries read from one report; later entries are skipped and counted. A real
/// node runs at most a few hundred Neuron applications (one per core at most, 128).
pub const MAX_RUNTIMES_PER_REPORT: usize = 1024;

/// Bytes of one label value taken from a report (instance fields, runtime tags); longer
/// values are cut at a character boundary. neuron-monitor's longest string, the
/// application tag, is at most 255 characters; AWS identifiers are far shorter.
pub const MAX_REPORT_LABEL_VALUE_BYTES: usize = 256;

/// Labels NeuronMonitorConfigs (`sinks.prometheus.extraLabels`) may add together to one
/// runtime series on the agent; beyond it the keys of later routes are left off and counted.
pub const MAX_EXTRA_LABELS_PER_SERIES: usize = 32;
