//! The rules a CloudWatch sink's settings obey, CloudWatch's and ours, in one place: the
//! operator refuses a config that breaks one (naming the field), and the agent checks
//! again before it starts a sink, since a node configuration may come from elsewhere.

use std::time::Duration;

use super::catalogue::dimension_sets;
// Re-exported where the sink's other rules are, for the agent's flags.
pub use crate::region::valid_region;
use crate::{
    crd::{CloudWatchNaming, CloudWatchSinkSpec, Dimension},
    duration::Period,
    limits::{MAX_CLOUDWATCH_NAMESPACE_BYTES, MAX_DATUM_DIMENSIONS},
};

/// One dimension is kept for a metric's own split (ErrorType, Percentile, …).
pub const MAX_SET_DIMENSIONS: usize = MAX_DATUM_DIMENSIONS - 1;
pub const DEFAULT_STORAGE_RESOLUTION: i32 = 60;
pub const DEFAULT_FLUSH_INTERVAL: Duration = Duration::from_secs(60);
const FLUSH_RANGE: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(3600));

/// A sink's settings, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct SinkSettings {
    pub namespace: String,
    /// `None`: the instance's region (the agent reads it from the reports).
    pub region: Option<String>,
    pub naming: CloudWatchNaming,
    /// The spec's set (or the default), then each distinct roll-up; empty with the
    /// Container Insights naming, whose sets are its own (`catalogue::insights`).
    pub dimension_sets: Vec<Vec<Dimension>>,
    pub storage_resolution: i32,
    pub flush_interval: Duration,
}

/// A rule the spec breaks: its field under `spec.sinks.cloudwatch`, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SinkError {
    pub field: &'static str,
    pub reason: String,
}

impl SinkError {
    pub(crate) fn new(field: &'static str, reason: impl Into<String>) -> Self {
        SinkError { field, reason: reason.into() }
    }
}

impl SinkSettings {
    pub fn check(spec: &CloudWatchSinkSpec) -> Result<SinkSettings, SinkError> {
        if !valid_namespace(&spec.namespace) {
            return Err(SinkError::new(
                "namespace",
                "must be 1 to 255 characters of A-Z a-z 0-9 . _ / # : - and space, not starting with AWS/ \
                 (reserved for AWS services)",
            ));
        }
        if let Some(region) = spec.region.as_deref().filter(|r| !valid_region(r)) {
            return Err(SinkError::new("region", format!("{region:?} is not an AWS region name such as us-east-1")));
        }
        let storage_resolution = spec.storage_resolution.unwrap_or(DEFAULT_STORAGE_RESOLUTION);
        if storage_resolution != 1 && storage_resolution != 60 {
            return Err(SinkError::new("storageResolution", "storage resolution is 1 or 60 seconds"));
        }
        let flush_interval = parse_flush_interval(spec.flush_interval.as_deref())?;
        let naming = spec.naming.unwrap_or_default();
        if naming == CloudWatchNaming::ContainerInsights {
            // Its names and sets are fixed: a list of ours would be silently meaningless.
            let ours = [
                ("dimensions", spec.dimensions.is_some()),
                ("rollups", spec.rollups.is_some()),
                ("metrics", spec.metrics.is_some()),
            ];
            if let Some((field, _)) = ours.into_iter().find(|(_, set)| *set) {
                return Err(SinkError::new(
                    field,
                    "Container Insights naming publishes its own metrics and dimension sets; remove this field",
                ));
            }
        }
        let sets = match naming {
            CloudWatchNaming::Classic => dimension_sets(spec.dimensions.as_deref(), spec.rollups.as_deref()),
            CloudWatchNaming::ContainerInsights => Vec::new(),
        };
        if let Some(big) = sets.iter().map(Vec::len).find(|n| *n > MAX_SET_DIMENSIONS) {
            return Err(SinkError::new(
                "dimensions",
                format!("a dimension set has {big} dimensions, more than {MAX_SET_DIMENSIONS}"),
            ));
        }
        Ok(SinkSettings {
            namespace: spec.namespace.clone(),
            region: spec.region.clone(),
            naming,
            dimension_sets: sets,
            storage_resolution,
            flush_interval,
        })
    }
}

