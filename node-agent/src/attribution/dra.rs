//! Devices allocated through Dynamic Resource Allocation (DRA): Neuron devices (AWS's
//! driver), EFA devices (AWS's EFA driver, [`efa`]) and NVIDIA GPUs (NVIDIA's driver,
//! [`nvidia`]), by one machinery per [`Driver`].
//!
//! The kubelet's pod-resources answer names, per container, each claim's devices by
//! driver, pool and DRA device name; the node's ResourceSlices ([`slices`]) say what each
//! name stands for (a Neuron device's index, the driver's `deviceId` attribute; a GPU's
//! UUID). Resolved, a claimed Neuron device is an [`Allocation`] of a whole device, as the
//! device plugin's are, carrying its claim: both kinds of allocation feed one attribution,
//! on one node too; a claimed EFA device is an EFA allocation, a claimed GPU a holder of
//! it ([`super::gpus`]), likewise.
//!
//! A claimed device that cannot be resolved (malformed, listed by no ResourceSlice of
//! this node, listed without an index) is left out of the allocations: its device keeps
//! reporting, without the pod; it is counted and logged once while the kubelet lists it.

pub mod efa;
pub mod nvidia;
pub mod slices;

use std::{
    collections::{BTreeSet, HashMap},
    fmt,
    sync::Arc,
};

use super::{
    bad_items::BadItemLog,
    podresources::{proto, Allocation, Unit},
    AttributionMetrics,
};
use crate::{state::PodRef, telemetry::ReasonLabel};
use api::{
    hardware::{NEURON_DRA_DEVICE_ID, NEURON_DRA_DEVICE_TYPE, NEURON_DRA_DRIVER, NEURON_DRA_RESOURCE_TYPE},
    limits::MAX_NEURON_DEVICES,
};

/// One attribute of a published device: its name, integer value and string value (the
/// other kinds are not read).
pub type Attribute<'a> = (&'a str, Option<i64>, Option<&'a str>);

/// A DRA driver whose claims are read: its name, and what one of its devices stands for.
pub trait Driver {
    const NAME: &'static str;
    /// What a published device stands for.
    type Device: Clone + fmt::Debug + PartialEq;
    /// The device its attributes describe; `None`: none this agent reads.
    fn device(attributes: &[Attribute<'_>]) -> Option<Self::Device>;
}

/// Whether the attribute `key` is `driver`'s `attribute`: bare, or qualified by the
/// driver's domain (`neuron.aws.com/deviceId`).
pub fn is_attribute(driver: &str, key: &str, attribute: &str) -> bool {
    key == attribute || key.strip_prefix(driver).and_then(|k| k.strip_prefix('/')) == Some(attribute)
}

/// AWS's Neuron driver: a device stands for a Neuron device index.
pub struct Neuron;

impl Driver for Neuron {
    const NAME: &'static str = NEURON_DRA_DRIVER;
    type Device = u32;

    fn device(attributes: &[Attribute<'_>]) -> Option<u32> {
        device_index(attributes.iter().copied())
    }
}

/// The labels that name a device's claim on the series of what the claim holds (idle
/// cores); a series of something no claim holds has neither (an empty value, to
/// Prometheus).
pub const CLAIM_NAMESPACE_LABEL: &str = "dra_claim_namespace";
pub const CLAIM_NAME_LABEL: &str = "dra_claim_name";

/// Bytes of a claim's namespace or name, a pool's or a device's name (the API's bound:
/// a DNS subdomain); longer ones are malformed. (How many claimed devices an answer gives,
/// and how long a string of it is, the answer's reading bounds: [`super::podresources::answer`].)
const MAX_NAME_BYTES: usize = 253;

/// A ResourceClaim's identity.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claim {
    pub namespace: String,
    pub name: String,
}

/// One device of a claim that a container holds, as the kubelet lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedDevice {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub claim: Arc<Claim>,
    pub pool: String,
    pub device: String,
    /// A name was empty or over [`MAX_NAME_BYTES`].
    pub malformed: bool,
}

/// Why a claimed device names no device of this node; the values of the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Unresolved {
    /// Empty or overlong names.
    Malformed,
    /// No ResourceSlice of this node lists the pool's device.
    UnknownDevice,
    /// Listed without a usable index (none, out of range, or not a device).
    NoDeviceId,
    /// A GPU no collection of this node has.
    UnknownGpu,
    /// Beyond the holders one GPU may have ([`super::gpus::MAX_HOLDERS_PER_GPU`]).
    TooMany,
}

