//! The agent without Kubernetes (`--config FILE`): the NeuronMonitorConfig documents
//! users `kubectl apply`, run on a host by the real agent binary on the simulator.

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use support::{cloudwatch, sim, Agent, TempDir, AGENT};

/// Two applications: a server and a trainer.
const APPS: [&str; 2] = ["--app=tag=serve-1,cores=0,util=40", "--app=tag=train-1,cores=1,util=80"];

fn config_doc(name: &str, tag_filter: &str, team: &str) -> String {
    format!(
        "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: {name}, namespace: ops }}\n\
         spec:\n  period: 1s\n  runtimes:\n  - tagFilter: '{tag_filter}'\n    metrics: [{{type: neuroncore_counters}}]\n  sinks:\n    prometheus: {{ extraLabels: {{ team: {team} }} }}\n"
    )
}

fn write(path: &Path, text: &str) {
    // A new file renamed over the old one, as editors and configuration tools do.
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).expect("write config");
    std::fs::rename(&partial, path).expect("rename config");
}

/// The `team` label of each runtime's utilization series, by runtime tag.
fn teams(agent: &Agent) -> Vec<(String, String)> {
    let metrics = agent.metrics();
    let mut teams: Vec<(String, String)> = metrics
        .find("neuroncore_utilization_ratio", &[])
        .iter()
        .filter_map(|s| Some((s.labels.get("runtime_tag")?.clone(), s.labels.get("team")?.clone())))
        .collect();
    teams.sort();
    teams.dedup();
    teams
}

