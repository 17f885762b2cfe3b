//! The agent without Kubernetes (`--config FILE`): the NeuronMonitorConfig documents
//! users `kubectl apply`, run on a host by the real agent binary on the simulator; on ECS,
//! with a stand-in for the ECS agent's introspection API (the ECS agent needs Docker).

mod support;

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use neuron_e2e::localstack::CloudWatch;
use support::{cloudwatch, kubelet::FakeProc, sim, Agent, TempDir, AGENT};

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

/// The neuron-monitor configuration file the running child was started with.
fn running_monitor_config(agent: &Agent) -> Option<String> {
    let pid = *agent.children().first()?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    args.iter().position(|a| a == "-c").and_then(|i| args.get(i + 1)).cloned()
}

/// The neuron-monitor configuration the agent last wrote (the one in force; the one
/// before it stays until the next, as neuron-monitor may still be starting on it).
fn latest_monitor_config(agent: &Agent) -> Option<String> {
    let entries = std::fs::read_dir(agent.state_dir.path()).ok()?;
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("neuron-monitor-") && n.ends_with(".json")))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path().display().to_string())))
        .max()
        .map(|(_, path)| path)
}

/// A change of sinks alone does not restart neuron-monitor; changes of what it collects,
/// made in a loop, restart it at the pace (3 at once, then one per 10 s), and it ends up
/// running the newest.
#[test]
fn a_config_edited_in_a_loop_restarts_neuron_monitor_at_a_pace_and_ends_on_the_newest() {
    let dir = TempDir::new("standalone-thrash");
    let file = dir.0.join("neuron-monitor.yaml");
    write(&file, &config_doc("serving", "^serve-", "a"));
    let agent = Agent::start(&APPS, &["--config", file.to_str().expect("path")]);
    wait_for_teams(&agent, &[("serve-1", "a")], Duration::from_secs(20));
    let restarts =
        |m: &support::Metrics| m.value("neuron_agent_monitor_restarts_total", &[("reason", "config_changed")]);
    let base = restarts(&agent.metrics()).unwrap_or(0.0);

    // Only the label of the series changes: the same neuron-monitor keeps running.
    let pid = agent.children();
    write(&file, &config_doc("serving", "^serve-", "b"));
    wait_for_teams(&agent, &[("serve-1", "b")], Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(restarts(&agent.metrics()).unwrap_or(0.0), base, "a change of labels restarted neuron-monitor");
    assert_eq!(agent.children(), pid);

    // Twelve edits of what neuron-monitor collects (its runtimes' filter), each seen by
    // the file's follower (polled every 250 ms).
    let started = Instant::now();
    for i in 0..12 {
        write(&file, &config_doc("serving", &format!("^serve-|^edit-{i}$"), &format!("t{i}")));
        std::thread::sleep(Duration::from_millis(300));
    }
    wait_for_teams(&agent, &[("serve-1", "t11")], Duration::from_secs(10));
    agent.wait_until("neuron-monitor runs the newest configuration", Duration::from_secs(25), |a| {
        let running = running_monitor_config(a);
        running.is_some() && running == latest_monitor_config(a)
    });
    let took = started.elapsed();
    let metrics = agent.metrics();
    let restarted = restarts(&metrics).unwrap_or(0.0) - base;
    let allowed = 3.0 + (took.as_secs_f64() / 10.0).ceil();
    eprintln!("12 edits: {restarted} restarts, the newest running after {took:?}");
    assert!(restarted >= 1.0 && restarted <= allowed, "{restarted} restarts in {took:?} (allowed {allowed})");
    assert!(metrics.value("neuron_agent_monitor_restarts_paced_total", &[]) >= Some(1.0), "no restart waited");
    // And reports go on under the newest configuration.
    let reports = metrics.value("neuron_agent_reports_total", &[]).unwrap_or(0.0);
    agent.wait_for("reports after the edits", Duration::from_secs(10), |m| {
        m.value("neuron_agent_reports_total", &[]).filter(|n| *n >= reports + 2.0)
    });
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
    let cw = CloudWatch::start();
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

/// A stand-in for the ECS agent's introspection API: `GET /v1/tasks` answers `tasks`.
struct EcsAgent {
    addr: std::net::SocketAddr,
    requests: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl EcsAgent {
    fn start(tasks: String) -> EcsAgent {
        use std::io::BufReader;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the ECS agent stand-in");
        let addr = listener.local_addr().expect("local address");
        let requests = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = requests.clone();
        // Lives as long as the test process; each connection is one request.
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(&stream);
                let Ok(Some(request)) = cloudwatch::read_message(&mut reader) else { continue };
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (status, body) = match request.start.split(' ').nth(1) {
                    Some("/v1/tasks") => ("HTTP/1.1 200 OK", tasks.clone().into_bytes()),
                    _ => ("HTTP/1.1 404 Not Found", Vec::new()),
                };
                let headers = vec![("content-type".to_owned(), "application/json".to_owned())];
                let response = cloudwatch::HttpMessage { start: status.to_owned(), headers, body };
                let _ = response.write_to(&mut &stream);
            }
        });
        EcsAgent { addr, requests }
    }
}

