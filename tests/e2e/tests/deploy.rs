//! The deployment files for running the agent without Kubernetes (`deploy/`,
//! docs/operations.md, "Without Kubernetes"), each checked by the tool that reads it or
//! by the agent itself:
//!
//! - `deploy/ec2/neuron-node-agent.service`: `systemd-analyze verify` (Debian's systemd)
//!   says nothing about it — an unknown directive or a bad value is only a warning there,
//!   so any output fails the test — and its `security --offline` exposure stays low. The
//!   unit's own command line (ExecStart), with the paths of this machine put in, starts
//!   the real agent on `deploy/ec2/configs.yaml`, which must run both documents.
//!   Not proven: how the sandbox behaves on a real instance (no systemd runs here) and
//!   with the real neuron-monitor.
//! - `deploy/ecs/task-definition.json`: valid input of ECS `RegisterTaskDefinition` per
//!   botocore's service model (what the AWS CLI validates `--cli-input-json` with:
//!   members, types, ranges, enum values; `tests/tools/aws_api_shape.py`), plus the rules
//!   the model cannot express that this deployment relies on (host network and PID
//!   namespace, host ports equal to container ports, the Neuron devices, the mounts the
//!   command's paths need, awslogs). Its command starts the real agent, and its health
//!   check command, run here, passes against that agent and fails without one.
//!   Not proven: what ECS itself would accept at registration beyond the model (e.g.
//!   account-specific ARNs), nor a container run.
//! - `deploy/iam/neuron-node-agent-policy.json`: only `cloudwatch:PutMetricData`, under a
//!   `cloudwatch:namespace` condition that admits every namespace of the example configs
//!   and of the chart's default tenancy policy (a team's `Teams/<namespace>/…`);
//!   and the agent's source calls no other CloudWatch operation (by name, from the model).
//! - `deploy/iam/neuron-node-agent-health-logs-policy.json` (attached only when the
//!   hardware-health event stream is on): exactly the CloudWatch Logs operations the
//!   agent's source calls, on the default log group and its streams only.
//! - `deploy/iam/neuron-node-agent-otlp-policy.json` (attached only when a config sends to
//!   CloudWatch's OTLP endpoint): `cloudwatch:PutMetricData`, which authorizes OTLP
//!   ingest, without a `cloudwatch:namespace` condition (OTLP requests have no namespace:
//!   such a condition denies them); the agent signs its OTLP requests for `monitoring`.
//! - `deploy/image-build.toml` (the images' cargo settings): cargo reads it, and a program
//!   built with it has its relative relocations packed (a `.relr.dyn` table, which the
//!   same program built without it lacks) and runs under this machine's loader.
//!   Not proven: the images' own build (no container engine here).
//! - `deploy/train-agent.sh` (the run the images' profile-guided agent is laid out from,
//!   `deploy/build-agent.sh`): the real agent and simulator get through it, and an agent
//!   that applies no report fails it. Not run here: the two dist builds around it (about
//!   16 minutes on these machines; docs/performance.md has their figures).
//!
//! Needs `cargo build --workspace --bins` (the agent and the simulator) and the tools of
//! `tests/tools/install.sh` (systemd-analyze; LocalStack's venv for botocore).

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    time::{Duration, Instant},
};

use neuron_e2e::{free_port, http_get, repo_root, tool, workspace_bin, TempDir};
use serde_json::Value;

const UNIT: &str = "deploy/ec2/neuron-node-agent.service";
const CONFIGS: &str = "deploy/ec2/configs.yaml";
const TASK_DEFINITION: &str = "deploy/ecs/task-definition.json";
const POLICY: &str = "deploy/iam/neuron-node-agent-policy.json";
const LOGS_POLICY: &str = "deploy/iam/neuron-node-agent-health-logs-policy.json";
const OTLP_POLICY: &str = "deploy/iam/neuron-node-agent-otlp-policy.json";
const IMAGE_BUILD: &str = "deploy/image-build.toml";
const TRAIN_AGENT: &str = "deploy/train-agent.sh";

/// Where the unit expects the agent and its configuration.
const UNIT_AGENT: &str = "/usr/local/bin/neuron-node-agent";
const UNIT_CONFIG: &str = "/etc/neuron-monitor/configs.yaml";

