//! The instance identity of a Kubernetes node from its own Node object, for a node that
//! has no report to take it from (GPUs and no Neuron device: no neuron-monitor): the
//! instance id and zone of `spec.providerID` (`aws:///<zone>/<instance-id>`), the
//! instance type and region of the well-known labels. Read once, through
//! `nodes/status` (the `get` the health condition already uses); a report's identity
//! wins field by field ([`crate::state::NodeState::set_node_instance`]).

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use api::{
    hardware::{INSTANCE_TYPE_LABELS, ZONE_LABELS},
    region::REGION_LABELS,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::state::{InstanceLabels, NodeState};

/// The AWS cloud provider's `spec.providerID` prefix.
const AWS_PROVIDER: &str = "aws:///";
/// Bytes of a value read (an instance type, region, zone or provider id is far shorter).
const MAX_VALUE_BYTES: usize = 128;
/// The wait between failed reads (the Node may not be readable yet).
const RETRY: Duration = Duration::from_secs(10);

/// `text` where it is at most 64 bytes of `[a-z0-9.-]` starting with a letter or digit.
fn token(text: &str) -> Option<&str> {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-';
    let first = text.bytes().next()?;
    (text.len() <= 64 && first.is_ascii_alphanumeric() && text.bytes().all(ok)).then_some(text)
}

/// `i-` and 8 or 17 hex digits.
fn instance_id(text: &str) -> Option<&str> {
    let hex = text.strip_prefix("i-")?;
    let ok = matches!(hex.len(), 8 | 17) && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    ok.then_some(text)
}

/// Zone and instance id of an AWS provider id (`aws:///us-west-2a/i-0abc…`).
fn provider_id(text: &str) -> Option<(&str, &str)> {
    let rest = text.strip_prefix(AWS_PROVIDER).filter(|_| text.len() <= MAX_VALUE_BYTES)?;
    let (zone, id) = rest.split_once('/')?;
    Some((token(zone)?, instance_id(id)?))
}

/// The identity the Node gives; `None` where it gives none (not an AWS node, values
/// that are no instance id, type, region or zone).
pub fn instance_from_node(node: &Node) -> Option<InstanceLabels> {
    let labels = node.metadata.labels.as_ref();
    // The first of a name's labels that is set decides (an invalid value is no value).
    let label = |keys: &[&str]| {
        let value = keys.iter().find_map(|key| labels.and_then(|l| l.get(*key)))?;
        token(value).map(str::to_owned)
    };
    let provider = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).and_then(provider_id);
    let identity = InstanceLabels {
        instance_id: provider.map(|(_, id)| id.to_owned()).unwrap_or_default(),
        instance_type: label(&INSTANCE_TYPE_LABELS).unwrap_or_default(),
        availability_zone: label(&ZONE_LABELS)
            .or_else(|| provider.map(|(zone, _)| zone.to_owned()))
            .unwrap_or_default(),
        region: label(&REGION_LABELS).unwrap_or_default(),
        ..InstanceLabels::default()
    };
    (identity != InstanceLabels::default()).then_some(identity)
}

/// Reads the Node's identity into the node state once, retrying until it is read.
pub struct NodeIdentity {
    pub client: Client,
    pub node: String,
    pub state: Arc<Mutex<NodeState>>,
}

impl NodeIdentity {
    /// Runs until `shutdown` (a critical task must not end before it).
    pub async fn run(self, shutdown: CancellationToken) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        loop {
            match nodes.get_status(&self.node).await {
                Ok(node) => {
                    self.take(&node);
                    break;
                }
                Err(e) => {
                    warn!(node = %self.node, error = %e, "cannot read the Node for its instance identity; retrying")
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(RETRY) => {}
            }
        }
        shutdown.cancelled().await
    }

    fn take(&self, node: &Node) {
        let Some(identity) = instance_from_node(node) else {
            info!(node = %self.node, "the Node names no AWS instance; the instance labels come from reports only");
            return;
        };
        info!(node = %self.node, instance_id = %identity.instance_id, instance_type = %identity.instance_type,
              "the Node's instance identity, where reports give none");
        self.state.lock().unwrap_or_else(|p| p.into_inner()).set_node_instance(identity);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(provider: Option<&str>, labels: serde_json::Value) -> Node {
        serde_json::from_value(json!({"metadata": {"name": "n", "labels": labels}, "spec": {"providerID": provider}}))
            .unwrap()
    }

    #[test]
    fn an_eks_node_names_its_instance() {
        let labels = json!({INSTANCE_TYPE_LABELS[0]: "g5.12xlarge", REGION_LABELS[0]: "us-west-2", ZONE_LABELS[0]: "us-west-2b"});
        let identity = instance_from_node(&node(Some("aws:///us-west-2b/i-0123456789abcdef0"), labels)).unwrap();
        assert_eq!(
            identity,
            InstanceLabels {
                instance_id: "i-0123456789abcdef0".into(),
                instance_type: "g5.12xlarge".into(),
                availability_zone: "us-west-2b".into(),
                region: "us-west-2".into(),
                ..InstanceLabels::default()
            }
        );
        // The legacy labels where the current ones are absent.
        let legacy = json!({INSTANCE_TYPE_LABELS[1]: "p4d.24xlarge", REGION_LABELS[1]: "us-east-1"});
        let identity = instance_from_node(&node(None, legacy)).unwrap();
        assert_eq!((identity.instance_type.as_str(), identity.region.as_str()), ("p4d.24xlarge", "us-east-1"));
        // The zone of the provider id where no label gives it; the short ids of old.
        let identity = instance_from_node(&node(Some("aws:///eu-west-1a/i-0abc1234"), json!({}))).unwrap();
        assert_eq!((identity.instance_id.as_str(), identity.availability_zone.as_str()), ("i-0abc1234", "eu-west-1a"));
    }

    #[test]
    fn values_that_are_no_identity_are_left_out() {
        let long = format!("aws:///us-west-2b/i-{}", "0".repeat(200));
        for provider in [
            "gce://project/zone/name",
            "aws:///us-west-2b/",
            "aws:///us-west-2b/i-XYZ12345",
            "aws:///us-west-2b/i-0123",
            "aws:///us west/i-0123456789abcdef0",
            "aws:///us-west-2b/i-0123456789abcdef0/x",
            "aws://us-west-2b/i-0123456789abcdef0",
            &long,
        ] {
            assert_eq!(instance_from_node(&node(Some(provider), json!({}))), None, "{provider}");
        }
        let hostile = json!({INSTANCE_TYPE_LABELS[0]: "g5\n.x", REGION_LABELS[0]: "é", ZONE_LABELS[0]: "x".repeat(65)});
        assert_eq!(instance_from_node(&node(None, hostile)), None);
        assert_eq!(instance_from_node(&node(None, json!({}))), None);
    }
}
