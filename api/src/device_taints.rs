//! The DeviceTaintRules the node agent publishes for the unhealthy Neuron devices and
//! NVIDIA GPUs that Dynamic Resource Allocation manages (`spec.health.deviceTaints`;
//! drivers [`DRIVERS`]): the API's versions
//! and which one is used, what each rule is named and labelled, and what it says. The
//! operator refuses the option where no version is served; the chart's admission policy
//! holds an agent to rules of its own node's devices by the same names.
//!
//! The API (`resource.k8s.io`, KEP 5055): `v1alpha3` in Kubernetes 1.33 to 1.35 (feature
//! gates `DRADeviceTaints`, and from 1.35 `DRADeviceTaintRules`, off by default, and the
//! version enabled with `--runtime-config`), `v1beta2` from 1.36, `v1` from 1.37. The
//! taint effect `None` is accepted from 1.35.

use crate::{
    hardware::{NEURON_DRA_DRIVER, NVIDIA_DRA_DRIVER},
    hash::content_hash,
};

pub const GROUP: &str = "resource.k8s.io";
pub const KIND: &str = "DeviceTaintRule";
pub const PLURAL: &str = "devicetaintrules";
/// The DRA drivers whose devices the agent taints (the chart's admission policy allows
/// these and no other).
pub const DRIVERS: [&str; 2] = [NEURON_DRA_DRIVER, NVIDIA_DRA_DRIVER];
/// The served versions the agent may use, the preferred first.
pub const VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1alpha3"];

/// The taint's key: the one of the agent's node taint, whose value also names the error.
pub const TAINT_KEY: &str = crate::names::TAINT_KEY;
/// The label on every rule of an agent: its node's name, or the name's hash where the
/// name is longer than a label value may be.
pub const NODE_LABEL: &str = "neuronmonitor.io/device-taint-node";
/// The annotation on every rule naming its node in full (what the admission policy reads).
pub const NODE_ANNOTATION: &str = crate::names::NODE_ANNOTATION;
/// The prefix of every rule's name.
const NAME_PREFIX: &str = "neuron-monitor-";

/// The version to use of those that serve DeviceTaintRules, `None` when none does.
pub fn preferred<'a>(served: impl IntoIterator<Item = &'a str>) -> Option<&'static str> {
    let served: Vec<&str> = served.into_iter().collect();
    VERSIONS.into_iter().find(|v| served.contains(v))
}

/// Whether the effect `None` is accepted by an API server serving `version` at
/// Kubernetes minor version `minor` (`None`: unknown, taken as accepting it).
pub fn accepts_inform(version: &str, minor: Option<u32>) -> bool {
    version != "v1alpha3" || minor.is_none_or(|m| m >= 35)
}

/// The minor version of a `/version` answer's `minor` (`"35"`, `"35+"` on EKS).
pub fn minor_version(minor: &str) -> Option<u32> {
    minor.trim_end_matches('+').parse().ok()
}

/// The rule of `device` (its DRA name) on `node`: `neuron-monitor-<node>-<device>`, or,
/// beyond the 253 characters of an object name, its start and a hash of both names.
pub fn rule_name(node: &str, device: &str) -> String {
    let name = format!("{NAME_PREFIX}{node}-{device}");
    if name.len() <= 253 {
        return name;
    }
    let hash = content_hash(format!("{node}/{device}").as_bytes());
    format!("{}-{hash}", name[..253 - hash.len() - 1].trim_end_matches(['.', '-']))
}

/// The value of [`NODE_LABEL`] for `node`.
pub fn node_label(node: &str) -> String {
    if node.len() <= 63 {
        node.to_owned()
    } else {
        content_hash(node.as_bytes())
    }
}

/// A taint value (a label value: at most 63 characters, alphanumeric at both ends, `-`,
/// `_`, `.` between) naming `error`; `None` when the name is not one.
pub fn taint_value(error: &str) -> Option<String> {
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let valid = error.len() <= 63
        && alnum(error.chars().next())
        && alnum(error.chars().last())
        && error.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    valid.then(|| error.to_owned())
}

/// One rule as the agent wants it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub name: String,
    /// One of [`DRIVERS`].
    pub driver: &'static str,
    pub pool: String,
    pub device: String,
    /// The error that made the device unhealthy, when it is a label value.
    pub value: Option<String>,
    pub effect: &'static str,
}

impl Rule {
    /// The object (without `apiVersion`, which the served version gives).
    pub fn object(&self, node: &str) -> serde_json::Value {
        serde_json::json!({
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "labels": { NODE_LABEL: node_label(node) },
                "annotations": { NODE_ANNOTATION: node },
            },
            "spec": {
                "deviceSelector": { "driver": self.driver, "pool": self.pool, "device": self.device },
                "taint": { "key": TAINT_KEY, "value": self.value, "effect": self.effect },
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_served_version_is_used() {
        assert_eq!(preferred(["v1beta1", "v1alpha3"]), Some("v1alpha3"));
        assert_eq!(preferred(["v1alpha3", "v1beta2", "v1"]), Some("v1"));
        assert_eq!(preferred(["v1beta1"]), None, "no DeviceTaintRule there");
        assert!(!accepts_inform("v1alpha3", Some(34)));
        assert!(accepts_inform("v1alpha3", Some(35)));
        assert!(accepts_inform("v1beta2", Some(36)));
        assert_eq!((minor_version("35+"), minor_version("x")), (Some(35), None));
    }

    #[test]
    fn names_are_deterministic_and_stay_valid() {
        assert_eq!(
            rule_name("ip-10-0-1-5.ec2.internal", "neurondevice3"),
            "neuron-monitor-ip-10-0-1-5.ec2.internal-neurondevice3"
        );
        let long = "a".repeat(250);
        let (a, b) = (rule_name(&long, "neurondevice1"), rule_name(&long, "neurondevice2"));
        assert!(a.len() <= 253 && a != b, "{a}");
        assert_eq!(a, rule_name(&long, "neurondevice1"));
        assert_eq!(node_label("ip-10-0-1-5.ec2.internal"), "ip-10-0-1-5.ec2.internal");
        assert_eq!(node_label(&long).len(), 16);
    }

    #[test]
    fn the_taint_names_the_error_when_it_is_a_label_value() {
        assert_eq!(taint_value("DMA_ERROR").as_deref(), Some("DMA_ERROR"));
        assert_eq!(taint_value(&"A".repeat(64)), None);
        assert_eq!(taint_value("_X"), None);
        let rule = Rule {
            name: "n".into(),
            driver: NEURON_DRA_DRIVER,
            pool: "node-a".into(),
            device: "neurondevice0".into(),
            value: Some("DMA_ERROR".into()),
            effect: "NoSchedule",
        };
        let object = rule.object("node-a");
        assert_eq!(object["spec"]["deviceSelector"]["driver"], "neuron.aws.com");
        assert_eq!(object["spec"]["taint"]["key"], TAINT_KEY);
        assert_eq!(object["metadata"]["annotations"][NODE_ANNOTATION], "node-a");
    }
}
