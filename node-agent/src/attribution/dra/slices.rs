//! This node's ResourceSlices (`resource.k8s.io/v1`), watched with the field selector
//! `spec.nodeName=<node>` once the kubelet lists a DRA claim of a Neuron device: the
//! Neuron driver's devices by pool and name, with their indices, for [`super::resolve`].
//!
//! The slice is read as its own small type (only the fields used here): the
//! `k8s-openapi` feature the workspace builds has no `resource.k8s.io/v1`, and the
//! oldest feature is kept.

use std::{borrow::Cow, collections::BTreeMap, time::Duration};

use api::hardware::NEURON_DRA_DRIVER;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{runtime::watcher::Event, Api, Client, ResourceExt};
use serde::Deserialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::{report_unresolved, DeviceTable, Slice, MAX_NAME_BYTES};
use crate::{
    attribution::{podresources::SharedDevices, AttributionMetrics},
    kubernetes::Watch,
};

/// Devices read from one slice (the API allows 128 per slice; a node has at most
/// [`api::limits::MAX_NEURON_DEVICES`] Neuron devices).
const MAX_SLICE_DEVICES: usize = 128;
/// Slices of the Neuron driver kept for one node.
const MAX_SLICES: usize = 64;

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

/// What a slice of the Neuron driver publishes; `None` for another driver's. Devices
/// beyond the bounds, or with overlong names, are left out (a claim of one is then
/// unresolvable, and said so).
pub fn summary(slice: &ResourceSlice) -> Option<Slice> {
    let spec = &slice.spec;
    if spec.driver != NEURON_DRA_DRIVER || spec.pool.name.len() > MAX_NAME_BYTES {
        return None;
    }
    let devices = spec.devices.iter().take(MAX_SLICE_DEVICES).filter(|d| d.name.len() <= MAX_NAME_BYTES);
    let devices = devices.map(|d| {
        let attributes = d.attributes.iter().map(|(k, v)| (k.as_str(), v.int, v.string.as_deref()));
        (d.name.clone(), super::device_index(attributes))
    });
    Some(Slice { pool: spec.pool.name.clone(), generation: spec.pool.generation, devices: devices.collect() })
}

/// Watches this node's ResourceSlices into the devices' table, once `wanted`.
pub struct SliceWatcher {
    pub client: Client,
    pub node: String,
    pub devices: SharedDevices,
    pub metrics: AttributionMetrics,
    pub watch_timeout: Duration,
    /// Set by the kubelet poller when an answer lists DRA claims.
    pub wanted: watch::Receiver<bool>,
}

impl SliceWatcher {
    /// Waits until DRA claims are seen, then watches until `shutdown`; errors are logged
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
        info!(node = %self.node, "the kubelet lists DRA claims: watching the ResourceSlices of this node");
        let mut listing: BTreeMap<String, Slice> = BTreeMap::new();
        // `None` until the first listing is done.
        let mut slices: Option<BTreeMap<String, Slice>> = None;
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
                self.publish(slices);
            }
        }
    }

    fn publish(&self, slices: &BTreeMap<String, Slice>) {
        let table = DeviceTable::from_slices(slices.values());
        self.metrics.dra_devices.set(table.len() as i64);
        let unresolvable = self.devices.write().unwrap_or_else(|p| p.into_inner()).set_dra_devices(table);
        report_unresolved(&unresolvable, &self.metrics);
    }
}

/// Keeps `slice` under its name when it is the Neuron driver's (and drops an older
/// version of it that was), up to [`MAX_SLICES`].
fn keep(slices: &mut BTreeMap<String, Slice>, slice: &ResourceSlice) {
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
