//! The Helm chart (charts/neuron-monitor) as the tests render and run it: helm with its
//! state in the target directory, the rendered objects, and a container's args and
//! environment as the binaries get them.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

use serde::Deserialize;
use serde_norway::Value;

use crate::{repo_root, tool};

/// charts/neuron-monitor.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/neuron-monitor")
}

/// Runs `command` to its end: (success, stdout, stderr).
pub fn run(mut command: Command) -> (bool, String, String) {
    let out =
        command.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("running {:?}: {e}", command.get_program()));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// helm, with its configuration and caches in the target directory rather than the
/// user's home.
pub fn helm(args: &[&str]) -> (bool, String, String) {
    static HOME: OnceLock<PathBuf> = OnceLock::new();
    let home = HOME.get_or_init(|| {
        // <target>/<profile>/deps/<test binary> → <target>/<profile>/helm-home
        let exe = std::env::current_exe().expect("the test executable's path");
        let dir = exe.parent().and_then(Path::parent).expect("target/<profile>").join("helm-home");
        std::fs::create_dir_all(&dir).expect("helm home");
        dir
    });
    let mut command = Command::new(tool("helm"));
    command
        .args(args)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    run(command)
}

/// `helm template` of the chart as `release` in `namespace`; panics with helm's message
/// when it fails.
pub fn template_as(release: &str, namespace: &str, values: Option<&Path>, extra: &[&str]) -> String {
    let chart = chart_dir();
    let mut args = vec!["template", release, chart.to_str().unwrap(), "--namespace", namespace];
    let values = values.map(|v| v.display().to_string());
    if let Some(v) = &values {
        args.extend(["--values", v]);
    }
    args.extend_from_slice(extra);
    let (ok, out, err) = helm(&args);
    assert!(ok, "helm {}: {err}", args.join(" "));
    out
}

/// The objects of a multi-document YAML text.
pub fn documents(yaml: &str) -> Vec<Value> {
    serde_norway::Deserializer::from_str(yaml)
        .map(|d| Value::deserialize(d).expect("rendered YAML parses"))
        .filter(|v| !v.is_null())
        .collect()
}

pub fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

pub fn find<'a>(docs: &'a [Value], k: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| kind(d) == k).collect()
}

/// The one object of kind `k`.
pub fn one<'a>(docs: &'a [Value], k: &str) -> &'a Value {
    match find(docs, k).as_slice() {
        [d] => d,
        other => panic!("expected one {k}, found {}", other.len()),
    }
}

/// A sequence of strings.
pub fn strings(v: &Value) -> Vec<String> {
    v.as_sequence().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_owned)).collect()
}

/// Container args of the chart with some flags' values replaced (the chart's own are
/// paths inside the pod); every other flag is passed as rendered, so that a flag the
/// binary does not know fails the test.
pub fn chart_args(container: &Value, replace: &[(&str, String)]) -> Vec<String> {
    strings(&container["args"])
        .into_iter()
        .map(|arg| {
            for (flag, value) in replace {
                if arg == *flag || arg.starts_with(&format!("{flag}=")) {
                    return format!("{flag}={value}");
                }
            }
            arg
        })
        .collect()
}

/// The environment of a container: plain values, and downward-API fields from `fields`.
pub fn chart_env(container: &Value, fields: &[(&str, String)]) -> Vec<(String, String)> {
    container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap().to_owned();
            let value = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                Some(path) => fields
                    .iter()
                    .find(|(f, _)| *f == path)
                    .unwrap_or_else(|| panic!("no test value for the downward-API field {path}"))
                    .1
                    .clone(),
                None => e["value"].as_str().unwrap_or_default().to_owned(),
            };
            (name, value)
        })
        .collect()
}

/// The status code and message of an API answer (200 and "" for a success).
pub fn api_answer(result: Result<impl Sized, kube::Error>) -> (u16, String) {
    match result {
        Ok(_) => (200, String::new()),
        Err(kube::Error::Api(e)) => (e.code, e.message),
        Err(e) => panic!("not an API answer: {e}"),
    }
}

/// Asserts a write was refused by the chart's admission policy with a message saying
/// `says`.
#[track_caller]
pub fn assert_refused(what: &str, answer: (u16, String), says: &str) {
    let (code, message) = answer;
    assert_eq!(code, 403, "{what}: expected a refusal, got {code} {message}");
    assert!(
        message.contains("ValidatingAdmissionPolicy") && message.contains(says),
        "{what}: the refusal says {says:?}: {message}"
    );
}
