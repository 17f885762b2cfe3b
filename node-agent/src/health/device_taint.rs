//! The optional DeviceTaintRules of the unhealthy Neuron devices that Dynamic Resource
//! Allocation manages (`spec.health.deviceTaints`, off by default): while it is on, each
//! unhealthy device this node's ResourceSlices name (driver `neuron.aws.com`) has a rule
//! of its own ([`api::device_taints`]: named after the node and the device, labelled and
//! annotated with the node), with the effect the configuration gives; the rule goes when
//! the device is healthy again (a driver reload, a reboot) or the option is turned off.
//! The Node condition, its Events and the node taint are not affected.
//!
//! The API's version is found by discovery ([`service::device_taints`]); where none is
//! served the option does nothing, counted and said once (the operator refuses such a
//! config already). The rules of this node are listed once (label selector), then created
//! and deleted as the model changes; a rule that exists with another device or effect is
//! deleted and created again. RBAC: `list`, `create`, `delete` of `devicetaintrules`;
//! the chart's admission policy holds an agent to its own node's devices.

use std::{collections::BTreeMap, time::Duration};

use api::{
    crd::DeviceTaintEffect,
    device_taints::{node_label, rule_name, taint_value, Rule, NODE_ANNOTATION, NODE_LABEL},
    names::AGENT_MANAGER,
};
use kube::{
    api::{Api, DeleteParams, DynamicObject, ListParams, PostParams},
    Client,
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use service::device_taints::{served, Served};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{
    model::{HealthModel, State},
    settings::SettingsReceiver,
    SharedHealth,
};
use crate::{
    attribution::podresources::SharedDevices,
    ratelimit::{Decision, RateLimit},
};

/// How often the model is compared with the rules.
const TICK: Duration = Duration::from_millis(250);
/// After a failed call, the next attempt waits this long.
const RETRY_AFTER_ERROR: Duration = Duration::from_secs(5);
/// How often discovery is asked again while no version is served (a cluster upgrade, or
/// the alpha API turned on).
const REDISCOVER: Duration = Duration::from_secs(300);
/// Rules of this node read from a listing (a node has at most 64 devices).
const MAX_LISTED_RULES: usize = 256;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabel {
    /// create, delete
    pub action: &'static str,
    /// written, error
    pub result: &'static str,
}

/// `neuron_agent_health_device_taint_*`.
#[derive(Clone, Debug, Default)]
pub struct DeviceTaintMetrics {
    pub writes: Family<WriteLabel, Counter>,
    pub rules: Gauge,
    pub unnamed: Gauge,
    pub unsupported: Counter,
}

impl DeviceTaintMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = DeviceTaintMetrics::default();
        let r = registry.sub_registry_with_prefix("neuron_agent_health_device_taint");
        r.register(
            "writes",
            "Writes of the DeviceTaintRules of unhealthy DRA-managed devices, by action (create, delete) and result \
             (written, error)",
            m.writes.clone(),
        );
        r.register("rules", "DeviceTaintRules of this node's devices in place", m.rules.clone());
        r.register(
            "unnamed_devices",
            "Unhealthy devices that no ResourceSlice of this node names (not DRA-managed, or not listed yet): no rule",
            m.unnamed.clone(),
        );
        r.register(
            "unsupported",
            "Discoveries that found no DeviceTaintRule API served while the configuration asks for the rules, or the \
             effect None on an API server that refuses it",
            m.unsupported.clone(),
        );
        m
    }
}

/// The rules the model calls for under `effect`, and how many unhealthy devices have no
/// DRA name (`dra_name`: a device index's pool and name).
pub fn wanted(
    model: &HealthModel,
    node: &str,
    effect: DeviceTaintEffect,
    dra_name: impl Fn(u32) -> Option<(String, String)>,
) -> (BTreeMap<String, Rule>, usize) {
    let mut rules = BTreeMap::new();
    let mut unnamed = 0;
    for (index, device) in model.devices.iter().filter(|(_, d)| d.state() == State::Unhealthy) {
        let Some((pool, name)) = dra_name(*index) else {
            unnamed += 1;
            continue;
        };
        let value = device.worst().and_then(|r| taint_value(&r.error));
        let rule = Rule { name: rule_name(node, &name), pool, device: name, value, effect: effect.as_str() };
        rules.insert(rule.name.clone(), rule);
    }
    (rules, unnamed)
}

