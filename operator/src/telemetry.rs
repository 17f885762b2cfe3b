//! The operator's own metrics.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};
use service::http::ConnectionMetrics;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabel {
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    pub kind: &'static str,
    pub action: &'static str,
}

/// Why a config is not accepted (the `Accepted` condition's reason): the label type
/// every binary's metrics share, in one home (the `service` crate).
pub use service::labels::ReasonLabel;

#[derive(Clone)]
pub struct OperatorMetrics {
    pub reconciles: Counter,
    pub reconcile_errors: Family<ErrorLabel, Counter>,
    pub reconcile_seconds: Histogram,
    pub writes: Family<WriteLabel, Counter>,
    pub write_failures: Family<WriteLabel, Counter>,
    pub refused_configs: Family<ReasonLabel, Gauge>,
    pub refusals: Family<ReasonLabel, Counter>,
    pub leader: Gauge,
    pub configs: Gauge,
    pub invalid_configs: Gauge,
    pub nodes: Gauge,
    /// Namespaces whose config changes wait for their pace's next slot.
    pub namespaces_held: Gauge,
    /// 1 while the tenancy policy in force is the one its ConfigMap holds.
    pub tenancy_policy_valid: Gauge,
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
            write_failures: Family::default(),
            refused_configs: Family::default(),
            refusals: Family::default(),
            leader: Gauge::default(),
            configs: Gauge::default(),
            invalid_configs: Gauge::default(),
            nodes: Gauge::default(),
            namespaces_held: Gauge::default(),
            tenancy_policy_valid: Gauge::default(),
            http: ConnectionMetrics::register(registry, "neuron_operator_http"),
        };
        let registry = registry.sub_registry_with_prefix("neuron_operator");
        registry.register("reconciles", "Full reconciles run", m.reconciles.clone());
        registry.register("reconcile_errors", "Reconciles that failed, by error", m.reconcile_errors.clone());
        registry.register(
            "reconcile_seconds",
            "Time of one full reconcile (validate, render, write)",
            m.reconcile_seconds.clone(),
        );
        registry.register(
            "writes",
            "Objects written, by kind (configmap, status, event, config) and action (apply, delete, create, annotate)",
            m.writes.clone(),
        );
        registry.register(
            "write_failures",
            "Writes that failed (the pass goes on, and is retried), by kind and action",
            m.write_failures.clone(),
        );
        registry.register(
            "refused_configs",
            "NeuronMonitorConfigs not accepted in the last pass, by reason (InvalidSpec, TooLarge, \
             NamespaceLimit, NodeLimit, TooManyLabels, TooManySeries, OutsidePolicy, CostCeiling, Unsupported)",
            m.refused_configs.clone(),
        );
        registry.register(
            "config_refusals",
            "Times a config became not accepted (or changed reason), by reason, as announced by an Event",
            m.refusals.clone(),
        );
        registry.register("leader", "1 while this replica holds the lease", m.leader.clone());
        registry.register("configs", "NeuronMonitorConfigs seen", m.configs.clone());
        registry.register("invalid_configs", "NeuronMonitorConfigs not accepted", m.invalid_configs.clone());
        registry.register(
            "neuron_nodes",
            "Nodes the configs apply to: Neuron nodes, and NVIDIA GPU nodes with --gpu-nodes",
            m.nodes.clone(),
        );
        registry.register(
            "namespaces_held",
            "Namespaces whose config changes come faster than the pace (5 at once, then one per 10 s) and wait \
             for its next slot; their nodes keep the versions adopted before",
            m.namespaces_held.clone(),
        );
        registry.register(
            "tenancy_policy_valid",
            "1 while the tenancy policy in force is what its ConfigMap holds (or the built-in one, when none is \
             named); 0 while that ConfigMap is missing or not valid and the last valid policy stays in force",
            m.tenancy_policy_valid.clone(),
        );
        m
    }

    pub fn wrote(&self, kind: &'static str, action: &'static str) {
        self.writes.get_or_create(&WriteLabel { kind, action }).inc();
    }

    pub fn write_failed(&self, kind: &'static str, action: &'static str) {
        self.write_failures.get_or_create(&WriteLabel { kind, action }).inc();
    }
}
