//! The series encoder every telemetry source shares: a [`Family`] of [`Labels`]ed
//! values, the [`FamilyEncoder`] it is written to (the `/metrics` exposition or an OTLP
//! request) and the [`Scope`] that says whose series an encoding takes. It sits below
//! the sources (node state, EFA, health) and the sinks, so both import it and neither
//! imports the other.

use std::{borrow::Cow, collections::BTreeMap, fmt};

use api::{
    monitor_config::{RuntimeGroup, SystemGroup},
    node_config::Route,
};
use prometheus_client::metrics::MetricType;

use crate::{
    routing::{PrometheusView, Routing, Selection},
    state::{InstanceLabels, PodRef, RuntimeLabels},
};

/// Whose series an encoding takes.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'r> {
    /// `/metrics`: what the Prometheus routes export (the built-in configuration: all).
    Exposition(&'r Routing),
    /// What one route's sink sends: the applications (and their groups) of its selection,
    /// the idle cores its namespace's pods hold, the route's extra labels; the node-level
    /// series only for a route of the operator's namespace (no `namespace`).
    Route(&'r Route, &'r Selection),
}

impl Scope<'_> {
    /// What is exported of a runtime of `namespace` with this tag; `None`: nothing.
    pub(crate) fn view(&self, namespace: Option<&str>, tag: &str) -> Option<PrometheusView> {
        match self {
            Scope::Exposition(routing) => routing.prometheus_view(namespace, tag),
            Scope::Route(route, selection) => Some(PrometheusView {
                groups: selection.groups(namespace, tag)?,
                extra_labels: route.prometheus.as_ref().map(|p| p.extra_labels.clone()).unwrap_or_default(),
                dropped_labels: 0,
                loaded_model_info: route.prometheus.as_ref().is_some_and(|p| p.loaded_model_info),
            }),
        }
    }

    /// Whether a system group's node-level series are taken.
    pub(crate) fn system(&self, group: SystemGroup) -> bool {
        match self {
            Scope::Exposition(routing) => routing.prometheus_system(group),
            Scope::Route(route, _) => route.namespace.is_none() && route.system_groups.contains(&group),
        }
    }

    /// Whether a core no application uses, held by a pod of `namespace` (or by none), is
    /// taken.
    pub(crate) fn idle_core(&self, namespace: Option<&str>) -> bool {
        match self {
            Scope::Exposition(_) => true,
            Scope::Route(_, selection) => selection.takes_untagged(namespace, RuntimeGroup::NeuroncoreCounters),
        }
    }

    /// Whether what a pod of `namespace` holds outside any application (an EFA device) is
    /// taken; `None`: held by no pod, taken by the operator namespace's routes only.
    pub fn sees(&self, namespace: Option<&str>) -> bool {
        match self {
            Scope::Exposition(routing) => routing.prometheus_sees(namespace),
            Scope::Route(_, selection) => selection.sees(namespace),
        }
    }

    /// Whether the node's own series (health, group errors, the agent's label drops) are
    /// taken.
    pub fn node_level(&self) -> bool {
        match self {
            Scope::Exposition(_) => true,
            Scope::Route(route, _) => route.namespace.is_none(),
        }
    }
}

/// Where families go: the exposition, or an OTLP request.
pub trait FamilyEncoder {
    /// Encodes one family; it has at least one series.
    fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error>;
}

/// A source of families on `/metrics` (the node state, EFA, health, GPUs). The exposition
/// writes their text itself; prometheus-client's registry holds the agent's own metrics.
pub trait Exported: Send + Sync {
    fn export(&self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error>;
}

/// One label value: text, or a number written without allocation.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    Text(&'a str),
    Number(u64),
}

impl fmt::Display for Value<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Text(t) => f.write_str(t),
            Value::Number(n) => write!(f, "{n}"),
        }
    }
}

/// Labels of the metric itself a series has at most (the device health state: index,
/// state, pods, claims).
const MAX_EXTRA_LABELS: usize = 4;

