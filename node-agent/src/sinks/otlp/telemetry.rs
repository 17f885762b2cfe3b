//! The OTLP sinks' own metrics (`neuron_agent_otlp_*`), labelled by sink (the
//! NeuronMonitorConfig, `namespace/name`): few sinks per node, so few series.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::sinks::common::{SinkFamilies, SinkHelp};
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
    /// The families every kind of sink has.
    pub common: SinkFamilies,
    pub points_sent: Family<SinkLabel, Counter>,
    pub bytes_sent: Family<SinkEncodingLabels, Counter>,
    pub attributes_dropped: Family<SinkLabel, Counter>,
    pub headers_watch_errors: Counter,
    pub headers_followed: Gauge,
}

const HELP: SinkHelp = SinkHelp {
    dropped_family: "dropped_points",
    queue_family: "queue_points",
    requests: "OTLP export attempts by result (success, failure)",
    failures: "Failed OTLP export attempts by reason (throttled, server_error, timeout, network, auth, rejected, \
               response, credentials, headers, other)",
    dropped: "Data points given up, by reason (queue_full: oldest dropped for newer; rejected: the receiver refused \
              the request; partial_success: the receiver rejected them in an accepted request; shutdown: not sent \
              within the shutdown time limit; invalid: the sink cannot send)",
    queue: "Data points waiting to be sent, including those of the request in flight",
    flushes: "Snapshots of the sink's series taken into requests",
    last_success: "Unix time of the last request the receiver accepted",
    unconfirmed_family: "unconfirmed_points",
    unconfirmed: "Data points of requests the receiver accepted (HTTP 2xx) with an answer over 64 KiB, not read: \
                  how many it rejected in part is unknown; not sent again",
    invalid: "1 for each configured OTLP sink that cannot send (reason: endpoint, region, flushInterval, \
              headersSecret, headersSecret.name: its settings; headers: its Secret's headers are missing or \
              unusable; tls: no CA certificates for https; partition: its region is in another AWS partition \
              than the instance's)",
};

impl OtlpMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let registry = registry.sub_registry_with_prefix("neuron_agent_otlp");
        let m = OtlpMetrics { common: SinkFamilies::register(registry, &HELP), ..OtlpMetrics::default() };
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
            "attributes_dropped",
            "Attributes left off data points beyond the 150 a point may carry (resource attributes included)",
            m.attributes_dropped.clone(),
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
}
