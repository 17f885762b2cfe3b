//! The tenancy policy as the cluster operator writes it (YAML in a ConfigMap the chart
//! renders from its `tenancy` values), and compiled: per Kubernetes namespace, the
//! CloudWatch namespaces, regions and OTLP endpoints its configs may use, and its
//! monthly cost ceiling.
//!
//! ```yaml
//! default:                                  # every namespace no override matches
//!   cloudWatchNamespaces: ["Teams/{namespace}/*"]
//!   regions: []                             # absent or empty: any region of the node's partition
//!   otlpEndpoints: []                       # none: CloudWatch's own OTLP endpoint only
//!   monthlyCostCeilingUsd: 500              # absent or null: none
//! overrides:                                # the first that matches a namespace applies
//! - namespaces: [ml-platform]
//!   namespaceSelector: { matchLabels: { tier: platform } }
//!   otlpEndpoints: ["http://otel-collector.observability:4318/v1/metrics"]
//!   monthlyCostCeilingUsd: null             # none, whatever the default says
//! ```
//!
//! An override's field left out takes the `default` section's; a `default` field left
//! out takes the built-in value above (no ceiling). `{namespace}` stands for the
//! config's Kubernetes namespace; a CloudWatch pattern ending with `*` admits any
//! suffix, otherwise only itself. Every field is checked when the policy is read, and
//! an unknown field is an error (a misspelt rule must not silently allow everything).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::{Deserialize, Deserializer};

use super::endpoint::{self, Endpoint};
use crate::{region::valid_region, validate::Selector};

/// The placeholder for the config's namespace in patterns and endpoints.
pub const NAMESPACE_PLACEHOLDER: &str = "{namespace}";
/// The CloudWatch namespaces of a team when the policy says nothing.
pub const DEFAULT_CLOUDWATCH_NAMESPACES: [&str; 1] = ["Teams/{namespace}/*"];
/// Overrides a policy may have; entries of one list.
const MAX_OVERRIDES: usize = 256;
const MAX_ENTRIES: usize = 64;

/// The policy as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PolicySpec {
    #[serde(default)]
    pub default: RulesSpec,
    #[serde(default)]
    pub overrides: Vec<OverrideSpec>,
}

/// Rules as written; a field left out is inherited.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RulesSpec {
    pub cloud_watch_namespaces: Option<Vec<String>>,
    pub regions: Option<Vec<String>>,
    pub otlp_endpoints: Option<Vec<String>>,
    /// Absent: inherited; `null`: no ceiling.
    #[serde(default, deserialize_with = "present")]
    pub monthly_cost_ceiling_usd: Option<Option<f64>>,
}

/// An override: which namespaces (by name, or by a selector on their labels) and the
/// rules that differ for them.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OverrideSpec {
    #[serde(default)]
    pub namespaces: Vec<String>,
    pub namespace_selector: Option<LabelSelector>,
    pub cloud_watch_namespaces: Option<Vec<String>>,
    pub regions: Option<Vec<String>>,
    pub otlp_endpoints: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    pub monthly_cost_ceiling_usd: Option<Option<f64>>,
}

/// A field that is present, `null` included: `Some(None)` for `null`.
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<f64>>, D::Error> {
    Option::<f64>::deserialize(d).map(Some)
}

/// A policy field that is not valid: its path (`overrides[1].regions[0]`) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct PolicyError {
    pub field: String,
    pub reason: String,
}

fn error(field: impl Into<String>, reason: impl Into<String>) -> PolicyError {
    PolicyError { field: field.into(), reason: reason.into() }
}

/// What the configs of one namespace may do.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    pub cloudwatch_namespaces: Vec<String>,
    /// `None`: any region of the node's partition.
    pub regions: Option<BTreeSet<String>>,
    /// Allow-list entries (URLs, `{namespace}` in them), each checked to parse.
    pub otlp_endpoints: Vec<String>,
    pub monthly_cost_ceiling_usd: Option<f64>,
}

