//! Tenancy: what a namespace's configs may do with the node's AWS identity and the
//! cluster's CloudWatch bill, as the cluster operator's policy ([`policy`]) says.
//!
//! A config of a team's namespace may publish only into the CloudWatch namespaces, to
//! the regions and to the OTLP endpoints ([`endpoint`]) its namespace's rules list, and
//! its namespace's configs together only up to the namespace's monthly cost ceiling.
//! Every config, the operator namespace's too, may name only a region of its nodes'
//! partition ([`crate::region`]): the node's identity belongs to that partition, and the
//! account's data to its boundary. The operator's namespace is the cluster operator's:
//! no other rule applies to its configs.
//!
//! A refusal names the field ([`Refusal::OutsidePolicy`], [`Refusal::CostCeiling`]); the
//! operator then keeps the config's last accepted version on its nodes, if that version
//! is within the policy in force.

pub mod endpoint;
pub mod policy;

use std::collections::BTreeMap;

use crate::{
    crd::NeuronMonitorConfigSpec,
    region::{same_partition, Partition},
    validate::{Invalid, Refusal},
};

pub use self::{
    endpoint::Endpoint,
    policy::{PolicyError, PolicySpec, Rules, TenancyPolicy},
};

/// The regions of a config's matched nodes whose region is known (a node label), each
/// with one node in it, for the messages.
pub type NodeRegions = BTreeMap<String, String>;

/// Checks where a config sends its data against its namespace's rules and its nodes'
/// regions. `cluster_wide`: a config of the operator's namespace (only the partition
/// rule applies).
pub fn check_targets(
    spec: &NeuronMonitorConfigSpec,
    namespace: &str,
    cluster_wide: bool,
    rules: &Rules,
    nodes: &NodeRegions,
) -> Result<(), Invalid> {
    let sinks = spec.sinks.as_ref();
    if let Some(cloudwatch) = sinks.and_then(|s| s.cloudwatch.as_ref()) {
        if !cluster_wide && !rules.allows_cloudwatch_namespace(namespace, &cloudwatch.namespace) {
            let allowed: Vec<String> = rules.cloudwatch_patterns(namespace).collect();
            return Err(refuse(
                "spec.sinks.cloudwatch.namespace",
                format!(
                    "{:?} is not a CloudWatch namespace the configs of namespace {namespace} may publish into \
                     (the cluster's tenancy policy allows {})",
                    cloudwatch.namespace,
                    listing(&allowed)
                ),
            ));
        }
        check_region(
            "spec.sinks.cloudwatch.region",
            cloudwatch.region.as_deref(),
            namespace,
            cluster_wide,
            rules,
            nodes,
        )?;
    }
    if let Some(otlp) = sinks.and_then(|s| s.otlp.as_ref()) {
        match &otlp.endpoint {
            // Another receiver: only where the policy lets this namespace send.
            Some(url) if !cluster_wide => {
                let field = "spec.sinks.otlp.endpoint";
                let endpoint = Endpoint::parse(url).map_err(|e| refuse(field, e))?;
                if !rules.allows_endpoint(namespace, &endpoint) {
                    return Err(refuse(
                        field,
                        format!(
                            "{url:?} is not an OTLP endpoint the configs of namespace {namespace} may send to (the \
                             cluster's tenancy policy allows {}; without endpoint, CloudWatch's own)",
                            listing(&rules.otlp_endpoints)
                        ),
                    ));
                }
            }
            Some(_) => {}
            // CloudWatch's OTLP endpoint of a region.
            None => {
                check_region("spec.sinks.otlp.region", otlp.region.as_deref(), namespace, cluster_wide, rules, nodes)?
            }
        }
    }
    if let Some(logs) = spec.health.as_ref().and_then(|h| h.logs.as_ref()) {
        check_region("spec.health.logs.region", logs.region.as_deref(), namespace, cluster_wide, rules, nodes)?;
    }
    Ok(())
}

