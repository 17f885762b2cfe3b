//! The health settings in force: the agent's flags, overridden by the `health` section
//! of the node configuration (`spec.health` of a config in the operator's namespace).
//! They travel on a [`watch`] channel from the [`Activator`](crate::config::Activator),
//! which sends them with every configuration it puts in force, to what follows them
//! without a restart: the Node condition's type, the taint, the kernel-log look-back
//! (taken at the reader's next start) and the CloudWatch Logs destination.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use api::{
    crd::DeviceTaintEffect,
    limits::MAX_THRESHOLD_COUNT,
    node_config::{FaultThreshold, LogDestination, NodeHealth, STATE_ERRORS},
    validate::{check_error_name, MAX_THRESHOLD_WINDOW, MIN_THRESHOLD_WINDOW},
};
use tokio::sync::watch;

use super::model::thresholds::{Threshold, Thresholds};

/// What the flags give when no config sets health.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthDefaults {
    /// `--health-condition-type`.
    pub condition_type: String,
    /// `--kmsg-lookback`.
    pub kmsg_look_back: Duration,
}

/// The health settings in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthSettings {
    /// `namespace/name` of the config they come from; `None`: the flags.
    pub config: Option<String>,
    /// The Node condition's type.
    pub condition_type: String,
    /// Kernel-log records this old are taken when the reader starts.
    pub kmsg_look_back: Duration,
    /// The error names that taint the Node (sorted); `None`: no taint.
    pub taint_errors: Option<Vec<String>>,
    /// Where the hardware events go in CloudWatch Logs; `None`: nowhere.
    pub logs: Option<LogDestination>,
    /// The effect of the DeviceTaintRule of each unhealthy DRA-managed device; `None`: no
    /// rules.
    pub device_taints: Option<DeviceTaintEffect>,
    /// The fault thresholds by error name (none: a fault at its first occurrence).
    pub thresholds: Thresholds,
}

/// The receiving end: each reader takes the current value when it needs it.
pub type SettingsReceiver = watch::Receiver<HealthSettings>;

impl HealthDefaults {
    /// The settings of a node configuration's `health` section (`None`: the flags alone).
    pub fn resolve(&self, health: Option<&NodeHealth>) -> HealthSettings {
        let Some(health) = health else {
            return HealthSettings {
                config: None,
                condition_type: self.condition_type.clone(),
                kmsg_look_back: self.kmsg_look_back,
                taint_errors: None,
                logs: None,
                device_taints: None,
                thresholds: Thresholds::default(),
            };
        };
        // The operator checked the type; a hand-written node configuration may not have:
        // a type the rule refuses (one of the kubelet's) keeps the flag's.
        let condition_type = health
            .condition_type
            .clone()
            .filter(|t| api::validate::check_condition_type(t).is_ok())
            .unwrap_or_else(|| self.condition_type.clone());
        HealthSettings {
            config: Some(health.config.clone()),
            condition_type,
            kmsg_look_back: health.kmsg_look_back.map_or(self.kmsg_look_back, |p| p.as_duration()),
            taint_errors: health.taint.as_ref().map(|t| {
                let mut errors = t.errors.clone();
                errors.sort();
                errors.dedup();
                errors
            }),
            logs: health.logs.clone(),
            device_taints: health.device_taints.map(|d| d.effect),
            thresholds: thresholds(&health.thresholds),
        }
    }
}

/// The thresholds a node configuration gives, those the operator's rules refuse left out
/// (a hand-written configuration has not been through them); the first of a name counts.
fn thresholds(given: &[FaultThreshold]) -> Thresholds {
    let mut out = BTreeMap::new();
    for t in given {
        let valid = check_error_name(&t.error).is_ok()
            && !STATE_ERRORS.contains(&t.error.as_str())
            && (1..=MAX_THRESHOLD_COUNT).contains(&t.count)
            && (MIN_THRESHOLD_WINDOW..=MAX_THRESHOLD_WINDOW).contains(&t.window);
        if valid {
            let threshold = Threshold { count: t.count, window_secs: t.window.as_duration().as_secs() };
            out.entry(t.error.clone()).or_insert(threshold);
        }
    }
    Arc::new(out)
}

/// A channel carrying the flags' settings until a configuration says otherwise.
pub fn channel(defaults: &HealthDefaults) -> (watch::Sender<HealthSettings>, SettingsReceiver) {
    watch::channel(defaults.resolve(None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::{duration::Period, node_config::NodeTaint};

    fn defaults() -> HealthDefaults {
        HealthDefaults { condition_type: "NeuronHealth".to_owned(), kmsg_look_back: Duration::from_secs(300) }
    }

    #[test]
    fn a_health_section_overrides_the_flags_and_only_what_it_sets() {
        let flags = defaults().resolve(None);
        assert_eq!((flags.condition_type.as_str(), flags.kmsg_look_back), ("NeuronHealth", Duration::from_secs(300)));
        assert_eq!((flags.taint_errors, flags.logs, flags.config), (None, None, None));

        let health = NodeHealth {
            config: "ops/fleet".to_owned(),
            taint: Some(NodeTaint { errors: vec!["DMA_ERROR".to_owned(), "DMA_ERROR".to_owned()] }),
            kmsg_look_back: Some(Period::from_secs(600)),
            logs: Some(LogDestination { group: "/g".to_owned(), region: None }),
            ..NodeHealth::default()
        };
        let s = defaults().resolve(Some(&health));
        assert_eq!(s.condition_type, "NeuronHealth", "not set: the flag's");
        assert_eq!(s.kmsg_look_back, Duration::from_secs(600));
        assert_eq!(s.taint_errors, Some(vec!["DMA_ERROR".to_owned()]));
        assert_eq!(s.logs.map(|l| l.group), Some("/g".to_owned()));

        let kubelet = NodeHealth { condition_type: Some("Ready".to_owned()), ..health };
        assert_eq!(defaults().resolve(Some(&kubelet)).condition_type, "NeuronHealth", "never the kubelet's Ready");
    }

    #[test]
    fn thresholds_the_operator_would_refuse_are_left_out() {
        let t = |error: &str, count, window| FaultThreshold {
            error: error.to_owned(),
            count,
            window: Period::from_secs(window),
        };
        let health = NodeHealth {
            thresholds: vec![
                t("DMA_ERROR", 3, 60),
                t("DMA_ERROR", 5, 60),
                t("UNHEALTHY_COMPONENT", 2, 60),
                t("NC_UNCORRECTABLE_ERROR", 0, 60),
                t("HBM_UNCORRECTABLE_ERROR", 2, 2 * 86_400),
                t("lower", 2, 60),
            ],
            ..NodeHealth::default()
        };
        let s = defaults().resolve(Some(&health));
        assert_eq!(s.thresholds.len(), 1, "{:?}", s.thresholds);
        assert_eq!(s.thresholds["DMA_ERROR"], Threshold { count: 3, window_secs: 60 }, "the first of a name");
        assert!(defaults().resolve(None).thresholds.is_empty());
    }
}