impl Rules {
    /// The CloudWatch namespace patterns of `namespace`, placeholder replaced.
    pub fn cloudwatch_patterns(&self, namespace: &str) -> impl Iterator<Item = String> + '_ {
        let namespace = namespace.to_owned();
        self.cloudwatch_namespaces.iter().map(move |p| p.replace(NAMESPACE_PLACEHOLDER, &namespace))
    }

    /// Whether `namespace`'s configs may publish into the CloudWatch namespace `target`.
    pub fn allows_cloudwatch_namespace(&self, namespace: &str, target: &str) -> bool {
        self.cloudwatch_patterns(namespace).any(|p| match p.strip_suffix('*') {
            Some(prefix) => target.starts_with(prefix),
            None => target == p,
        })
    }

    /// Whether `namespace`'s configs may send OTLP to `candidate` (parsed).
    pub fn allows_endpoint(&self, namespace: &str, candidate: &Endpoint) -> bool {
        self.otlp_endpoints.iter().any(|entry| {
            endpoint::parse_entry(&entry.replace(NAMESPACE_PLACEHOLDER, namespace))
                .is_ok_and(|e| endpoint::admits(&e, candidate))
        })
    }
}

/// An override, compiled.
#[derive(Clone, Debug, PartialEq)]
struct Override {
    namespaces: BTreeSet<String>,
    selector: Option<Selector>,
    rules: Rules,
}

/// The compiled policy.
#[derive(Clone, Debug, PartialEq)]
pub struct TenancyPolicy {
    default: Rules,
    overrides: Vec<Override>,
}

impl Default for TenancyPolicy {
    /// The built-in policy: what is in force without a policy, or until a valid one is read.
    fn default() -> Self {
        match TenancyPolicy::compile(&PolicySpec::default()) {
            Ok(policy) => policy,
            // The built-in values are valid (a unit test compiles them).
            Err(_) => TenancyPolicy {
                default: Rules {
                    cloudwatch_namespaces: Vec::new(),
                    regions: None,
                    otlp_endpoints: Vec::new(),
                    monthly_cost_ceiling_usd: None,
                },
                overrides: Vec::new(),
            },
        }
    }
}

impl TenancyPolicy {
    /// Checks every field and compiles the policy.
    pub fn compile(spec: &PolicySpec) -> Result<TenancyPolicy, PolicyError> {
        let built_in = Rules {
            cloudwatch_namespaces: DEFAULT_CLOUDWATCH_NAMESPACES.map(str::to_owned).to_vec(),
            regions: None,
            otlp_endpoints: Vec::new(),
            monthly_cost_ceiling_usd: None,
        };
        let d = &spec.default;
        let default = rules(
            "default",
            &built_in,
            d.cloud_watch_namespaces.as_deref(),
            d.regions.as_deref(),
            d.otlp_endpoints.as_deref(),
            d.monthly_cost_ceiling_usd,
        )?;
        if spec.overrides.len() > MAX_OVERRIDES {
            return Err(error("overrides", format!("at most {MAX_OVERRIDES} overrides")));
        }
        let mut overrides = Vec::with_capacity(spec.overrides.len());
        for (i, o) in spec.overrides.iter().enumerate() {
            let field = format!("overrides[{i}]");
            if o.namespaces.is_empty() && o.namespace_selector.is_none() {
                return Err(error(&field, "names no namespace: give namespaces, a namespaceSelector or both"));
            }
            check_count(&o.namespaces, &format!("{field}.namespaces"))?;
            for (j, ns) in o.namespaces.iter().enumerate() {
                if !is_dns_label(ns) {
                    return Err(error(format!("{field}.namespaces[{j}]"), format!("{ns:?} is not a namespace name")));
                }
            }
            let selector = match &o.namespace_selector {
                Some(s) => Some(
                    Selector::compile(Some(s), &format!("{field}.namespaceSelector"))
                        .map_err(|e| error(e.field, e.reason))?,
                ),
                None => None,
            };
            let rules = rules(
                &field,
                &default,
                o.cloud_watch_namespaces.as_deref(),
                o.regions.as_deref(),
                o.otlp_endpoints.as_deref(),
                o.monthly_cost_ceiling_usd,
            )?;
            overrides.push(Override { namespaces: o.namespaces.iter().cloned().collect(), selector, rules });
        }
        Ok(TenancyPolicy { default, overrides })
    }

    /// The rules of a namespace with these labels: the first override that names it or
    /// whose selector matches its labels, else the default.
    pub fn rules_for(&self, namespace: &str, labels: &BTreeMap<String, String>) -> &Rules {
        self.overrides
            .iter()
            .find(|o| o.namespaces.contains(namespace) || o.selector.as_ref().is_some_and(|s| s.matches(labels)))
            .map_or(&self.default, |o| &o.rules)
    }
}