/// A rule of this node as listed: what decides whether it is the one wanted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Existing {
    pub pool: String,
    pub device: String,
    pub effect: String,
}

impl Existing {
    fn of(object: &DynamicObject) -> Existing {
        let text = |v: &serde_json::Value| v.as_str().filter(|s| s.len() <= 253).unwrap_or_default().to_owned();
        let spec = &object.data["spec"];
        Existing {
            pool: text(&spec["deviceSelector"]["pool"]),
            device: text(&spec["deviceSelector"]["device"]),
            effect: text(&spec["taint"]["effect"]),
        }
    }

    fn is(&self, rule: &Rule) -> bool {
        self.pool == rule.pool && self.device == rule.device && self.effect == rule.effect
    }
}

/// What to delete and what to create to go from `existing` to `wanted` (a rule of
/// another device or effect is both).
pub fn changes<'a>(
    existing: &BTreeMap<String, Existing>,
    wanted: &'a BTreeMap<String, Rule>,
) -> (Vec<String>, Vec<&'a Rule>) {
    let delete = existing
        .iter()
        .filter(|(name, e)| wanted.get(*name).is_none_or(|w| !e.is(w)))
        .map(|(name, _)| name.clone())
        .collect();
    let create = wanted.values().filter(|w| existing.get(&w.name).is_none_or(|e| !e.is(w))).collect();
    (delete, create)
}

/// What the agent knows of the API.
enum ApiState {
    Unknown,
    Missing { since: std::time::Instant },
    Served(Served),
}

/// Keeps the DeviceTaintRules of this node's devices as the model and the settings want them.
pub struct DeviceTainter {
    pub client: Client,
    pub node: String,
    pub health: SharedHealth,
    pub settings: SettingsReceiver,
    /// The DRA names of the Neuron devices; `None` without attribution (no rule can name a
    /// device).
    pub devices: Option<SharedDevices>,
    /// Starts the ResourceSlice watch.
    pub dra_wanted: Option<watch::Sender<bool>>,
    pub metrics: DeviceTaintMetrics,
}

/// The tainter's state between two steps.
struct Progress {
    api: ApiState,
    /// The rules of this node as far as the agent knows; `None`: to be listed.
    known: Option<BTreeMap<String, Existing>>,
    /// Said once: no API, the effect None refused, devices without a DRA name.
    said_missing: bool,
    said_inform: bool,
    said_unnamed: bool,
    errors_logged: RateLimit,
}

