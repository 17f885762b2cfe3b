//! The OTLP sinks' own metrics (`neuron_agent_otlp_*`), labelled by sink (the
//! NeuronMonitorConfig, `namespace/name`): few sinks per node, so few series.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

pub use crate::sinks::common::{SinkLabel, SinkReasonLabels, SinkResultLabels};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkEncodingLabels {
    pub sink: String,
    /// `gzip` (on the wire) or `raw` (the protobuf before compression).
    pub encoding: &'static str,
}

/// Handles to the sinks' metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct OtlpMetrics {
    pub requests: Family<SinkResultLabels, Counter>,
    pub points_sent: Family<SinkLabel, Counter>,
    pub bytes_sent: Family<SinkEncodingLabels, Counter>,
    pub failures: Family<SinkReasonLabels, Counter>,
    pub dropped: Family<SinkReasonLabels, Counter>,
    pub queue_points: Family<SinkLabel, Gauge>,
    pub flushes: Family<SinkLabel, Counter>,
    pub attributes_dropped: Family<SinkLabel, Counter>,
    pub last_success: Family<SinkLabel, Gauge<f64, AtomicU64>>,
    pub invalid: Family<SinkReasonLabels, Gauge>,
    pub headers_watch_errors: Counter,
    pub headers_followed: Gauge,
}

impl OtlpMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = OtlpMetrics::default();
        let registry = registry.sub_registry_with_prefix("neuron_agent_otlp");
        registry.register("requests", "OTLP export attempts by result (success, failure)", m.requests.clone());
        registry.register(
            "points_sent",
            "Data points the receiver accepted (a partial success's rejected points excluded)",
            m.points_sent.clone(),
        );
        registry.register(
            "sent_bytes",
            "Bytes of the requests the receiver accepted, by encoding (gzip: on the wire; raw: the protobuf)",
            m.bytes_sent.clone(),
        );
        registry.register(
            "failures",
            "Failed OTLP export attempts by reason (throttled, server_error, timeout, network, auth, rejected, \
             response, credentials, headers, other)",
            m.failures.clone(),
        );
        registry.register(
            "dropped_points",
            "Data points given up, by reason (queue_full: oldest dropped for newer; rejected: the receiver refused \
             the request; partial_success: the receiver rejected them in an accepted request; shutdown: not sent \
             within the shutdown time limit; invalid: the sink cannot send)",
            m.dropped.clone(),
        );
        registry.register(
            "queue_points",
            "Data points waiting to be sent, including those of the request in flight",
            m.queue_points.clone(),
        );
        registry.register("flushes", "Snapshots of the sink's series taken into requests", m.flushes.clone());
        registry.register(
            "attributes_dropped",
            "Attributes left off data points beyond the 150 a point may carry (resource attributes included)",
            m.attributes_dropped.clone(),
        );
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last request the receiver accepted",
            m.last_success.clone(),
        );
        registry.register(
            "invalid_sinks",
            "1 for each configured OTLP sink that cannot send (reason: endpoint, region, flushInterval, \
             headersSecret, headersSecret.name: its settings; headers: its Secret's headers are missing or \
             unusable; tls: no CA certificates for https; partition: its region is in another AWS partition \
             than the instance's)",
            m.invalid.clone(),
        );
        registry.register(
            "headers_watch_errors",
            "Failed requests of the watch of the mirrored OTLP headers Secret (retried with backoff)",
            m.headers_watch_errors.clone(),
        );
        registry.register(
            "headers_followed",
            "1 while a config in force names OTLP headers and the agent follows their mirror Secret, else 0",
            m.headers_followed.clone(),
        );
        m
    }

    pub(crate) fn set_invalid(&self, sink: &str, reason: &'static str, invalid: bool) {
        self.invalid.get_or_create(&SinkReasonLabels { sink: sink.to_owned(), reason }).set(i64::from(invalid));
    }
}
