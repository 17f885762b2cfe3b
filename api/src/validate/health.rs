//! `spec.health`: the hardware-health settings a config of the operator's namespace gives
//! its nodes, checked and resolved into the rendered [`NodeHealth`].

use std::collections::BTreeSet;

use crate::crd::{FaultThresholdSpec, HealthSpec, KUBELET_CONDITION_TYPES};
use crate::duration::Period;
use crate::limits::{MAX_ERROR_NAME_BYTES, MAX_FAULT_THRESHOLDS, MAX_TAINT_ERRORS, MAX_THRESHOLD_COUNT};
use crate::node_config::{
    FaultThreshold, LogDestination, NodeDeviceTaints, NodeHealth, NodeTaint, DEFAULT_LOG_GROUP, STATE_ERRORS,
};
use crate::{cloudwatch::logs::check_log_group, region::valid_region};

use super::{ConfigKey, Invalid};

/// Bounds of `kmsgLookBack` and of a threshold's `window` (the schema's CEL rule says the
/// same).
const MIN_LOOK_BACK: Period = Period::from_secs(1);
const MAX_LOOK_BACK: Period = Period::from_secs(24 * 3600);
pub const MIN_THRESHOLD_WINDOW: Period = MIN_LOOK_BACK;
pub const MAX_THRESHOLD_WINDOW: Period = MAX_LOOK_BACK;

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
    let device_taints = spec
        .device_taints
        .as_ref()
        .filter(|d| d.enabled == Some(true))
        .map(|d| NodeDeviceTaints { effect: d.effect.unwrap_or_default() });
    let thresholds = thresholds(spec.thresholds.as_deref().unwrap_or_default())?;
    Ok(Some(NodeHealth {
        config: key.to_string(),
        condition_type: spec.condition_type.clone(),
        taint,
        kmsg_look_back,
        logs,
        device_taints,
        thresholds,
    }))
}

/// The fault thresholds, sorted by error name: each name once, never a state's, a count
/// from 1 to [`MAX_THRESHOLD_COUNT`], a window from 1s to 24h.
fn thresholds(specs: &[FaultThresholdSpec]) -> Result<Vec<FaultThreshold>, Invalid> {
    let field = "spec.health.thresholds";
    if specs.len() > MAX_FAULT_THRESHOLDS {
        return Err(Invalid::new(field, format!("at most {MAX_FAULT_THRESHOLDS} thresholds")));
    }
    let mut out: Vec<FaultThreshold> = Vec::with_capacity(specs.len());
    for (i, spec) in specs.iter().enumerate() {
        let at = |part: &str| format!("{field}[{i}].{part}");
        check_error_name(&spec.error).map_err(|reason| Invalid::new(at("error"), reason))?;
        if STATE_ERRORS.contains(&spec.error.as_str()) {
            let reason = "is a state, not an error that occurs: it turns the device unhealthy while it lasts";
            return Err(Invalid::new(at("error"), reason));
        }
        if out.iter().any(|t| t.error == spec.error) {
            return Err(Invalid::new(at("error"), format!("{} has a threshold already", spec.error)));
        }
        if !(1..=MAX_THRESHOLD_COUNT).contains(&spec.count) {
            return Err(Invalid::new(at("count"), format!("must be from 1 to {MAX_THRESHOLD_COUNT}")));
        }
        let range = "must be a duration from 1s to 24h, such as 10m";
        let window: Period = spec.window.parse().map_err(|e| Invalid::new(at("window"), format!("{e}; {range}")))?;
        if !(MIN_THRESHOLD_WINDOW..=MAX_THRESHOLD_WINDOW).contains(&window) {
            return Err(Invalid::new(at("window"), format!("{:?} {range}", spec.window)));
        }
        out.push(FaultThreshold { error: spec.error.clone(), count: spec.count, window });
    }
    out.sort_by(|a, b| a.error.cmp(&b.error));
    Ok(out)
}

/// An error name: A-Z, 0-9 and `_`, starting with a letter, at most [`MAX_ERROR_NAME_BYTES`].
pub fn check_error_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let valid = name.len() <= MAX_ERROR_NAME_BYTES
        && chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_');
    if valid {
        Ok(())
    } else {
        Err(format!("is not an error name (A-Z, 0-9 and _, starting with a letter, at most {MAX_ERROR_NAME_BYTES})"))
    }
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
        check_error_name(name).map_err(|reason| Invalid::new(format!("{field}[{i}]"), reason))?;
        if !out.insert(name.clone()) {
            return Err(Invalid::new(format!("{field}[{i}]"), format!("{name} is listed twice")));
        }
    }
    Ok(out.into_iter().collect())
}
