//! Sending: the queue of events waiting to go, the batches PutLogEvents takes, and the
//! task that creates the group and stream and puts the batches, retrying what may
//! succeed later.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use api::region::same_partition;
use aws_sdk_cloudwatchlogs::{
    error::{ProvideErrorMetadata, SdkError},
    types::InputLogEvent,
    Client,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    stream_name, unix_millis, LogDestination, LogMetrics, LogOptions, Record, EVENT_OVERHEAD_BYTES, INSTANCE_ID_WAIT,
    MAX_EVENTS_PER_REQUEST, MAX_REQUEST_BYTES, MAX_SPAN_MS,
};
use crate::{
    delivery::{
        aws::{classify, sdk_config},
        queue::{self, QueueMetrics, QUEUE_FULL},
    },
    ratelimit::{Decision, RateLimit},
    state::NodeState,
};

/// The events waiting to be sent, oldest first.
pub type Queue = queue::Queue<Record, LogMetrics>;

impl QueueMetrics for LogMetrics {
    fn depth(&self, items: usize) {
        self.queue.set(items as i64);
    }

    /// Counted as events of that result: `dropped` (pushed out, turned off, shutdown) or
    /// `failed` (refused by CloudWatch Logs).
    fn dropped(&self, reason: &'static str, items: usize) {
        self.events(if reason == QUEUE_FULL { "dropped" } else { reason }, items);
    }
}

/// The age of the oldest queued event, if any.
pub(super) fn oldest_ms(queue: &Queue) -> Option<i64> {
    queue.front(|r| r.map(|r| r.timestamp_ms))
}

/// The next request's events, now in flight.
pub(super) fn take(queue: &Queue, identity: &Identity) -> Batch {
    queue.take(|records| take_batch(records, identity))
}

/// What names the instance in its events and stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identity {
    pub instance_id: Option<String>,
    pub node: Option<String>,
}

impl Identity {
    /// The stream: the instance id, else the node's name, else the host's.
    pub fn stream(&self) -> String {
        let name = self.instance_id.clone().or_else(|| self.node.clone()).unwrap_or_else(hostname);
        stream_name(&name)
    }
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it
    // or truncates, and the last byte stays 0.
    let ok = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) } == 0;
    let end = buf.iter().position(|b| *b == 0).unwrap_or(0);
    if ok {
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    }
}

/// One request's events: the records (to put back if it fails) and their messages.
#[derive(Debug, Default)]
pub struct Batch {
    pub records: Vec<Record>,
    pub events: Vec<InputLogEvent>,
    /// Records left out because one alone is over the byte limit (cannot happen with
    /// the bounded fields; counted as failed rather than looped on).
    pub oversized: usize,
}

/// The next request's events, taken from the front of `queue`: at most
/// [`MAX_EVENTS_PER_REQUEST`] and [`MAX_REQUEST_BYTES`] (messages + 26 bytes each),
/// timestamps within [`MAX_SPAN_MS`], sorted by timestamp (the readers of the sysfs tree
/// and of the kernel log may hand theirs over out of order). The instance id, once
/// known, goes into the records that lack it. Every field of a record is bounded, so
/// one record is far below the byte limit.
pub fn take_batch(queue: &mut VecDeque<Record>, identity: &Identity) -> Batch {
    let mut out = Batch::default();
    let mut batch: Vec<(Record, String)> = Vec::new();
    let (mut bytes, mut min, mut max) = (0usize, i64::MAX, i64::MIN);
    while let Some(record) = queue.front() {
        if batch.len() >= MAX_EVENTS_PER_REQUEST {
            break;
        }
        let t = record.timestamp_ms;
        if !batch.is_empty() && (t.max(max) - t.min(min) > MAX_SPAN_MS) {
            break;
        }
        let mut record = record.clone();
        if record.instance_id.is_none() {
            record.instance_id = identity.instance_id.clone();
        }
        let message = serde_json::to_string(&record).unwrap_or_default();
        let size = message.len() + EVENT_OVERHEAD_BYTES;
        if size > MAX_REQUEST_BYTES {
            queue.pop_front();
            out.oversized += 1;
            continue;
        }
        if bytes + size > MAX_REQUEST_BYTES {
            break;
        }
        queue.pop_front();
        bytes += size;
        (min, max) = (min.min(t), max.max(t));
        batch.push((record, message));
    }
    batch.sort_by_key(|(r, _)| r.timestamp_ms);
    for (record, message) in batch {
        if let Ok(event) = InputLogEvent::builder().timestamp(record.timestamp_ms).message(message).build() {
            out.events.push(event);
            out.records.push(record);
        }
    }
    out
}

