//! `spec.health`: the hardware-health settings a config of the operator's namespace gives
//! its nodes, checked and resolved into the rendered [`NodeHealth`].

use std::collections::BTreeSet;

use crate::crd::{HealthSpec, KUBELET_CONDITION_TYPES};
use crate::duration::Period;
use crate::limits::{MAX_ERROR_NAME_BYTES, MAX_TAINT_ERRORS};
use crate::node_config::{LogDestination, NodeHealth, NodeTaint, DEFAULT_LOG_GROUP};
use crate::{cloudwatch::logs::check_log_group, region::valid_region};

use super::{ConfigKey, Invalid};

/// Bounds of `kmsgLookBack` (the schema's CEL rule says the same).
const MIN_LOOK_BACK: Period = Period::from_secs(1);
const MAX_LOOK_BACK: Period = Period::from_secs(24 * 3600);

/// Checks `spec.health` and resolves it for the nodes. `cluster_wide`: the config is in
/// the operator's namespace, the only one whose configs may set it.
pub(super) fn node_health(
    spec: Option<&HealthSpec>,
    key: &ConfigKey,
    cluster_wide: bool,
    operator_namespace: &str,
) -> Result<Option<NodeHealth>, Invalid> {
    let Some(spec) = spec else { return Ok(None) };
    if !cluster_wide {
        return Err(Invalid::new(
            "spec.health",
            format!(
                "only configs in the operator's namespace ({operator_namespace}) may set the nodes' health settings"
            ),
        ));
    }
    if let Some(condition_type) = &spec.condition_type {
        check_condition_type(condition_type).map_err(|reason| Invalid::new("spec.health.conditionType", reason))?;
    }
    let taint = match &spec.taint {
        Some(taint) if taint.enabled == Some(true) => Some(match &taint.errors {
            Some(errors) => NodeTaint { errors: taint_errors(errors)? },
            None => NodeTaint::default(),
        }),
        Some(taint) => {
            // Checked even while off, so that turning it on cannot fail later.
            if let Some(errors) = &taint.errors {
                taint_errors(errors)?;
            }
            None
        }
        None => None,
    };
    let kmsg_look_back = match spec.kmsg_look_back.as_deref() {
        None => None,
        Some(value) => {
            let field = "spec.health.kmsgLookBack";
            let range = "must be a duration from 1s to 24h, such as 5m";
            let period: Period = value.parse().map_err(|e| Invalid::new(field, format!("{e}; {range}")))?;
            if !(MIN_LOOK_BACK..=MAX_LOOK_BACK).contains(&period) {
                return Err(Invalid::new(field, format!("{value:?} {range}")));
            }
            Some(period)
        }
    };
    let logs = match &spec.logs {
        None => None,
        Some(logs) => {
            let group = logs.group.clone().unwrap_or_else(|| DEFAULT_LOG_GROUP.to_owned());
            check_log_group(&group).map_err(|reason| Invalid::new("spec.health.logs.group", reason))?;
            if let Some(region) = logs.region.as_deref().filter(|r| !valid_region(r)) {
                let reason = format!("{region:?} is not an AWS region name such as us-east-1");
                return Err(Invalid::new("spec.health.logs.region", reason));
            }
            Some(LogDestination { group, region: logs.region.clone() })
        }
    };
    Ok(Some(NodeHealth {
        config: key.to_string(),
        condition_type: spec.condition_type.clone(),
        taint,
        kmsg_look_back,
        logs,
    }))
}

/// A Node condition type the health condition may take: an optional DNS-subdomain
/// prefix and `/`, then a name of at most 63 letters, digits, `-`, `_`, `.`, starting
/// and ending with a letter or digit; never one the kubelet writes (the agent would
/// overwrite `Ready`). The agent's `--health-condition-type` obeys the same rule.
pub fn check_condition_type(value: &str) -> Result<(), String> {
    const RULE: &str =
        "is an optional DNS-subdomain prefix and '/', then at most 63 letters, digits, '-', '_' or '.', \
                        starting and ending with a letter or digit";
    let (prefix, name) = match value.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, value),
    };
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && alnum(name.chars().next())
        && alnum(name.chars().last())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    });
    if !(name_ok && prefix_ok) {
        return Err(RULE.to_owned());
    }
    if KUBELET_CONDITION_TYPES.contains(&value) {
        return Err(format!("{value} is a condition the kubelet writes"));
    }
    Ok(())
}

/// The error names that taint: sorted, each once, each an upper-case name.
fn taint_errors(errors: &[String]) -> Result<Vec<String>, Invalid> {
    let field = "spec.health.taint.errors";
    if errors.is_empty() {
        return Err(Invalid::new(field, "lists no error name: leave it out for the default (the fatal errors)"));
    }
    if errors.len() > MAX_TAINT_ERRORS {
        return Err(Invalid::new(field, format!("at most {MAX_TAINT_ERRORS} error names")));
    }
    let mut out = BTreeSet::new();
    for (i, name) in errors.iter().enumerate() {
        let mut chars = name.chars();
        let valid = name.len() <= MAX_ERROR_NAME_BYTES
            && chars.next().is_some_and(|c| c.is_ascii_uppercase())
            && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(Invalid::new(
                format!("{field}[{i}]"),
                format!(
                    "is not an error name (A-Z, 0-9 and _, starting with a letter, at most {MAX_ERROR_NAME_BYTES})"
                ),
            ));
        }
        if !out.insert(name.clone()) {
            return Err(Invalid::new(format!("{field}[{i}]"), format!("{name} is listed twice")));
        }
    }
    Ok(out.into_iter().collect())
}
