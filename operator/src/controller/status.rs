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
        let accepted = accepted_verdict(&verdict, matched, carried);
        let ready = ready_verdict(accepted.status, matched, carried, applied);
        let mut conditions = vec![
            accepted.condition(&previous, "Accepted", generation),
            ready.condition(&previous, "Ready", generation),
        ];
        // Health settings: only one config's are in force on a node; the others are told.
        if let (true, Some(conflict)) = (accepted.status, health) {
            let health = health_verdict(conflict.as_ref(), matched, carried);
            conditions.push(health.condition(&previous, "HealthSettings", generation));
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
        self.announce(config, accepted.status, accepted.reason, &accepted.message).await;
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

/// What one condition says: its status, reason and message.
#[derive(Debug, PartialEq, Eq)]
struct Verdict {
    status: bool,
    reason: &'static str,
    message: String,
}

impl Verdict {
    fn new(status: bool, reason: &'static str, message: String) -> Self {
        Verdict { status, reason, message }
    }

    fn condition(&self, previous: &NeuronMonitorConfigStatus, type_: &str, generation: Option<i64>) -> Condition {
        condition(previous, type_, self.status, self.reason, &self.message, generation)
    }
}

/// Accepted: valid and matching some node. Only what reached the nodes' ConfigMaps is
/// claimed: `carried` of the `matched` nodes.
fn accepted_verdict(verdict: &Result<(), Invalid>, matched: usize, carried: usize) -> Verdict {
    match verdict {
        Err(invalid) => Verdict::new(false, invalid.kind.as_str(), invalid.to_string()),
        Ok(()) if matched == 0 => {
            Verdict::new(false, "NoMatchingNodes", "spec.nodeSelector: matches no Neuron node".to_owned())
        }
        Ok(()) if carried < matched => Verdict::new(
            true,
            "Valid",
            format!(
                "rendered, and written to the ConfigMaps of {carried} of {matched} node(s); \
                 the other writes failed and are retried"
            ),
        ),
        Ok(()) => Verdict::new(true, "Valid", format!("rendered for {matched} node(s)")),
    }
}

/// Ready: accepted, written to every matched node, and acknowledged by every agent.
fn ready_verdict(accepted: bool, matched: usize, carried: usize, applied: usize) -> Verdict {
    if !accepted {
        Verdict::new(false, "NotAccepted", "see the Accepted condition".to_owned())
    } else if carried < matched {
        Verdict::new(
            false,
            "WriteFailed",
            format!(
                "the ConfigMaps of {} of {matched} node(s) could not be written (retrying); \
                 {applied} node(s) run the current configuration",
                matched - carried
            ),
        )
    } else if applied == matched {
        Verdict::new(true, "Applied", format!("all {matched} node(s) run the current configuration"))
    } else {
        Verdict::new(false, "Applying", format!("{applied} of {matched} node(s) run the current configuration"))
    }
}

/// HealthSettings: whether this config's health settings are in force on its nodes, or
/// which config's are instead (`conflict`).
fn health_verdict(conflict: Option<&HealthConflict>, matched: usize, carried: usize) -> Verdict {
    match conflict {
        None => Verdict::new(true, "InForce", format!("its health settings are in force on its {carried} node(s)")),
        Some(c) => Verdict::new(
            false,
            "Overridden",
            format!(
                "on {} of its {matched} node(s) the health settings of {} are in force instead: a node takes \
                 those of the oldest config with a health section (then by name)",
                c.nodes, c.in_force
            ),
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepted_claims_only_what_reached_the_nodes() {
        let invalid =
            Invalid { field: "spec.period".to_owned(), reason: "too short".to_owned(), kind: Refusal::ALL[0] };
        let refused = accepted_verdict(&Err(invalid.clone()), 3, 3);
        assert_eq!((refused.status, refused.reason), (false, Refusal::ALL[0].as_str()));
        assert!(refused.message.contains("spec.period"), "{}", refused.message);
        assert_eq!(accepted_verdict(&Ok(()), 0, 0).reason, "NoMatchingNodes");
        let partly = accepted_verdict(&Ok(()), 4, 3);
        assert_eq!((partly.status, partly.reason), (true, "Valid"));
        assert!(partly.message.contains("3 of 4"), "{}", partly.message);
        assert_eq!(accepted_verdict(&Ok(()), 4, 4).message, "rendered for 4 node(s)");
    }

    #[test]
    fn ready_needs_every_matched_node_written_and_acknowledged() {
        assert_eq!(ready_verdict(false, 4, 4, 4).reason, "NotAccepted");
        let failed = ready_verdict(true, 4, 3, 2);
        assert_eq!((failed.status, failed.reason), (false, "WriteFailed"));
        assert!(failed.message.starts_with("the ConfigMaps of 1 of 4"), "{}", failed.message);
        assert_eq!(ready_verdict(true, 4, 4, 3).reason, "Applying");
        let ready = ready_verdict(true, 4, 4, 4);
        assert_eq!((ready.status, ready.reason), (true, "Applied"));
    }

    #[test]
    fn health_settings_name_the_config_in_force_instead() {
        assert_eq!(health_verdict(None, 2, 2).reason, "InForce");
        let conflict = HealthConflict { nodes: 1, in_force: "platform/health".to_owned() };
        let overridden = health_verdict(Some(&conflict), 2, 2);
        assert_eq!((overridden.status, overridden.reason), (false, "Overridden"));
        assert!(overridden.message.contains("on 1 of its 2 node(s)") && overridden.message.contains("platform/health"));
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let earlier = Time(Timestamp::from_second(1_700_000_000).unwrap_or(Timestamp::UNIX_EPOCH));
        let previous = NeuronMonitorConfigStatus {
            conditions: vec![Condition {
                type_: "Ready".to_owned(),
                status: "False".to_owned(),
                reason: "Applying".to_owned(),
                message: String::new(),
                observed_generation: Some(1),
                last_transition_time: earlier.clone(),
            }],
            ..NeuronMonitorConfigStatus::default()
        };
        let same = condition(&previous, "Ready", false, "WriteFailed", "", Some(2));
        assert_eq!((same.last_transition_time, same.observed_generation), (earlier.clone(), Some(2)));
        let changed = condition(&previous, "Ready", true, "Applied", "", Some(2));
        assert_ne!(changed.last_transition_time, earlier);
    }

    #[test]
    fn reason_labels_are_the_refusals_or_no_matching_nodes() {
        for refusal in Refusal::ALL {
            assert_eq!(reason_label(refusal.as_str()), refusal.as_str());
        }
        assert_eq!(reason_label("anything else"), "NoMatchingNodes");
    }
}
