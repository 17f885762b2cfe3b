//! Simulated Neuron applications that run in workload pods, and how the node's
//! simulator finds them.
//!
//! `neuron-monitor-sim app --tag NAME --util PERCENT` runs in a pod holding
//! `aws.amazon.com/neuroncore` (or `aws.amazon.com/neuron`); it takes its cores from
//! `NEURON_RT_VISIBLE_CORES`, as the Neuron runtime does, and stays until it is stopped.
//! The real neuron-monitor learns of an application from the driver the application
//! opened; the simulated driver has no such channel into a container, so the
//! application re-executes itself with its cores on its command line (same PID), and
//! the node's simulator (`--discover-apps`, with the host's PID namespace) reads
//! `/proc/<pid>/cmdline`, which any process may read. The runtime it reports then
//! carries the application's host PID: the agent places it through the real
//! `/proc/<pid>/cgroup` and the kubelet's real pod-resources answer.

use std::{
    collections::HashSet,
    ffi::OsString,
    fs,
    io::Read,
    os::unix::process::CommandExt,
    path::Path,
    process::{Command, ExitCode},
};

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::scenario::{parse_core_list, AppSpec};

/// The first argument that selects this mode.
pub const SUBCOMMAND: &str = "app";
/// The name the application gives itself when it re-executes: what discovery matches.
const PROGRAM: &str = "neuron-monitor-sim";
/// Where the Neuron runtime takes its cores from; the device plugin sets it.
const VISIBLE_CORES: &str = "NEURON_RT_VISIBLE_CORES";
/// Bytes of a command line read; an application's is under 200.
const MAX_CMDLINE_BYTES: u64 = 4096;
/// Applications discovered at most (a trn2 node with LNC=1 has 128 cores).
const MAX_APPS: usize = 256;
/// Processes whose problem was said; forgotten past this many (said again, once).
const MAX_REMEMBERED: usize = 1024;

#[derive(Debug, Parser)]
#[command(
    name = "neuron-monitor-sim app",
    about = "A simulated Neuron application: reported by the node's simulator (--discover-apps) \
             on the cores in NEURON_RT_VISIBLE_CORES until it is stopped."
)]
struct AppArgs {
    /// NEURON_PROCESS_TAG of the application (`neuron_runtime_tag`).
    #[arg(long, value_parser = parse_tag)]
    tag: String,
    /// Utilization percent on each of its cores.
    #[arg(long, value_parser = parse_percent)]
    util: f64,
    /// Completed executions per second.
    #[arg(long, default_value_t = 10.0, value_parser = parse_rate)]
    rps: f64,
    /// Host NeuronCore indices (default: NEURON_RT_VISIBLE_CORES), a list of indices and
    /// ranges like 0-3,8.
    #[arg(long)]
    cores: Option<String>,
}

fn parse_tag(tag: &str) -> Result<String, String> {
    match tag.len() {
        0 => Err("a tag is needed".into()),
        1..=255 => Ok(tag.to_owned()),
        _ => Err("longer than 255 bytes".into()),
    }
}

fn parse_percent(value: &str) -> Result<f64, String> {
    parse_rate(value).and_then(|v| if v <= 100.0 { Ok(v) } else { Err("a percentage, at most 100".into()) })
}

fn parse_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err("not a non-negative number".into()),
    }
}