fn wait_for_teams(agent: &Agent, want: &[(&str, &str)], limit: Duration) -> Duration {
    let want: Vec<(String, String)> = want.iter().map(|(t, v)| ((*t).to_owned(), (*v).to_owned())).collect();
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < limit {
        seen = teams(agent);
        if seen == want {
            return start.elapsed();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("timed out after {limit:?} waiting for teams {want:?}; last seen {seen:?}");
}

#[test]
fn documents_route_by_tag_filter_and_an_edit_reloads_without_restart() {
    let dir = TempDir::new("standalone");
    let file = dir.0.join("neuron-monitor.yaml");
    write(&file, &format!("{}---\n{}", config_doc("serving", "^serve-", "a"), config_doc("training", "^train-", "b")));
    let agent = Agent::start(&APPS, &["--config", file.to_str().expect("path")]);
    wait_for_teams(&agent, &[("serve-1", "a"), ("train-1", "b")], Duration::from_secs(20));
    let metrics = agent.metrics();
    let hash_of = |m: &support::Metrics| {
        m.find("neuron_agent_config", &[("source", "config")]).first().map(|s| s.labels["hash"].clone())
    };
    let first_hash = hash_of(&metrics).expect("the file's configuration is in force");

    // An edit is in force at once: the serving team renamed, the trainer dropped.
    write(&file, &config_doc("serving", "^serve-", "c"));
    let took = wait_for_teams(&agent, &[("serve-1", "c")], Duration::from_secs(10));
    eprintln!("edit in force after {took:?}");
    let pid = agent.child.id();
    assert!(support::alive(pid), "the agent was not restarted");
    let edited_hash = hash_of(&agent.metrics()).expect("in force");
    assert_ne!(edited_hash, first_hash);

    // A broken edit (a tag filter that does not compile) is refused; the last good stays.
    write(&file, &config_doc("serving", "^serve-(", "d"));
    agent.wait_for("the broken edit is counted", Duration::from_secs(10), |m| {
        (m.value("neuron_agent_config_reloads_total", &[("result", "invalid")]) >= Some(1.0)).then_some(())
    });
    assert_eq!(teams(&agent), vec![("serve-1".to_owned(), "c".to_owned())]);
    assert_eq!(hash_of(&agent.metrics()), Some(edited_hash));
}

/// Runs the agent on `yaml` and returns its exit status and stderr (it must not start).
fn refused(yaml: &str) -> (std::process::ExitStatus, String, String) {
    let dir = TempDir::new("standalone-bad");
    let file = dir.0.join("bad.yaml");
    std::fs::write(&file, yaml).expect("write");
    let mut child = Command::new(AGENT)
        .args(["--monitor-command", sim(), "--listen", "127.0.0.1:0", "--config"])
        .arg(&file)
        .arg("--state-dir")
        .arg(dir.0.join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the agent kept running on an invalid configuration file");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("read stderr");
    (status, stderr, file.display().to_string())
}

#[test]
fn an_invalid_document_stops_the_agent_naming_file_document_and_field() {
    let good = config_doc("serving", "^serve-", "a");
    let cases = [
        // The second document's tag filter does not compile.
        (format!("{good}---\n{}", config_doc("training", "^train-(", "b")), "document 2 (ops/training)", "tagFilter"),
        // A selector has nothing to select on one host.
        (
            good.replace("  period: 1s\n", "  period: 1s\n  nodeSelector: { matchLabels: { a: b } }\n"),
            "document 1 (ops/serving)",
            "spec.nodeSelector",
        ),
        // Not our kind.
        (good.replace("kind: NeuronMonitorConfig", "kind: ConfigMap"), "document 1", "apiVersion/kind"),
        // A period out of range.
        (good.replace("period: 1s", "period: 3h"), "document 1 (ops/serving)", "spec.period"),
        // A field of the wrong shape, named by its path.
        (
            good.replace("metrics: [{type: neuroncore_counters}]", "metrics: 5"),
            "document 1",
            "spec.runtimes[0].metrics",
        ),
    ];
    for (yaml, document, field) in cases {
        let (status, stderr, path) = refused(&yaml);
        assert!(!status.success(), "refused: {stderr}");
        for part in [path.as_str(), document, field] {
            assert!(stderr.contains(part), "the error names {part:?}: {stderr}");
        }
    }
}

#[test]
fn two_documents_publish_to_their_own_cloudwatch_namespaces() {
    let cw = cloudwatch::CloudWatch::start();
    let (ns_a, ns_b) = (cw.namespace("Serving"), cw.namespace("Training"));
    let doc = |name: &str, filter: &str, namespace: &str| {
        format!(
            "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: {name}, namespace: ops }}\n\
             spec:\n  period: 1s\n  runtimes:\n  - tagFilter: '{filter}'\n    metrics: [{{type: neuroncore_counters}}]\n\
             \x20 sinks:\n    prometheus: {{ enabled: false }}\n    cloudwatch:\n      namespace: {namespace}\n      region: us-east-1\n\
             \x20     dimensions: [InstanceId, InstanceType, NeuronCore]\n      metrics: [neuroncore_utilization]\n      flushInterval: 1s\n"
        )
    };
    let dir = TempDir::new("standalone-cw");
    let file = dir.0.join("neuron-monitor.yaml");
    write(&file, &format!("{}---\n{}", doc("serving", "^serve-", &ns_a), doc("training", "^train-", &ns_b)));
    let agent = cloudwatch::start_agent_with_config_file(&APPS, &file, cw.addr(), &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    let per_namespace = loop {
        let stored = cw.stored();
        let of = |ns: &str| -> Vec<(String, f64)> {
            stored
                .iter()
                .filter(|v| v.namespace == ns && v.name == "neuroncore_utilization")
                .map(|v| (v.dimensions.get("NeuronCore").cloned().unwrap_or_default(), v.value))
                .collect()
        };
        let (a, b) = (of(&ns_a), of(&ns_b));
        if !a.is_empty() && !b.is_empty() {
            break (a, b, stored);
        }
        let names: std::collections::BTreeSet<(&str, &str)> =
            stored.iter().map(|v| (v.namespace.as_str(), v.name.as_str())).collect();
        assert!(Instant::now() < deadline, "both namespaces receive datapoints; stored so far: {names:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let (serving, training, stored) = per_namespace;
    // Each namespace holds only its application's core, with the simulator's utilization.
    assert!(serving.iter().all(|(core, value)| core == "0" && (*value - 40.0).abs() < 1e-9), "{serving:?}");
    assert!(training.iter().all(|(core, value)| core == "1" && (*value - 80.0).abs() < 1e-9), "{training:?}");
    // The instance dimensions come from neuron-monitor's instance_info.
    for v in stored.iter().filter(|v| v.namespace == ns_a || v.namespace == ns_b) {
        for dimension in ["InstanceId", "InstanceType"] {
            assert!(v.dimensions.get(dimension).is_some_and(|d| !d.is_empty()), "{dimension} on {v:?}");
        }
    }
    drop(agent);
}