/// The labels of one series: instance labels, the runtime's labels if any, its pod's
/// labels if any, and up to [`MAX_EXTRA_LABELS`] labels of the metric itself.
pub struct Labels<'a> {
    instance: &'a InstanceLabels,
    runtime: Option<&'a RuntimeLabels>,
    /// The pod of a series without a runtime (an idle core held by a pod).
    pod: Option<&'a PodRef>,
    /// Labels a NeuronMonitorConfig adds to its runtimes' series.
    config: Option<&'a BTreeMap<String, String>>,
    extra: [Option<(&'static str, Value<'a>)>; MAX_EXTRA_LABELS],
    /// More labels of the metric itself (an info series' fields), after `extra`.
    fields: &'a [(&'static str, String)],
}

impl<'a> Labels<'a> {
    pub(crate) fn node(instance: &'a InstanceLabels) -> Self {
        Labels { instance, runtime: None, pod: None, config: None, extra: [None; MAX_EXTRA_LABELS], fields: &[] }
    }

    pub(crate) fn runtime(rt: &'a RuntimeLabels, view: &'a PrometheusView) -> Self {
        let config = (!view.extra_labels.is_empty()).then_some(&view.extra_labels);
        Labels {
            instance: &rt.instance,
            runtime: Some(rt),
            pod: rt.pod.as_deref(),
            config,
            extra: [None; MAX_EXTRA_LABELS],
            fields: &[],
        }
    }

