//! NVIDIA GPUs in the classic naming: the CloudWatch agent's `nvidia_gpu` plugin's
//! `nvidia_smi_<measurement>` names, so users' dashboards and alarms on the agent's data
//! work on this agent's. (The Container Insights names of GPUs are in [`super::insights`].)
//!
//! Each GPU is one series per metric, under the dimensions the CloudWatch agent documents
//! (`index`, `name`, `host`) plus, as every classic metric, the sink's dimension sets
//! (`dimensions`, `rollups`) where a dimension applies to a GPU ([`super::applies`] with
//! [`super::Level::Gpu`]): the cluster, node and instance, and the pod holding the GPU.
//! As the CloudWatch agent does, no unit is set (`None`); memory is in MiB (nvidia-smi's
//! "MB"), clocks in MHz, power in W, temperature in °C.
//!
//! Left out ([`CLASSIC_LEFT_OUT`]): what the agent's GPU collector does not read through
//! NVML (fan speed, encoder sessions, the video clock).

use super::Unit;
use crate::crd::CloudWatchSinkSpec;

/// What a GPU metric's value is, read from the GPU collector's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GpuValue {
    /// Percent of the last sample period a kernel ran (NVML utilization, `gpu`).
    Utilization,
    /// Percent of the last sample period device memory was read or written (NVML
    /// utilization, `memory`).
    MemoryBandwidthUtilization,
    /// Framebuffer used, percent of the usable (total less reserved): DCGM's `FB_USED_PERCENT`.
    MemoryUsedPercent,
    /// °C.
    Temperature,
    /// W.
    PowerDraw,
    MemoryTotalBytes,
    MemoryUsedBytes,
    /// MiB, whole (nvidia-smi's).
    MemoryTotalMib,
    MemoryUsedMib,
    MemoryFreeMib,
    PcieLinkGen,
    /// Lanes.
    PcieLinkWidth,
    /// MHz.
    GraphicsClock,
    SmClock,
    MemoryClock,
}

/// One classic GPU metric: the CloudWatch agent's name and what it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassicGpuMetric {
    pub name: &'static str,
    pub value: GpuValue,
}

const fn classic(name: &'static str, value: GpuValue) -> ClassicGpuMetric {
    ClassicGpuMetric { name, value }
}

/// The CloudWatch agent's `nvidia_smi_<measurement>` metrics that NVML gives the agent.
pub const CLASSIC: [ClassicGpuMetric; 12] = {
    use GpuValue::*;
    [
        classic("nvidia_smi_utilization_gpu", Utilization),
        classic("nvidia_smi_utilization_memory", MemoryBandwidthUtilization),
        classic("nvidia_smi_temperature_gpu", Temperature),
        classic("nvidia_smi_power_draw", PowerDraw),
        classic("nvidia_smi_memory_total", MemoryTotalMib),
        classic("nvidia_smi_memory_used", MemoryUsedMib),
        classic("nvidia_smi_memory_free", MemoryFreeMib),
        classic("nvidia_smi_pcie_link_gen_current", PcieLinkGen),
        classic("nvidia_smi_pcie_link_width_current", PcieLinkWidth),
        classic("nvidia_smi_clocks_current_graphics", GraphicsClock),
        classic("nvidia_smi_clocks_current_sm", SmClock),
        classic("nvidia_smi_clocks_current_memory", MemoryClock),
    ]
};

/// The CloudWatch agent's measurements this agent does not send, and why.
pub const CLASSIC_LEFT_OUT: [(&str, &str); 5] = [
    ("fan_speed", "the GPU collector does not read fans (data-centre GPUs have none of their own)"),
    ("encoder_stats_session_count", "the GPU collector does not read the video encoder"),
    ("encoder_stats_average_fps", "the GPU collector does not read the video encoder"),
    ("encoder_stats_average_latency", "the GPU collector does not read the video encoder"),
    ("clocks_current_video", "the GPU collector does not read the video clock"),
];

/// The unit of every classic GPU metric: none, as the CloudWatch agent sends them.
pub const CLASSIC_UNIT: Unit = Unit::NoUnit;

/// The CloudWatch agent's dimensions of every GPU metric, in order: NVML's index, the
/// model name, the host's name.
pub const CLASSIC_DIMENSIONS: [&str; 3] = ["index", "name", "host"];

/// The classic GPU metrics a sink publishes: all of them, unless the sink has an
/// allow-list (`metrics`), which names Neuron metrics only: a sink that restricts its
/// metrics gets no GPU series.
pub fn published_classic(spec: &CloudWatchSinkSpec) -> &'static [ClassicGpuMetric] {
    if spec.metrics.is_some() {
        &[]
    } else {
        &CLASSIC
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The CloudWatch agent's 17 measurements (the reference's list, from the CloudWatch
    /// user guide): each is sent as `nvidia_smi_<measurement>` or left out with a reason.
    #[test]
    fn every_measurement_of_the_cloudwatch_agent_is_sent_or_said_left_out() {
        let measurements = [
            "utilization_gpu",
            "utilization_memory",
            "temperature_gpu",
            "power_draw",
            "fan_speed",
            "memory_total",
            "memory_used",
            "memory_free",
            "pcie_link_gen_current",
            "pcie_link_width_current",
            "encoder_stats_session_count",
            "encoder_stats_average_fps",
            "encoder_stats_average_latency",
            "clocks_current_graphics",
            "clocks_current_sm",
            "clocks_current_memory",
            "clocks_current_video",
        ];
        let sent: BTreeSet<&str> = CLASSIC.iter().map(|m| m.name).collect();
        let left_out: BTreeSet<&str> = CLASSIC_LEFT_OUT.iter().map(|(m, _)| *m).collect();
        assert_eq!(sent.len(), CLASSIC.len(), "each name once");
        for m in measurements {
            let name = format!("nvidia_smi_{m}");
            assert!(sent.contains(name.as_str()) != left_out.contains(m), "{m}: sent or left out, not both");
        }
        assert_eq!(sent.len() + left_out.len(), measurements.len());
        assert_eq!(CLASSIC_DIMENSIONS, ["index", "name", "host"]);
        // Memory as nvidia-smi writes it (MiB), not bytes.
        let value = |name: &str| CLASSIC.iter().find(|m| m.name == name).map(|m| m.value);
        assert_eq!(value("nvidia_smi_memory_used"), Some(GpuValue::MemoryUsedMib));
        assert_eq!(value("nvidia_smi_utilization_memory"), Some(GpuValue::MemoryBandwidthUtilization));
    }

    #[test]
    fn an_allow_list_of_neuron_metrics_leaves_the_gpus_out() {
        let mut spec = CloudWatchSinkSpec::default();
        assert_eq!(published_classic(&spec).len(), 12);
        spec.metrics = Some(vec![crate::crd::CloudWatchMetric::NeuroncoreUtilization]);
        assert!(published_classic(&spec).is_empty());
    }
}
