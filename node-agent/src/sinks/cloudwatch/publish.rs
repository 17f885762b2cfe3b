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
//! - The SDK's own retries are off, so every attempt is counted here.

use std::{
    sync::Arc,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aws_config::{retry::RetryConfig, timeout::TimeoutConfig, BehaviorVersion, Region};
use aws_sdk_cloudwatch::{
    error::{ProvideErrorMetadata, SdkError},
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
    ratelimit::{Decision, RateLimit},
    sinks::queue::{self, QueueMetrics},
};

/// Retry timing of failed requests.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Delay before retry `attempt` (0-based): exponential, capped, and jittered over its
    /// upper half so that agents throttled together do not retry together.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self.initial.saturating_mul(1u32 << attempt.min(20)).min(self.max);
        let half = exp / 2;
        half + Duration::from_nanos(fastrand::u64(0..=half.as_nanos().min(u128::from(u64::MAX)) as u64))
    }
}

/// The datums of one sink waiting to be sent.
pub type Queue = queue::Queue<Datum, SinkQueueMetrics>;

/// A sink's queue in the sinks' metrics.
pub struct SinkQueueMetrics {
    pub sink: String,
    pub metrics: CloudWatchMetrics,
}

impl QueueMetrics for SinkQueueMetrics {
    fn depth(&self, items: usize) {
        self.metrics.queue_datums.get_or_create(&SinkLabel { sink: self.sink.clone() }).set(items as i64);
    }

    fn dropped(&self, reason: &'static str, items: usize) {
        if items > 0 {
            let labels = SinkReasonLabels { sink: self.sink.clone(), reason };
            self.metrics.dropped.get_or_create(&labels).inc_by(items as u64);
        }
    }
}

/// Why an attempt failed, and whether the same request may succeed later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    pub reason: &'static str,
    pub retry: bool,
}

/// Error codes of throttling (CloudWatch's query-compatible code and the SDKs' list).
const THROTTLING_CODES: [&str; 7] = [
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "RequestLimitExceeded",
    "SlowDown",
];
/// Error codes of credentials that may become valid (a rotated web-identity token, an
/// instance profile attached late).
const AUTH_CODES: [&str; 6] = [
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "AccessDenied",
    "AccessDeniedException",
];

/// Sorts a failed PutMetricData.
pub fn classify<E: ProvideErrorMetadata + std::error::Error + 'static>(
    error: &SdkError<E, aws_sdk_cloudwatch::config::http::HttpResponse>,
) -> Failure {
    match error {
        SdkError::TimeoutError(_) => Failure { reason: "timeout", retry: true },
        SdkError::DispatchFailure(d) if d.is_timeout() => Failure { reason: "timeout", retry: true },
        SdkError::DispatchFailure(d) if d.is_io() => Failure { reason: "network", retry: true },
        // Credentials that cannot be loaded yet surface here too.
        SdkError::DispatchFailure(_) => Failure { reason: "other", retry: true },
        SdkError::ResponseError(_) => Failure { reason: "response", retry: true },
        SdkError::ServiceError(e) => {
            let status = e.raw().status().as_u16();
            let code = e.err().code().unwrap_or_default();
            classify_service(status, code)
        }
        _ => Failure { reason: "other", retry: true },
    }
}

/// Sorts a service error by HTTP status and error code.
pub fn classify_service(status: u16, code: &str) -> Failure {
    if status == 429 || THROTTLING_CODES.contains(&code) {
        Failure { reason: "throttled", retry: true }
    } else if status >= 500 {
        Failure { reason: "server_error", retry: true }
    } else if AUTH_CODES.contains(&code) || status == 401 || status == 403 {
        Failure { reason: "auth", retry: true }
    } else {
        Failure { reason: "rejected", retry: false }
    }
}

/// The SDK client of one sink (see [`sdk_config`]; the endpoint from
/// `AWS_ENDPOINT_URL_CLOUDWATCH` / `AWS_ENDPOINT_URL` when set).
pub async fn client(region: &str, attempt_timeout: Duration) -> Client {
    Client::new(&sdk_config(region, attempt_timeout).await)
}

/// The configuration of every AWS client of the agent (CloudWatch, CloudWatch Logs): the
/// standard credential chain (environment, web identity for IRSA, container credentials
/// for EKS Pod Identity, instance profile), rustls on ring, no SDK retries (the callers
/// retry and count each attempt), a time limit per attempt. Each service's client takes
/// its endpoint from `AWS_ENDPOINT_URL_<SERVICE>` / `AWS_ENDPOINT_URL` when set.
pub async fn sdk_config(region: &str, attempt_timeout: Duration) -> aws_config::SdkConfig {
    use aws_smithy_http_client::tls;
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring))
        .build_https();
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .http_client(http)
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(attempt_timeout)
                .build(),
        )
        .load()
        .await
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
                    target.metrics.requests.get_or_create(&result_labels(&target.sink, "success")).inc();
                    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
                    target.metrics.last_success.get_or_create(&sink).set(now.as_secs_f64());
                    debug!(sink = %target.sink, datums = batch.len(), attempt, "PutMetricData accepted");
                    break;
                }
                Err(error) => {
                    let failure = classify(&error);
                    target.metrics.requests.get_or_create(&result_labels(&target.sink, "failure")).inc();
                    let labels = SinkReasonLabels { sink: target.sink.clone(), reason: failure.reason };
                    target.metrics.failures.get_or_create(&labels).inc();
                    if let Decision::Allow { suppressed_before } = log_limit.check() {
                        let detail = aws_sdk_cloudwatch::error::DisplayErrorContext(&error);
                        warn!(sink = %target.sink, reason = failure.reason, retry = failure.retry, datums = batch.len(),
                              attempt, suppressed_before, error = %detail, "PutMetricData failed");
                    }
                    if !failure.retry {
                        let labels = SinkReasonLabels { sink: target.sink.clone(), reason: "rejected" };
                        target.metrics.dropped.get_or_create(&labels).inc_by(batch.len() as u64);
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

fn result_labels(sink: &str, result: &'static str) -> SinkResultLabels {
    SinkResultLabels { sink: sink.to_owned(), result }
}