/// A sink's `flushInterval` (CloudWatch's and OTLP's): from 1 s to 1 h; absent, 60 s.
pub(crate) fn parse_flush_interval(text: Option<&str>) -> Result<Duration, SinkError> {
    let Some(text) = text else { return Ok(DEFAULT_FLUSH_INTERVAL) };
    let period: Period = text.parse().map_err(|e| SinkError::new("flushInterval", format!("{text:?}: {e}")))?;
    let d = period.as_duration();
    if d < FLUSH_RANGE.0 || d > FLUSH_RANGE.1 {
        return Err(SinkError::new("flushInterval", format!("{text:?} must be from 1s to 1h")));
    }
    Ok(d)
}

/// CloudWatch's namespace rule: 1-255 characters of `A-Za-z0-9._/#:-` and space, not
/// starting with `AWS/`.
pub fn valid_namespace(ns: &str) -> bool {
    (1..=MAX_CLOUDWATCH_NAMESPACE_BYTES).contains(&ns.len())
        && !ns.starts_with("AWS/")
        && ns.chars().all(|c| c.is_ascii_alphanumeric() || "._/#: -".contains(c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(namespace: &str) -> CloudWatchSinkSpec {
        CloudWatchSinkSpec { namespace: namespace.into(), ..Default::default() }
    }

    fn field(change: impl FnOnce(&mut CloudWatchSinkSpec)) -> &'static str {
        let mut s = spec("Team/Neuron");
        change(&mut s);
        SinkSettings::check(&s).unwrap_err().field
    }

    #[test]
    fn namespaces() {
        assert!(valid_namespace("Team A/Neuron#1"));
        assert!(!valid_namespace("AWS/Neuron") && !valid_namespace("") && !valid_namespace("a|b"));
        assert!(!valid_namespace(&"n".repeat(256)));
    }

    #[test]
    fn defaults_and_refusals_name_the_field() {
        let s = SinkSettings::check(&spec("Team/Neuron")).unwrap();
        assert_eq!((s.storage_resolution, s.flush_interval, s.region), (60, DEFAULT_FLUSH_INTERVAL, None));
        assert_eq!(field(|s| s.namespace = "AWS/EC2".into()), "namespace");
        assert_eq!(field(|s| s.region = Some("moon-1".into())), "region");
        assert_eq!(field(|s| s.storage_resolution = Some(5)), "storageResolution");
        assert_eq!(field(|s| s.flush_interval = Some("500ms".into())), "flushInterval");
        assert_eq!(field(|s| s.flush_interval = Some("soon".into())), "flushInterval");
        assert_eq!(field(|s| s.flush_interval = Some("2h".into())), "flushInterval");
    }

    #[test]
    fn container_insights_naming_refuses_our_own_lists() {
        let insights = |s: &mut CloudWatchSinkSpec| s.naming = Some(CloudWatchNaming::ContainerInsights);
        let ok = {
            let mut s = spec("ContainerInsights");
            insights(&mut s);
            SinkSettings::check(&s).unwrap()
        };
        assert_eq!(ok.naming, CloudWatchNaming::ContainerInsights);
        assert!(ok.dimension_sets.is_empty());
        assert_eq!(
            field(|s| {
                insights(s);
                s.dimensions = Some(vec![Dimension::PodName]);
            }),
            "dimensions"
        );
        assert_eq!(
            field(|s| {
                insights(s);
                s.rollups = Some(vec![vec![Dimension::ClusterName]]);
            }),
            "rollups"
        );
        assert_eq!(
            field(|s| {
                insights(s);
                s.metrics = Some(vec![]);
            }),
            "metrics"
        );
        // The classic naming takes them, as before.
        let mut classic = spec("Team/Neuron");
        classic.naming = Some(CloudWatchNaming::Classic);
        classic.dimensions = Some(vec![Dimension::PodName]);
        assert_eq!(SinkSettings::check(&classic).unwrap().dimension_sets, vec![vec![Dimension::PodName]]);
    }
}
