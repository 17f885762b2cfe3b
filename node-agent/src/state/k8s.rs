//! `neuron_k8s_info` into the node state: who neuron-monitor says uses each core and
//! device, bounded like the rest of a report (indices below the hardware limits, names
//! as bounded label values, a few containers per entry).

use api::{
    limits::{MAX_NEURONCORES, MAX_NEURON_DEVICES},
    report::{IndexMap, K8sOwner as ReportOwner, Report},
};

use super::{label_value, K8sOwner, K8sOwners, NodeState, Refusals};

impl NodeState {
    /// A report without the group keeps the last one (it has its own period); one in
    /// error leaves no owners until it recovers.
    pub(super) fn apply_k8s(&mut self, report: &Report<'_>) {
        let Some(group) = report.k8s_info() else {
            return;
        };
        self.note("neuron_k8s_info", "", group);
        let owners = group.ok().map(|info| K8sOwners {
            cores: owners(info.neuroncores_k8s_info.as_ref(), Unit::Core, &mut self.refusals),
            devices: owners(info.neurondevices_k8s_info.as_ref(), Unit::Device, &mut self.refusals),
        });
        if owners != self.k8s {
            self.k8s = owners;
            self.k8s_generation += 1;
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Unit {
    Core,
    Device,
}

/// The entries naming a pod and its namespace, by index (the first of an index kept).
fn owners(entries: Option<&IndexMap<ReportOwner<'_>>>, unit: Unit, refusals: &mut Refusals) -> Vec<(u32, K8sOwner)> {
    let mut out: Vec<(u32, K8sOwner)> = Vec::new();
    for (index, entry) in entries.into_iter().flat_map(|e| e.iter()) {
        let (limit, refused) = match unit {
            Unit::Core => (MAX_NEURONCORES, &mut refusals.core_indices),
            Unit::Device => (MAX_NEURON_DEVICES, &mut refusals.device_indices),
        };
        if index >= limit {
            *refused += 1;
            continue;
        }
        let (Some(namespace), Some(pod)) = (entry.namespace.as_deref(), entry.pod_name.as_deref()) else {
            continue;
        };
        if namespace.is_empty() || pod.is_empty() {
            continue;
        }
        let containers = entry.container_name.as_ref();
        refusals.k8s_containers += containers.map_or(0, |c| c.skipped as u64);
        let refused = &mut refusals.label_values;
        out.push((
            index,
            K8sOwner {
                namespace: label_value(namespace, refused),
                pod: label_value(pod, refused),
                containers: containers
                    .into_iter()
                    .flat_map(|c| &c.names)
                    .filter(|c| !c.is_empty())
                    .map(|c| label_value(c, refused))
                    .collect(),
            },
        ));
    }
    out.sort_by_key(|(index, _)| *index); // stable: the first of an index stays first
    out.dedup_by_key(|(index, _)| *index);
    out
}