impl Unresolved {
    pub fn as_str(self) -> &'static str {
        match self {
            Unresolved::Malformed => "malformed",
            Unresolved::UnknownDevice => "unknown_device",
            Unresolved::NoDeviceId => "no_device_id",
            Unresolved::UnknownGpu => "unknown_gpu",
            Unresolved::TooMany => "too_many",
        }
    }
}

/// A claimed device that could not be resolved, and why.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Unresolvable {
    pub claim: Arc<Claim>,
    pub pool: String,
    pub device: String,
    pub reason: Unresolved,
}

impl Unresolvable {
    pub fn of(c: &ClaimedDevice, reason: Unresolved) -> Self {
        Unresolvable { claim: c.claim.clone(), pool: c.pool.clone(), device: c.device.clone(), reason }
    }
}

/// Whether `name` cannot be a claim's, pool's or device's name: empty, or over
/// [`MAX_NAME_BYTES`].
fn malformed(name: &str) -> bool {
    name.is_empty() || name.len() > MAX_NAME_BYTES
}

/// The devices of `driver` the claims of a `List` answer hold (other drivers' are not
/// read), in answer order (as many as the answer's reading kept).
pub fn claimed_devices(response: &proto::ListPodResourcesResponse, driver: &str) -> Vec<ClaimedDevice> {
    let mut out = Vec::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for resource in &container.dynamic_resources {
                let (namespace, name) = (&resource.claim_namespace, &resource.claim_name);
                let bad_claim = malformed(namespace) || malformed(name);
                let claim = Arc::new(Claim { namespace: namespace.clone(), name: name.clone() });
                for device in resource.claim_resources.iter().filter(|r| r.driver_name == driver) {
                    out.push(ClaimedDevice {
                        namespace: pod.namespace.clone(),
                        pod: pod.name.clone(),
                        container: container.name.clone(),
                        claim: claim.clone(),
                        pool: device.pool_name.clone(),
                        device: device.device_name.clone(),
                        malformed: bad_claim || malformed(&device.pool_name) || malformed(&device.device_name),
                    });
                }
            }
        }
    }
    out
}

/// What one ResourceSlice of a driver publishes: its pool, the pool's generation, and
/// each device's name and what it stands for (`None`: nothing usable).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Slice<D> {
    pub pool: String,
    pub generation: i64,
    pub devices: Vec<(String, Option<D>)>,
}

/// A device's index from its attributes (name, integer value, string value): the driver's
/// `deviceId` (bare or qualified by the driver's domain), below [`MAX_NEURON_DEVICES`], on
/// a device whose `resourceType`, when given, is `neuron_device`.
pub fn device_index<'a>(attributes: impl IntoIterator<Item = (&'a str, Option<i64>, Option<&'a str>)>) -> Option<u32> {
    let ours = |key: &str, attribute: &str| is_attribute(NEURON_DRA_DRIVER, key, attribute);
    let mut index = None;
    let mut a_device = true;
    for (key, int, string) in attributes {
        if ours(key, NEURON_DRA_DEVICE_ID) {
            index = int.and_then(|i| u32::try_from(i).ok()).filter(|i| *i < MAX_NEURON_DEVICES);
        } else if ours(key, NEURON_DRA_RESOURCE_TYPE) {
            a_device = string == Some(NEURON_DRA_DEVICE_TYPE);
        }
    }
    index.filter(|_| a_device)
}

/// One driver's devices of this node's ResourceSlices by (pool, device name).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTable<D> {
    /// Pool → device name → what it stands for.
    pools: HashMap<String, HashMap<String, Option<D>>>,
}

impl<D> Default for DeviceTable<D> {
    fn default() -> Self {
        DeviceTable { pools: HashMap::new() }
    }
}

