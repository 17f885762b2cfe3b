//! The CloudWatch sinks' own metrics (`neuron_agent_cloudwatch_*`), labelled by sink (the
//! NeuronMonitorConfig, `namespace/name`): few sinks per node, so few series.

use prometheus_client::{
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

use crate::sinks::common::{SinkFamilies, SinkHelp};
pub use crate::sinks::common::{SinkLabel, SinkReasonLabels, SinkResultLabels};

/// Handles to the sinks' metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct CloudWatchMetrics {
    /// The families every kind of sink has.
    pub common: SinkFamilies,
    pub datums_sent: Family<SinkLabel, Counter>,
}

const HELP: SinkHelp = SinkHelp {
    dropped_family: "dropped_datums",
    queue_family: "queue_datums",
    requests: "PutMetricData attempts by result (success, failure)",
    failures: "Failed PutMetricData attempts by reason (throttled, server_error, timeout, network, auth, rejected, \
               response, response_too_large, other)",
    dropped: "Datums given up, by reason (queue_full: oldest dropped for newer; rejected: CloudWatch refused the \
              request; shutdown: not sent within the shutdown time limit)",
    queue: "Datums waiting to be sent, including those of the request in flight",
    flushes: "Flushes of collected samples into datums",
    last_success: "Unix time of the last request CloudWatch accepted",
    unconfirmed_family: "unconfirmed_datums",
    unconfirmed: "Datums of requests CloudWatch accepted (HTTP 2xx) with an answer over 64 KiB, not read: whether \
                  it took them is unknown; not sent again",
    invalid: "1 for each configured CloudWatch sink left out because its settings are invalid (reason: region, \
              namespace, resolution, flush_interval, dimensions, rollups, metrics; cluster_name: a Container \
              Insights sink without --cluster-name; partition: a region of another AWS partition than the \
              instance's)",
};

impl CloudWatchMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let registry = registry.sub_registry_with_prefix("neuron_agent_cloudwatch");
        let m = CloudWatchMetrics { common: SinkFamilies::register(registry, &HELP), datums_sent: Family::default() };
        registry.register(
            "datums_sent",
            "Datums CloudWatch accepted (one per metric and flush, carrying all its samples)",
            m.datums_sent.clone(),
        );
        m
    }
}