impl DeviceTainter {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut progress = Progress {
            api: ApiState::Unknown,
            known: None,
            said_missing: false,
            said_inform: false,
            said_unnamed: false,
            errors_logged: RateLimit::new(5, Duration::from_secs(300)),
        };
        loop {
            let effect = self.settings.borrow_and_update().device_taints;
            let mut pause = TICK;
            if let Err(e) = self.step(effect, &mut progress).await {
                if let Decision::Allow { suppressed_before } = progress.errors_logged.check() {
                    warn!(error = %e, node = %self.node, suppressed_before,
                          "cannot write the DeviceTaintRules of this node's unhealthy devices; retrying");
                }
                pause = RETRY_AFTER_ERROR;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.settings.changed() => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    /// One comparison of the model with the rules, and the writes it calls for.
    async fn step(&self, effect: Option<DeviceTaintEffect>, p: &mut Progress) -> kube::Result<()> {
        if effect.is_none() && p.known.as_ref().is_some_and(BTreeMap::is_empty) {
            return Ok(());
        }
        let Some(served) = self.discover(effect.is_some(), p).await? else { return Ok(()) };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &served.resource);
        let known = match p.known.take() {
            Some(known) => known,
            None => match self.list(&api).await {
                Ok(known) => known,
                Err(e) => {
                    forget_if_gone(&e, p);
                    return Err(e);
                }
            },
        };
        let want = match effect {
            Some(effect) => match self.wanted_rules(effect, &served, p) {
                Some(want) => want,
                None => {
                    // Before the first reading of the devices nothing is decided.
                    p.known = Some(known);
                    return Ok(());
                }
            },
            None => BTreeMap::new(),
        };
        let (delete, create) = changes(&known, &want);
        let mut now = known;
        let result = self.write(&api, &served, delete, create, &mut now).await;
        self.metrics.rules.set(now.len() as i64);
        // After a conflict (a rule created meanwhile) the rules are listed again.
        match result {
            Ok(list_again) => {
                p.known = (!list_again).then_some(now);
                Ok(())
            }
            Err(e) => {
                p.known = None;
                forget_if_gone(&e, p);
                Err(e)
            }
        }
    }

    /// The served version, discovered when not known (and again after [`REDISCOVER`]
    /// while none is served and the rules are wanted).
    async fn discover(&self, wanted: bool, p: &mut Progress) -> kube::Result<Option<Served>> {
        let ask = match &p.api {
            ApiState::Unknown => true,
            ApiState::Missing { since } => wanted && since.elapsed() >= REDISCOVER,
            ApiState::Served(_) => false,
        };
        if ask {
            p.api = match served(&self.client).await? {
                Some(s) => ApiState::Served(s),
                None => {
                    if wanted {
                        self.metrics.unsupported.inc();
                        if !std::mem::replace(&mut p.said_missing, true) {
                            warn!(
                                "the API server serves no DeviceTaintRule (resource.k8s.io): spec.health.deviceTaints \
                                   publishes nothing on this cluster"
                            );
                        }
                    }
                    ApiState::Missing { since: std::time::Instant::now() }
                }
            };
        }
        match &p.api {
            ApiState::Served(s) => Ok(Some(s.clone())),
            _ => Ok(None),
        }
    }

    /// This node's rules (by label, then by the annotation naming the node in full).
    async fn list(&self, api: &Api<DynamicObject>) -> kube::Result<BTreeMap<String, Existing>> {
        let params = ListParams::default().labels(&format!("{NODE_LABEL}={}", node_label(&self.node)));
        let listed = api.list(&params).await?;
        let ours = listed.items.iter().filter(|o| {
            o.metadata.annotations.as_ref().and_then(|a| a.get(NODE_ANNOTATION)).map(String::as_str)
                == Some(self.node.as_str())
        });
        let named = ours.filter_map(|o| Some((o.metadata.name.clone()?, Existing::of(o))));
        Ok(named.take(MAX_LISTED_RULES).collect())
    }

    /// The rules the model calls for; `None` before the devices were read once. Asks
    /// for the ResourceSlice watch (the devices' DRA names).
    fn wanted_rules(
        &self,
        effect: DeviceTaintEffect,
        served: &Served,
        p: &mut Progress,
    ) -> Option<BTreeMap<String, Rule>> {
        if let Some(tx) = &self.dra_wanted {
            tx.send_if_modified(|wanted| !std::mem::replace(wanted, true));
        }
        if effect == DeviceTaintEffect::Inform && !served.accepts_inform {
            self.metrics.unsupported.inc();
            if !std::mem::replace(&mut p.said_inform, true) {
                warn!("the API server refuses the taint effect None (Kubernetes before 1.35): no DeviceTaintRule");
            }
            return Some(BTreeMap::new());
        }
        let model = self.health.lock().unwrap_or_else(|e| e.into_inner());
        if !model.read_once {
            return None;
        }
        let dra_name = |index| self.devices.as_ref()?.read().unwrap_or_else(|e| e.into_inner()).dra_name(index);
        let (want, unnamed) = wanted(&model, &self.node, effect, dra_name);
        self.metrics.unnamed.set(unnamed as i64);
        if unnamed > 0 && !std::mem::replace(&mut p.said_unnamed, true) {
            info!(unnamed, "unhealthy Neuron devices that no ResourceSlice of this node names get no DeviceTaintRule");
        }
        Some(want)
    }

    /// Deletes then creates; `Ok(true)` when a rule to create existed already (the rules
    /// are then listed again).
    async fn write(
        &self,
        api: &Api<DynamicObject>,
        served: &Served,
        delete: Vec<String>,
        create: Vec<&Rule>,
        now: &mut BTreeMap<String, Existing>,
    ) -> kube::Result<bool> {
        let count = |action, result| {
            self.metrics.writes.get_or_create(&WriteLabel { action, result }).inc();
        };
        for name in delete {
            match api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => count("delete", "written"),
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => {
                    count("delete", "error");
                    return Err(e);
                }
            }
            now.remove(&name);
            info!(rule = %name, "deleted the DeviceTaintRule of a device that is healthy again (or no longer wanted)");
        }
        let params = PostParams { field_manager: Some(AGENT_MANAGER.to_owned()), ..Default::default() };
        for rule in create {
            let mut object = rule.object(&self.node);
            object["apiVersion"] = served.resource.api_version.clone().into();
            let object: DynamicObject = serde_json::from_value(object).map_err(kube::Error::SerdeError)?;
            match api.create(&params, &object).await {
                Ok(_) => count("create", "written"),
                Err(kube::Error::Api(e)) if e.code == 409 => return Ok(true),
                Err(e) => {
                    count("create", "error");
                    return Err(e);
                }
            }
            let existing =
                Existing { pool: rule.pool.clone(), device: rule.device.clone(), effect: rule.effect.to_owned() };
            now.insert(rule.name.clone(), existing);
            info!(rule = %rule.name, device = %rule.device, effect = rule.effect,
                  error = rule.value.as_deref().unwrap_or_default(), "created a DeviceTaintRule for an unhealthy device");
        }
        Ok(false)
    }
}

