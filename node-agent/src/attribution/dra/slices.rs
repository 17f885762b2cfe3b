//! This node's ResourceSlices (`resource.k8s.io/v1`), watched with the field selector
//! `spec.nodeName=<node>` once the kubelet lists a DRA claim of a Neuron or EFA device or
//! a GPU: each read driver's devices by pool and name, with what they stand for (a Neuron
//! device's index for [`super::resolve`], an EFA device's name for [`super::efa::resolve`],
//! a GPU for [`crate::attribution::gpus`]).
//!
//! The slices kept ([`Kept`]) are chosen by driver, pool and generation: of each pool
//! (a driver's pool name) only its newest generation (older ones are stale, as the API
//! says), at most [`MAX_SLICES_PER_POOL`] slices a pool and [`MAX_SLICES_PER_DRIVER`] a
//! driver. A slice past a bound is left out, unless the kubelet's claims need it more than
//! one kept: a slice publishing a claimed device pushes out one that publishes none, a
//! slice of a claimed pool one of a pool no claim names. Extra slices (decoys, a driver's
//! leftovers) can thus never push out the pool a claim names; when a claim comes to name a
//! device no kept slice publishes after slices were left out, the slices are listed again.
//!
//! The slice is read as its own small type (only the fields used here): the
//! `k8s-openapi` feature the workspace builds has no `resource.k8s.io/v1`, and the
//! oldest feature is kept.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::{Duration, Instant},
};

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{runtime::watcher::Event, Api, Client, ResourceExt};
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::{
    efa::{Efa, NetDevice},
    nvidia::{GpuDevice, Nvidia},
    report_unresolved, DeviceTable, Driver, Neuron, Slice, MAX_NAME_BYTES,
};
use crate::{
    attribution::{
        bad_items::BadItemLog,
        gpus::GpuHolding,
        podresources::{answer::Kind, proto::ListPodResourcesResponse, SharedDevices},
        AttributionMetrics, DriverLabel,
    },
    kubernetes::Watch,
};

/// Devices read from one slice (the API allows 128 per slice; a node has at most
/// [`api::limits::MAX_NEURON_DEVICES`] Neuron devices, [`crate::gpu::MAX_GPUS`] GPUs, 32
/// EFA devices beside its other network devices).
const MAX_SLICE_DEVICES: usize = 128;
/// Slices kept of one pool, in its newest generation: a driver splits a pool only past 128
/// devices a slice (NVIDIA's, with MIG and partitionable devices, into a few).
const MAX_SLICES_PER_POOL: usize = 8;
/// Slices kept of one driver, every pool of the node together: a driver publishes one pool
/// a node, or a few. With the three drivers read, at most 96 slices (before: 64 of all
/// drivers, which 64 decoys of one filled).
const MAX_SLICES_PER_DRIVER: usize = 32;
/// Attributes read of one device (the API allows 32).
const MAX_DEVICE_ATTRIBUTES: usize = 32;
/// The slices are listed again at most this often for claims that name devices of slices
/// left out (a kubelet whose claims change at every poll costs the API server one listing
/// of this node's slices in this time).
const MIN_RELIST_INTERVAL: Duration = Duration::from_secs(30);

/// A `resource.k8s.io/v1` ResourceSlice, as far as it is read.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ResourceSlice {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: SliceSpec,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SliceSpec {
    #[serde(default)]
    pub driver: String,
    #[serde(default)]
    pub pool: SlicePool,
    #[serde(default)]
    pub devices: Vec<SliceDevice>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SlicePool {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub generation: i64,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct SliceDevice {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub attributes: BTreeMap<String, DeviceAttribute>,
}

/// One attribute's value: one of the four is set (booleans and versions are not read).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct DeviceAttribute {
    #[serde(default)]
    pub int: Option<i64>,
    #[serde(default)]
    pub string: Option<String>,
}

impl kube::Resource for ResourceSlice {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ResourceSlice".into()
    }

    fn group(_: &()) -> Cow<'_, str> {
        "resource.k8s.io".into()
    }

    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }

    fn plural(_: &()) -> Cow<'_, str> {
        "resourceslices".into()
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What a slice of a read driver publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Summary {
    Neuron(Slice<u32>),
    Efa(Slice<NetDevice>),
    Nvidia(Slice<GpuDevice>),
}

