//! The neuron-monitor configuration file, as written for `neuron-monitor -c FILE`.
//!
//! `period` may sit at the root, on a runtime entry or on a metric group; the nearest
//! one wins and the default is 5 s ([`MonitorConfig::group_period`]).

use serde::{Deserialize, Serialize};

use crate::duration::Period;

/// neuron-monitor's period when none is configured.
pub const DEFAULT_PERIOD: Period = Period::from_secs(5);

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MonitorConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub neuron_runtimes: Vec<RuntimeSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub system_metrics: Vec<GroupConfig<SystemGroup>>,
}

/// Which applications to watch (by tag) and which runtime groups to collect from them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeSelector {
    /// Regular expression matched against the application tag; absent means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag_filter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
    #[serde(default)]
    pub metrics: Vec<GroupConfig<RuntimeGroup>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig<G> {
    #[serde(rename = "type")]
    pub kind: G,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period: Option<Period>,
}

impl<G> GroupConfig<G> {
    pub fn new(kind: G) -> Self {
        GroupConfig { kind, period: None }
    }
}

/// Metric groups reported per monitored application.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "crd", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum RuntimeGroup {
    NeuroncoreCounters,
    MemoryUsed,
    NeuronRuntimeVcpuUsage,
    /// Older releases call this group `inference_stats`.
    #[serde(alias = "inference_stats")]
    ExecutionStats,
}

impl RuntimeGroup {
    pub const ALL: [RuntimeGroup; 4] = [
        RuntimeGroup::NeuroncoreCounters,
        RuntimeGroup::MemoryUsed,
        RuntimeGroup::NeuronRuntimeVcpuUsage,
        RuntimeGroup::ExecutionStats,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeGroup::NeuroncoreCounters => "neuroncore_counters",
            RuntimeGroup::MemoryUsed => "memory_used",
            RuntimeGroup::NeuronRuntimeVcpuUsage => "neuron_runtime_vcpu_usage",
            RuntimeGroup::ExecutionStats => "execution_stats",
        }
    }
}

/// Metric groups reported once per host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "crd", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum SystemGroup {
    VcpuUsage,
    MemoryInfo,
    NeuronHwCounters,
    /// Which pod, namespace and containers use each core and device (EKS; off unless
    /// asked for). Not a metric group users choose: the node agent asks for it where the
    /// kubelet's pod-resources socket is not mounted, as an attribution source; so it is
    /// neither in the CRD's enum nor in [`SystemGroup::ALL`].
    #[cfg_attr(feature = "crd", schemars(skip))]
    NeuronK8sInfo,
}

impl SystemGroup {
    /// The metric groups of the CRD (and of neuron-monitor without a configuration).
    pub const ALL: [SystemGroup; 3] = [SystemGroup::VcpuUsage, SystemGroup::MemoryInfo, SystemGroup::NeuronHwCounters];

    pub fn as_str(self) -> &'static str {
        match self {
            SystemGroup::VcpuUsage => "vcpu_usage",
            SystemGroup::MemoryInfo => "memory_info",
            SystemGroup::NeuronHwCounters => "neuron_hw_counters",
            SystemGroup::NeuronK8sInfo => "neuron_k8s_info",
        }
    }
}

impl MonitorConfig {
    /// What neuron-monitor does without `-c`: every group, every application, 5 s.
    pub fn all_groups(period: Period) -> Self {
        MonitorConfig {
            period: Some(period),
            neuron_runtimes: vec![RuntimeSelector {
                tag_filter: Some(".*".to_owned()),
                period: None,
                metrics: RuntimeGroup::ALL.into_iter().map(GroupConfig::new).collect(),
            }],
            system_metrics: SystemGroup::ALL.into_iter().map(GroupConfig::new).collect(),
        }
    }

    /// The effective period of a runtime group: group, then runtime entry, then root.
    pub fn group_period(&self, runtime: &RuntimeSelector, group: &GroupConfig<RuntimeGroup>) -> Period {
        group.period.or(runtime.period).or(self.period).unwrap_or(DEFAULT_PERIOD)
    }

    /// The effective period of a system group: group, then root.
    pub fn system_period(&self, group: &GroupConfig<SystemGroup>) -> Period {
        group.period.or(self.period).unwrap_or(DEFAULT_PERIOD)
    }