/// A 404 of the resource itself (the API was turned off): discovered again.
fn forget_if_gone(e: &kube::Error, p: &mut Progress) {
    if matches!(e, kube::Error::Api(a) if a.code == 404 && a.reason == "NotFound") {
        p.api = ApiState::Unknown;
        p.known = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::kmsg::kernel_event;

    fn names(i: u32) -> Option<(String, String)> {
        (i < 2).then(|| ("node-a".to_owned(), format!("neurondevice{i}")))
    }

    #[test]
    fn only_unhealthy_devices_with_a_dra_name_get_a_rule() {
        let mut model = HealthModel::with_ready_devices(3);
        assert_eq!(wanted(&model, "node-a", DeviceTaintEffect::NoSchedule, names).0.len(), 0, "all healthy");
        for (seq, text) in ["NEURON_HW_ERR=DMA_ERROR nd-id=1", "NEURON_HW_ERR=DMA_ERROR nd-id=2"].iter().enumerate() {
            model.apply_events(vec![(Some(seq as u64), kernel_event(text).unwrap())], None, 5);
        }
        let (rules, unnamed) = wanted(&model, "node-a", DeviceTaintEffect::NoExecute, names);
        assert_eq!(unnamed, 1, "device 2 is in no ResourceSlice");
        let rule = &rules["neuron-monitor-node-a-neurondevice1"];
        assert_eq!(
            (rule.pool.as_str(), rule.device.as_str(), rule.value.as_deref(), rule.effect),
            ("node-a", "neurondevice1", Some("DMA_ERROR"), "NoExecute")
        );
        assert_eq!(rules.len(), 1, "device 0 is healthy");
    }

    #[test]
    fn rules_of_another_device_or_effect_are_replaced_and_the_rest_kept() {
        let rule = |name: &str, device: &str, effect| Rule {
            name: name.to_owned(),
            pool: "p".to_owned(),
            device: device.to_owned(),
            value: None,
            effect,
        };
        let existing = |device: &str, effect: &str| Existing {
            pool: "p".to_owned(),
            device: device.to_owned(),
            effect: effect.to_owned(),
        };
        let want: BTreeMap<String, Rule> = [rule("a", "d0", "NoSchedule"), rule("b", "d1", "NoExecute")]
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
        let have: BTreeMap<String, Existing> = [
            ("a".to_owned(), existing("d0", "NoSchedule")),
            ("b".to_owned(), existing("d1", "NoSchedule")),
            ("c".to_owned(), existing("d2", "NoSchedule")),
        ]
        .into();
        let (delete, create) = changes(&have, &want);
        assert_eq!(delete, ["b", "c"], "b's effect changed, c's device is healthy");
        assert_eq!(create.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(), ["b"]);
        let nothing = BTreeMap::new();
        let (delete, create) = changes(&BTreeMap::new(), &nothing);
        assert!(delete.is_empty() && create.is_empty());
    }
}