/// A region a sink names (or, `None`, its node's): in the partition of every node, and
/// for a team one its rules list, if they list any.
fn check_region(
    field: &str,
    region: Option<&str>,
    namespace: &str,
    cluster_wide: bool,
    rules: &Rules,
    nodes: &NodeRegions,
) -> Result<(), Invalid> {
    let listed = rules.regions.as_ref().filter(|_| !cluster_wide);
    let Some(region) = region else {
        // The node's own region: in its partition by definition; listed or not.
        if let Some(listed) = listed {
            if let Some((node_region, node)) = nodes.iter().find(|(r, _)| !listed.contains(*r)) {
                return Err(refuse(
                    field,
                    format!(
                        "is not set, so node {node}'s own region {node_region} would be used, which is not one the \
                         configs of namespace {namespace} may use ({}): name one of them",
                        listing(listed)
                    ),
                ));
            }
        }
        return Ok(());
    };
    if let Some(listed) = listed.filter(|l| !l.contains(region)) {
        return Err(refuse(
            field,
            format!("{region} is not a region the configs of namespace {namespace} may use ({})", listing(listed)),
        ));
    }
    if let Some((node_region, node)) = nodes.iter().find(|(r, _)| !same_partition(r, region)) {
        return Err(refuse(
            field,
            format!(
                "{region} is in AWS partition {}, but node {node} is in {} ({node_region}): its AWS identity belongs \
                 to {} and the data stays there; name a region of {}, or none for the node's own",
                Partition::of(region),
                Partition::of(node_region),
                Partition::of(node_region),
                Partition::of(node_region)
            ),
        ));
    }
    Ok(())
}

fn refuse(field: &str, reason: impl Into<String>) -> Invalid {
    Invalid::of(Refusal::OutsidePolicy, field, reason)
}

/// `none`, or the items quoted and comma-separated.
fn listing<'a>(items: impl IntoIterator<Item = &'a String>) -> String {
    let quoted: Vec<String> = items.into_iter().map(|i| format!("{i:?}")).collect();
    if quoted.is_empty() {
        "none".to_owned()
    } else {
        quoted.join(", ")
    }
}

/// One config of a namespace with a cost ceiling, in the order configs are given room
/// (`ValidConfig::precedes`): what its current version costs a month, and what its last
/// accepted version does, if it has one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Priced {
    pub usd: f64,
    pub last_accepted_usd: Option<f64>,
}

/// Where a config stands within its namespace's ceiling.
#[derive(Clone, Debug, PartialEq)]
pub enum Fit {
    /// Its current version fits.
    Admitted,
    /// Refused; its last accepted version fits and stays on its nodes.
    LastAccepted(Invalid),
    /// Refused, and on no node.
    Refused(Invalid),
}

/// Shares a namespace's monthly ceiling among its configs, given in the order they are
/// given room: each takes its cost from what the configs before it left; one that does
/// not fit is refused (its last accepted version taking its place if that fits), so a
/// new config never displaces an established one and the namespace's newest configs are
/// refused first.
pub fn share_ceiling(namespace: &str, ceiling_usd: f64, configs: &[Priced]) -> Vec<Fit> {
    let mut spent = 0.0;
    configs
        .iter()
        .map(|c| {
            if spent + c.usd <= ceiling_usd {
                spent += c.usd;
                return Fit::Admitted;
            }
            let reason = Invalid::of(
                Refusal::CostCeiling,
                "spec.sinks",
                format!(
                    "its CloudWatch cost, estimated at ${:.2} a month, would take namespace {namespace}'s estimate to \
                     ${:.2}, above its ceiling of ${ceiling_usd:.2} (the configs given room before it, the oldest \
                     first, take ${spent:.2}); see status.estimatedCost for cheaper ways",
                    c.usd,
                    spent + c.usd
                ),
            );
            match c.last_accepted_usd {
                Some(usd) if spent + usd <= ceiling_usd => {
                    spent += usd;
                    Fit::LastAccepted(reason)
                }
                _ => Fit::Refused(reason),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