impl Summary {
    fn driver(&self) -> &'static str {
        match self {
            Summary::Neuron(_) => Neuron::NAME,
            Summary::Efa(_) => Efa::NAME,
            Summary::Nvidia(_) => Nvidia::NAME,
        }
    }

    /// The pool's name and generation.
    fn pool(&self) -> (&str, i64) {
        match self {
            Summary::Neuron(s) => (&s.pool, s.generation),
            Summary::Efa(s) => (&s.pool, s.generation),
            Summary::Nvidia(s) => (&s.pool, s.generation),
        }
    }

    fn device_names(&self) -> Box<dyn Iterator<Item = &str> + '_> {
        match self {
            Summary::Neuron(s) => Box::new(s.devices.iter().map(|(name, _)| name.as_str())),
            Summary::Efa(s) => Box::new(s.devices.iter().map(|(name, _)| name.as_str())),
            Summary::Nvidia(s) => Box::new(s.devices.iter().map(|(name, _)| name.as_str())),
        }
    }
}

/// The devices the kubelet's claims name, of the read drivers: driver → pool → device names.
pub type ClaimedNames = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// The devices the claims of a pod-resources answer name (of the read drivers).
pub fn claimed_names(response: &ListPodResourcesResponse) -> ClaimedNames {
    let mut names = ClaimedNames::new();
    let containers = response.pod_resources.iter().flat_map(|p| &p.containers);
    let devices = containers.flat_map(|c| &c.dynamic_resources).flat_map(|claim| &claim.claim_resources);
    for d in devices.filter(|d| Kind::of_driver(&d.driver_name).is_some()) {
        let pools = names.entry(d.driver_name.clone()).or_default();
        pools.entry(d.pool_name.clone()).or_default().insert(d.device_name.clone());
    }
    names
}

/// How much the claims need a slice: it publishes a claimed device, is of a claimed pool,
/// or neither.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Need {
    None,
    Pool,
    Device,
}

fn need(summary: &Summary, claimed: &ClaimedNames) -> Need {
    let (pool, _) = summary.pool();
    match claimed.get(summary.driver()).and_then(|pools| pools.get(pool)) {
        None => Need::None,
        Some(devices) if summary.device_names().any(|d| devices.contains(d)) => Need::Device,
        Some(_) => Need::Pool,
    }
}

/// One pool's slices of its newest generation seen, by slice name.
#[derive(Debug)]
struct Pool {
    generation: i64,
    slices: BTreeMap<String, Summary>,
}

/// (driver, pool name).
type PoolKey = (&'static str, String);

/// The slices kept, by pool, within the bounds ([module](self)).
#[derive(Debug, Default)]
pub struct Kept {
    pools: BTreeMap<PoolKey, Pool>,
    /// The pool of each slice kept, to find it again when it changes or goes.
    names: BTreeMap<String, PoolKey>,
    /// Slices were left out since this listing began.
    left_out: bool,
}

impl Kept {
    /// Takes a slice added or changed; one not read, stale or past the bounds is left out
    /// (and its older version forgotten). Returns the slices left out (or pushed out).
    pub fn apply(&mut self, slice: &ResourceSlice, claimed: &ClaimedNames) -> u64 {
        let name = slice.name_any();
        self.remove(&name);
        let Some(summary) = summary(slice) else { return 0 };
        let (pool, generation) = summary.pool();
        let key: PoolKey = (summary.driver(), pool.to_owned());
        if !self.newest_generation(&key, generation) {
            return 0; // stale: an older generation than the pool's newest
        }
        let wanted = need(&summary, claimed);
        let mut left_out = 0;
        for scope in [Scope::Pool(&key), Scope::Driver(key.0)] {
            if self.room(scope) {
                continue;
            }
            self.left_out = true;
            left_out += 1;
            let Some(victim) = self.least_needed(scope, wanted, claimed) else {
                return left_out;
            };
            self.remove(&victim);
        }
        let kept = self.pools.entry(key.clone()).or_insert(Pool { generation, slices: BTreeMap::new() });
        kept.slices.insert(name.clone(), summary);
        self.names.insert(name, key);
        left_out
    }

    /// Forgets a slice (deleted, or replaced).
    pub fn remove(&mut self, name: &str) {
        let Some(key) = self.names.remove(name) else { return };
        if let Some(pool) = self.pools.get_mut(&key) {
            pool.slices.remove(name);
        }
        self.drop_if_empty(&key);
    }

    fn drop_if_empty(&mut self, key: &PoolKey) {
        if self.pools.get(key).is_some_and(|p| p.slices.is_empty()) {
            self.pools.remove(key);
        }
    }

    /// Whether `generation` is the pool's newest seen; a newer one makes the kept slices of
    /// the pool stale: they are forgotten.
    fn newest_generation(&mut self, key: &PoolKey, generation: i64) -> bool {
        let Some(pool) = self.pools.get_mut(key) else { return true };
        if generation < pool.generation {
            return false;
        }
        if generation > pool.generation {
            for stale in std::mem::take(&mut pool.slices).into_keys() {
                self.names.remove(&stale);
            }
            self.pools.remove(key);
        }
        true
    }

    /// Whether `scope` has room for another slice.
    fn room(&self, scope: Scope<'_>) -> bool {
        self.in_scope(scope).count() < scope.bound()
    }

    /// The slices of `scope`, by name.
    fn in_scope<'s>(&'s self, scope: Scope<'s>) -> impl Iterator<Item = (&'s String, &'s Summary)> {
        self.pools.iter().filter(move |(key, _)| scope.holds(key)).flat_map(|(_, p)| p.slices.iter())
    }

    /// The slice of `scope` the claims need least, if they need it less than `wanted`.
    fn least_needed(&self, scope: Scope<'_>, wanted: Need, claimed: &ClaimedNames) -> Option<String> {
        let needs = self.in_scope(scope).map(|(name, s)| (name, need(s, claimed)));
        let (name, least) = needs.min_by_key(|(_, n)| *n)?;
        (least < wanted).then(|| name.clone())
    }

    /// Whether a claimed device is published by no kept slice while slices were left out:
    /// a listing again may find it.
    fn misses(&self, claimed: &ClaimedNames) -> bool {
        if !self.left_out {
            return false;
        }
        for (driver, pools) in claimed {
            for (pool, devices) in pools {
                let kept = self.pools.iter().filter(|((d, p), _)| *d == driver.as_str() && p == pool);
                let published: BTreeSet<&str> =
                    kept.flat_map(|(_, p)| p.slices.values()).flat_map(Summary::device_names).collect();
                if devices.iter().any(|d| !published.contains(d.as_str())) {
                    return true;
                }
            }
        }
        false
    }

    fn summaries(&self) -> impl Iterator<Item = &Summary> + Clone {
        self.pools.values().flat_map(|p| p.slices.values())
    }
}