/// How many events of a request of `n` CloudWatch Logs refused (too old, expired, too new).
pub fn rejected_count(
    n: usize,
    too_old_end: Option<i32>,
    expired_end: Option<i32>,
    too_new_start: Option<i32>,
) -> usize {
    let index = |i: Option<i32>| i.and_then(|i| usize::try_from(i).ok());
    let old = [index(too_old_end), index(expired_end)].into_iter().flatten().map(|i| i + 1).max().unwrap_or(0);
    let new = index(too_new_start).map_or(0, |i| n.saturating_sub(i));
    (old.min(n) + new).min(n)
}

/// What a failed call says: retry it (and why it failed), or give up.
enum Outcome {
    Done,
    /// The group or stream is missing: create them and retry.
    NotFound,
    Retry(&'static str),
    GiveUp(&'static str),
}

fn outcome<E: ProvideErrorMetadata + std::error::Error + 'static>(
    error: &SdkError<E, aws_sdk_cloudwatchlogs::config::http::HttpResponse>,
    log_limit: &mut RateLimit,
    what: &str,
) -> Outcome {
    let code = match error {
        SdkError::ServiceError(e) => e.err().code().unwrap_or_default(),
        _ => "",
    };
    let outcome = match code {
        "ResourceAlreadyExistsException" => return Outcome::Done,
        "ResourceNotFoundException" => Outcome::NotFound,
        _ => {
            let failure = classify(error);
            if failure.retry {
                Outcome::Retry(failure.reason)
            } else {
                Outcome::GiveUp(failure.reason)
            }
        }
    };
    if let Decision::Allow { suppressed_before } = log_limit.check() {
        let detail = aws_sdk_cloudwatchlogs::error::DisplayErrorContext(error);
        warn!(call = what, suppressed_before, error = %detail, "CloudWatch Logs request failed");
    }
    outcome
}

/// Sends the queue's events to the destination in force.
pub(super) struct Sender {
    pub(super) queue: Arc<Queue>,
    pub(super) destination: watch::Receiver<Option<LogDestination>>,
    pub(super) state: Arc<Mutex<NodeState>>,
    pub(super) node_name: Option<String>,
    pub(super) options: LogOptions,
    pub(super) metrics: LogMetrics,
    /// The agent is stopping: send at once, do not wait for the instance id.
    pub(super) closing: CancellationToken,
    pub(super) started: Instant,
}

/// The client of a region, and the group and stream it created.
struct Connection {
    region: String,
    client: Client,
    ready: Option<(String, String)>,
}

impl Sender {
    pub(super) async fn run(self, stop: CancellationToken) {
        let mut connection: Option<Connection> = None;
        let mut log_limit = RateLimit::new(5, Duration::from_secs(60));
        let mut attempt = 0u32;
        let mut announced: Option<LogDestination> = None;
        loop {
            // Something to send, and the time to send it.
            let wait = self.wait();
            tokio::select! {
                _ = stop.cancelled() => return,
                ready = wait => if !ready { continue },
            }
            let destination = self.destination.borrow().clone();
            let Some(destination) = destination else {
                // Turned off: what was queued for it goes.
                self.queue.abandon("dropped");
                continue;
            };
            if let Err(field) = destination.check() {
                self.metrics.invalid.set(1);
                if announced.as_ref() != Some(&destination) {
                    warn!(group = %destination.group, region = ?destination.region, field,
                          "hardware-health log stream left out: invalid destination");
                    announced = Some(destination);
                }
                self.queue.abandon("dropped");
                continue;
            }
            self.metrics.invalid.set(0);
            let (identity, instance_region) = self.identity();
            // The first events wait a little for the instance id that names the stream.
            if identity.instance_id.is_none()
                && self.started.elapsed() < INSTANCE_ID_WAIT
                && !self.closing.is_cancelled()
            {
                self.pause(&stop, Duration::from_millis(250)).await;
                continue;
            }
            // A node with GPUs and no Neuron device has no report, so no instance region:
            // after the wait, a region the destination names is taken as it is.
            let instance_region = instance_region.or_else(|| {
                let no_report = self.started.elapsed() >= INSTANCE_ID_WAIT && identity.instance_id.is_none();
                destination.region.clone().filter(|_| no_report)
            });
            let Some(instance_region) = instance_region else {
                // No region yet: the events wait for neuron-monitor's first report.
                self.pause(&stop, Duration::from_millis(500)).await;
                continue;
            };
            let region = destination.region.clone().unwrap_or_else(|| instance_region.clone());
            // The node's identity and data stay in its partition (the operator refuses
            // such a config; a destination may come from the agent's flags).
            if !same_partition(&instance_region, &region) {
                self.metrics.invalid.set(1);
                if announced.as_ref() != Some(&destination) {
                    warn!(group = %destination.group, %region, instance_region = %instance_region,
                          "hardware-health log stream left out: its region is in another AWS partition than the instance's");
                    announced = Some(destination);
                }
                self.queue.abandon("dropped");
                continue;
            }
            if announced.as_ref() != Some(&destination) {
                info!(group = %destination.group, %region, stream = %identity.stream(),
                      "sending hardware-health events to CloudWatch Logs");
                announced = Some(destination.clone());
            }
            if connection.as_ref().is_none_or(|c| c.region != region) {
                let client = Client::new(&sdk_config(&region, self.options.request_timeout).await);
                connection = Some(Connection { region: region.clone(), client, ready: None });
            }
            let Some(conn) = connection.as_mut() else { continue };
            let target = (destination.group.clone(), identity.stream());
            let result = match conn.ready.as_ref() == Some(&target) {
                true => self.put(conn, &target, &identity, &mut log_limit).await,
                false => match ensure(&conn.client, &target, &mut log_limit).await {
                    Outcome::Done => {
                        conn.ready = Some(target.clone());
                        self.put(conn, &target, &identity, &mut log_limit).await
                    }
                    other => other,
                },
            };
            self.settle(result, conn, &stop, &mut attempt).await;
        }
    }

