//! The configuration file turned into a schedule: which application is reported under
//! which runtime entry (tag filters), and which groups are due at a given moment.
//!
//! Time is simulated milliseconds since start, so the whole schedule is a pure function
//! of it: a group with period `p` is refreshed at `p`, `2p`, `3p`, … and a document is
//! written at every moment at least one group is due.

use anyhow::{Context, Result};
use api::duration::Period;
use api::monitor_config::{MonitorConfig, RuntimeGroup, SystemGroup};
use api::tag_filter::go_meaning;
use regex::Regex;

/// One metric group of the schedule. Runtime groups belong to a runtime entry of the
/// configuration (by position), since each entry has its own groups and periods.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GroupKey {
    Runtime { selector: usize, group: RuntimeGroup },
    System(SystemGroup),
}

#[derive(Debug)]
pub struct Selector {
    /// `None` matches every tag.
    filter: Option<Regex>,
    pub groups: Vec<(RuntimeGroup, Period)>,
}

#[derive(Debug)]
pub struct Plan {
    pub selectors: Vec<Selector>,
    pub system: Vec<(SystemGroup, Period)>,
}

impl Plan {
    /// Resolves every group's period (nearest wins) and compiles the tag filters.
    pub fn new(config: &MonitorConfig) -> Result<Plan> {
        let mut selectors = Vec::with_capacity(config.neuron_runtimes.len());
        for (i, runtime) in config.neuron_runtimes.iter().enumerate() {
            let filter = match &runtime.tag_filter {
                None => None,
                // With Go's meaning (ASCII `\w`, `\d`, `\s`, `\b`), as neuron-monitor.
                Some(re) => {
                    Some(go_meaning(re).map_err(anyhow::Error::msg).and_then(|p| Ok(Regex::new(&p)?)).with_context(
                        || format!("neuron_runtimes[{i}].tag_filter {re:?} is not a valid regular expression"),
                    )?)
                }
            };
            let mut groups: Vec<(RuntimeGroup, Period)> = Vec::new();
            for g in &runtime.metrics {
                // A group listed twice keeps its first period.
                if !groups.iter().any(|(k, _)| *k == g.kind) {
                    groups.push((g.kind, config.group_period(runtime, g)));
                }
            }
            selectors.push(Selector { filter, groups });
        }
        let mut system: Vec<(SystemGroup, Period)> = Vec::new();
        for g in &config.system_metrics {
            if !system.iter().any(|(k, _)| *k == g.kind) {
                system.push((g.kind, config.system_period(g)));
            }
        }
        Ok(Plan { selectors, system })
    }

    /// The runtime entry an application is reported under: the first whose filter
    /// matches its tag (unanchored, as neuron-monitor's Go regexp does).
    pub fn selector_for(&self, tag: &str) -> Option<usize> {
        self.selectors.iter().position(|s| s.filter.as_ref().is_none_or(|re| re.is_match(tag)))
    }

