//! The optional DeviceTaintRules of the unhealthy Neuron devices and NVIDIA GPUs that
//! Dynamic Resource Allocation manages (`spec.health.deviceTaints`, off by default): while
//! it is on, each unhealthy device this node's ResourceSlices name (driver
//! `neuron.aws.com`; for a GPU, `gpu.nvidia.com`: the GPU and each of its MIG devices) has
//! a rule of its own ([`api::device_taints`]: named after the node and the device, labelled and
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
    hardware::{NEURON_DRA_DRIVER, NVIDIA_DRA_DRIVER},
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
    attribution::{gpus::GpuHolding, podresources::SharedDevices},
    gpu::GpuIdentity,
    ratelimit::{Decision, RateLimit},
};

/// How often the rules are compared when the model did not change: the devices' DRA
/// names and holders (the attribution, the ResourceSlices) change without telling.
const TICK: Duration = Duration::from_secs(1);
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

/// How the unhealthy devices are named in this node's ResourceSlices.
pub struct DraNames<N, G> {
    /// A Neuron device index's (pool, name).
    pub neuron: N,
    /// Each (pool, name) of NVIDIA's driver that stands for a GPU.
    pub gpu: G,
}

/// The rules the model calls for under `effect`, and how many unhealthy devices (Neuron
/// devices and GPUs) have no DRA name.
pub fn wanted<N, G>(
    model: &HealthModel,
    node: &str,
    effect: DeviceTaintEffect,
    names: DraNames<N, G>,
) -> (BTreeMap<String, Rule>, usize)
where
    N: Fn(u32) -> Option<(String, String)>,
    G: Fn(&GpuIdentity) -> Vec<(String, String)>,
{
    let mut rules = BTreeMap::new();
    let mut unnamed = 0;
    let mut add = |driver, (pool, name): (String, String), value: Option<String>| {
        let rule = Rule { name: rule_name(node, &name), driver, pool, device: name, value, effect: effect.as_str() };
        rules.insert(rule.name.clone(), rule);
    };
    for (index, device) in model.devices.iter().filter(|(_, d)| d.state() == State::Unhealthy) {
        match (names.neuron)(*index) {
            Some(name) => add(NEURON_DRA_DRIVER, name, device.worst().and_then(|r| taint_value(&r.error))),
            None => unnamed += 1,
        }
    }
    // A GPU's fault outlives a stale collection: only its reasons make it unhealthy.
    for gpu in model.gpus.gpus.values().filter(|g| g.state(false) == State::Unhealthy) {
        let gpu_names = (names.gpu)(&gpu.identity);
        unnamed += usize::from(gpu_names.is_empty());
        for name in gpu_names {
            add(NVIDIA_DRA_DRIVER, name, gpu.worst().and_then(|r| taint_value(&r.error)));
        }
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
    /// The DRA names of the GPUs; `None` without attribution.
    pub gpus: Option<GpuHolding>,
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

impl Progress {
    /// Whether the tainter compares again by itself, not only at a change of the settings:
    /// while rules are wanted (their devices' DRA names and holders change without
    /// telling), or while rules of this node may be left to remove.
    fn comes_back(&self, effect: Option<DeviceTaintEffect>) -> bool {
        let none_left =
            self.known.as_ref().is_some_and(BTreeMap::is_empty) || matches!(self.api, ApiState::Missing { .. });
        effect.is_some() || !none_left
    }
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
        let mut model_changed = self.health.lock().unwrap_or_else(|p| p.into_inner()).subscribe();
        loop {
            let effect = self.settings.borrow_and_update().device_taints;
            let failed = match self.step(effect, &mut progress).await {
                Ok(()) => false,
                Err(e) => {
                    if let Decision::Allow { suppressed_before } = progress.errors_logged.check() {
                        warn!(error = %e, node = %self.node, suppressed_before,
                              "cannot write the DeviceTaintRules of this node's unhealthy devices; retrying");
                    }
                    true
                }
            };
            let pause = if failed { Some(RETRY_AFTER_ERROR) } else { progress.comes_back(effect).then_some(TICK) };
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.settings.changed() => {}
                Ok(()) = model_changed.changed(), if !failed && effect.is_some() => {}
                _ = tokio::time::sleep(pause.unwrap_or(TICK)), if pause.is_some() => {}
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
        let names = DraNames {
            neuron: |index| self.devices.as_ref()?.read().unwrap_or_else(|e| e.into_inner()).dra_name(index),
            gpu: |gpu: &GpuIdentity| self.gpus.as_ref().map(|g| g.dra_names(gpu)).unwrap_or_default(),
        };
        let (want, unnamed) = wanted(&model, &self.node, effect, names);
        self.metrics.unnamed.set(unnamed as i64);
        if unnamed > 0 && !std::mem::replace(&mut p.said_unnamed, true) {
            info!(unnamed, "unhealthy devices that no ResourceSlice of this node names get no DeviceTaintRule");
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
            info!(rule = %rule.name, driver = rule.driver, device = %rule.device, effect = rule.effect,
                  error = rule.value.as_deref().unwrap_or_default(), api_version = %served.resource.api_version,
                  "created a DeviceTaintRule for an unhealthy device");
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

    /// GPU 0 is a whole device, GPU 1 in MIG mode two, GPU 2 in no slice.
    fn gpu_names(gpu: &GpuIdentity) -> Vec<(String, String)> {
        let name = |n: &str| ("node-a".to_owned(), n.to_owned());
        match gpu.index {
            0 => vec![name("gpu-0")],
            1 => vec![name("gpu-1-mig-0"), name("gpu-1-mig-1")],
            _ => Vec::new(),
        }
    }

    fn no_gpus(_: &GpuIdentity) -> Vec<(String, String)> {
        Vec::new()
    }

    #[test]
    fn only_unhealthy_devices_with_a_dra_name_get_a_rule() {
        let mut model = HealthModel::with_ready_devices(3);
        let both = || DraNames { neuron: names, gpu: no_gpus };
        assert_eq!(wanted(&model, "node-a", DeviceTaintEffect::NoSchedule, both()).0.len(), 0, "all healthy");
        for (seq, text) in ["NEURON_HW_ERR=DMA_ERROR nd-id=1", "NEURON_HW_ERR=DMA_ERROR nd-id=2"].iter().enumerate() {
            model.apply_events(vec![(Some(seq as u64), kernel_event(text).unwrap())], None, 5);
        }
        let (rules, unnamed) = wanted(&model, "node-a", DeviceTaintEffect::NoExecute, both());
        assert_eq!(unnamed, 1, "device 2 is in no ResourceSlice");
        let rule = &rules["neuron-monitor-node-a-neurondevice1"];
        assert_eq!(
            (rule.driver, rule.pool.as_str(), rule.device.as_str(), rule.value.as_deref(), rule.effect),
            ("neuron.aws.com", "node-a", "neurondevice1", Some("DMA_ERROR"), "NoExecute")
        );
        assert_eq!(rules.len(), 1, "device 0 is healthy");
    }

    #[test]
    fn an_unhealthy_gpu_gets_a_rule_per_device_of_nvidias_driver_that_stands_for_it() {
        let mut model = HealthModel::with_ready_devices(0);
        let gpu = |index: u32| crate::gpu::Gpu {
            identity: GpuIdentity { index, uuid: format!("GPU-{index}"), ..GpuIdentity::default() },
            ..Default::default()
        };
        let snapshot =
            crate::gpu::GpuSnapshot { gpus: (0..3).map(gpu).collect(), collections: 1, ..Default::default() };
        model.apply_gpu_snapshot(&snapshot, 1);
        for index in [1, 2] {
            model.apply_nvml_xid(index, 79, 2);
        }
        let names = DraNames { neuron: |_| None, gpu: gpu_names };
        let (rules, unnamed) = wanted(&model, "node-a", DeviceTaintEffect::NoSchedule, names);
        assert_eq!(unnamed, 1, "GPU 2 is in no ResourceSlice");
        let summary: Vec<(&str, &str, Option<&str>)> =
            rules.values().map(|r| (r.driver, r.device.as_str(), r.value.as_deref())).collect();
        assert_eq!(
            summary,
            [("gpu.nvidia.com", "gpu-1-mig-0", Some("XID_79")), ("gpu.nvidia.com", "gpu-1-mig-1", Some("XID_79"))],
            "GPU 0 is healthy; GPU 1's two MIG devices"
        );
    }

    #[test]
    fn rules_of_another_device_or_effect_are_replaced_and_the_rest_kept() {
        let rule = |name: &str, device: &str, effect| Rule {
            name: name.to_owned(),
            driver: NEURON_DRA_DRIVER,
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