#[test]
fn an_ecs_task_s_runtime_carries_its_task_in_labels_and_dimensions() {
    const TRAINER: &str = "5b1e7c2d9f3a4b6c8d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e";
    const SERVER: &str = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00";
    let arn = |id: &str| format!("arn:aws:ecs:us-west-2:123456789012:task/neuron/{id}");
    let (train_task, serve_task) = ("0f1e2d3c4b5a69788796a5b4c3d2e1f0", "9a8b7c6d5e4f30211203f4e5d6c7b8a9");
    let task = |id: &str, family: &str, container: &str, docker_id: &str| {
        serde_json::json!({"Arn": arn(id), "DesiredStatus": "RUNNING", "KnownStatus": "RUNNING", "Family": family,
            "Version": "1", "Containers": [{"DockerId": docker_id, "DockerName": format!("ecs-{family}-1-{container}"), "Name": container}]})
    };
    let tasks = serde_json::json!({"Tasks": [task(train_task, "bert-training", "trainer", TRAINER),
                                              task(serve_task, "llama-inference", "server", SERVER)]});
    let ecs = EcsAgent::start(tasks.to_string());
    // The trainer in an ECS cgroup of cgroup v1 (task limits, cgroupfs), the server in one
    // of cgroup v2 (systemd), a third application directly on the host.
    let proc = FakeProc::new();
    proc.process(4301, &format!("4:memory:/ecs/{train_task}/{TRAINER}\n1:name=systemd:/ecs/{train_task}/{TRAINER}\n"));
    proc.process(4302, &format!("0::/ecstasks.slice/ecstasks-{serve_task}.slice/docker-{SERVER}.scope\n"));
    proc.process(4303, "0::/system.slice/batch.service\n");

    let cw = CloudWatch::start();
    let namespace = cw.namespace("Ecs");
    let dir = TempDir::new("standalone-ecs");
    let file = dir.0.join("neuron-monitor.yaml");
    write(
        &file,
        &format!(
            "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: all }}\n\
             spec:\n  period: 1s\n  runtimes:\n  - metrics: [{{type: neuroncore_counters}}]\n  sinks:\n    cloudwatch:\n\
             \x20     namespace: {namespace}\n      region: us-east-1\n\
             \x20     dimensions: [TaskDefinitionFamily, TaskArn, ContainerName, NeuronCore]\n\
             \x20     metrics: [neuroncore_utilization]\n      flushInterval: 1s\n"
        ),
    );
    let apps = [
        "--instance-type=trn1.32xlarge",
        "--app=tag=train-1,cores=0,util=80,pid=4301",
        "--app=tag=serve-1,cores=1,util=40,pid=4302",
        "--app=tag=batch-1,cores=2,util=10,pid=4303",
    ];
    let uri = format!("http://{}", ecs.addr);
    let proc_root = proc.root().to_str().expect("a UTF-8 path");
    let agent = cloudwatch::start_agent_with_config_file(
        &apps,
        &file,
        cw.addr(),
        &["--proc-root", proc_root, "--ecs-agent-uri", &uri],
    );

    // Prometheus: each task's runtime carries its task; the host's carries none.
    let labels = agent.wait_for("the ECS task labels on /metrics", Duration::from_secs(30), |m| {
        let of = |tag: &str| {
            let sample = m.find("neuroncore_utilization_ratio", &[("runtime_tag", tag)]).into_iter().next()?;
            Some(["ecs_task_family", "ecs_container", "ecs_task_arn"].map(|k| sample.labels.get(k).cloned()))
        };
        let (train, serve, batch) = (of("train-1")?, of("serve-1")?, of("batch-1")?);
        train[0].is_some().then_some((train, serve, batch))
    });
    let some = |v: [&str; 3]| v.map(|s| Some(s.to_owned()));
    assert_eq!(labels.0, some(["bert-training", "trainer", &arn(train_task)]));
    assert_eq!(labels.1, some(["llama-inference", "server", &arn(serve_task)]));
    assert_eq!(labels.2, [None, None, None], "a host process is in no task");
    let metrics = agent.metrics();
    assert_eq!(metrics.value("neuron_agent_runtimes_attributed", &[("source", "ecs")]), Some(2.0));
    assert_eq!(metrics.value("neuron_agent_ecs_containers", &[]), Some(2.0));
    assert!(ecs.requests.load(std::sync::atomic::Ordering::SeqCst) >= 1);

    // CloudWatch: the task's family, ARN and container as dimensions, with the values;
    // the host process's core (2) and the idle ones without them.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut by_core = std::collections::BTreeMap::new();
    while !(by_core.contains_key("0") && by_core.contains_key("1") && by_core.contains_key("2")) {
        for v in cw.stored().into_iter().filter(|v| v.namespace == namespace) {
            let d = |k: &str| v.dimensions.get(k).cloned().unwrap_or_default();
            by_core.insert(d("NeuronCore"), (d("TaskDefinitionFamily"), d("TaskArn"), d("ContainerName"), v.value));
        }
        assert!(Instant::now() < deadline, "datapoints of cores 0, 1 and 2; so far {by_core:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let task =
        |family: &str, arn: String, container: &str, value: f64| (family.to_owned(), arn, container.to_owned(), value);
    assert_eq!(by_core["0"], task("bert-training", arn(train_task), "trainer", 80.0));
    assert_eq!(by_core["1"], task("llama-inference", arn(serve_task), "server", 40.0));
    assert_eq!(by_core["2"], task("", String::new(), "", 10.0));
    assert!(by_core.iter().filter(|(core, _)| !["0", "1"].contains(&core.as_str())).all(|(_, t)| t.0.is_empty()));
    drop(agent);
}

/// Peak resident memory of a process, in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read the agent's status");
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("a number of kB")
}

/// The agent on `yaml`, once its configuration is in force: its peak RSS in KiB.
fn peak_rss_with(tag: &str, yaml: &str) -> u64 {
    let dir = TempDir::new(tag);
    let file = dir.0.join("neuron-monitor.yaml");
    write(&file, yaml);
    let agent = Agent::start(&APPS, &["--config", file.to_str().expect("path")]);
    agent.wait_for("the file's configuration in force", Duration::from_secs(30), |m| {
        m.find("neuron_agent_config", &[("source", "config")]).first().map(|_| ())
    });
    // A few reports routed through every filter.
    agent.wait_for("reports", Duration::from_secs(20), |m| {
        (m.value("neuron_agent_reports_total", &[]) >= Some(3.0)).then_some(())
    });
    peak_rss_kib(agent.child.id())
}

/// Issue 24: 3 configs x 16 entries of `[\w]{200}rN` (distinct filters) in one namespace,
/// 2.6 KB of YAML, took the agent to 405 MB (Unicode `\w`, ~13 MB per entry). With Go's
/// ASCII `\w` and each distinct filter compiled once under the cost limits, it stays
/// near the agent's baseline.
#[test]
fn heavy_tag_filters_keep_the_agent_small() {
    let heavy_doc = |c: usize| {
        let entries: String = (0..16)
            .map(|e| {
                format!("  - tagFilter: '[\\w]{{200}}r{}'\n    metrics: [{{type: neuroncore_counters}}]\n", c * 16 + e)
            })
            .collect();
        format!(
            "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: heavy{c}, namespace: team }}\n\
             spec:\n  period: 1s\n  runtimes:\n{entries}"
        )
    };
    let heavy = (0..3).map(heavy_doc).collect::<Vec<_>>().join("---\n");
    let baseline = peak_rss_with("rss-baseline", &config_doc("serving", "^serve-", "a"));
    let with_heavy = peak_rss_with("rss-heavy", &heavy);
    eprintln!(
        "peak RSS: baseline {} MiB, 3 configs x 16 entries of [\\w]{{200}}rN ({} bytes of YAML) {} MiB",
        baseline / 1024,
        heavy.len(),
        with_heavy / 1024
    );
    assert!(with_heavy < baseline + 32 * 1024, "baseline {baseline} KiB, heavy filters {with_heavy} KiB");
}

/// A GPU-only host on the fake NVML library, its GPU collection as a config's `spec.gpu`
/// says, followed at each edit without a restart.
#[test]
fn a_configs_gpu_settings_are_followed_without_restart() {
    let dir = TempDir::new("standalone-gpu");
    let nvml = dir.path().join("nvml.yaml");
    std::fs::write(&nvml, "instance_type: g5.xlarge\n").expect("write the fake NVML configuration");
    let file = dir.path().join("configs.yaml");
    let doc = |gpu: &str| {
        format!(
            "apiVersion: neuronmonitor.io/v1alpha1\nkind: NeuronMonitorConfig\nmetadata: {{ name: ops, namespace: ops }}\nspec:\n  gpu: {gpu}\n"
        )
    };
    write(&file, &doc("{period: 1s}"));
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so");
    let args = [
        // The built-in period: a collection an hour unless the config's is followed.
        "--period",
        "1h",
        "--config",
        file.to_str().expect("utf-8 path"),
        "--nvml-library",
        library.to_str().expect("utf-8 path"),
    ];
    // A GPU-only host: no neuron-monitor is started, so none is needed.
    let agent =
        Agent::start_with_env("/nonexistent/neuron-monitor", &[], &args, &[("FAKE_NVML_CONFIG", nvml.as_os_str())]);
    let collections = |m: &support::Metrics| m.value("neuron_agent_gpu_collections_total", &[]);
    let gpus = |m: &support::Metrics| m.find("DCGM_FI_DEV_GPU_UTIL", &[]).len();

    // At the config's 1s: three more collections within a few seconds.
    let first = agent.wait_for("a first collection", Duration::from_secs(20), |m| collections(m).filter(|n| *n >= 1.0));
    agent
        .wait_for("collections each second", Duration::from_secs(10), |m| collections(m).filter(|n| *n >= first + 3.0));
    assert_eq!(gpus(&agent.metrics()), 1, "g5.xlarge: one A10G");

    // Off: the GPU series go, no more reads, and the agent stays ready.
    write(&file, &doc("{enabled: false}"));
    agent.wait_for("the GPU series gone", Duration::from_secs(10), |m| (gpus(m) == 0).then_some(()));
    let stopped = collections(&agent.metrics()).expect("the counter stays");
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(collections(&agent.metrics()), Some(stopped), "no NVML read while off");
    assert_eq!(agent.get("/readyz").map(|(status, _)| status), Some(200));

    // On again: collected at once, then at its period.
    write(&file, &doc("{period: 1s}"));
    agent.wait_for("the GPU series back", Duration::from_secs(10), |m| (gpus(m) == 1).then_some(()));
    agent.wait_for("collections again", Duration::from_secs(10), |m| collections(m).filter(|n| *n >= stopped + 2.0));
}

/// Issue 24, fault 7: a 400 KB file of nested lists is refused at once (its nesting is
/// bounded before parsing), and a corrected edit saved right after is in force.
#[test]
fn a_deeply_nested_edit_is_refused_at_once_and_the_next_good_edit_applies() {
    let dir = TempDir::new("standalone-deep");
    let file = dir.0.join("neuron-monitor.yaml");
    write(&file, &config_doc("serving", "^serve-", "a"));
    let agent = Agent::start(&APPS, &["--config", file.to_str().expect("path")]);
    wait_for_teams(&agent, &[("serve-1", "a")], Duration::from_secs(20));
    let levels = 200_000;
    let deep = config_doc("serving", "^serve-", "a")
        .replace("team: a", &format!("team: {}x{}", "[".repeat(levels), "]".repeat(levels)));
    assert!(deep.len() > 400_000);
    write(&file, &deep);
    let started = Instant::now();
    agent.wait_for("the nested edit refused", Duration::from_secs(10), |m| {
        (m.value("neuron_agent_config_reloads_total", &[("result", "invalid")]) >= Some(1.0)).then_some(())
    });
    eprintln!("nested edit refused after {:?} (polled every 250 ms)", started.elapsed());
    write(&file, &config_doc("serving", "^serve-", "b"));
    wait_for_teams(&agent, &[("serve-1", "b")], Duration::from_secs(5));
}