    /// Every group with its resolved period.
    pub fn groups(&self) -> impl Iterator<Item = (GroupKey, Period)> + '_ {
        let runtime = self.selectors.iter().enumerate().flat_map(|(selector, s)| {
            s.groups.iter().map(move |&(group, p)| (GroupKey::Runtime { selector, group }, p))
        });
        let system = self.system.iter().map(|&(g, p)| (GroupKey::System(g), p));
        runtime.chain(system)
    }

    /// The groups refreshed at `t_ms`, with their periods.
    pub fn due_at(&self, t_ms: u64) -> Vec<(GroupKey, Period)> {
        if t_ms == 0 {
            return Vec::new();
        }
        self.groups().filter(|(_, p)| t_ms.is_multiple_of(p.as_millis())).collect()
    }

    /// The first moment after `t_ms` at which some group is due; `None` when the
    /// configuration selects no group at all.
    pub fn next_tick_after(&self, t_ms: u64) -> Option<u64> {
        self.groups().map(|(_, p)| (t_ms / p.as_millis() + 1) * p.as_millis()).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(json: &str) -> Plan {
        Plan::new(&serde_json::from_str(json).unwrap()).unwrap()
    }

    fn names(due: &[(GroupKey, Period)]) -> Vec<String> {
        due.iter()
            .map(|(k, _)| match k {
                GroupKey::Runtime { selector, group } => format!("{selector}:{}", group.as_str()),
                GroupKey::System(g) => g.as_str().to_owned(),
            })
            .collect()
    }

    /// Steps through simulated time: (tick, groups due then).
    fn ticks(plan: &Plan, until_ms: u64) -> Vec<(u64, Vec<String>)> {
        let mut out = Vec::new();
        let mut t = 0;
        while let Some(next) = plan.next_tick_after(t) {
            if next > until_ms {
                break;
            }
            out.push((next, names(&plan.due_at(next))));
            t = next;
        }
        out
    }

    #[test]
    fn nearest_period_decides_which_groups_each_tick_carries() {
        let p = plan(
            r#"{"period":"1s",
                "neuron_runtimes":[{"period":"500ms","metrics":[
                    {"type":"neuroncore_counters"},{"type":"execution_stats","period":"2s"}]}],
                "system_metrics":[{"type":"memory_info"},{"type":"neuron_hw_counters","period":"1500ms"}]}"#,
        );
        let got = ticks(&p, 3000);
        let expect: Vec<(u64, Vec<&str>)> = vec![
            (500, vec!["0:neuroncore_counters"]),
            (1000, vec!["0:neuroncore_counters", "memory_info"]),
            (1500, vec!["0:neuroncore_counters", "neuron_hw_counters"]),
            (2000, vec!["0:neuroncore_counters", "0:execution_stats", "memory_info"]),
            (2500, vec!["0:neuroncore_counters"]),
            (3000, vec!["0:neuroncore_counters", "memory_info", "neuron_hw_counters"]),
        ];
        let expect: Vec<(u64, Vec<String>)> =
            expect.into_iter().map(|(t, g)| (t, g.into_iter().map(String::from).collect())).collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn without_configuration_everything_is_due_every_five_seconds() {
        let p = Plan::new(&MonitorConfig::all_groups(api::monitor_config::DEFAULT_PERIOD)).unwrap();
        assert_eq!(p.next_tick_after(0), Some(5000));
        assert_eq!(p.due_at(5000).len(), 7);
        assert!(p.due_at(4999).is_empty());
        assert!(p.due_at(0).is_empty());
        assert_eq!(p.next_tick_after(5000), Some(10000));
    }

    #[test]
    fn default_period_applies_when_none_is_given() {
        let p = plan(r#"{"system_metrics":[{"type":"vcpu_usage"}]}"#);
        assert_eq!(p.next_tick_after(0), Some(5000));
        assert_eq!(plan("{}").next_tick_after(0), None);
    }

    #[test]
    fn tag_filters_pick_the_first_matching_entry() {
        let p = plan(
            r#"{"neuron_runtimes":[
                {"tag_filter":"^train-","metrics":[{"type":"memory_used"}]},
                {"tag_filter":"bert","metrics":[{"type":"neuroncore_counters"}]},
                {"metrics":[{"type":"execution_stats"}]}]}"#,
        );
        assert_eq!(p.selector_for("train-bert"), Some(0));
        assert_eq!(p.selector_for("my-bert-1"), Some(1));
        assert_eq!(p.selector_for("1234"), Some(2));

        let only = plan(r#"{"neuron_runtimes":[{"tag_filter":"^serve$","metrics":[]}]}"#);
        assert_eq!(only.selector_for("serve"), Some(0));
        assert_eq!(only.selector_for("serve-2"), None);
    }

    #[test]
    fn a_bad_tag_filter_is_a_startup_error() {
        let config: MonitorConfig =
            serde_json::from_str(r#"{"neuron_runtimes":[{"tag_filter":"(unclosed","metrics":[]}]}"#).unwrap();
        let err = format!("{:#}", Plan::new(&config).unwrap_err());
        assert!(err.contains("neuron_runtimes[0].tag_filter") && err.contains("(unclosed"), "{err}");
    }

    #[test]
    fn a_group_listed_twice_is_refreshed_once() {
        let p = plan(r#"{"system_metrics":[{"type":"memory_info","period":"1s"},{"type":"memory_info"}]}"#);
        assert_eq!(p.due_at(5000).len(), 1);
        assert_eq!(p.next_tick_after(0), Some(1000));
    }
}
