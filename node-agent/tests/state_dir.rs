//! The real agent binary and its state directory: a directory that is a symbolic link
//! or belongs to another user is refused at start, and files planted in it are never
//! followed, overwritten or deleted.

mod support;

use std::{
    os::unix::fs::{chown, symlink},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use api::{duration::Period, monitor_config::MonitorConfig, node_config::content_hash};
use support::{free_port, sim, Agent, TempDir, AGENT};

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