    /// Counts a send's outcome and waits the backoff it calls for.
    async fn settle(&self, result: Outcome, conn: &mut Connection, stop: &CancellationToken, attempt: &mut u32) {
        match result {
            Outcome::Done => *attempt = 0,
            Outcome::NotFound => {
                self.metrics.failure("not_found");
                conn.ready = None;
                self.backoff(stop, attempt).await;
            }
            Outcome::Retry(reason) => {
                self.metrics.failure(reason);
                self.backoff(stop, attempt).await;
            }
            Outcome::GiveUp(reason) => {
                // The group or stream cannot be made (an invalid name for the service, a
                // refused request): what is queued cannot go.
                self.metrics.failure(reason);
                self.queue.abandon("failed");
                *attempt = 0;
            }
        }
    }

    /// Waits until there is something to send and its time came: the oldest event waited
    /// the flush interval, a request's worth is queued, or the agent is stopping. `false`:
    /// look again.
    async fn wait(&self) -> bool {
        let notified = self.queue.notify.notified();
        let Some(oldest) = oldest_ms(&self.queue) else {
            // Nothing to send, closing or not: wait for more (or for `stop`).
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            return false;
        };
        if self.closing.is_cancelled() || self.queue.len() >= MAX_EVENTS_PER_REQUEST {
            return true;
        }
        let waited = Duration::from_millis(unix_millis().saturating_sub(oldest).max(0) as u64);
        if waited >= self.options.flush_interval {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(self.options.flush_interval - waited) => {}
            _ = self.closing.cancelled() => {}
        }
        true
    }