/// The highest `systemd-analyze security` exposure accepted (0 = fully sandboxed, 10 =
/// not at all; systemd calls up to 3.9 "OK"). The unit measures 2.2 with systemd 252.
const MAX_EXPOSURE: f64 = 3.0;

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn output_text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

// ---------------------------------------------------------------------------------------
// systemd

/// The unit's `ExecStart=` command line (continuation lines joined), as words.
fn exec_start(unit: &str) -> Vec<String> {
    let mut line = String::new();
    let mut lines = unit.lines().skip_while(|l| !l.starts_with("ExecStart="));
    for l in lines.by_ref() {
        let (text, continued) = match l.trim_end().strip_suffix('\\') {
            Some(text) => (text, true),
            None => (l, false),
        };
        line.push_str(text);
        line.push(' ');
        if !continued {
            break;
        }
    }
    let words: Vec<String> = line.trim_start_matches("ExecStart=").split_whitespace().map(str::to_owned).collect();
    assert!(!words.is_empty(), "{UNIT} has an ExecStart= line");
    words
}

/// The unit with its agent path pointing at the agent of this build (`verify` checks that
/// ExecStart's executable exists), in a file of the unit's own name.
fn unit_for_this_machine(dir: &Path) -> PathBuf {
    let unit = read(UNIT);
    assert_eq!(unit.matches(UNIT_AGENT).count(), 1, "{UNIT} starts {UNIT_AGENT}, once");
    let local = unit.replace(UNIT_AGENT, &workspace_bin("neuron-node-agent").display().to_string());
    let path = dir.join("neuron-node-agent.service");
    std::fs::write(&path, local).expect("write the unit");
    path
}

#[test]
fn the_systemd_unit_verifies_without_a_word_and_is_sandboxed() {
    let dir = TempDir::new("deploy-unit");
    let unit = unit_for_this_machine(&dir.0);
    let analyze = tool("systemd-analyze");

    // An unknown directive or a value systemd cannot parse is a warning ("…, ignoring"),
    // and the exit status stays 0: any output at all fails.
    let verify = Command::new(&analyze).arg("verify").arg(&unit).output().expect("run systemd-analyze verify");
    let said = output_text(&verify);
    assert!(verify.status.success() && said.trim().is_empty(), "systemd-analyze verify {UNIT}:\n{said}");

    let security = Command::new(&analyze)
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit)
        .output()
        .expect("run systemd-analyze security");
    let report = output_text(&security);
    let overall = report
        .lines()
        .find_map(|l| l.split("Overall exposure level for neuron-node-agent.service:").nth(1))
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{report}"));
    let exposure: f64 = overall
        .split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("exposure level {overall:?}"));
    println!("systemd-analyze security --offline=true: exposure {}", overall.trim());
    assert!(exposure <= MAX_EXPOSURE, "exposure {exposure} above {MAX_EXPOSURE}:\n{report}");

    // The paths the rest of this file (and docs/operations.md) rely on.
    let words = exec_start(&read(UNIT));
    assert_eq!(words[0], UNIT_AGENT);
    assert_eq!(flag_value(&words, "--config"), Some(UNIT_CONFIG));
    assert_eq!(flag_value(&words, "--monitor-command"), Some("/opt/aws/neuron/bin/neuron-monitor"));
}

fn flag_value<'a>(words: &'a [String], flag: &str) -> Option<&'a str> {
    words.iter().position(|w| w == flag).and_then(|i| words.get(i + 1)).map(String::as_str)
}

// ---------------------------------------------------------------------------------------
// The agent, started as a deployment file says

/// Applications on the simulator: one the example's serving document picks (`^serve-`),
/// one it does not.
const SIM_APPS: [&str; 2] = ["--app=tag=serve-llama,cores=0,util=40", "--app=tag=batch-7,cores=1,util=80"];