/// Rules from their written fields, each left out taken from `inherited`.
fn rules(
    field: &str,
    inherited: &Rules,
    cloudwatch_namespaces: Option<&[String]>,
    regions: Option<&[String]>,
    otlp_endpoints: Option<&[String]>,
    ceiling: Option<Option<f64>>,
) -> Result<Rules, PolicyError> {
    let mut out = inherited.clone();
    if let Some(patterns) = cloudwatch_namespaces {
        let field = format!("{field}.cloudWatchNamespaces");
        check_count(patterns, &field)?;
        for (i, p) in patterns.iter().enumerate() {
            check_pattern(p).map_err(|reason| error(format!("{field}[{i}]"), reason))?;
        }
        out.cloudwatch_namespaces = patterns.to_vec();
    }
    if let Some(regions) = regions {
        let field = format!("{field}.regions");
        check_count(regions, &field)?;
        for (i, r) in regions.iter().enumerate() {
            if !valid_region(r) {
                return Err(error(
                    format!("{field}[{i}]"),
                    format!("{r:?} is not an AWS region name such as us-east-1"),
                ));
            }
        }
        out.regions = (!regions.is_empty()).then(|| regions.iter().cloned().collect());
    }
    if let Some(endpoints) = otlp_endpoints {
        let field = format!("{field}.otlpEndpoints");
        check_count(endpoints, &field)?;
        for (i, e) in endpoints.iter().enumerate() {
            // Checked with a namespace of the longest name in place of the placeholder.
            endpoint::parse_entry(&e.replace(NAMESPACE_PLACEHOLDER, &"n".repeat(63)))
                .map_err(|reason| error(format!("{field}[{i}]"), reason))?;
        }
        out.otlp_endpoints = endpoints.to_vec();
    }
    if let Some(ceiling) = ceiling {
        if let Some(usd) = ceiling.filter(|usd| !usd.is_finite() || *usd < 0.0) {
            return Err(error(format!("{field}.monthlyCostCeilingUsd"), format!("{usd} is not an amount of dollars")));
        }
        out.monthly_cost_ceiling_usd = ceiling;
    }
    Ok(out)
}

fn check_count<T>(items: &[T], field: &str) -> Result<(), PolicyError> {
    if items.len() > MAX_ENTRIES {
        return Err(error(field, format!("at most {MAX_ENTRIES} entries")));
    }
    Ok(())
}

/// A CloudWatch namespace pattern: CloudWatch's characters and `{namespace}`, with an
/// optional `*` at the end. Between the last placeholder and a `*` there must be a
/// character no namespace name has (`/`, `.`, …): with `Teams/{namespace}-*`, team `a`
/// would also write into the namespaces of team `a-b`.
fn check_pattern(pattern: &str) -> Result<(), String> {
    let body = pattern.strip_suffix('*').unwrap_or(pattern);
    if body.contains('*') {
        return Err(format!("{pattern:?}: * is taken at the end only"));
    }
    let after_last = body.rsplit_once(NAMESPACE_PLACEHOLDER).map(|(_, tail)| tail);
    if pattern.ends_with('*')
        && after_last
            .is_some_and(|tail| tail.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'))
    {
        return Err(format!(
            "{pattern:?}: between {NAMESPACE_PLACEHOLDER} and * there must be a character no namespace name has \
             (such as /), or namespace a could write into namespace a-b's: e.g. Teams/{NAMESPACE_PLACEHOLDER}/*"
        ));
    }
    let literal = body.replace(NAMESPACE_PLACEHOLDER, "n");
    let valid = literal.len() <= 255
        && !literal.starts_with("AWS/")
        && literal.chars().all(|c| c.is_ascii_alphanumeric() || "._/#: -".contains(c));
    if !valid || (literal.is_empty() && !pattern.ends_with('*')) {
        return Err(format!(
            "{pattern:?} is not a CloudWatch namespace pattern (A-Z a-z 0-9 . _ / # : - and space, \
             {NAMESPACE_PLACEHOLDER}, * at the end; not AWS/)"
        ));
    }
    Ok(())
}

/// A Kubernetes namespace name (an RFC 1123 label).
fn is_dns_label(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}