    /// The instance id (once known, or given up waiting for) and the instance's region.
    fn identity(&self) -> (Identity, Option<String>) {
        let instance = self.state.lock().unwrap_or_else(|p| p.into_inner()).instance.clone();
        let known = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        let identity = Identity { instance_id: known(&instance.instance_id), node: self.node_name.clone() };
        (identity, known(&instance.region))
    }

    async fn pause(&self, stop: &CancellationToken, d: Duration) {
        tokio::select! {
            _ = stop.cancelled() => {}
            _ = tokio::time::sleep(d) => {}
        }
    }

    async fn backoff(&self, stop: &CancellationToken, attempt: &mut u32) {
        let delay = self.options.backoff.delay(*attempt);
        *attempt = attempt.saturating_add(1);
        self.pause(stop, delay).await;
    }

    /// One PutLogEvents of the queue's next events.
    async fn put(
        &self,
        conn: &Connection,
        (group, stream): &(String, String),
        identity: &Identity,
        log_limit: &mut RateLimit,
    ) -> Outcome {
        let Batch { records, events, oversized } = take(&self.queue, identity);
        self.metrics.events("failed", oversized);
        if events.is_empty() {
            self.queue.finish();
            return Outcome::Done;
        }
        let n = events.len();
        let result = conn
            .client
            .put_log_events()
            .log_group_name(group)
            .log_stream_name(stream)
            .set_log_events(Some(events))
            .send()
            .await;
        let outcome = match result {
            Ok(out) => {
                let rejected = out.rejected_log_events_info().map_or(0, |r| {
                    rejected_count(
                        n,
                        r.too_old_log_event_end_index(),
                        r.expired_log_event_end_index(),
                        r.too_new_log_event_start_index(),
                    )
                });
                if rejected > 0 {
                    self.metrics.failure("rejected");
                    warn!(events = rejected, "CloudWatch Logs refused hardware-health events (too old or too new)");
                }
                self.metrics.events("sent", n - rejected);
                self.metrics.events("failed", rejected);
                debug!(events = n, %group, %stream, "PutLogEvents accepted");
                self.queue.finish();
                return Outcome::Done;
            }
            Err(e) => outcome(&e, log_limit, "PutLogEvents"),
        };
        match outcome {
            // Refused for its content: these events cannot go, the others may.
            Outcome::GiveUp(reason) => {
                self.metrics.failure(reason);
                self.metrics.events("failed", n);
                self.queue.finish();
                Outcome::Done
            }
            // Not sent: the events go back to the front of the queue.
            other => {
                self.queue.put_back(records);
                other
            }
        }
    }
}

/// Creates the group and the stream when absent.
async fn ensure(client: &Client, (group, stream): &(String, String), log_limit: &mut RateLimit) -> Outcome {
    match client.create_log_group().log_group_name(group).send().await {
        Ok(_) => info!(%group, "created the log group"),
        Err(e) => match outcome(&e, log_limit, "CreateLogGroup") {
            Outcome::Done => {}
            // Not allowed to create groups: the group may exist, made by its owner.
            Outcome::Retry("auth") => {}
            other => return other,
        },
    }
    match client.create_log_stream().log_group_name(group).log_stream_name(stream).send().await {
        Ok(_) => {
            info!(%group, %stream, "created the log stream");
            Outcome::Done
        }
        Err(e) => outcome(&e, log_limit, "CreateLogStream"),
    }
}