/// The real agent, started with a deployment file's arguments, killed on drop.
struct Agent {
    child: Child,
    addr: SocketAddr,
    _dir: TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Starts the agent with `args` (a deployment file's, without the program), each
    /// `--flag value` of `replace` given this machine's value instead: every other flag
    /// is passed as written, so a flag the agent does not know fails the start.
    fn start(args: &[String], replace: &[(&str, String)]) -> Agent {
        let dir = TempDir::new("deploy-agent");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("address");
        let mut replace = replace.to_vec();
        replace.extend([
            ("--listen", addr.to_string()),
            ("--state-dir", dir.0.join("state").display().to_string()),
            ("--monitor-command", workspace_bin("neuron-monitor-sim").display().to_string()),
        ]);
        let mut args = args.to_vec();
        for (flag, value) in &replace {
            let at = args.iter().position(|a| a == flag).unwrap_or_else(|| panic!("{flag} in {args:?}"));
            args[at + 1] = value.clone();
        }
        args.extend(SIM_APPS.map(|a| format!("--monitor-arg={a}")));
        // CloudWatch: a closed loopback port and fake keys (nothing leaves this machine).
        let closed = free_port();
        let child = Command::new(workspace_bin("neuron-node-agent"))
            .args(&args)
            // Hermetic: not this machine's kernel log or sysfs (the ECS command's flag is
            // replaced by the caller).
            .env("NEURON_AGENT_KMSG_PATH", dir.0.join("no-kmsg"))
            .env("NEURON_AGENT_SYSFS_ROOT", dir.0.join("no-sysfs"))
            .env("NEURON_AGENT_LOG", "info,aws_config=warn,aws_smithy_runtime=warn")
            .env("AWS_ENDPOINT_URL_CLOUDWATCH", format!("http://127.0.0.1:{closed}"))
            .env("AWS_ACCESS_KEY_ID", "AKIDTEST")
            .env("AWS_SECRET_ACCESS_KEY", "test-secret")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the agent");
        Agent { child, addr, _dir: dir }
    }

    /// Waits until the agent runs the file (`neuron_agent_config{source="config"}`) and
    /// the serving document's label is on the serving application's series, and only
    /// there: both documents in force.
    fn wait_for_both_documents(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = String::new();
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the agent exited ({status}) on the deployment's arguments; see its log above");
            }
            if let Some((200, metrics)) = http_get(self.addr, "/metrics") {
                let config =
                    metrics.lines().any(|l| l.starts_with("neuron_agent_config{") && l.contains("source=\"config\""));
                let utilization: Vec<&str> =
                    metrics.lines().filter(|l| l.starts_with("neuroncore_utilization_ratio{")).collect();
                let serving = utilization
                    .iter()
                    .any(|l| l.contains("runtime_tag=\"serve-llama\"") && l.contains("team=\"inference\""));
                let batch_seen = utilization.iter().any(|l| l.contains("runtime_tag=\"batch-7\""));
                let batch_labelled =
                    utilization.iter().any(|l| l.contains("runtime_tag=\"batch-7\"") && l.contains("team="));
                assert!(!batch_labelled, "the serving document's label on another application:\n{metrics}");
                if config && serving && batch_seen {
                    return;
                }
                last = metrics;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the agent did not run both documents of {CONFIGS} within 30 s; last /metrics:\n{last}");
    }
}

#[test]
fn the_units_command_line_runs_the_example_configs() {
    let words = exec_start(&read(UNIT));
    let config = repo_root().join(CONFIGS);
    let mut agent = Agent::start(&words[1..], &[("--config", config.display().to_string())]);
    agent.wait_for_both_documents();
    assert_eq!(http_get(agent.addr, "/healthz").map(|(status, _)| status), Some(200));
}

// ---------------------------------------------------------------------------------------
// ECS

/// The Python of LocalStack's venv (`tests/tools/install.sh`), which has botocore.
fn botocore_python() -> PathBuf {
    let tools =
        std::env::var_os("NEURON_TOOLS_DIR").map(PathBuf::from).unwrap_or_else(|| repo_root().join("target/tools"));
    let python = tools.join("localstack/venv/bin/python");
    assert!(python.is_file(), "{} is missing: run tests/tools/install.sh", python.display());
    python
}

fn aws_api_shape(args: &[&str]) -> Output {
    Command::new(botocore_python())
        .arg(repo_root().join("tests/tools/aws_api_shape.py"))
        .args(args)
        .output()
        .expect("run tests/tools/aws_api_shape.py")
}

fn task_definition() -> Value {
    serde_json::from_str(&read(TASK_DEFINITION)).unwrap_or_else(|e| panic!("{TASK_DEFINITION}: {e}"))
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or_else(|| panic!("{TASK_DEFINITION}: {pointer}"))
}

fn command_of(container: &Value) -> Vec<String> {
    let command = container["command"].as_array().expect("the container's command");
    command.iter().map(|w| w.as_str().expect("command words are strings").to_owned()).collect()
}

#[test]
fn the_task_definition_is_register_task_definition_input_for_a_host_daemon() {
    let path = repo_root().join(TASK_DEFINITION);
    let checked = aws_api_shape(&["ecs-task-definition", path.to_str().expect("path")]);
    assert!(checked.status.success(), "{TASK_DEFINITION} against RegisterTaskDefinition:\n{}", output_text(&checked));

    let td = task_definition();
    // One agent per container instance, seeing the host's processes and ports.
    assert_eq!(str_at(&td, "/networkMode"), "host");
    assert_eq!(str_at(&td, "/pidMode"), "host");
    let compatibilities = td["requiresCompatibilities"].as_array().expect("requiresCompatibilities");
    assert!(compatibilities.iter().any(|c| c == "EC2"), "EC2 launch type (daemons, host mode, devices)");
    assert!(str_at(&td, "/taskRoleArn").starts_with("arn:aws:iam::"), "a task role for PutMetricData");

    let containers = td["containerDefinitions"].as_array().expect("containerDefinitions");
    assert_eq!(containers.len(), 1);
    let c = &containers[0];
    assert_eq!(c["essential"], true);

    // Host mode: ECS requires hostPort (if given) to equal containerPort; the agent
    // listens on the port the command names.
    let command = command_of(c);
    let listen_port = flag_value(&command, "--listen").and_then(|l| l.rsplit(':').next()).expect("--listen");
    for mapping in c["portMappings"].as_array().expect("portMappings") {
        let container_port = mapping["containerPort"].as_u64().expect("containerPort");
        assert_eq!(mapping.get("hostPort").and_then(Value::as_u64).unwrap_or(container_port), container_port);
        assert_eq!(container_port.to_string(), listen_port, "the mapped port is the agent's");
    }

    // Memory: the reservation fits under the hard limit (ECS refuses the opposite).
    let (soft, hard) =
        (c["memoryReservation"].as_u64().expect("memoryReservation"), c["memory"].as_u64().expect("memory"));
    assert!(soft <= hard, "memoryReservation {soft} > memory {hard}");

    // Devices: /dev/neuron0…N-1 read-write, in order, each at its own path; the kernel
    // log read-only.
    let devices = c.pointer("/linuxParameters/devices").and_then(Value::as_array).expect("linuxParameters.devices");
    let neuron: Vec<&Value> =
        devices.iter().filter(|d| d["hostPath"].as_str().is_some_and(|p| p.starts_with("/dev/neuron"))).collect();
    assert!(!neuron.is_empty(), "the Neuron devices");
    for (i, d) in neuron.iter().enumerate() {
        assert_eq!(d["hostPath"], format!("/dev/neuron{i}"));
        assert_eq!(d["containerPath"], d["hostPath"]);
        assert_eq!(d["permissions"], serde_json::json!(["read", "write"]), "{d}");
    }
    let kmsg = devices.iter().find(|d| d["hostPath"] == "/dev/kmsg").expect("/dev/kmsg");
    assert_eq!(kmsg["permissions"], serde_json::json!(["read"]));
    assert_eq!(devices.len(), neuron.len() + 1, "no other device");

    // Every path of the command that comes from the host is a mount (read-only) of a
    // host volume: the configuration's directory and sysfs.
    let mounts = c["mountPoints"].as_array().expect("mountPoints");
    let volumes = td["volumes"].as_array().expect("volumes");
    let host_source = |container_path: &str| -> Option<String> {
        let mount = mounts.iter().find(|m| container_path.starts_with(m["containerPath"].as_str().unwrap_or("\0")))?;
        assert_eq!(mount["readOnly"], true, "{mount}");
        let volume = volumes.iter().find(|v| v["name"] == mount["sourceVolume"])?;
        volume.pointer("/host/sourcePath").and_then(Value::as_str).map(str::to_owned)
    };
    let config = flag_value(&command, "--config").expect("--config");
    assert_eq!(host_source(config).as_deref(), Some("/etc/neuron-monitor"), "{config} from the host");
    let sysfs = flag_value(&command, "--sysfs-root").expect("--sysfs-root");
    assert_eq!(host_source(sysfs).as_deref(), Some("/sys"), "{sysfs} from the host");
    // The state directory is writable: under a tmpfs (the root filesystem is read-only).
    assert_eq!(c["readonlyRootFilesystem"], true);
    let state = flag_value(&command, "--state-dir").expect("--state-dir");
    let tmpfs = c.pointer("/linuxParameters/tmpfs").and_then(Value::as_array).expect("tmpfs");
    assert!(
        tmpfs.iter().any(|t| t["containerPath"].as_str().is_some_and(|p| state.starts_with(&format!("{p}/")))),
        "{state} on a tmpfs"
    );

    // Logs to CloudWatch Logs.
    assert_eq!(str_at(c, "/logConfiguration/logDriver"), "awslogs");
    for option in ["awslogs-group", "awslogs-region", "awslogs-stream-prefix"] {
        assert!(c.pointer(&format!("/logConfiguration/options/{option}")).is_some(), "{option}");
    }

    // The health check is exec form, within ECS's ranges (the model has no ranges).
    let check = &c["healthCheck"];
    assert_eq!(check["command"][0], "CMD", "exec form (the image has no /bin/sh features it could rely on)");
    for (field, low, high) in [("interval", 5, 300), ("timeout", 2, 60), ("retries", 1, 10), ("startPeriod", 0, 300)] {
        let v = check[field].as_u64().unwrap_or_else(|| panic!("healthCheck.{field}"));
        assert!((low..=high).contains(&v), "healthCheck.{field} {v} outside {low}..={high}");
    }
}

/// The health check command of the task definition, for the agent listening on `port`
/// (the definition's port replaced): its exit status.
fn health_check(td: &Value, listen_port: &str, port: u16) -> std::process::ExitStatus {
    let command = td.pointer("/containerDefinitions/0/healthCheck/command").and_then(Value::as_array).expect("command");
    let words: Vec<String> = command[1..]
        .iter()
        .map(|w| w.as_str().expect("string").replace(&format!("/{listen_port} "), &format!("/{port} ")))
        .collect();
    let mut child =
        Command::new(&words[0]).args(&words[1..]).stdin(Stdio::null()).spawn().expect("run the health check");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the health check ran past its timeout");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_task_definitions_command_runs_the_example_configs_and_its_health_check_probes_it() {
    let td = task_definition();
    let command = command_of(&td["containerDefinitions"][0]);
    let listen_port = flag_value(&command, "--listen").and_then(|l| l.rsplit(':').next()).expect("--listen").to_owned();
    let command_text =
        td.pointer("/containerDefinitions/0/healthCheck/command/3").and_then(Value::as_str).unwrap_or("");
    assert!(
        command_text.contains(&format!("/{listen_port} ")),
        "the health check probes the agent's port {listen_port}"
    );
    let config = repo_root().join(CONFIGS);
    let mut agent = Agent::start(
        &command,
        &[("--config", config.display().to_string()), ("--sysfs-root", "/nonexistent-sysfs".to_owned())],
    );
    agent.wait_for_both_documents();
    let healthy = health_check(&td, &listen_port, agent.addr.port());
    assert!(healthy.success(), "the health check passes against a running agent: {healthy}");
    drop(agent);
    // Nothing listens there any more.
    let port = free_port();
    let unhealthy = health_check(&td, &listen_port, port);
    assert!(!unhealthy.success(), "the health check fails without an agent");
}

// ---------------------------------------------------------------------------------------
// IAM

/// The CloudWatch namespaces of the example configuration's documents.
fn example_namespaces() -> Vec<String> {
    let text = read(CONFIGS);
    let mut namespaces = Vec::new();
    for document in serde_norway::Deserializer::from_str(&text) {
        let value: serde_norway::Value = serde::Deserialize::deserialize(document).expect("YAML document");
        if let Some(ns) = value
            .get("spec")
            .and_then(|s| s.get("sinks"))
            .and_then(|s| s.get("cloudwatch"))
            .and_then(|c| c.get("namespace"))
            .and_then(serde_norway::Value::as_str)
        {
            namespaces.push(ns.to_owned());
        }
    }
    namespaces
}

/// CloudWatch namespaces the chart's default tenancy policy lets a team (`team-a`)
/// publish into: each pattern of `tenancy.default.cloudWatchNamespaces`, with a name
/// after its trailing `*`.
fn chart_team_namespaces() -> Vec<String> {
    let values: serde_norway::Value =
        serde_norway::from_str(&read("charts/neuron-monitor/values.yaml")).expect("the chart's values");
    let patterns = values["tenancy"]["default"]["cloudWatchNamespaces"].as_sequence().expect("a list of patterns");
    patterns
        .iter()
        .map(|p| {
            let p = p.as_str().expect("a pattern").replace("{namespace}", "team-a");
            match p.strip_suffix('*') {
                Some(prefix) => format!("{prefix}Neuron"),
                None => p,
            }
        })
        .collect()
}

/// IAM's `StringLike`: `*` any run of characters, `?` one character.
fn string_like(pattern: &str, value: &str) -> bool {
    fn matches(p: &[char], v: &[char]) -> bool {
        match (p.first(), v.first()) {
            (None, None) => true,
            (Some('*'), _) => matches(&p[1..], v) || (!v.is_empty() && matches(p, &v[1..])),
            (Some('?'), Some(_)) => matches(&p[1..], &v[1..]),
            (Some(a), Some(b)) if a == b => matches(&p[1..], &v[1..]),
            _ => false,
        }
    }
    matches(&pattern.chars().collect::<Vec<_>>(), &value.chars().collect::<Vec<_>>())
}

fn one_or_many(value: &Value) -> Vec<&str> {
    match value {
        Value::String(s) => vec![s.as_str()],
        Value::Array(items) => items.iter().map(|i| i.as_str().expect("strings")).collect(),
        other => panic!("a string or a list of strings: {other}"),
    }
}

#[test]
fn the_iam_policy_allows_put_metric_data_only_in_the_configured_namespaces() {
    let policy: Value = serde_json::from_str(&read(POLICY)).unwrap_or_else(|e| panic!("{POLICY}: {e}"));
    assert_eq!(policy["Version"], "2012-10-17");
    let statements = policy["Statement"].as_array().expect("Statement list");
    assert!(!statements.is_empty());
    let mut namespaces = example_namespaces();
    assert!(namespaces.len() >= 2, "the example publishes to CloudWatch: {namespaces:?}");
    let team = chart_team_namespaces();
    assert_eq!(team, vec!["Teams/team-a/Neuron"], "the chart's default tenancy policy");
    namespaces.extend(team);
    for statement in statements {
        assert_eq!(statement["Effect"], "Allow", "{statement}");
        assert!(statement.get("NotAction").is_none() && statement.get("NotResource").is_none(), "{statement}");
        assert_eq!(one_or_many(&statement["Action"]), vec!["cloudwatch:PutMetricData"], "{statement}");
        // PutMetricData has no resource-level permissions: "*" and a namespace condition.
        assert_eq!(one_or_many(&statement["Resource"]), vec!["*"]);
        let condition = statement["Condition"].as_object().expect("a Condition");
        let mut patterns: Vec<(&str, &str)> = Vec::new();
        for (operator, keys) in condition {
            assert!(matches!(operator.as_str(), "StringEquals" | "StringLike"), "condition operator {operator}");
            let keys = keys.as_object().expect("condition keys");
            assert_eq!(keys.keys().collect::<Vec<_>>(), vec!["cloudwatch:namespace"], "{statement}");
            patterns.extend(one_or_many(&keys["cloudwatch:namespace"]).into_iter().map(|p| (operator.as_str(), p)));
        }
        assert!(!patterns.is_empty(), "a cloudwatch:namespace condition");
        assert!(patterns.iter().all(|(_, p)| *p != "*"), "a namespace condition that admits everything");
        for ns in &namespaces {
            let allowed = patterns.iter().any(|(op, p)| if *op == "StringLike" { string_like(p, ns) } else { p == ns });
            assert!(allowed, "{CONFIGS} or the chart's tenancy policy publishes to {ns}, which {POLICY} does not allow ({patterns:?})");
        }
    }

    // The agent calls no other CloudWatch operation: none of the model's operation names
    // appears as a method call in its source but PutMetricData.
    assert_eq!(
        called_operations("cloudwatch"),
        BTreeSet::from(["put_metric_data".to_owned()]),
        "CloudWatch operations the agent calls"
    );
}

/// The operations of an AWS service (botocore's model) that the agent's source calls, by
/// the SDK's method names (`.put_metric_data()`).
fn called_operations(service: &str) -> BTreeSet<String> {
    let listed = aws_api_shape(&["operations", service]);
    assert!(listed.status.success(), "{}", output_text(&listed));
    let operations: Vec<String> = String::from_utf8_lossy(&listed.stdout).lines().map(str::to_owned).collect();
    assert!(operations.len() > 20, "{service}: {operations:?}");
    let mut called = BTreeSet::new();
    for file in rust_files(&repo_root().join("node-agent/src")) {
        let text = std::fs::read_to_string(&file).expect("read source");
        for op in &operations {
            if text.contains(&format!(".{op}()")) {
                called.insert(op.clone());
            }
        }
    }
    called
}

#[test]
fn the_health_logs_policy_allows_exactly_the_log_calls_of_the_agent_on_its_group() {
    let policy: Value = serde_json::from_str(&read(LOGS_POLICY)).unwrap_or_else(|e| panic!("{LOGS_POLICY}: {e}"));
    assert_eq!(policy["Version"], "2012-10-17");
    let statements = policy["Statement"].as_array().expect("Statement list");
    let mut actions = BTreeSet::new();
    for statement in statements {
        assert_eq!(statement["Effect"], "Allow", "{statement}");
        assert!(statement.get("NotAction").is_none() && statement.get("NotResource").is_none(), "{statement}");
        actions.extend(one_or_many(&statement["Action"]).into_iter().map(str::to_owned));
        // The default group and its streams, in any region and account: nothing else.
        for resource in one_or_many(&statement["Resource"]) {
            let rest = resource.strip_prefix("arn:aws:logs:*:*:log-group:/aws/neuron/hardware-events");
            assert!(matches!(rest, Some("" | ":log-stream:*")), "{resource}");
        }
    }
    // logs:CreateLogGroup ↔ create_log_group, …
    let snake = |action: &str| {
        let name = action.strip_prefix("logs:").unwrap_or_else(|| panic!("not a logs action: {action}"));
        let mut out = String::new();
        for c in name.chars() {
            if c.is_ascii_uppercase() && !out.is_empty() {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    };
    let allowed: BTreeSet<String> = actions.iter().map(|a| snake(a)).collect();
    assert_eq!(
        allowed,
        BTreeSet::from(["create_log_group", "create_log_stream", "put_log_events"].map(str::to_owned)),
        "{LOGS_POLICY}"
    );
    assert_eq!(called_operations("logs"), allowed, "CloudWatch Logs operations the agent calls");
}

#[test]
fn the_otlp_policy_allows_put_metric_data_without_a_namespace_condition() {
    let policy: Value = serde_json::from_str(&read(OTLP_POLICY)).unwrap_or_else(|e| panic!("{OTLP_POLICY}: {e}"));
    assert_eq!(policy["Version"], "2012-10-17");
    let statements = policy["Statement"].as_array().expect("Statement list");
    assert_eq!(statements.len(), 1, "{policy}");
    let statement = &statements[0];
    assert_eq!(statement["Effect"], "Allow");
    assert!(statement.get("NotAction").is_none() && statement.get("NotResource").is_none(), "{statement}");
    assert_eq!(one_or_many(&statement["Action"]), vec!["cloudwatch:PutMetricData"]);
    assert_eq!(one_or_many(&statement["Resource"]), vec!["*"]);
    // OTLP requests carry no CloudWatch namespace: a condition on it would deny them all.
    assert!(statement.get("Condition").is_none(), "{statement}");

    // What the agent signs: requests to CloudWatch's OTLP endpoint for the service whose
    // PutMetricData this grants, and no SDK call beyond PutMetricData (the test above).
    assert_eq!(api::otlp::CLOUDWATCH_SIGNING_NAME, "monitoring");
    assert_eq!(
        api::otlp::cloudwatch_endpoint("us-west-2").url(),
        "https://monitoring.us-west-2.amazonaws.com/v1/metrics"
    );
    let signing: Vec<PathBuf> = rust_files(&repo_root().join("node-agent/src"))
        .into_iter()
        .filter(|f| std::fs::read_to_string(f).is_ok_and(|t| t.contains("CLOUDWATCH_SIGNING_NAME")))
        .collect();
    assert_eq!(signing.len(), 1, "one place signs OTLP requests: {signing:?}");
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())).flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

/// The names of an ELF64 little-endian file's sections.
fn elf_section_names(elf: &[u8]) -> Vec<String> {
    let u16_at = |at: usize| usize::from(u16::from_le_bytes(elf[at..at + 2].try_into().unwrap()));
    let u64_at = |at: usize| usize::try_from(u64::from_le_bytes(elf[at..at + 8].try_into().unwrap())).unwrap();
    assert_eq!(&elf[..5], b"\x7fELF\x02", "an ELF64 file");
    let (table, entry, count, names) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| table + i * entry;
    let strings = u64_at(header(names) + 0x18);
    (0..count)
        .map(|i| {
            let start = strings + u32::from_le_bytes(elf[header(i)..header(i) + 4].try_into().unwrap()) as usize;
            let end = start + elf[start..].iter().position(|&b| b == 0).unwrap();
            String::from_utf8_lossy(&elf[start..end]).into_owned()
        })
        .collect()
}

/// Builds a program with pointers to relocate (a table of strings), with `extra` cargo
/// arguments, and returns its section names after checking that it runs.
fn build_probe(dir: &Path, extra: &[&str]) -> Vec<String> {
    std::fs::create_dir_all(dir.join("src")).unwrap();
    let manifest = "[package]\nname = \"relocation-probe\"\nversion = \"0.1.0\"\nedition = \"2021\"\n[workspace]\n";
    std::fs::write(dir.join("Cargo.toml"), manifest).unwrap();
    let program = "static NAMES: [&str; 4] = [\"a\", \"bb\", \"ccc\", \"dddd\"];\n\
                   fn main() { println!(\"{}\", NAMES.iter().map(|n| n.len()).sum::<usize>()); }\n";
    std::fs::write(dir.join("src/main.rs"), program).unwrap();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--release", "--offline", "--quiet"])
        .args(extra)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", dir.join("target"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo build {extra:?}: {}", output_text(&out));
    let binary = dir.join("target/release/relocation-probe");
    let run = Command::new(&binary).output().unwrap();
    assert_eq!(
        (run.status.success(), String::from_utf8_lossy(&run.stdout).trim()),
        (true, "10"),
        "{}",
        output_text(&run)
    );
    elf_section_names(&std::fs::read(binary).unwrap())
}

#[test]
fn the_images_cargo_settings_pack_the_relative_relocations() {
    let dir = TempDir::new("image-build");
    let settings = repo_root().join(IMAGE_BUILD).canonicalize().unwrap();
    let packed = build_probe(&dir.path().join("packed"), &["--config", settings.to_str().unwrap()]);
    let plain = build_probe(&dir.path().join("plain"), &[]);
    assert!(packed.iter().any(|s| s == ".relr.dyn"), "{packed:?}");
    assert!(!plain.iter().any(|s| s == ".relr.dyn"), "the plain build's own default: {plain:?}");
}

/// Runs the images' training run of `agent` on `simulator`, two seconds a pace.
fn train_agent(agent: &Path, simulator: &Path) -> Output {
    Command::new("bash")
        .arg(repo_root().join(TRAIN_AGENT))
        .arg(agent)
        .arg(simulator)
        .env("TRAIN_SECONDS", "2")
        .output()
        .unwrap()
}

#[test]
fn the_images_training_run_takes_the_agent_through_reports_and_scrapes() {
    let agent = workspace_bin("neuron-node-agent");
    let trained = train_agent(&agent, &workspace_bin("neuron-monitor-sim"));
    assert!(trained.status.success(), "{}", output_text(&trained));
    // A "neuron-monitor" that reports nothing: the agent serves its scrapes, and the run
    // still fails, as a layout for start-up only must.
    let silent = train_agent(&agent, Path::new("/bin/true"));
    assert!(!silent.status.success(), "{}", output_text(&silent));
    assert!(output_text(&silent).contains("applied no report"), "{}", output_text(&silent));
}