    pub(crate) fn fields(self, fields: &'a [(&'static str, String)]) -> Self {
        Labels { fields, ..self }
    }

    /// A node-level series of something a pod may hold (an idle core, an EFA device).
    pub(crate) fn held_by(instance: &'a InstanceLabels, pod: Option<&'a PodRef>) -> Self {
        Labels { pod, ..Labels::node(instance) }
    }

    fn with(mut self, key: &'static str, value: Value<'a>) -> Self {
        let slot = self.extra.iter_mut().find(|s| s.is_none());
        debug_assert!(slot.is_some(), "more than {MAX_EXTRA_LABELS} labels of the metric itself: {key} left out");
        if let Some(slot) = slot {
            *slot = Some((key, value));
        }
        self
    }

    pub(crate) fn text(self, key: &'static str, value: &'a str) -> Self {
        self.with(key, Value::Text(value))
    }

    pub(crate) fn number(self, key: &'static str, value: u32) -> Self {
        self.with(key, Value::Number(value.into()))
    }

    pub(crate) fn id(self, key: &'static str, value: u64) -> Self {
        self.with(key, Value::Number(value))
    }

    /// The pod the series belongs to, if any.
    pub fn pod(&self) -> Option<&'a PodRef> {
        self.pod
    }

    /// The host's labels, every series' first six.
    pub fn instance(&self) -> &'a InstanceLabels {
        self.instance
    }

    /// Every label in order, as the exposition writes them; stops at the first error.
    pub fn try_for_each<E>(&self, mut f: impl FnMut(&str, Value<'_>) -> Result<(), E>) -> Result<(), E> {
        let i = self.instance;
        for (key, value) in [
            ("instance_name", &i.instance_name),
            ("instance_id", &i.instance_id),
            ("instance_type", &i.instance_type),
            ("availability_zone", &i.availability_zone),
            ("region", &i.region),
            ("subnet_id", &i.subnet_id),
        ] {
            f(key, Value::Text(value))?;
        }
        self.try_for_each_after_instance(f)
    }

    /// The labels after the instance's, in order.
    pub fn try_for_each_after_instance<E>(&self, mut f: impl FnMut(&str, Value<'_>) -> Result<(), E>) -> Result<(), E> {
        if let Some(rt) = self.runtime {
            f("runtime_tag", Value::Text(&rt.runtime_tag))?;
        }
        if let Some(pod) = self.pod {
            f("namespace", Value::Text(&pod.namespace))?;
            f("pod", Value::Text(&pod.pod))?;
            f("container", Value::Text(&pod.container))?;
            // A configuration's label of the same name wins: a name appears once per series.
            for (key, value) in &pod.labels {
                if !self.config.is_some_and(|c| c.contains_key(key)) {
                    f(key, Value::Text(value))?;
                }
            }
        }
        if let Some(ecs) = self.runtime.and_then(|rt| rt.ecs.as_deref()) {
            f("ecs_task_arn", Value::Text(&ecs.task_arn))?;
            f("ecs_task_family", Value::Text(&ecs.family))?;
            f("ecs_container", Value::Text(&ecs.container))?;
        }
        for (key, value) in self.config.into_iter().flatten() {
            f(key, Value::Text(value))?;
        }
        for (key, value) in self.extra.iter().flatten() {
            f(key, *value)?;
        }
        for (key, value) in self.fields {
            f(key, Value::Text(value))?;
        }
        Ok(())
    }
}

/// One metric family being assembled; it is encoded only if it has a series.
pub struct Family<'s> {
    /// Fixed, but for families named after what the node has (`efa_<counter>`).
    name: Cow<'static, str>,
    help: &'static str,
    kind: MetricType,
    series: Vec<(Labels<'s>, f64)>,
}

impl<'s> Family<'s> {
    pub(crate) fn new(name: impl Into<Cow<'static, str>>, help: &'static str, kind: MetricType) -> Self {
        Family { name: name.into(), help, kind, series: Vec::new() }
    }

    pub(crate) fn push(&mut self, labels: Labels<'s>, value: Option<f64>) {
        if let Some(v) = value.filter(|v| v.is_finite()) {
            self.series.push((labels, v));
        }
    }

    pub(crate) fn write(self, encoder: &mut dyn FamilyEncoder) -> Result<(), fmt::Error> {
        if self.series.is_empty() {
            return Ok(());
        }
        encoder.encode_family(&self)
    }

    pub fn kind(&self) -> MetricType {
        self.kind
    }

    pub fn help(&self) -> &'static str {
        self.help
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The name as `/metrics` serves it in the classic format: counters end in `_total`,
    /// info metrics in `_info` (see
    /// [`openmetrics_to_classic`](crate::sinks::prometheus::openmetrics_to_classic)).
    pub fn classic_name(&self) -> String {
        format!("{}{}", self.name, classic_suffix(self.kind))
    }

    /// Each series' labels and value (finite).
    pub fn series(&self) -> &[(Labels<'s>, f64)] {
        &self.series
    }
}

/// What the classic text format appends to an OpenMetrics family name.
pub(crate) fn classic_suffix(kind: MetricType) -> &'static str {
    match kind {
        MetricType::Counter => "_total",
        MetricType::Info => "_info",
        _ => "",
    }
}

/// prometheus-client's encoding of the families: what the exposition's own text encoder
/// (`sinks::prometheus::text`) is checked against.
#[cfg(test)]
mod reference {
    use prometheus_client::{
        encoding::{
            DescriptorEncoder, EncodeLabel, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelSetEncoder,
            LabelValueEncoder,
        },
        metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
    };

    use super::*;

    impl FamilyEncoder for DescriptorEncoder<'_> {
        fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error> {
            let mut metric = self.encode_descriptor(&family.name, family.help, None, family.kind)?;
            for (labels, value) in &family.series {
                match family.kind {
                    MetricType::Info => metric.encode_info(labels)?,
                    MetricType::Counter => ConstCounter::new(*value).encode(metric.encode_family(labels)?)?,
                    _ => ConstGauge::new(*value).encode(metric.encode_family(labels)?)?,
                }
            }
            Ok(())
        }
    }

    impl EncodeLabelValue for Value<'_> {
        fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), fmt::Error> {
            match self {
                Value::Text(t) => t.encode(encoder),
                Value::Number(n) => n.encode(encoder),
            }
        }
    }

    impl EncodeLabelSet for Labels<'_> {
        fn encode(&self, encoder: &mut LabelSetEncoder) -> Result<(), fmt::Error> {
            self.try_for_each(|key, value| (key, value).encode(encoder.encode_label()))
        }
    }
}
