//! Datums out to CloudWatch: a bounded queue per sink and the task that empties it with
//! PutMetricData, retrying what may succeed later.
//!
//! - The queue holds datums, oldest first; when a flush would overflow it, the oldest
//!   queued datums go (counted as `queue_full`), so fresh data wins over stale.
//! - One request in flight per sink, at most 1,000 datums and 1 MB ([`take_batch`]).
//! - Throttling, 5xx, time-outs, network and credential errors are retried with jittered
//!   exponential backoff, without end: data is lost only when the queue overflows, which
//!   keeps a long outage bounded in memory. Any other refusal drops the request's datums
//!   (counted as `rejected`): resending the same data would fail the same way.
//! - An answer over `delivery::MAX_RESPONSE_BYTES` is not read (`delivery::aws`): after a
//!   2xx the datums count as unconfirmed and are not sent again (CloudWatch took the
//!   request); after an error status the request is retried like any other.
//! - The SDK's own retries are off, so every attempt is counted here.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aws_sdk_cloudwatch::{
    primitives::DateTime,
    types::{Dimension as CwDimension, MetricDatum, StandardUnit, StatisticSet},
    Client,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::{
    datum::{take_batch, Datum, Values},
    telemetry::{CloudWatchMetrics, SinkLabel, SinkReasonLabels, SinkResultLabels},
};
use crate::{
    delivery::{
        aws::{classify, sdk_config, Failure, RESPONSE_TOO_LARGE},
        backoff::Backoff,
        queue,
    },
    ratelimit::{Decision, RateLimit},
    sinks::common::SinkQueueMetrics,
};

/// The datums of one sink waiting to be sent.
pub type Queue = queue::Queue<Datum, SinkQueueMetrics>;

/// The SDK client of one sink (see [`sdk_config`]; the endpoint from
/// `AWS_ENDPOINT_URL_CLOUDWATCH` / `AWS_ENDPOINT_URL` when set).
pub async fn client(region: &str, attempt_timeout: Duration) -> Client {
    Client::new(&sdk_config(region, attempt_timeout).await)
}

/// One datum in the SDK's terms.
pub fn to_sdk(datum: &Datum) -> MetricDatum {
    let mut b = MetricDatum::builder()
        .metric_name(datum.key.name)
        .unit(StandardUnit::from(datum.unit.as_str()))
        .timestamp(DateTime::from(datum.timestamp))
        .storage_resolution(datum.storage_resolution);
    for (name, value) in &datum.key.dimensions {
        b = b.dimensions(CwDimension::builder().name(*name).value(value).build());
    }
    match &datum.values {
        Values::Distribution(v) => {
            b = b
                .set_values(Some(v.iter().map(|(value, _)| *value).collect()))
                .set_counts(Some(v.iter().map(|(_, count)| *count).collect()));
        }
        Values::Statistics { count, sum, min, max } => {
            b = b.statistic_values(
                StatisticSet::builder().sample_count(*count).sum(*sum).minimum(*min).maximum(*max).build(),
            );
        }
    }
    b.build()
}

/// Where a sink's requests go.
pub struct Target {
    pub sink: String,
    pub namespace: String,
    pub client: Client,
    pub backoff: Backoff,
    pub metrics: CloudWatchMetrics,
}

/// Sends what the queue holds until `stop` (which abandons the request in flight).
pub async fn run_sender(queue: Arc<Queue>, target: Target, stop: CancellationToken) {
    let mut log_limit = RateLimit::new(5, Duration::from_secs(60));
    loop {
        let batch = loop {
            let batch = queue.take(|datums| take_batch(datums, &target.namespace));
            if !batch.is_empty() {
                break batch;
            }
            queue.finish();
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = queue.notify.notified() => {}
            }
        };
        let data: Vec<MetricDatum> = batch.iter().map(to_sdk).collect();
        let mut attempt = 0u32;
        loop {
            let request =
                target.client.put_metric_data().namespace(&target.namespace).set_metric_data(Some(data.clone())).send();
            let result = tokio::select! {
                _ = stop.cancelled() => return,
                result = request => result,
            };
            match result {
                Ok(_) => {
                    let sink = SinkLabel { sink: target.sink.clone() };
                    target.metrics.datums_sent.get_or_create(&sink).inc_by(batch.len() as u64);
                    target.metrics.common.requests.get_or_create(&result_labels(&target.sink, "success")).inc();
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                    target.metrics.common.last_success.get_or_create(&sink).set(now.as_secs_f64());
                    debug!(sink = %target.sink, datums = batch.len(), attempt, "PutMetricData accepted");
                    break;
                }
                Err(error) => {
                    let failure = classify(&error);
                    target.metrics.common.requests.get_or_create(&result_labels(&target.sink, "failure")).inc();
                    let labels = SinkReasonLabels { sink: target.sink.clone(), reason: failure.reason };
                    target.metrics.common.failures.get_or_create(&labels).inc();
                    if let Decision::Allow { suppressed_before } = log_limit.check() {
                        let detail = aws_sdk_cloudwatch::error::DisplayErrorContext(&error);
                        warn!(sink = %target.sink, reason = failure.reason, retry = failure.retry, datums = batch.len(),
                              attempt, suppressed_before, error = %detail, "PutMetricData failed");
                    }
                    if !failure.retry {
                        give_up(&target, failure, batch.len());
                        break;
                    }
                    let delay = target.backoff.delay(attempt);
                    attempt = attempt.saturating_add(1);
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
        queue.finish();
    }
}

/// Counts the datums of a request not sent again: unconfirmed when CloudWatch took the
/// request but its answer was over the limit, else rejected.
fn give_up(target: &Target, failure: Failure, datums: usize) {
    let common = &target.metrics.common;
    if failure.reason == RESPONSE_TOO_LARGE {
        common.unconfirmed.get_or_create(&SinkLabel { sink: target.sink.clone() }).inc_by(datums as u64);
    } else {
        let labels = SinkReasonLabels { sink: target.sink.clone(), reason: "rejected" };
        common.dropped.get_or_create(&labels).inc_by(datums as u64);
    }
}

fn result_labels(sink: &str, result: &'static str) -> SinkResultLabels {
    SinkResultLabels { sink: sink.to_owned(), result }
}
