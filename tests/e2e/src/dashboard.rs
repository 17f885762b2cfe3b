//! The chart's Grafana dashboard (`charts/neuron-monitor/files/dashboard.json`) as the
//! tests query it: every panel's PromQL and every variable's selector, with the
//! variables replaced by values that select everything.

use std::collections::BTreeSet;

use serde_json::Value;

use crate::repo_root;

/// The dashboard's JSON.
pub fn load() -> Value {
    let path = repo_root().join("charts/neuron-monitor/files/dashboard.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// (panel title or `variable <name>`, PromQL) of every query target, and of every
/// `label_values(<selector>, label)` variable its selector; as written (see [`expand`]).
pub fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let (Some(title), Some(expr)) = (panel["title"].as_str(), target["expr"].as_str()) {
                queries.push((title.to_owned(), expr.to_owned()));
            }
        }
    }
    for var in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"].as_str().unwrap_or_default();
        let selector = query.strip_prefix("label_values(").and_then(|r| r.rsplit_once(',')).map(|(s, _)| s);
        let selector = selector.unwrap_or_else(|| panic!("variable {}: not label_values(…): {query}", var["name"]));
        queries.push((format!("variable {}", var["name"].as_str().unwrap_or_default()), selector.to_owned()));
    }
    queries
}

/// The families only an agent whose kubelet says what can be allocated serves: the
/// queries reading them are answered by node-agent's attribution tests (a test kubelet),
/// not by the chart test's agents, which run without Kubernetes.
pub const KUBELET_METRICS: [&str; 3] =
    ["neuron_node_neuroncores", "neuron_node_neuron_devices", "neuron_device_neuroncores"];

/// Whether a query reads one of [`KUBELET_METRICS`].
pub fn needs_kubelet(promql: &str) -> bool {
    metric_names(promql).iter().any(|m| KUBELET_METRICS.contains(&m.as_str()))
}

/// Replaces the dashboard's variables with values that select everything.
pub fn expand(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__interval", "5s")
        .replace("$__range", "5m")
        .replace("$instance_type", ".*")
        .replace("$namespace", ".*")
        .replace("$pod", ".*")
}

/// Metric names selected in a PromQL expression: identifiers followed by `{`.
pub fn metric_names(promql: &str) -> BTreeSet<String> {
    let bytes = promql.as_bytes();
    let mut names = BTreeSet::new();
    for (i, _) in promql.match_indices('{') {
        let start =
            promql[..i].rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')).map_or(0, |p| p + 1);
        if start < i && !bytes[start].is_ascii_digit() {
            names.insert(promql[start..i].to_owned());
        }
    }
    names
}
