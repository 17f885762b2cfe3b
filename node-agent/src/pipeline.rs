//! One line of neuron-monitor output in, the node state updated: parse, apply,
//! attribute to pods, count.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use api::report::Report;
use tokio::{runtime::RuntimeFlavor, sync::watch};
use tracing::warn;

use crate::{
    attribution::Attribution,
    ratelimit::{Decision, RateLimit},
    state::{NodeState, ProblemKind, Refusals},
    telemetry::{AgentMetrics, GroupProblemLabels, WhatLabel},
};

/// A line's buffers (the line reader's, the parse's) are kept between lines up to this
/// size; a larger one, after a rare huge report, is released.
pub const RETAINED_CAPACITY: usize = 2 * 1024 * 1024;

/// Why a line was skipped; the value of the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejection {
    /// Not a JSON report document.
    Malformed,
    /// A JSON document cut short.
    Truncated,
    /// Longer than `--max-line-bytes`.
    Oversized,
    NotUtf8,
}

impl Rejection {
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::Truncated => "truncated",
            Rejection::Oversized => "oversized",
            Rejection::NotUtf8 => "not_utf8",
        }
    }
}

pub struct Pipeline {
    state: Arc<Mutex<NodeState>>,
    metrics: AgentMetrics,
    ready: AtomicBool,
    log_limit: Mutex<RateLimit>,
    refusal_log_limit: Mutex<RateLimit>,
    attribution: Option<Attribution>,
    /// What serde reads of each line ([`Report::parse_reusing`]), kept for the next one.
    parse_buffer: Mutex<String>,
    /// Reports applied so far; sinks that sample the state (CloudWatch) watch it. A watch
    /// never blocks the sender and keeps only the latest value, so a slow sink skips
    /// reports rather than holding this path.
    applied: watch::Sender<u64>,
}

impl Pipeline {
    pub fn new(state: Arc<Mutex<NodeState>>, metrics: AgentMetrics) -> Self {
        Pipeline {
            state,
            metrics,
            ready: AtomicBool::new(false),
            log_limit: Mutex::new(RateLimit::new(10, std::time::Duration::from_secs(60))),
            refusal_log_limit: Mutex::new(RateLimit::new(10, std::time::Duration::from_secs(60))),
            attribution: None,
            parse_buffer: Mutex::new(String::new()),
            applied: watch::Sender::new(0),
        }
    }

