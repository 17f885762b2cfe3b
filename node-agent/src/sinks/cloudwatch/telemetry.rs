//! The CloudWatch sinks' own metrics (`neuron_agent_cloudwatch_*`), labelled by sink (the
//! NeuronMonitorConfig, `namespace/name`): few sinks per node, so few series.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

pub use crate::sinks::common::{SinkLabel, SinkReasonLabels, SinkResultLabels};

/// Handles to the sinks' metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct CloudWatchMetrics {
    pub datums_sent: Family<SinkLabel, Counter>,
    pub requests: Family<SinkResultLabels, Counter>,
    pub failures: Family<SinkReasonLabels, Counter>,
    pub dropped: Family<SinkReasonLabels, Counter>,
    pub queue_datums: Family<SinkLabel, Gauge>,
    pub flushes: Family<SinkLabel, Counter>,
    pub last_success: Family<SinkLabel, Gauge<f64, AtomicU64>>,
    pub invalid: Family<SinkReasonLabels, Gauge>,
}

impl CloudWatchMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = CloudWatchMetrics::default();
        let registry = registry.sub_registry_with_prefix("neuron_agent_cloudwatch");
        registry.register(
            "datums_sent",
            "Datums CloudWatch accepted (one per metric and flush, carrying all its samples)",
            m.datums_sent.clone(),
        );
        registry.register("requests", "PutMetricData attempts by result (success, failure)", m.requests.clone());
        registry.register(
            "failures",
            "Failed PutMetricData attempts by reason (throttled, server_error, timeout, network, auth, rejected, \
             response, other)",
            m.failures.clone(),
        );
        registry.register(
            "dropped_datums",
            "Datums given up, by reason (queue_full: oldest dropped for newer; rejected: CloudWatch refused the \
             request; shutdown: not sent within the shutdown time limit)",
            m.dropped.clone(),
        );
        registry.register(
            "queue_datums",
            "Datums waiting to be sent, including those of the request in flight",
            m.queue_datums.clone(),
        );
        registry.register("flushes", "Flushes of collected samples into datums", m.flushes.clone());
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last request CloudWatch accepted",
            m.last_success.clone(),
        );
        registry.register(
            "invalid_sinks",
            "1 for each configured CloudWatch sink left out because its settings are invalid (reason: region, \
             namespace, resolution, flush_interval, dimensions, rollups, metrics; cluster_name: a Container \
             Insights sink without --cluster-name; partition: a region of another AWS partition than the \
             instance's)",
            m.invalid.clone(),
        );
        m
    }
}
