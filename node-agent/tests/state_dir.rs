//! The real agent binary and its state directory: a directory that is a symbolic link
//! or belongs to another user is refused at start, and files planted in it are never
//! followed, overwritten or deleted; one that cannot be written leaves the agent running,
//! degraded.

mod support;

use std::{
    ffi::OsStr,
    os::unix::fs::{chown, symlink},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use api::{duration::Period, monitor_config::MonitorConfig, node_config::content_hash};
use support::{driver::append_kmsg_record, free_port, sim, Agent, Metrics, TempDir, AGENT};

/// A user the tests are not: files chowned to it belong to "another user".
const OTHER_UID: u32 = 65534;

/// Runs the agent on `state_dir` and expects it to refuse to start: returns its stderr.
fn refused_start(state_dir: &Path) -> String {
    let mut child = Command::new(AGENT)
        .args(["--monitor-command", sim(), "--state-dir"])
        .arg(state_dir)
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the agent started on the state directory {}", state_dir.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut stderr).expect("read stderr");
    assert!(!status.success(), "{status}: {stderr}");
    stderr
}

#[test]
fn a_state_directory_that_is_a_symlink_is_refused() {
    let dir = TempDir::new("state-link");
    let target = dir.0.join("elsewhere");
    std::fs::create_dir(&target).expect("mkdir");
    // A file the old agent deleted: it looked like one of its own configurations.
    let victim = target.join("neuron-monitor-0123456789abcdef.json");
    std::fs::write(&victim, "precious").expect("write");
    let link = dir.0.join("state");
    symlink(&target, &link).expect("symlink");

    let stderr = refused_start(&link);
    assert!(stderr.contains("symbolic link"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&victim).expect("the victim file"), "precious");
    assert_eq!(std::fs::read_dir(&target).expect("ls").count(), 1, "nothing written through the link");
}

#[test]
fn a_state_directory_of_another_user_is_refused() {
    let dir = TempDir::new("state-owner");
    let state = dir.0.join("state");
    std::fs::create_dir(&state).expect("mkdir");
    chown(&state, Some(OTHER_UID), Some(OTHER_UID)).expect("chown (the tests run as root)");
    let stderr = refused_start(&state);
    assert!(stderr.contains(&format!("owned by uid {OTHER_UID}")), "{stderr}");
    assert_eq!(std::fs::read_dir(&state).expect("ls").count(), 0, "nothing written");
}

#[test]
fn files_planted_in_the_state_directory_are_never_followed_or_deleted() {
    let outside = TempDir::new("outside");
    let victims: Vec<_> = ["a", "b"].iter().map(|n| outside.0.join(n)).collect();
    for v in &victims {
        std::fs::write(v, "precious").expect("write");
    }
    let period = "1s";
    let builtin = MonitorConfig::all_groups(period.parse::<Period>().expect("period"));
    let name = format!("neuron-monitor-{}.json", content_hash(&serde_json::to_vec_pretty(&builtin).expect("json")));

    let agent = Agent::start_configured(sim(), &[], &["--period", period], |_, state_dir| {
        // The temporary name the old agent wrote through, a link posing as an old
        // configuration, and a configuration of another user.
        symlink(&victims[0], state_dir.join(format!(".{name}.partial"))).expect("symlink");
        symlink(&victims[1], state_dir.join("neuron-monitor-ffffffffffffffff.json")).expect("symlink");
        let foreign = state_dir.join("neuron-monitor-eeeeeeeeeeeeeeee.json");
        std::fs::write(&foreign, "{}").expect("write");
        chown(&foreign, Some(OTHER_UID), Some(OTHER_UID)).expect("chown (the tests run as root)");
    });
    let m = agent.wait_for("reports on the built-in configuration", Duration::from_secs(20), |m| {
        (m.sum("neuron_agent_reports_total", &[]) >= 2.0).then(|| m.clone())
    });
    for v in &victims {
        assert_eq!(std::fs::read_to_string(v).expect("victim"), "precious", "{} was written through", v.display());
    }
    let state = &agent.state_dir.0;
    let config = std::fs::symlink_metadata(state.join(&name)).expect("the configuration");
    assert!(config.file_type().is_file(), "the configuration is a file of its own");
    assert!(std::fs::symlink_metadata(state.join("neuron-monitor-ffffffffffffffff.json")).is_ok());
    assert!(state.join("neuron-monitor-eeeeeeeeeeeeeeee.json").exists(), "another user's file is left alone");
    // The two links and the other user's file.
    assert_eq!(m.sum("neuron_agent_state_files_refused_total", &[]), 3.0);
}

const WAIT: Duration = Duration::from_secs(30);

/// Starts the agent on `state_dir` (which the support's start makes itself) with `args`
/// and `env`; returns once it serves.
fn start_on(state_dir: &Path, monitor_args: &[&str], args: &[&str], env: &[(&str, &OsStr)]) -> Agent {
    let addr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let scratch = TempDir::new("agent");
    let mut command = Command::new(AGENT);
    command
        .args(["--monitor-command", sim(), "--listen", &format!("{addr}"), "--state-dir"])
        .arg(state_dir)
        .args(args)
        .args(monitor_args.iter().map(|a| format!("--monitor-arg={a}")))
        .env("NEURON_AGENT_LOG", "info")
        .env("NEURON_AGENT_KMSG_PATH", scratch.0.join("no-kmsg"))
        .env("NEURON_AGENT_SYSFS_ROOT", scratch.0.join("no-sysfs"))
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    let agent = Agent { child: command.spawn().expect("start the agent"), addr, state_dir: scratch };
    agent.wait_until("the HTTP endpoint answers", Duration::from_secs(20), |a| a.get("/healthz").is_some());
    agent
}

fn degraded(m: &Metrics, file: &str) -> Option<f64> {
    m.value("neuron_agent_state_dir_degraded", &[("file", file)])
}

/// A state directory that cannot be made: its parent is a regular file. (A full or
/// read-only file system fails the same writes.)
fn unwritable_state_dir(dir: &TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
    let parent = dir.0.join("parent");
    std::fs::write(&parent, "a file where the state directory's parent should be").expect("write");
    (parent.clone(), parent.join("state"))
}

/// Issue 41, item 9: a state directory that cannot be written at start does not stop a
/// GPU-only node's agent (a crash loop took its GPU metrics and health with it). It
/// monitors on, says it is degraded (a metric, `/readyz`'s body, still ready), and once
/// the directory can be made, writes the health state at its next attempt.
#[test]
fn an_unwritable_state_directory_leaves_a_gpu_node_monitored_and_degraded() {
    let dir = TempDir::new("state-unwritable-gpu");
    let (parent, state) = unwritable_state_dir(&dir);
    let config = dir.write("nvml.yaml", "instance_type: p5.48xlarge\n");
    let kmsg = dir.write("kmsg", "");
    let library = neuron_e2e::workspace_bin("libnvidia_ml_fake.so").display().to_string();
    let args = ["--nvml-library", &library, "--kmsg-path", kmsg.to_str().expect("utf-8"), "--period", "500ms"];
    let agent = start_on(&state, &[], &args, &[("FAKE_NVML_CONFIG", config.as_os_str())]);
    let healthy = |m: &Metrics| m.value("gpu_health_state", &[("gpu", "0"), ("state", "healthy")]);
    let m = agent.wait_for("GPU 0 healthy", WAIT, |m| (healthy(m)? == 1.0).then(|| m.clone()));
    assert_eq!(degraded(&m, "monitor_config"), Some(1.0));
    assert!(!m.find("DCGM_FI_DEV_GPU_UTIL", &[]).is_empty(), "the GPU metrics");
    let (status, body) = agent.get("/readyz").expect("GET /readyz");
    assert_eq!(status, 200, "monitoring works: ready ({body})");
    assert!(
        body.starts_with("ok\n") && body.contains("degraded: cannot write the neuron-monitor configuration"),
        "{body}"
    );

    // A fault: the health state cannot be written either, and says so.
    append_kmsg_record(&kmsg, 3, 1, "NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=a, GPU has fallen off the bus.");
    agent.wait_for("the health state's write failed", WAIT, |m| (degraded(m, "health")? == 1.0).then_some(()));
    let unhealthy = |m: &Metrics| m.value("gpu_health_state", &[("gpu", "0"), ("state", "unhealthy")]);
    agent.wait_for("GPU 0 unhealthy", WAIT, |m| (unhealthy(m)? == 1.0).then_some(()));

    // The directory can be made now: the health state is written at the next attempt.
    std::fs::remove_file(&parent).expect("remove the file");
    std::fs::create_dir(&parent).expect("make the parent");
    agent.wait_until("the health state written", WAIT, |_| {
        std::fs::read_to_string(state.join("neuron-health.json")).is_ok_and(|t| t.contains("XID_79"))
    });
    agent.wait_for("not degraded for the health state", WAIT, |m| (degraded(m, "health")? == 0.0).then_some(()));
}

/// Issue 41, item 9, on a Neuron node: neuron-monitor runs on its configuration held in
/// memory, and its reports are exported.
#[test]
fn an_unwritable_state_directory_leaves_neuron_monitor_running_from_memory() {
    let dir = TempDir::new("state-unwritable");
    let (_parent, state) = unwritable_state_dir(&dir);
    let agent = start_on(&state, &["--instance-type=trn1.2xlarge"], &["--period", "500ms"], &[]);
    let m = agent.wait_for("reports", WAIT, |m| (m.sum("neuron_agent_reports_total", &[]) >= 2.0).then(|| m.clone()));
    assert_eq!(degraded(&m, "monitor_config"), Some(1.0));
    assert!(!m.find("neuroncore_utilization_ratio", &[]).is_empty(), "neuron-monitor's metrics");
    let (status, body) = agent.get("/readyz").expect("GET /readyz");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("degraded: "), "{body}");
    assert!(!state.exists());
}
