//! This node's ResourceSlices (`resource.k8s.io/v1`), watched with the field selector
//! `spec.nodeName=<node>` once the kubelet lists a DRA claim of a Neuron or EFA device or
//! a GPU: each read driver's devices by pool and name, with what they stand for (a Neuron
//! device's index for [`super::resolve`], an EFA device's name for [`super::efa::resolve`],
//! a GPU for [`crate::attribution::gpus`]).
//!
//! The slice is read as its own small type (only the fields used here): the
//! `k8s-openapi` feature the workspace builds has no `resource.k8s.io/v1`, and the
//! oldest feature is kept.

use std::{borrow::Cow, collections::BTreeMap, time::Duration};

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
    attribution::{bad_items::BadItemLog, gpus::GpuHolding, podresources::SharedDevices, AttributionMetrics, DriverLabel},
    kubernetes::Watch,
};

/// Devices read from one slice (the API allows 128 per slice; a node has at most
/// [`api::limits::MAX_NEURON_DEVICES`] Neuron devices, [`crate::gpu::MAX_GPUS`] GPUs, 32
/// EFA devices beside its other network devices).
const MAX_SLICE_DEVICES: usize = 128;
/// Slices of the read drivers kept for one node.
const MAX_SLICES: usize = 64;
/// Attributes read of one device (the API allows 32).
const MAX_DEVICE_ATTRIBUTES: usize = 32;

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
}

impl SliceWatcher {
    /// Waits until the slices are wanted, then watches until `shutdown`; errors are logged
    /// and retried with backoff, the known devices stay.
    pub async fn run(mut self, shutdown: CancellationToken) {
        let wanted = tokio::select! {
            _ = shutdown.cancelled() => return,
            wanted = self.wanted.wait_for(|w| *w) => wanted.is_ok(),
        };
        if !wanted {
            // No poller any more: nothing will want the slices.
            return shutdown.cancelled().await;
        }
        let watch = Watch {
            fields: format!("spec.nodeName={}", self.node),
            timeout: self.watch_timeout,
            errors: self.metrics.slice_watch_errors.clone(),
            what: "the ResourceSlices of this node",
            meanwhile: "the known DRA devices stay",
        };
        let api = Api::<ResourceSlice>::all(self.client.clone());
        let mut events = std::pin::pin!(watch.events(api, shutdown));
        info!(node = %self.node, "this node's ResourceSlices are needed (DRA claims, no Neuron device of a device \
               plugin, or DeviceTaintRules): watching them");
        let log = BadItemLog::default();
        let mut listing: BTreeMap<String, Summary> = BTreeMap::new();
        // `None` until the first listing is done.
        let mut slices: Option<BTreeMap<String, Summary>> = None;
        while let Some(event) = events.next().await {
            let changed = match event {
                Event::Init => {
                    listing.clear();
                    false
                }
                Event::InitApply(s) => {
                    keep(&mut listing, &s);
                    false
                }
                Event::InitDone => {
                    slices = Some(std::mem::take(&mut listing));
                    true
                }
                Event::Apply(s) => slices.as_mut().map(|known| keep(known, &s)).is_some(),
                Event::Delete(s) => slices.as_mut().map(|known| known.remove(&s.name_any())).is_some(),
            };
            if let (true, Some(slices)) = (changed, &slices) {
                self.publish(slices, &log);
            }
        }
    }

    /// Each driver's table to its users (the GPUs' is read at the kubelet's next answer).
    fn publish(&self, slices: &BTreeMap<String, Summary>, log: &BadItemLog) {
        let neuron = slices.values().filter_map(|s| if let Summary::Neuron(s) = s { Some(s) } else { None });
        let efa = slices.values().filter_map(|s| if let Summary::Efa(s) = s { Some(s) } else { None });
        let nvidia = slices.values().filter_map(|s| if let Summary::Nvidia(s) = s { Some(s) } else { None });
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

/// Keeps `slice` under its name when it is a read driver's (and drops an older version of
/// it that was), up to [`MAX_SLICES`].
fn keep(slices: &mut BTreeMap<String, Summary>, slice: &ResourceSlice) {
    let name = slice.name_any();
    match summary(slice) {
        Some(s) if slices.len() < MAX_SLICES || slices.contains_key(&name) => {
            slices.insert(name, s);
        }
        _ => {
            slices.remove(&name);
        }
    }
}