/// Where a slice needs room.
#[derive(Clone, Copy)]
enum Scope<'k> {
    Pool(&'k PoolKey),
    Driver(&'static str),
}

impl Scope<'_> {
    fn holds(self, key: &PoolKey) -> bool {
        match self {
            Scope::Pool(pool) => key == pool,
            Scope::Driver(driver) => key.0 == driver,
        }
    }

    fn bound(self) -> usize {
        match self {
            Scope::Pool(_) => MAX_SLICES_PER_POOL,
            Scope::Driver(_) => MAX_SLICES_PER_DRIVER,
        }
    }
}

/// What a slice publishes; `None` for a driver not read.
pub fn summary(slice: &ResourceSlice) -> Option<Summary> {
    match slice.spec.driver.as_str() {
        Neuron::NAME => summary_of::<Neuron>(&slice.spec).map(Summary::Neuron),
        Efa::NAME => summary_of::<Efa>(&slice.spec).map(Summary::Efa),
        Nvidia::NAME => summary_of::<Nvidia>(&slice.spec).map(Summary::Nvidia),
        _ => None,
    }
}

/// What a slice of `D` publishes. Devices beyond the bounds, or with overlong names, are
/// left out (a claim of one is then unresolvable, and said so).
fn summary_of<D: Driver>(spec: &SliceSpec) -> Option<Slice<D::Device>> {
    if spec.pool.name.len() > MAX_NAME_BYTES {
        return None;
    }
    let devices = spec.devices.iter().take(MAX_SLICE_DEVICES).filter(|d| d.name.len() <= MAX_NAME_BYTES);
    let devices = devices.map(|d| {
        let attributes = d.attributes.iter().take(MAX_DEVICE_ATTRIBUTES);
        let attributes: Vec<_> = attributes.map(|(k, v)| (k.as_str(), v.int, v.string.as_deref())).collect();
        (d.name.clone(), D::device(&attributes))
    });
    Some(Slice { pool: spec.pool.name.clone(), generation: spec.pool.generation, devices: devices.collect() })
}

/// Watches this node's ResourceSlices into the devices' table, once `wanted`.
pub struct SliceWatcher {
    pub client: Client,
    pub node: String,
    pub devices: SharedDevices,
    /// Who holds each GPU: takes the GPUs' table.
    pub gpus: GpuHolding,
    pub metrics: AttributionMetrics,
    pub watch_timeout: Duration,
    /// Set when the slices are needed: by the kubelet poller when an answer lists DRA
    /// claims or the device plugin allocates no Neuron device, or by the health's
    /// DeviceTaintRules (which name devices by them).
    pub wanted: watch::Receiver<bool>,
    /// The devices the kubelet's latest claims name: their slices are kept first.
    pub claimed: watch::Receiver<Arc<ClaimedNames>>,
}

