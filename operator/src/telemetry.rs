//! The operator's own metrics.

use http_server::ConnectionMetrics;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    pub kind: &'static str,
    pub action: &'static str,
}

#[derive(Clone)]
pub struct OperatorMetrics {
    pub reconciles: Counter,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub reconcile_seconds: Histogram,
    pub writes: Family<WriteLabel, Counter>,
    pub leader: Gauge,
    pub configs: Gauge,
    pub invalid_configs: Gauge,
    pub nodes: Gauge,
    /// The HTTP server's connections (`neuron_operator_http_*`).
    pub http: ConnectionMetrics,
}

impl OperatorMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = OperatorMetrics {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            reconcile_seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                0.001, 2.0, 14,
            )),
            writes: Family::default(),
            leader: Gauge::default(),
            configs: Gauge::default(),
            invalid_configs: Gauge::default(),
            nodes: Gauge::default(),
            http: ConnectionMetrics::register(registry, "neuron_operator_http"),
        };
        registry.register("neuron_operator_reconciles", "Full reconciles run", m.reconciles.clone());
        registry.register(
            "neuron_operator_reconcile_errors",
            "Reconciles that failed, by error",
            m.reconcile_errors.clone(),
        );
        registry.register(
            "neuron_operator_reconcile_seconds",
            "Time of one full reconcile (validate, render, write)",
            m.reconcile_seconds.clone(),
        );
        registry.register(
            "neuron_operator_writes",
            "Objects written, by kind (configmap, status, event) and action (apply, delete)",
            m.writes.clone(),
        );
        registry.register("neuron_operator_leader", "1 while this replica holds the lease", m.leader.clone());
        registry.register("neuron_operator_configs", "NeuronMonitorConfigs seen", m.configs.clone());
        registry.register(
            "neuron_operator_invalid_configs",
            "NeuronMonitorConfigs not accepted",
            m.invalid_configs.clone(),
        );
        registry.register("neuron_operator_neuron_nodes", "Neuron nodes seen", m.nodes.clone());
        m
    }

    pub fn wrote(&self, kind: &'static str, action: &'static str) {
        self.writes.get_or_create(&WriteLabel { kind, action }).inc();
    }
}
