//! What the CloudWatch and OTLP sinks share: the labels of their own metrics (by sink,
//! the NeuronMonitorConfig `namespace/name`), their queues' metrics, and the rule of which
//! running sinks stay when the routes change.

use std::future::Future;

use api::node_config::Route;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
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
