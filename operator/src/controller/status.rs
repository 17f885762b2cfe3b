//! What the controller tells users about a config: its status (conditions, counts,
//! unhealthy nodes, cost estimate), written by server-side apply, and an Event when its Accepted state
//! changes.

use api::{
    cloudwatch::cost::{usd_text, Costs, Mode},
    crd::{EstimatedCost, ModeCost, NeuronMonitorConfig, NeuronMonitorConfigStatus},
};
use k8s_openapi::{
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    api::{Patch, PatchParams},
    runtime::events::{Event, EventType},
    Api, Resource, ResourceExt,
};
use serde_json::json;
use tracing::{info, warn};

use super::{Controller, Error, MANAGER};
use api::{
    render::HealthConflict,
    validate::{Invalid, Refusal},
};

use crate::{headers::HeadersOutcome, telemetry::ReasonLabel};

/// What a pass found for one config.
pub(super) struct Outcome {
    pub(super) verdict: Result<(), Invalid>,
    /// Nodes its selector matches.
    pub(super) matched: usize,
    /// Matched nodes whose ConfigMap carries it (rendered, and written or unchanged).
    pub(super) carried: usize,
    /// Of those, nodes whose agent acknowledged that content.
    pub(super) applied: usize,
    /// Of the carried nodes, those whose health condition is True.
    pub(super) unhealthy: usize,
    /// For a config with a `health` section: where another config's settings are in
    /// force instead (`Some(None)`: nowhere).
    pub(super) health: Option<Option<HealthConflict>>,
    /// What an accepted config with a CloudWatch or OTLP sink costs.
    pub(super) costs: Option<Costs>,
    /// For a config whose OTLP sink has a `headersSecret`: whether its headers reach the
    /// agents.
    pub(super) headers: Option<HeadersOutcome>,
}