/// What ended one watch of the slices.
enum Ended {
    Shutdown,
    /// A claim names a device no kept slice publishes, and slices were left out.
    Missing,
}

impl SliceWatcher {
    /// Waits until the slices are wanted, then watches until `shutdown`; errors are logged
    /// and retried with backoff, the known devices stay. The slices are listed again when
    /// a claim needs a slice that was left out (at most every [`MIN_RELIST_INTERVAL`]).
    pub async fn run(mut self, shutdown: CancellationToken) {
        let wanted = tokio::select! {
            _ = shutdown.cancelled() => return,
            wanted = self.wanted.wait_for(|w| *w) => wanted.is_ok(),
        };
        if !wanted {
            // No poller any more: nothing will want the slices.
            return shutdown.cancelled().await;
        }
        info!(node = %self.node, "this node's ResourceSlices are needed (DRA claims, no Neuron device of a device \
               plugin, or DeviceTaintRules): watching them");
        let log = BadItemLog::default();
        loop {
            let listed = Instant::now();
            if let Ended::Shutdown = self.watch(&log, &shutdown).await {
                return;
            }
            info!("a claim names a device of a ResourceSlice left out past the bounds: listing the slices again");
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until((listed + MIN_RELIST_INTERVAL).into()) => {}
            }
        }
    }

    /// One watch: a listing, then the changes, until `shutdown` or a claim needs a slice
    /// left out.
    async fn watch(&mut self, log: &BadItemLog, shutdown: &CancellationToken) -> Ended {
        let watch = Watch {
            fields: format!("spec.nodeName={}", self.node),
            timeout: self.watch_timeout,
            errors: self.metrics.slice_watch_errors.clone(),
            what: "the ResourceSlices of this node",
            meanwhile: "the known DRA devices stay",
        };
        let api = Api::<ResourceSlice>::all(self.client.clone());
        let mut events = std::pin::pin!(watch.events(api, shutdown.clone()));
        let mut listing = Kept::default();
        // `None` until the first listing is done.
        let mut kept: Option<Kept> = None;
        loop {
            let event = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => return Ended::Shutdown,
                },
                Ok(()) = self.claimed.changed() => {
                    if kept.as_ref().is_some_and(|k| k.misses(&self.claimed.borrow_and_update())) {
                        return Ended::Missing;
                    }
                    continue;
                }
            };
            let claimed = self.claimed.borrow().clone();
            let (changed, left_out) = match event {
                Event::Init => {
                    listing = Kept::default();
                    (false, 0)
                }
                Event::InitApply(s) => (false, listing.apply(&s, &claimed)),
                Event::InitDone => {
                    kept = Some(std::mem::take(&mut listing));
                    (true, 0)
                }
                Event::Apply(s) => match kept.as_mut() {
                    Some(known) => (true, known.apply(&s, &claimed)),
                    None => (false, 0),
                },
                Event::Delete(s) => (kept.as_mut().map(|known| known.remove(&s.name_any())).is_some(), 0),
            };
            self.metrics.slices_left_out.inc_by(left_out);
            if let (true, Some(kept)) = (changed, &kept) {
                self.publish(kept, log);
            }
        }
    }

    /// Each driver's table to its users (the GPUs' is read at the kubelet's next answer).
    fn publish(&self, kept: &Kept, log: &BadItemLog) {
        let neuron = kept.summaries().filter_map(|s| if let Summary::Neuron(s) = s { Some(s) } else { None });
        let efa = kept.summaries().filter_map(|s| if let Summary::Efa(s) = s { Some(s) } else { None });
        let nvidia = kept.summaries().filter_map(|s| if let Summary::Nvidia(s) = s { Some(s) } else { None });
        let (neuron, efa, nvidia) =
            (DeviceTable::from_slices(neuron), DeviceTable::from_slices(efa), DeviceTable::from_slices(nvidia));
        let count = |driver| self.metrics.dra_devices.get_or_create(&DriverLabel { driver }).clone();
        count(Neuron::NAME).set(neuron.len() as i64);
        count(Efa::NAME).set(efa.len() as i64);
        count(Nvidia::NAME).set(nvidia.len() as i64);
        self.gpus.set_dra_devices(nvidia);
        let mut devices = self.devices.write().unwrap_or_else(|p| p.into_inner());
        let unresolvable = devices.set_dra_devices(neuron);
        let efa_unresolvable = devices.set_efa_dra_devices(efa);
        drop(devices);
        report_unresolved(&unresolvable, Neuron::NAME, &self.metrics, log);
        report_unresolved(&efa_unresolvable, Efa::NAME, &self.metrics, log);
    }
}

#[cfg(test)]
mod tests;