    /// Changes after each report applied to the state (the value: reports so far).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied.subscribe()
    }

    /// Labels runtimes and cores with their pods after each report.
    pub fn with_attribution(mut self, attribution: Attribution) -> Self {
        self.attribution = Some(attribution);
        self
    }

    /// True once a first report was applied.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Parses and applies one line. Returns whether it was a report.
    ///
    /// On the agent's multi-threaded runtime the work runs in `block_in_place`: a large
    /// report is CPU work, and the async workers must stay free for `/healthz` and
    /// scrapes meanwhile.
    pub fn handle_line(&self, line: &[u8]) -> bool {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if runtime.runtime_flavor() == RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(|| self.process_line(line))
            }
            _ => self.process_line(line),
        }
    }

    fn process_line(&self, line: &[u8]) -> bool {
        let started = Instant::now();
        let line = line.trim_ascii();
        if line.is_empty() {
            return false;
        }
        let Ok(text) = std::str::from_utf8(line) else {
            self.reject(Rejection::NotUtf8, "line is not UTF-8");
            return false;
        };
        let mut buffer = self.parse_buffer.lock().unwrap_or_else(|p| p.into_inner());
        if buffer.capacity() > RETAINED_CAPACITY {
            *buffer = String::new();
        }
        let report = match Report::parse_reusing(text, &mut buffer) {
            Ok(report) => report,
            Err(e) => {
                let reason = if e.is_truncated() { Rejection::Truncated } else { Rejection::Malformed };
                self.reject(reason, &e.to_string());
                return false;
            }
        };
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            state.apply(&report);
            if let Some(attribution) = &self.attribution {
                attribution.attribute(&mut state);
            }
            for problem in &state.problems {
                let labels = GroupProblemLabels { group: problem.group, kind: problem.kind.as_str() };
                self.metrics.group_errors.get_or_create(&labels).inc();
            }
            if !state.refusals.is_empty() {
                self.count_refusals(&state);
            }
        }
        self.metrics.reports.inc();
        self.applied.send_modify(|n| *n += 1);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        self.metrics.last_report_timestamp.set(now.as_secs_f64());
        self.metrics.report_processing_seconds.observe(started.elapsed().as_secs_f64());
        self.ready.store(true, Ordering::Relaxed);
        true
    }

    /// Counts what a report had beyond the limits and logs it, rate-limited.
    fn count_refusals(&self, state: &NodeState) {
        let refusals = state.refusals;
        for (what, count) in Refusals::KINDS.iter().zip(refusals.counts()) {
            if count > 0 {
                self.metrics.report_values_refused.get_or_create(&WhatLabel { what }).inc_by(count);
            }
        }
        let decision = self.refusal_log_limit.lock().unwrap_or_else(|p| p.into_inner()).check();
        if let Decision::Allow { suppressed_before } = decision {
            let hardware = state.problems.iter().find(|p| p.kind == ProblemKind::OutOfBounds).map(|p| &p.message);
            warn!(
                runtimes_skipped = refusals.runtimes,
                core_indices = refusals.core_indices,
                core_entries = refusals.core_entries,
                device_indices = refusals.device_indices,
                label_values = refusals.label_values,
                value_names = refusals.value_names,
                loaded_models = refusals.loaded_models,
                k8s_containers = refusals.k8s_containers,
                hardware = hardware.map(String::as_str).unwrap_or(""),
                suppressed_before,
                "a neuron-monitor report exceeded the agent's limits; the excess was left out"
            );
        }
    }

    /// Counts a skipped line and logs it, rate-limited.
    pub fn reject(&self, reason: Rejection, detail: &str) {
        self.metrics.reject(reason.as_str());
        let decision = self.log_limit.lock().unwrap_or_else(|p| p.into_inner()).check();
        if let Decision::Allow { suppressed_before } = decision {
            warn!(reason = reason.as_str(), detail, suppressed_before, "skipped a line of neuron-monitor output");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pipeline() -> Pipeline {
        let metrics = AgentMetrics::register(&mut prometheus_client::registry::Registry::default());
        Pipeline::new(Arc::new(Mutex::new(NodeState::default())), metrics)
    }

    /// A report's loaded models, `n` models of one runtime.
    fn report(models: usize) -> String {
        let model = r#"{"name":"m.neff","model_id":1,"is_running":true,"subgraphs":{}}"#;
        format!(
            r#"{{"neuron_runtime_data":[{{"pid":1,"report":{{"memory_used":{{"error":"","loaded_models":[{}]}}}}}}],"x":"{}"}}"#,
            vec![model; models].join(","),
            "y".repeat(models * 64)
        )
    }

    #[test]
    fn the_parse_buffer_of_a_huge_report_is_released_at_the_next_one() {
        let pipeline = pipeline();
        assert!(pipeline.process_line(report(1).as_bytes()));
        let small = pipeline.parse_buffer.lock().unwrap().capacity();
        assert!(pipeline.process_line(report(RETAINED_CAPACITY / 64).as_bytes()));
        assert!(pipeline.parse_buffer.lock().unwrap().capacity() > RETAINED_CAPACITY);
        assert!(pipeline.process_line(report(1).as_bytes()));
        assert!(pipeline.parse_buffer.lock().unwrap().capacity() <= small.max(1024));
        assert_eq!(pipeline.state.lock().unwrap().runtimes.len(), 1);
    }
}