impl Controller {
    pub(super) async fn update_status(&self, config: &NeuronMonitorConfig, outcome: Outcome) -> Result<(), Error> {
        let Outcome { verdict, matched, carried, applied, unhealthy, health, headers, costs } = outcome;
        let previous = config.status.clone().unwrap_or_default();
        let generation = config.metadata.generation;
        // Only what reached the nodes' ConfigMaps is claimed.
        let (accepted, accepted_reason, accepted_message) = match &verdict {
            Err(invalid) => (false, invalid.kind.as_str(), invalid.to_string()),
            Ok(()) if matched == 0 => {
                (false, "NoMatchingNodes", "spec.nodeSelector: matches no Neuron node".to_owned())
            }
            Ok(()) if carried < matched => (
                true,
                "Valid",
                format!(
                    "rendered, and written to the ConfigMaps of {carried} of {matched} node(s); \
                     the other writes failed and are retried"
                ),
            ),
            Ok(()) => (true, "Valid", format!("rendered for {matched} node(s)")),
        };
        let (ready, ready_reason, ready_message) = if !accepted {
            (false, "NotAccepted", "see the Accepted condition".to_owned())
        } else if carried < matched {
            (
                false,
                "WriteFailed",
                format!(
                    "the ConfigMaps of {} of {matched} node(s) could not be written (retrying); \
                     {applied} node(s) run the current configuration",
                    matched - carried
                ),
            )
        } else if applied == matched {
            (true, "Applied", format!("all {matched} node(s) run the current configuration"))
        } else {
            (false, "Applying", format!("{applied} of {matched} node(s) run the current configuration"))
        };
        let mut conditions = vec![
            condition(&previous, "Accepted", accepted, accepted_reason, &accepted_message, generation),
            condition(&previous, "Ready", ready, ready_reason, &ready_message, generation),
        ];
        // Health settings: only one config's are in force on a node; the others are told.
        if let (true, Some(conflict)) = (accepted, health) {
            let (in_force, reason, message) = match conflict {
                None => (true, "InForce", format!("its health settings are in force on its {carried} node(s)")),
                Some(c) => (
                    false,
                    "Overridden",
                    format!(
                        "on {} of its {matched} node(s) the health settings of {} are in force instead: a node takes \
                         those of the oldest config with a health section (then by name)",
                        c.nodes, c.in_force
                    ),
                ),
            };
            conditions.push(condition(&previous, "HealthSettings", in_force, reason, &message, generation));
        }
        if let Some(h) = headers {
            conditions.push(condition(&previous, "OtlpHeaders", h.mirrored, h.reason, &h.message, generation));
        }
        let status = NeuronMonitorConfigStatus {
            observed_generation: generation,
            conditions,
            matched_nodes: i32::try_from(carried).unwrap_or(i32::MAX),
            applied_nodes: i32::try_from(applied).unwrap_or(i32::MAX),
            unhealthy_nodes: i32::try_from(unhealthy).unwrap_or(i32::MAX),
            estimated_cloud_watch_metrics: costs
                .as_ref()
                .and_then(|c| c.cloudwatch.as_ref())
                .map(|e| saturating(e.metrics)),
            estimated_monthly_cost_usd: costs.as_ref().map(|c| usd_text(c.own_usd())),
            estimated_cost: costs.as_ref().map(estimated_cost),
        };
        self.announce(config, accepted, accepted_reason, &accepted_message).await;
        if status == previous {
            return Ok(());
        }
        let api: Api<NeuronMonitorConfig> =
            Api::namespaced(self.client.clone(), &config.namespace().unwrap_or_default());
        let patch = json!({
            "apiVersion": NeuronMonitorConfig::api_version(&()),
            "kind": NeuronMonitorConfig::kind(&()),
            "status": status,
        });
        api.patch_status(&config.name_any(), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch)).await?;
        self.metrics.wrote("status", "apply");
        Ok(())
    }

    /// An Event when a config's Accepted state or reason is first seen or changes; a
    /// refusal is also counted, by reason.
    async fn announce(&self, config: &NeuronMonitorConfig, accepted: bool, reason: &str, message: &str) {
        let uid = config.uid().unwrap_or_default();
        {
            let mut announced = self.announced.lock().unwrap_or_else(|p| p.into_inner());
            let state = (accepted, reason.to_owned());
            if announced.get(&uid) == Some(&state) {
                return;
            }
            announced.insert(uid, state);
        }
        if !accepted {
            self.metrics.refusals.get_or_create(&ReasonLabel { reason: reason_label(reason) }).inc();
            info!(config = %config.name_any(), namespace = ?config.namespace(), reason, message, "config not accepted");
        }
        let event = Event {
            type_: if accepted { EventType::Normal } else { EventType::Warning },
            reason: if accepted { "Accepted".to_owned() } else { reason.to_owned() },
            note: Some(message.chars().take(1000).collect()),
            action: "Render".to_owned(),
            secondary: None,
        };
        match self.recorder.publish(&event, &config.object_ref(&())).await {
            Ok(()) => self.metrics.wrote("event", "create"),
            Err(e) => warn!(error = %e, config = %config.name_any(), "could not publish an event"),
        }
    }
}

/// The status form of every mode's cost.
fn estimated_cost(costs: &Costs) -> EstimatedCost {
    let mode = |m: Mode| {
        costs.modes.iter().find(|c| c.mode == m).map_or_else(ModeCost::default, |c| ModeCost {
            series: saturating(c.series),
            requests_per_month: (m != Mode::Otlp).then(|| saturating(c.requests)),
            bytes_per_month: (m == Mode::Otlp).then(|| saturating(c.bytes)),
            monthly_usd: usd_text(c.monthly_usd),
        })
    };
    EstimatedCost {
        cheapest_mode: costs.cheapest.as_str().to_owned(),
        classic: mode(Mode::Classic),
        container_insights: mode(Mode::ContainerInsights),
        otlp: mode(Mode::Otlp),
    }
}

fn saturating(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The static label of an Accepted=False reason.
fn reason_label(reason: &str) -> &'static str {
    Refusal::ALL.iter().map(|r| r.as_str()).find(|r| *r == reason).unwrap_or("NoMatchingNodes")
}

/// A condition, keeping its transition time when its status did not change.
fn condition(
    previous: &NeuronMonitorConfigStatus,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    let status = if status { "True" } else { "False" }.to_owned();
    let last_transition_time = previous
        .conditions
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(Timestamp::now()));
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message: message.to_owned(),
        observed_generation: generation,
        last_transition_time,
    }
}