    /// This configuration, also asking for `neuron_k8s_info` (at the root period).
    pub fn with_k8s_info(mut self) -> Self {
        if !self.system_metrics.iter().any(|g| g.kind == SystemGroup::NeuronK8sInfo) {
            self.system_metrics.push(GroupConfig::new(SystemGroup::NeuronK8sInfo));
        }
        self
    }

    /// The shortest period of any configured group: how often a report is due at least.
    pub fn shortest_period(&self) -> Period {
        let runtime = self.neuron_runtimes.iter().flat_map(|r| r.metrics.iter().map(move |g| self.group_period(r, g)));
        let system = self.system_metrics.iter().map(|g| self.system_period(g));
        runtime.chain(system).min().unwrap_or(self.period.unwrap_or(DEFAULT_PERIOD))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFERENCE_EXAMPLE: &str = r#"{
      "period": "1s",
      "neuron_runtimes": [
        { "tag_filter": ".*", "metrics": [ {"type": "neuroncore_counters"}, {"type": "memory_used"},
                                           {"type": "neuron_runtime_vcpu_usage"}, {"type": "execution_stats"} ] }
      ],
      "system_metrics": [ {"type": "vcpu_usage"}, {"type": "memory_info"},
                          {"type": "neuron_hw_counters", "period": "2s"} ]
    }"#;

    #[test]
    fn reads_the_documented_example() {
        let config: MonitorConfig = serde_json::from_str(REFERENCE_EXAMPLE).unwrap();
        assert_eq!(config.period, Some(Period::from_secs(1)));
        assert_eq!(config.neuron_runtimes[0].metrics.len(), 4);
        let hw = config.system_metrics[2];
        assert_eq!(hw.kind, SystemGroup::NeuronHwCounters);
        assert_eq!(config.system_period(&hw), Period::from_secs(2));
        assert_eq!(config.system_period(&config.system_metrics[0]), Period::from_secs(1));
        assert_eq!(config.shortest_period(), Period::from_secs(1));
    }

    #[test]
    fn nearest_period_wins_and_default_is_five_seconds() {
        let config: MonitorConfig = serde_json::from_str(
            r#"{"neuron_runtimes":[{"period":"3s","metrics":[{"type":"memory_used"},{"type":"execution_stats","period":"500ms"}]}],
                "system_metrics":[{"type":"memory_info"}]}"#,
        )
        .unwrap();
        let rt = &config.neuron_runtimes[0];
        assert_eq!(config.group_period(rt, &rt.metrics[0]), Period::from_secs(3));
        assert_eq!(config.group_period(rt, &rt.metrics[1]), Period::from_millis(500));
        assert_eq!(config.system_period(&config.system_metrics[0]), DEFAULT_PERIOD);
        assert_eq!(config.shortest_period(), Period::from_millis(500));
    }

    #[test]
    fn accepts_the_old_group_name() {
        let g: GroupConfig<RuntimeGroup> = serde_json::from_str(r#"{"type":"inference_stats"}"#).unwrap();
        assert_eq!(g.kind, RuntimeGroup::ExecutionStats);
    }

    #[test]
    fn rejects_unknown_groups_and_bad_periods() {
        assert!(serde_json::from_str::<GroupConfig<RuntimeGroup>>(r#"{"type":"vcpu_usage"}"#).is_err());
        assert!(serde_json::from_str::<MonitorConfig>(r#"{"period":"fast"}"#).is_err());
    }

    #[test]
    fn k8s_info_is_asked_for_once_and_only_on_request() {
        let config = MonitorConfig::all_groups(Period::from_secs(5));
        assert!(!serde_json::to_string(&config).unwrap().contains("neuron_k8s_info"));
        let with = config.with_k8s_info().with_k8s_info();
        let text = serde_json::to_string(&with).unwrap();
        assert_eq!(text.matches(r#"{"type":"neuron_k8s_info"}"#).count(), 1, "{text}");
        let read: MonitorConfig = serde_json::from_str(&text).unwrap();
        assert_eq!(read.system_metrics.last().map(|g| g.kind), Some(SystemGroup::NeuronK8sInfo));
    }

    #[test]
    fn round_trips_deterministically() {
        let config = MonitorConfig::all_groups(Period::from_millis(1500));
        let text = serde_json::to_string(&config).unwrap();
        assert_eq!(serde_json::from_str::<MonitorConfig>(&text).unwrap(), config);
        assert_eq!(serde_json::to_string(&config).unwrap(), text);
        assert!(text.contains(r#""period":"1500ms""#));
    }
}