/// `neuron-monitor-sim app ...`: `args` holds what follows `app`.
pub fn run(args: impl Iterator<Item = OsString>) -> Result<ExitCode> {
    let args = match AppArgs::try_parse_from(std::iter::once(OsString::from(PROGRAM)).chain(args)) {
        Ok(args) => args,
        Err(e) => {
            let _ = e.print();
            return Ok(ExitCode::from(2));
        }
    };
    let Some(cores) = &args.cores else {
        return announce_cores(&args);
    };
    let cores = parse_core_list(cores).context("--cores")?;
    println!("neuron-monitor-sim app: tag {} on NeuronCores {cores:?} at {}%", args.tag, args.util);
    stop_on_termination();
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

/// Re-executes the application with its cores on its command line, where the node's
/// simulator reads them; returns only on failure.
fn announce_cores(args: &AppArgs) -> Result<ExitCode> {
    let Some(visible) = std::env::var_os(VISIBLE_CORES) else {
        bail!("{VISIBLE_CORES} is not set: request aws.amazon.com/neuroncore (or neuron) from the device plugin, or give --cores");
    };
    let visible = visible.to_str().with_context(|| format!("{VISIBLE_CORES} is not UTF-8"))?;
    let cores = parse_core_list(visible).with_context(|| format!("{VISIBLE_CORES}={visible:?}"))?;
    let cores: Vec<String> = cores.iter().map(u32::to_string).collect();
    let error = Command::new(std::env::current_exe().context("locating this executable")?)
        .arg0(PROGRAM)
        .args([SUBCOMMAND, "--tag", &args.tag, "--util", &args.util.to_string(), "--rps", &args.rps.to_string()])
        .args(["--cores", &cores.join(",")])
        .exec();
    Err(error).context("re-executing with --cores")
}

/// A pod's PID 1 gets no default action for SIGTERM: without a handler the kubelet
/// would wait out the grace period.
fn stop_on_termination() {
    extern "C" fn exit_now(_: libc::c_int) {
        // Only async-signal-safe calls here.
        unsafe { libc::_exit(0) }
    }
    let handler = exit_now as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler calls only _exit, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// Finds the applications among a host's processes.
#[derive(Debug, Default)]
pub struct Discovery {
    /// PIDs whose command line was refused, said once.
    said: HashSet<u32>,
}

impl Discovery {
    /// The applications running under `proc_root` (the host's `/proc`), as app specs
    /// with their PIDs, sorted by PID; a process whose announcement is wrong is said once
    /// on stderr and left out.
    pub fn scan(&mut self, proc_root: &Path) -> Vec<AppSpec> {
        let Ok(entries) = fs::read_dir(proc_root) else {
            return Vec::new();
        };
        let mut apps = Vec::new();
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            let Some(cmdline) = read_cmdline(&entry.path().join("cmdline")) else {
                continue;
            };
            match announced(pid, &cmdline) {
                None => {}
                Some(Ok(spec)) if apps.len() < MAX_APPS => apps.push(spec),
                Some(Ok(_)) => self.say(pid, &format!("more than {MAX_APPS} applications; left out")),
                Some(Err(e)) => self.say(pid, &format!("{e:#}")),
            }
        }
        apps.sort_by_key(|a| a.pid);
        apps
    }

    /// Says once per process why it is not reported.
    pub fn say(&mut self, pid: u32, problem: &str) {
        if self.said.len() >= MAX_REMEMBERED {
            self.said.clear();
        }
        if self.said.insert(pid) {
            eprintln!("neuron-monitor-sim: application process {pid} left out: {problem}");
        }
    }
}

fn read_cmdline(path: &Path) -> Option<Vec<u8>> {
    let mut bytes = Vec::new();
    fs::File::open(path).ok()?.take(MAX_CMDLINE_BYTES).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The application a command line announces: `None` for any other process (including
/// an application that has not re-executed with its cores yet).
fn announced(pid: u32, cmdline: &[u8]) -> Option<Result<AppSpec>> {
    // Each argument ends in a NUL.
    let cmdline = cmdline.strip_suffix(&[0]).unwrap_or(cmdline);
    let args: Vec<&str> = cmdline.split(|b| *b == 0).filter_map(|a| std::str::from_utf8(a).ok()).collect();
    let program = args.first()?.rsplit('/').next()?;
    if program != PROGRAM || args.get(1) != Some(&SUBCOMMAND) || !args.contains(&"--cores") {
        return None;
    }
    let parsed = AppArgs::try_parse_from(std::iter::once(PROGRAM).chain(args[2..].iter().copied()));
    Some(match parsed {
        Err(e) => Err(anyhow::anyhow!("{}", e.kind())),
        Ok(app) => parse_core_list(app.cores.as_deref().unwrap_or_default()).map(|cores| AppSpec {
            tag: app.tag,
            cores,
            util: app.util,
            rps: app.rps,
            pid: Some(pid),
            errors: 0.0,
            error_type: None,
            host_mem: None,
            pod: None,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmdline(args: &[&str]) -> Vec<u8> {
        args.iter().flat_map(|a| a.bytes().chain([0])).collect()
    }

    #[test]
    fn an_announced_application_is_read_from_its_command_line() {
        let line =
            cmdline(&["neuron-monitor-sim", "app", "--tag", "train", "--util", "70", "--rps", "5", "--cores", "2,3"]);
        let spec = announced(4242, &line).expect("an application").expect("a valid one");
        assert_eq!(
            (spec.tag.as_str(), spec.cores, spec.util, spec.rps, spec.pid),
            ("train", vec![2, 3], 70.0, 5.0, Some(4242))
        );
        let absolute =
            cmdline(&["/usr/local/bin/neuron-monitor-sim", "app", "--tag", "t", "--util", "1", "--cores", "0-1"]);
        assert_eq!(announced(1, &absolute).and_then(Result::ok).map(|s| s.cores), Some(vec![0, 1]));
    }

    #[test]
    fn other_processes_and_unannounced_applications_are_not_applications() {
        for args in [
            &["bash", "-c", "neuron-monitor-sim app --cores 1"][..],
            &["neuron-monitor-sim", "-c", "config.json"],
            &["neuron-monitor-sim", "app", "--tag", "t", "--util", "5"],
            &[],
        ] {
            assert!(announced(7, &cmdline(args)).is_none(), "{args:?}");
        }
    }

    #[test]
    fn a_wrong_announcement_is_an_error_not_an_application() {
        for args in [
            &["neuron-monitor-sim", "app", "--tag", "t", "--util", "500", "--cores", "1"][..],
            &["neuron-monitor-sim", "app", "--tag", "t", "--util", "5", "--cores", "0-4000000000"],
            &["neuron-monitor-sim", "app", "--util", "5", "--cores", "1"],
        ] {
            assert!(matches!(announced(7, &cmdline(args)), Some(Err(_))), "{args:?}");
        }
    }

    #[test]
    fn discovery_reads_a_proc_tree_and_says_each_problem_once() {
        let root = std::env::temp_dir().join(format!("sim-discovery-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        let write = |pid: &str, args: &[&str]| {
            fs::create_dir_all(root.join(pid)).unwrap();
            fs::write(root.join(pid).join("cmdline"), cmdline(args)).unwrap();
        };
        write("300", &["neuron-monitor-sim", "app", "--tag", "b", "--util", "20", "--cores", "4"]);
        write("12", &["neuron-monitor-sim", "app", "--tag", "a", "--util", "50", "--cores", "0-1"]);
        write("13", &["neuron-monitor-sim", "app", "--tag", "bad", "--util", "500", "--cores", "2"]);
        write("14", &["sleep", "100"]);
        write("self", &["neuron-monitor-sim", "app", "--tag", "x", "--util", "1", "--cores", "5"]);
        let mut discovery = Discovery::default();
        let apps = discovery.scan(&root);
        let found: Vec<(u32, &str)> = apps.iter().map(|a| (a.pid.unwrap(), a.tag.as_str())).collect();
        assert_eq!(found, [(12, "a"), (300, "b")]);
        assert!(discovery.said.contains(&13));
        fs::remove_dir_all(&root).unwrap();
    }
}
