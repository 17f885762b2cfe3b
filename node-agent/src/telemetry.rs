//! The agent's own metrics (`neuron_agent_*`): is neuron-monitor running, are its
//! reports arriving and readable, how long processing takes.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, info::Info},
    registry::Registry,
};
use std::sync::atomic::AtomicU64;

use service::http::ConnectionMetrics;
/// The label types every binary's metrics share, in one home (the `service` crate).
pub use service::labels::{ReasonLabel, ResultLabel};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GroupProblemLabels {
    pub group: &'static str,
    pub kind: &'static str,
}

/// What of a report the agent did not take as reported (see `state::Refusals`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WhatLabel {
    pub what: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StderrLabel {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigLabels {
    /// `builtin`, `file` or `configmap` (see `config::Origin`).
    pub source: &'static str,
    pub hash: String,
}

/// Handles to the agent's metrics; cloning shares them.
#[derive(Clone)]
pub struct AgentMetrics {
    pub monitor_restarts: Family<ReasonLabel, Counter>,
    pub monitor_restarts_paced: Counter,
    pub monitor_up: Gauge,
    pub monitor_orphans: Counter,
    pub monitor_kills: Counter,
    pub state_files_refused: Counter,
    pub config_watch_errors: Counter,
    pub config_ack_failures: Counter,
    pub monitor_backoff_seconds: Gauge<f64, AtomicU64>,
    pub reports: Counter,
    pub lines_rejected: Family<ReasonLabel, Counter>,
    pub last_report_timestamp: Gauge<f64, AtomicU64>,
    pub report_processing_seconds: Histogram,
    pub group_errors: Family<GroupProblemLabels, Counter>,
    pub report_values_refused: Family<WhatLabel, Counter>,
    pub monitor_stderr_lines: Family<StderrLabel, Counter>,
    pub config_reloads: Family<ResultLabel, Counter>,
    pub config: Family<ConfigLabels, Gauge>,
    pub routes_refused: Family<ReasonLabel, Counter>,
    /// The HTTP server's connections (`neuron_agent_http_*`).
    pub http: ConnectionMetrics,
}

impl AgentMetrics {
    /// Creates the metrics and registers them, with the build info, in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = AgentMetrics {
            monitor_restarts: Family::default(),
            monitor_restarts_paced: Counter::default(),
            monitor_up: Gauge::default(),
            monitor_orphans: Counter::default(),
            monitor_kills: Counter::default(),
            state_files_refused: Counter::default(),
            config_watch_errors: Counter::default(),
            config_ack_failures: Counter::default(),
            monitor_backoff_seconds: Gauge::default(),
            reports: Counter::default(),
            lines_rejected: Family::default(),
            last_report_timestamp: Gauge::default(),
            // 10 µs .. ~80 ms: a report takes well under a millisecond.
            report_processing_seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                10e-6, 2.0, 14,
            )),
            group_errors: Family::default(),
            report_values_refused: Family::default(),
            monitor_stderr_lines: Family::default(),
            config_reloads: Family::default(),
            config: Family::default(),
            routes_refused: Family::default(),
            http: ConnectionMetrics::register(registry, "neuron_agent_http"),
        };
        // Names below are under `neuron_agent_`.
        let r = registry.sub_registry_with_prefix("neuron_agent");
        metrics.register_supervision(r);
        metrics.register_reports(r);
        r.register("build", "Version of the agent", Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]));
        metrics
    }

    /// neuron-monitor's supervision and the node configuration it runs on: one
    /// registration per metric, read as a table.
    fn register_supervision(&self, r: &mut Registry) {
        let metrics = self;
        r.register(
            "monitor_restarts",
            "Restarts of neuron-monitor by reason (exited, silent, spawn_failed, config_changed)",
            metrics.monitor_restarts.clone(),
        );
        r.register(
            "monitor_restarts_paced",
            "Restarts of neuron-monitor for a new configuration that waited for the restart pace (configuration changes coming faster than 3 at once, then one per 10 s)",
            metrics.monitor_restarts_paced.clone(),
        );
        r.register("monitor_up", "1 while a neuron-monitor process runs", metrics.monitor_up.clone());
        r.register(
            "monitor_orphans",
            "Exits of neuron-monitor that left processes of its group running (they are stopped with it)",
            metrics.monitor_orphans.clone(),
        );
        r.register(
            "monitor_kills",
            "Stops of neuron-monitor's process group that needed SIGKILL after the SIGTERM grace",
            metrics.monitor_kills.clone(),
        );
        r.register(
            "state_files_refused",
            "Files in the state directory left alone: symbolic links, not regular files, or owned by another user",
            metrics.state_files_refused.clone(),
        );
        r.register(
            "config_watch_errors",
            "Failed requests of the node ConfigMap watch (retried with backoff; the configuration in force stays)",
            metrics.config_watch_errors.clone(),
        );
        r.register(
            "config_ack_failures",
            "Failed acknowledgements of the node configuration (each retried with backoff until it lands)",
            metrics.config_ack_failures.clone(),
        );
        r.register(
            "monitor_backoff_seconds",
            "Delay before the next neuron-monitor start; 0 while it runs healthy",
            metrics.monitor_backoff_seconds.clone(),
        );
    }

    /// The reports and what was refused of them, and the configuration in force.
    fn register_reports(&self, r: &mut Registry) {
        let metrics = self;
        r.register("reports", "Reports parsed and applied", metrics.reports.clone());
        r.register(
            "lines_rejected",
            "Output lines of neuron-monitor skipped, by reason (malformed, truncated, oversized, not_utf8)",
            metrics.lines_rejected.clone(),
        );
        r.register(
            "last_report_timestamp_seconds",
            "Unix time of the last report applied",
            metrics.last_report_timestamp.clone(),
        );
        r.register(
            "report_processing_seconds",
            "Time to parse one report and apply it to the node state",
            metrics.report_processing_seconds.clone(),
        );
        r.register(
            "group_errors",
            "Metric groups found in error (kind=monitor), unreadable (kind=malformed) or beyond any real node \
             (kind=out_of_bounds), per report",
            metrics.group_errors.clone(),
        );
        r.register(
            "report_values_refused",
            "Values of reports beyond the agent's limits, by what: runtime (entries after the first 1024, skipped), \
             neuroncore_index (>= 512) and neuron_device_index (>= 64) entries ignored, hardware_counts \
             (neuron_hardware_info refused), label_value (cut to 256 bytes or control characters replaced)",
            metrics.report_values_refused.clone(),
        );
        r.register(
            "monitor_stderr_lines",
            "Lines neuron-monitor wrote to stderr, logged or suppressed by the rate limit",
            metrics.monitor_stderr_lines.clone(),
        );
        r.register(
            "config_reloads",
            "Node configurations received, by result (applied, invalid)",
            metrics.config_reloads.clone(),
        );
        r.register(
            "config",
            "1 for the configuration in force: source (builtin, configmap) and content hash",
            metrics.config.clone(),
        );
        r.register(
            "routes_refused",
            "Routes of a node configuration left out when it was put in force, by reason: tag_filter_budget (the \
             node's distinct tag filters over 16 MiB compiled), tag_filter_cost (one filter over 256 KiB)",
            metrics.routes_refused.clone(),
        );
    }

    /// Records the configuration now in force.
    pub fn config_in_force(&self, source: &'static str, hash: &str) {
        self.config.clear();
        self.config.get_or_create(&ConfigLabels { source, hash: hash.to_owned() }).set(1);
    }

    pub fn reject(&self, reason: &'static str) {
        self.lines_rejected.get_or_create(&ReasonLabel { reason }).inc();
    }
}
