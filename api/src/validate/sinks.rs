//! `spec.sinks`: the Prometheus route (extra labels), the CloudWatch and OTLP sinks' rules.

use std::collections::BTreeSet;
use std::fmt;

use crate::cloudwatch::{
    cost::{self, otlp},
    sink::SinkSettings,
};
use crate::crd::{CloudWatchSinkSpec, NeuronMonitorConfigSpec, OtlpSinkSpec, PrometheusSinkSpec};
use crate::limits::{MAX_EXTRA_LABELS, MAX_LABEL_VALUE_CHARS, MAX_ROLLUPS, MAX_SERIES_PER_CONFIG_PER_NODE};
use crate::node_config::PrometheusRoute;
use crate::otlp::OtlpSettings;

use super::{Invalid, Refusal};

/// Label names the node agent already puts on its series (see the CRD's CEL rule): an
/// extra label with one of these names would produce duplicate labels. Also `job` and
/// `instance`, the labels Prometheus gives a target (a series carrying its own would
/// pass for another target's where a scrape honours its labels), and `node` and
/// `agent_pod`, the chart's target labels of the agents.
pub const RESERVED_LABELS: [&str; 27] = [
    "job",
    "instance",
    "node",
    "agent_pod",
    "mode",
    "instance_name",
    "instance_id",
    "instance_type",
    "availability_zone",
    "region",
    "subnet_id",
    "runtime_tag",
    "namespace",
    "pod",
    "container",
    "neuroncore",
    "physical_neuroncore",
    "memory_location",
    "usage_type",
    "error_type",
    "status_type",
    "percentile",
    "event_type",
    "neuron_device_index",
    "ecs_task_arn",
    "ecs_task_family",
    "ecs_container",
];

pub(super) fn prometheus_route(spec: Option<&PrometheusSinkSpec>) -> Result<Option<PrometheusRoute>, Invalid> {
    let Some(spec) = spec else {
        return Ok(Some(PrometheusRoute::default()));
    };
    if spec.enabled == Some(false) {
        return Ok(None);
    }
    let extra_labels = spec.extra_labels.clone().unwrap_or_default();
    let field = "spec.sinks.prometheus.extraLabels";
    if extra_labels.len() > MAX_EXTRA_LABELS {
        return Err(Invalid::new(field, format!("at most {MAX_EXTRA_LABELS} labels")));
    }
    for (name, value) in &extra_labels {
        let field = format!("{field}[{name:?}]");
        let mut chars = name.chars();
        let valid_name = name.len() <= 63
            && chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
            && !name.starts_with("__");
        if !valid_name {
            return Err(Invalid::new(
                field,
                "is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, at most 63 characters, not starting with __)",
            ));
        }
        if RESERVED_LABELS.contains(&name.as_str()) {
            return Err(Invalid::new(field, "is a label the metrics already carry"));
        }
        if value.chars().count() > MAX_LABEL_VALUE_CHARS {
            return Err(Invalid::new(field, format!("values are at most {MAX_LABEL_VALUE_CHARS} characters")));
        }
    }
    Ok(Some(PrometheusRoute { extra_labels, loaded_model_info: spec.exports_model_info() }))
}

pub(super) fn check_cloudwatch(spec: &CloudWatchSinkSpec) -> Result<(), Invalid> {
    let field = "spec.sinks.cloudwatch";
    // The rules the agent applies too; then what only a list in the spec can get wrong.
    SinkSettings::check(spec).map_err(|e| Invalid::new(format!("{field}.{}", e.field), e.reason))?;
    // A dimension listed twice, or more than CloudWatch takes.
    if let Some(dimensions) = &spec.dimensions {
        check_set(dimensions, 30, &format!("{field}.dimensions"))?;
    }
    let rollups = spec.rollups.as_deref().unwrap_or_default();
    if rollups.len() > MAX_ROLLUPS {
        return Err(Invalid::new(format!("{field}.rollups"), format!("at most {MAX_ROLLUPS} roll-ups")));
    }
    for (i, rollup) in rollups.iter().enumerate() {
        check_set(rollup, 30, &format!("{field}.rollups[{i}]"))?;
    }
    if let Some(metrics) = &spec.metrics {
        check_set(metrics, usize::MAX, &format!("{field}.metrics"))?;
    }
    Ok(())
}

/// The series each sink creates on the largest Neuron node: at most
/// [`MAX_SERIES_PER_CONFIG_PER_NODE`], so that no config makes every agent it reaches
/// build, queue and send an unbounded number of them.
pub(super) fn check_series(spec: &NeuronMonitorConfigSpec, cluster_wide: bool) -> Result<(), Invalid> {
    let node = cost::largest_node();
    let sinks = spec.sinks.as_ref();
    let cloudwatch = cost::estimate(spec, cluster_wide, &[&node]).map(|e| ("spec.sinks.cloudwatch", e.metrics));
    let otlp =
        sinks.and_then(|s| s.otlp.as_ref()).map(|_| ("spec.sinks.otlp", otlp::series(spec, cluster_wide, &node)));
    for (field, series) in cloudwatch.into_iter().chain(otlp) {
        if series > MAX_SERIES_PER_CONFIG_PER_NODE {
            return Err(Invalid::of(
                Refusal::TooManySeries,
                field,
                format!(
                    "would create {series} series on a node of {} NeuronCores (one application per core); at most \
                     {MAX_SERIES_PER_CONFIG_PER_NODE} per config per node: fewer dimension sets or roll-ups, a metric \
                     allow-list or fewer metric groups",
                    node.cores
                ),
            ));
        }
    }
    Ok(())
}

/// The rules the agent applies too (endpoint, region, headers only with an endpoint,
/// flush interval).
pub(super) fn check_otlp(spec: &OtlpSinkSpec) -> Result<(), Invalid> {
    OtlpSettings::check(spec).map_err(|e| Invalid::new(format!("spec.sinks.otlp.{}", e.field), e.reason))?;
    Ok(())
}

pub(super) fn check_set<T: Ord + fmt::Debug>(items: &[T], max: usize, field: &str) -> Result<(), Invalid> {
    if items.len() > max {
        return Err(Invalid::new(field, format!("at most {max} entries")));
    }
    let mut seen = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        if !seen.insert(item) {
            return Err(Invalid::new(format!("{field}[{i}]"), format!("{item:?} is listed twice")));
        }
    }
    Ok(())
}