impl<D: Clone> DeviceTable<D> {
    /// The devices of the newest generation of each pool (a driver that updates a pool
    /// publishes its new slices before it removes the old ones: those are ignored).
    pub fn from_slices<'a>(slices: impl IntoIterator<Item = &'a Slice<D>> + Clone) -> Self
    where
        D: 'a,
    {
        let mut newest: HashMap<&str, i64> = HashMap::new();
        for s in slices.clone() {
            let g = newest.entry(&s.pool).or_insert(s.generation);
            *g = (*g).max(s.generation);
        }
        let mut pools: HashMap<String, HashMap<String, Option<D>>> = HashMap::new();
        for s in slices.into_iter().filter(|s| newest.get(s.pool.as_str()) == Some(&s.generation)) {
            let devices = pools.entry(s.pool.clone()).or_default();
            devices.extend(s.devices.iter().cloned());
        }
        DeviceTable { pools }
    }

    /// How many devices the slices list.
    pub fn len(&self) -> usize {
        self.pools.values().map(HashMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What each listed device stands for (those listed without, left out).
    pub fn resolved(&self) -> impl Iterator<Item = &D> {
        self.pools.values().flat_map(HashMap::values).flatten()
    }

    /// What `device` of `pool` stands for.
    pub fn device(&self, pool: &str, device: &str) -> Result<&D, Unresolved> {
        match self.pools.get(pool).and_then(|devices| devices.get(device)) {
            None => Err(Unresolved::UnknownDevice),
            Some(None) => Err(Unresolved::NoDeviceId),
            Some(Some(d)) => Ok(d),
        }
    }

    /// The (pool, device name) that stands for `wanted`, the first in name order when
    /// several do (the agent's DeviceTaintRules name a Neuron device by it).
    pub fn name_of(&self, wanted: &D) -> Option<(&str, &str)>
    where
        D: PartialEq,
    {
        self.names_of(|d| d == wanted).into_iter().next()
    }

    /// Every (pool, device name) whose device `stands_for` says yes to, in name order (a
    /// GPU in MIG mode is several devices).
    pub fn names_of(&self, stands_for: impl Fn(&D) -> bool) -> Vec<(&str, &str)> {
        let mut names: Vec<(&str, &str)> = self
            .pools
            .iter()
            .flat_map(|(pool, devices)| {
                let ours = devices.iter().filter(|(_, d)| d.as_ref().is_some_and(&stands_for));
                ours.map(move |(name, _)| (pool.as_str(), name.as_str()))
            })
            .collect();
        names.sort_unstable();
        names
    }

    /// What the claimed device `c` stands for.
    pub fn claimed(&self, c: &ClaimedDevice) -> Result<&D, Unresolved> {
        if c.malformed {
            return Err(Unresolved::Malformed);
        }
        self.device(&c.pool, &c.device)
    }
}

/// The claimed devices as whole-device allocations carrying their claims, and those
/// that name no device of `table`. The cores of an allocation are all of its device's
/// under the node's LNC ([`Allocation::cores`]); a claim's own LNC (its `NeuronConfig`)
/// would ride on the allocation with its claim.
pub fn resolve(claimed: &[ClaimedDevice], table: &DeviceTable<u32>) -> (Vec<Allocation>, Vec<Unresolvable>) {
    let mut allocations = Vec::new();
    let mut unresolvable = Vec::new();
    for c in claimed {
        match table.claimed(c) {
            Ok(id) => allocations.push(Allocation {
                namespace: c.namespace.clone(),
                pod: c.pod.clone(),
                container: c.container.clone(),
                unit: Unit::Device,
                id: *id,
                claim: Some(c.claim.clone()),
            }),
            Err(reason) => unresolvable.push(Unresolvable::of(c, reason)),
        }
    }
    (allocations, unresolvable)
}

/// The claimed devices that could not be resolved, each told once while it stays so.
#[derive(Debug, Default)]
pub struct UnresolvedLog {
    current: BTreeSet<Unresolvable>,
}

impl UnresolvedLog {
    /// Takes the latest unresolvable devices; returns those not in the previous ones.
    pub fn fresh(&mut self, latest: Vec<Unresolvable>) -> Vec<Unresolvable> {
        let latest: BTreeSet<Unresolvable> = latest.into_iter().collect();
        let fresh = latest.difference(&self.current).cloned().collect();
        self.current = latest;
        fresh
    }

    pub fn clear(&mut self) {
        self.current.clear();
    }
}

/// Counts `driver`'s claimed devices newly found unresolvable, and logs them in `log`.
pub fn report_unresolved(fresh: &[Unresolvable], driver: &str, metrics: &AttributionMetrics, log: &BadItemLog) {
    for u in fresh {
        metrics.dra_unresolved.get_or_create(&ReasonLabel { reason: u.reason.as_str() }).inc();
    }
    let named = fresh.iter().map(|u| {
        format!("{}/{} {driver} {}/{}: {}", u.claim.namespace, u.claim.name, u.pool, u.device, u.reason.as_str())
    });
    log.warn(
        "DRA claims' devices name no device of this node's ResourceSlices (or no GPU of this node); their series \
         keep the device, without the pod",
        fresh.len(),
        named,
    );
}

/// `owner` holding a device through `claim`: its labels name the claim too.
pub fn claim_holder(owner: &PodRef, claim: &Claim) -> PodRef {
    let mut holder = owner.clone();
    holder.labels.push((CLAIM_NAMESPACE_LABEL.to_owned(), claim.namespace.clone()));
    holder.labels.push((CLAIM_NAME_LABEL.to_owned(), claim.name.clone()));
    holder
}

#[cfg(test)]
mod tests;
