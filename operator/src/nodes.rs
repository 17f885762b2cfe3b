//! Which Node objects are Neuron nodes: those whose kubelet advertises a Neuron device
//! resource, or whose instance type is a Neuron family (a node can be labelled before
//! the device plugin reports its devices, or while it is down). Where the agent runs on
//! GPU nodes too, NVIDIA GPU nodes are monitored beside them ([`is_gpu_node`]).

use std::collections::BTreeMap;

use api::{
    cloudwatch::cost::NodeFacts,
    hardware::{
        EKS_ACCELERATOR_LABEL, INSTANCE_TYPE_LABELS, NEURONCORE_RESOURCE, NEURONDEVICE_RESOURCE,
        NEURON_INSTANCE_FAMILIES, NEURON_RESOURCES, NVIDIA_GPU_COUNT_LABELS, NVIDIA_GPU_PRESENT_LABEL,
        NVIDIA_GPU_RESOURCE, NVIDIA_GPU_SHARED_RESOURCE, NVIDIA_INSTANCE_FAMILIES, NVIDIA_MIG_RESOURCE_PREFIX,
        ZONE_LABELS,
    },
};
use k8s_openapi::api::core::v1::Node;

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

/// A node's labels (empty when it has none).
pub fn labels(node: &Node) -> &BTreeMap<String, String> {
    node.metadata.labels.as_ref().unwrap_or(&NO_LABELS)
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeuronNodePolicy {
    /// Extended resources that make a node a Neuron node when its capacity or
    /// allocatable has a non-zero quantity of one.
    pub resources: Vec<String>,
    /// Prefixes of the instance type (`node.kubernetes.io/instance-type`, or the legacy
    /// `beta.` label) that make a node a Neuron node.
    pub instance_type_prefixes: Vec<String>,
    /// NVIDIA GPU nodes are monitored too (the agent runs there).
    pub gpu_nodes: bool,
}

impl Default for NeuronNodePolicy {
    fn default() -> Self {
        NeuronNodePolicy {
            resources: NEURON_RESOURCES.map(String::from).to_vec(),
            instance_type_prefixes: NEURON_INSTANCE_FAMILIES.map(String::from).to_vec(),
            gpu_nodes: false,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("no Neuron resource and no instance-type prefix: no node would be a Neuron node")]
    Empty,
}

impl NeuronNodePolicy {
    /// A policy from two comma-separated lists (the CLI flags' form); blanks around
    /// items and empty items are ignored.
    pub fn from_lists(resources: &str, instance_type_prefixes: &str) -> Result<Self, PolicyError> {
        let policy = NeuronNodePolicy {
            resources: split_list(resources),
            instance_type_prefixes: split_list(instance_type_prefixes),
            gpu_nodes: false,
        };
        if policy.resources.is_empty() && policy.instance_type_prefixes.is_empty() {
            return Err(PolicyError::Empty);
        }
        Ok(policy)
    }

    /// Whether the operator renders a configuration for the node: a Neuron node, or a GPU
    /// node where GPU nodes are monitored.
    pub fn is_monitored_node(&self, node: &Node) -> bool {
        self.is_neuron_node(node) || (self.gpu_nodes && is_gpu_node(node))
    }

    pub fn is_neuron_node(&self, node: &Node) -> bool {
        self.has_neuron_resource(node) || self.has_neuron_instance_type(node)
    }

    fn has_neuron_resource(&self, node: &Node) -> bool {
        let Some(status) = &node.status else {
            return false;
        };
        [&status.capacity, &status.allocatable].into_iter().flatten().any(|resources| {
            self.resources.iter().any(|r| resources.get(r).is_some_and(|q| quantity_is_positive(&q.0)))
        })
    }

    fn has_neuron_instance_type(&self, node: &Node) -> bool {
        has_instance_type(node, &self.instance_type_prefixes)
    }
}

/// Whether the node has NVIDIA GPUs: a positive `nvidia.com/gpu`, `nvidia.com/gpu.shared`
/// or `nvidia.com/mig-…` resource, the GPU Operator's `nvidia.com/gpu.present=true`, EKS's
/// `k8s.amazonaws.com/accelerator=nvidia-…`, or an instance type with NVIDIA GPUs.
pub fn is_gpu_node(node: &Node) -> bool {
    let labels = labels(node);
    let (present, yes) = NVIDIA_GPU_PRESENT_LABEL;
    let (accelerator, nvidia) = EKS_ACCELERATOR_LABEL;
    labels.get(present).is_some_and(|v| v == yes)
        || labels.get(accelerator).is_some_and(|v| v.starts_with(nvidia))
        || has_gpu_resource(node)
        || has_instance_type(node, &NVIDIA_INSTANCE_FAMILIES)
}

fn has_gpu_resource(node: &Node) -> bool {
    let Some(status) = &node.status else {
        return false;
    };
    [&status.capacity, &status.allocatable].into_iter().flatten().any(|resources| {
        resources.iter().any(|(name, q)| {
            let gpu = name == NVIDIA_GPU_RESOURCE || name == NVIDIA_GPU_SHARED_RESOURCE;
            (gpu || name.starts_with(NVIDIA_MIG_RESOURCE_PREFIX)) && quantity_is_positive(&q.0)
        })
    })
}

/// Whether the node's instance type (current or legacy label) starts with one of
/// `prefixes` (empty ones never match).
fn has_instance_type<P: AsRef<str>>(node: &Node, prefixes: &[P]) -> bool {
    let labels = labels(node);
    INSTANCE_TYPE_LABELS
        .iter()
        .filter_map(|l| labels.get(*l))
        .any(|t| prefixes.iter().map(AsRef::as_ref).any(|p| !p.is_empty() && t.starts_with(p)))
}

/// What the CloudWatch cost estimate needs of a node: its cores and devices from the
/// device plugin's capacity, else from its instance type; its GPUs and their shares from
/// the NVIDIA device plugin ([`gpu_counts`]); its type and zone.
pub fn facts(node: &Node) -> NodeFacts {
    let labels = labels(node);
    let instance_type = INSTANCE_TYPE_LABELS.iter().find_map(|l| labels.get(*l)).cloned();
    let table = instance_type.as_deref().and_then(NodeFacts::from_instance_type).unwrap_or_default();
    let capacity = |resource: &str| {
        let quantity = node.status.as_ref()?.capacity.as_ref()?.get(resource)?;
        quantity.0.parse::<u32>().ok().filter(|n| *n > 0)
    };
    let (gpus, gpu_shares) = gpu_counts(node, labels);
    NodeFacts {
        cores: capacity(NEURONCORE_RESOURCE).unwrap_or(table.cores),
        devices: capacity(NEURONDEVICE_RESOURCE).unwrap_or(table.devices),
        gpus,
        gpu_shares,
        instance_type,
        availability_zone: ZONE_LABELS.iter().find_map(|l| labels.get(*l)).cloned(),
    }
}

/// A node's physical GPUs and the GPU allocations its device plugin hands out: every
/// `nvidia.com/gpu`, `gpu.shared` and `mig-…` unit of its capacity (time-sliced replicas
/// and MIG devices each one). The GPUs are the GPU Operator's `nvidia.com/gpu.count`
/// label where it is set, else the `nvidia.com/gpu` units over its `nvidia.com/gpu.replicas`
/// label, else the allocations (an upper bound: a cost ceiling must not undercount).
fn gpu_counts(node: &Node, labels: &BTreeMap<String, String>) -> (u32, u32) {
    let capacity = node.status.as_ref().and_then(|s| s.capacity.as_ref());
    let units = |name: &str| capacity.and_then(|c| c.get(name)).and_then(|q| q.0.parse::<u32>().ok()).unwrap_or(0);
    let shares = capacity
        .into_iter()
        .flatten()
        .filter(|(name, _)| {
            name.as_str() == NVIDIA_GPU_RESOURCE
                || name.as_str() == NVIDIA_GPU_SHARED_RESOURCE
                || name.starts_with(NVIDIA_MIG_RESOURCE_PREFIX)
        })
        .filter_map(|(_, q)| q.0.parse::<u32>().ok())
        .fold(0u32, u32::saturating_add);
    let label = |name: &str| labels.get(name).and_then(|v| v.parse::<u32>().ok()).filter(|n| *n > 0);
    let (count_label, replicas_label) = NVIDIA_GPU_COUNT_LABELS;
    let gpus = match (label(count_label), label(replicas_label)) {
        (Some(count), _) => count,
        (None, Some(replicas)) => {
            (units(NVIDIA_GPU_RESOURCE).saturating_add(units(NVIDIA_GPU_SHARED_RESOURCE))) / replicas
        }
        (None, None) => shares,
    };
    (gpus, shares)
}

/// Whether the node has the condition `condition_type` with status True (for the Neuron
/// health condition: a device has a fault).
pub fn condition_is_true(node: &Node, condition_type: &str) -> bool {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
    conditions.into_iter().flatten().any(|c| c.type_ == condition_type && c.status == "True")
}

/// Comma-separated items, trimmed, empty ones dropped.
pub fn split_list(list: &str) -> Vec<String> {
    list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned).collect()
}

/// Whether a Kubernetes quantity (`"16"`, `"0"`, `"1k"`, `"0.5"`, `"2e3"`) is above
/// zero: its number, before the suffix, has a non-zero digit and no minus sign. An
/// unreadable quantity counts as zero.
fn quantity_is_positive(quantity: &str) -> bool {
    let q = quantity.trim();
    let q = q.strip_prefix('+').unwrap_or(q);
    let number: &str = q.split(|c: char| !(c.is_ascii_digit() || c == '.')).next().unwrap_or_default();
    number.chars().any(|c| matches!(c, '1'..='9'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(labels: &[(&str, &str)], capacity: &[(&str, &str)], allocatable: &[(&str, &str)]) -> Node {
        let map = |kv: &[(&str, &str)]| -> Option<BTreeMap<String, Quantity>> {
            (!kv.is_empty()).then(|| kv.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect())
        };
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.labels =
            (!labels.is_empty()).then(|| labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        n.status = Some(NodeStatus { capacity: map(capacity), allocatable: map(allocatable), ..Default::default() });
        n
    }

    #[test]
    fn resources_with_a_positive_quantity_make_a_neuron_node() {
        let p = NeuronNodePolicy::default();
        assert!(p.is_neuron_node(&node(&[], &[("aws.amazon.com/neuroncore", "2")], &[])));
        assert!(p.is_neuron_node(&node(&[], &[], &[("aws.amazon.com/neurondevice", "1")])));
        assert!(p.is_neuron_node(&node(&[], &[("aws.amazon.com/neuron", "16")], &[])));
        assert!(!p.is_neuron_node(&node(
            &[],
            &[("aws.amazon.com/neuroncore", "0"), ("cpu", "8")],
            &[("aws.amazon.com/neuroncore", "0")]
        )));
        assert!(!p.is_neuron_node(&node(&[], &[("nvidia.com/gpu", "8")], &[])));
        assert!(!p.is_neuron_node(&Node::default()));
    }

    #[test]
    fn neuron_instance_types_make_a_neuron_node() {
        let p = NeuronNodePolicy::default();
        for t in api::hardware::INSTANCE_TYPES.map(|t| t.name) {
            assert!(p.is_neuron_node(&node(&[("node.kubernetes.io/instance-type", t)], &[], &[])), "{t}");
        }
        assert!(p.is_neuron_node(&node(&[("beta.kubernetes.io/instance-type", "inf2.xlarge")], &[], &[])));
        for t in ["m5.large", "trn", "inf10.xlarge", "p4d.24xlarge"] {
            assert!(!p.is_neuron_node(&node(&[("node.kubernetes.io/instance-type", t)], &[], &[])), "{t}");
        }
        // The prefix must be on the instance-type label, not any label.
        assert!(!p.is_neuron_node(&node(&[("team", "inf2.xlarge")], &[], &[])));
    }

    #[test]
    fn gpu_nodes_are_told_by_resource_label_or_instance_type() {
        let gpu = [
            node(&[], &[("nvidia.com/gpu", "8")], &[]),
            node(&[], &[], &[("nvidia.com/mig-1g.10gb", "7")]),
            node(&[], &[("nvidia.com/gpu.shared", "4")], &[]),
            node(&[("nvidia.com/gpu.present", "true")], &[], &[]),
            node(&[("k8s.amazonaws.com/accelerator", "nvidia-tesla-a10g")], &[], &[]),
            node(&[("node.kubernetes.io/instance-type", "p5.48xlarge")], &[], &[]),
            node(&[("node.kubernetes.io/instance-type", "g6.xlarge")], &[], &[]),
            node(&[("beta.kubernetes.io/instance-type", "p4d.24xlarge")], &[], &[]),
        ];
        for n in &gpu {
            assert!(is_gpu_node(n), "{:?}", n.metadata.labels);
        }
        let not_gpu = [
            Node::default(),
            node(&[], &[("nvidia.com/gpu", "0")], &[("nvidia.com/gpu", "0")]),
            node(&[("nvidia.com/gpu.present", "false")], &[], &[]),
            node(&[("k8s.amazonaws.com/accelerator", "amd-radeon")], &[], &[]),
            node(&[("node.kubernetes.io/instance-type", "g4ad.xlarge")], &[], &[]),
            node(&[("node.kubernetes.io/instance-type", "trn1.32xlarge")], &[], &[]),
            node(&[("team", "p5.48xlarge")], &[], &[]),
        ];
        for n in &not_gpu {
            assert!(!is_gpu_node(n), "{:?}", n.metadata.labels);
        }
    }

    #[test]
    fn gpu_nodes_are_monitored_only_where_the_policy_says_and_neuron_nodes_always() {
        let off = NeuronNodePolicy::default();
        let on = NeuronNodePolicy { gpu_nodes: true, ..NeuronNodePolicy::default() };
        let gpu = node(&[], &[("nvidia.com/gpu", "8")], &[]);
        let neuron = node(&[("node.kubernetes.io/instance-type", "trn1.32xlarge")], &[], &[]);
        assert!(!off.is_monitored_node(&gpu));
        assert!(on.is_monitored_node(&gpu));
        assert!(!on.is_neuron_node(&gpu), "a GPU node is still not a Neuron node");
        assert!(off.is_monitored_node(&neuron) && on.is_monitored_node(&neuron));
        assert!(!on.is_monitored_node(&Node::default()));
    }

    #[test]
    fn quantities() {
        for q in ["1", "16", "0.5", "1k", "2e3", "+3", " 4 "] {
            assert!(quantity_is_positive(q), "{q}");
        }
        for q in ["0", "0.0", "0k", "0e3", "-1", "", "k", "abc"] {
            assert!(!quantity_is_positive(q), "{q}");
        }
    }

    #[test]
    fn policy_from_flag_lists() {
        let p = NeuronNodePolicy::from_lists(" example.com/accel , ,", "trn1.,inf2.").unwrap();
        assert_eq!(p.resources, vec!["example.com/accel"]);
        assert_eq!(p.instance_type_prefixes, vec!["trn1.", "inf2."]);
        assert!(p.is_neuron_node(&node(&[], &[("example.com/accel", "1")], &[])));
        assert!(!p.is_neuron_node(&node(&[], &[("aws.amazon.com/neuron", "1")], &[])));
        assert_eq!(NeuronNodePolicy::from_lists("", " , "), Err(PolicyError::Empty));
        assert!(NeuronNodePolicy::from_lists("", "trn2.").is_ok());
    }

    #[test]
    fn the_cost_estimate_counts_gpus_and_their_shares_time_sliced_or_mig() {
        let plain = node(&[], &[("nvidia.com/gpu", "4")], &[]);
        assert_eq!((facts(&plain).gpus, facts(&plain).gpu_shares), (4, 4));
        // Time-sliced, 4 replicas a GPU: the GPU Operator's labels say how many GPUs.
        let sliced = node(&[("nvidia.com/gpu.replicas", "4")], &[("nvidia.com/gpu", "16")], &[]);
        assert_eq!((facts(&sliced).gpus, facts(&sliced).gpu_shares), (4, 16));
        let shared = node(&[("nvidia.com/gpu.count", "4")], &[("nvidia.com/gpu.shared", "16")], &[]);
        assert_eq!((facts(&shared).gpus, facts(&shared).gpu_shares), (4, 16));
        // MIG, mixed strategy: 7 + 7 devices of two A100s; without labels the GPUs are
        // bounded by the devices.
        let mig = node(
            &[("nvidia.com/gpu.count", "2")],
            &[("nvidia.com/mig-1g.5gb", "7"), ("nvidia.com/mig-3g.20gb", "2"), ("nvidia.com/gpu", "0")],
            &[],
        );
        assert_eq!((facts(&mig).gpus, facts(&mig).gpu_shares), (2, 9));
        let unlabelled = node(&[], &[("nvidia.com/mig-1g.5gb", "7")], &[]);
        assert_eq!((facts(&unlabelled).gpus, facts(&unlabelled).gpu_shares), (7, 7));
        assert_eq!(facts(&node(&[("nvidia.com/gpu.count", "many")], &[], &[])).gpus, 0);
    }

    #[test]
    fn the_cost_estimate_counts_the_gpus_of_the_nvidia_device_plugin() {
        let gpus = node(&[("node.kubernetes.io/instance-type", "g5.12xlarge")], &[("nvidia.com/gpu", "4")], &[]);
        assert_eq!((facts(&gpus).gpus, facts(&gpus).cores), (4, 0));
        let trn = node(&[("node.kubernetes.io/instance-type", "trn1.32xlarge")], &[], &[]);
        assert_eq!((facts(&trn).gpus, facts(&trn).cores), (0, 32));
        assert_eq!(facts(&node(&[], &[("nvidia.com/gpu", "lots")], &[])).gpus, 0, "an unreadable count is none");
    }
}
