//! What the CloudWatch and OTLP sinks share: the labels of their own metrics (by sink,
//! the NeuronMonitorConfig `namespace/name`), their queues' metrics, and the rule of which
//! running sinks stay when the routes change.

use std::{future::Future, sync::atomic::AtomicU64};

use api::node_config::Route;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{delivery::queue::QueueMetrics, routing::Selection};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabel {
    pub sink: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkReasonLabels {
    pub sink: String,
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkResultLabels {
    pub sink: String,
    pub result: &'static str,
}

/// The families every kind of sink has, under its kind's prefix; cloning shares them.
#[derive(Clone, Default)]
pub struct SinkFamilies {
    pub requests: Family<SinkResultLabels, Counter>,
    pub failures: Family<SinkReasonLabels, Counter>,
    pub dropped: Family<SinkReasonLabels, Counter>,
    pub queue: Family<SinkLabel, Gauge>,
    pub flushes: Family<SinkLabel, Counter>,
    pub last_success: Family<SinkLabel, Gauge<f64, AtomicU64>>,
    pub invalid: Family<SinkReasonLabels, Gauge>,
    pub unconfirmed: Family<SinkLabel, Counter>,
}

/// What a kind of sink says of its [`SinkFamilies`]: the names of the families counted in
/// its queue's unit (`dropped_datums`, `queue_points`) and each family's help.
pub struct SinkHelp {
    pub dropped_family: &'static str,
    pub queue_family: &'static str,
    pub requests: &'static str,
    pub failures: &'static str,
    pub dropped: &'static str,
    pub queue: &'static str,
    pub flushes: &'static str,
    pub last_success: &'static str,
    pub invalid: &'static str,
    pub unconfirmed_family: &'static str,
    pub unconfirmed: &'static str,
}

impl SinkFamilies {
    /// Registers the families in `registry` (already under the kind's prefix).
    pub fn register(registry: &mut Registry, help: &SinkHelp) -> Self {
        let m = SinkFamilies::default();
        registry.register("requests", help.requests, m.requests.clone());
        registry.register("failures", help.failures, m.failures.clone());
        registry.register(help.dropped_family, help.dropped, m.dropped.clone());
        registry.register(help.queue_family, help.queue, m.queue.clone());
        registry.register("flushes", help.flushes, m.flushes.clone());
        registry.register("last_success_timestamp_seconds", help.last_success, m.last_success.clone());
        registry.register("invalid_sinks", help.invalid, m.invalid.clone());
        registry.register(help.unconfirmed_family, help.unconfirmed, m.unconfirmed.clone());
        m
    }

    /// The queue of `sink` in these families.
    pub fn queue_metrics(&self, sink: &str) -> SinkQueueMetrics {
        SinkQueueMetrics { sink: sink.to_owned(), depth: self.queue.clone(), dropped: self.dropped.clone() }
    }

    pub fn set_invalid(&self, sink: &str, reason: &'static str, invalid: bool) {
        self.invalid.get_or_create(&SinkReasonLabels { sink: sink.to_owned(), reason }).set(i64::from(invalid));
    }
}

/// A sink's queue in its kind's metrics: the depth gauge and the counter of what it gave
/// up, in the queue's unit (datums, data points).
pub struct SinkQueueMetrics {
    pub sink: String,
    pub depth: Family<SinkLabel, Gauge>,
    pub dropped: Family<SinkReasonLabels, Counter>,
}

impl QueueMetrics for SinkQueueMetrics {
    fn depth(&self, items: usize) {
        self.depth.get_or_create(&SinkLabel { sink: self.sink.clone() }).set(items as i64);
    }

    fn dropped(&self, reason: &'static str, items: usize) {
        if items > 0 {
            let labels = SinkReasonLabels { sink: self.sink.clone(), reason };
            self.dropped.get_or_create(&labels).inc_by(items as u64);
        }
    }
}

/// Keeps the running sinks whose route is still `wanted` and stops the others, each on a
/// task of its own: a destination that does not answer must not hold up the sampling of
/// the other sinks for the shutdown time limit.
pub fn stop_unwanted<R, F>(
    running: &mut Vec<R>,
    wanted: &[(&Route, &Selection)],
    route_of: impl Fn(&R) -> &Route,
    stop: impl Fn(R) -> F,
) where
    F: Future<Output = ()> + Send + 'static,
{
    let (keep, gone): (Vec<R>, Vec<R>) =
        std::mem::take(running).into_iter().partition(|r| wanted.iter().any(|(route, _)| *route == route_of(r)));
    *running = keep;
    for sink in gone {
        tokio::spawn(stop(sink));
    }
}
