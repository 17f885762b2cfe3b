//! `spec.nodeSelector`: a label selector compiled once, matched against every node.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::Invalid;

/// A compiled label selector. No requirement: every node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

/// `In`/`NotIn` values are sorted, for binary search.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    DoesNotExist,
}

impl Selector {
    /// Compiles a label selector with Kubernetes' semantics: every requirement must hold;
    /// an empty selector matches everything. `field` is the selector's path.
    pub fn compile(selector: Option<&LabelSelector>, field: &str) -> Result<Selector, Invalid> {
        let Some(selector) = selector else {
            return Ok(Selector::default());
        };
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            let field = format!("{field}.matchLabels[{key:?}]");
            check_label_key(key).map_err(|reason| Invalid::new(&field, reason))?;
            check_label_value(value).map_err(|reason| Invalid::new(&field, reason))?;
            requirements.push(Requirement { key: key.clone(), op: Op::In(vec![value.clone()]) });
        }
        for (i, expr) in selector.match_expressions.iter().flatten().enumerate() {
            let field = format!("{field}.matchExpressions[{i}]");
            check_label_key(&expr.key).map_err(|reason| Invalid::new(format!("{field}.key"), reason))?;
            let values = expr.values.as_deref().unwrap_or_default();
            for (j, value) in values.iter().enumerate() {
                check_label_value(value).map_err(|reason| Invalid::new(format!("{field}.values[{j}]"), reason))?;
            }
            let mut sorted = values.to_vec();
            sorted.sort_unstable();
            sorted.dedup();
            let op = match expr.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(Invalid::new(
                        format!("{field}.values"),
                        format!("must not be empty for operator {}", expr.operator),
                    ))
                }
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(Invalid::new(
                        format!("{field}.values"),
                        format!("must be empty for operator {}", expr.operator),
                    ))
                }
                "In" => Op::In(sorted),
                "NotIn" => Op::NotIn(sorted),
                "Exists" => Op::Exists,
                "DoesNotExist" => Op::DoesNotExist,
                other => {
                    return Err(Invalid::new(
                        format!("{field}.operator"),
                        format!("unknown operator {other:?}; use In, NotIn, Exists or DoesNotExist"),
                    ))
                }
            };
            requirements.push(Requirement { key: expr.key.clone(), op });
        }
        Ok(Selector { requirements })
    }

    /// True when the selector matches every node (no requirement).
    pub fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| {
            let value = labels.get(r.key.as_str());
            match &r.op {
                Op::In(values) => value.is_some_and(|v| values.binary_search(v).is_ok()),
                Op::NotIn(values) => value.is_none_or(|v| values.binary_search(v).is_err()),
                Op::Exists => value.is_some(),
                Op::DoesNotExist => value.is_none(),
            }
        })
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric).
pub(super) fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let labels_ok = prefix.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
        if prefix.len() > 253 || !labels_ok {
            return Err(format!("{key:?}: the prefix must be a DNS subdomain such as example.com"));
        }
    }
    if name.is_empty() || !is_label_name(name) {
        return Err(format!(
            "{key:?} is not a label key (a name of at most 63 alphanumerics, '-', '_' or '.', \
             starting and ending alphanumeric, with an optional DNS-subdomain prefix and '/')"
        ));
    }
    Ok(())
}

pub(super) fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || is_label_name(value) {
        Ok(())
    } else {
        Err(format!(
            "{value:?} is not a label value (at most 63 alphanumerics, '-', '_' or '.', \
             starting and ending alphanumeric)"
        ))
    }
}

pub(super) fn is_label_name(s: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    s.len() <= 63
        && s.starts_with(alnum)
        && s.ends_with(alnum)
        && s.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.'))
}
