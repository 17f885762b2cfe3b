//! `neuron-monitor-sim`: stands in for AWS's neuron-monitor (same command line, same
//! NDJSON reports) in tests and in the local demo, with a configurable host, simulated
//! applications and injectable faults. See `--help`.
//!
//! - [`scenario`]: the `--app` specs and the simulated host's applications.
//! - [`hardware`]: the instance type (from `api`'s table), `instance_info` and
//!   `neuron_hardware_info`.
//! - [`schedule`]: the `-c` configuration as a schedule of groups over time.
//! - [`wire`]: the report document as neuron-monitor writes it.
//! - [`document`]: the values written into it, tick by tick.
//! - [`faults`]: garbage, truncated and oversized lines, exit and hang.
//! - [`replay`]: `--replay FILE` instead of generated documents.
//! - [`driver`]: a fake Neuron driver: its sysfs tree, kernel-log records, hardware
//!   faults on a schedule or a control file.
//! - [`efa`]: fake EFA devices in the same sysfs tree, their counters following the
//!   applications' activity.
//! - [`pod_app`]: `neuron-monitor-sim app`, an application for a workload pod, and
//!   `--discover-apps`, which reports those running on the host.
//!
//! `neuron-monitor-sim hardware --instance-type T` prints the simulated instance's
//! devices, cores and EFA device names as one JSON line (for a test device plugin).

mod document;
mod driver;
mod efa;
mod faults;
mod hardware;
mod pod_app;
mod replay;
mod scenario;
mod schedule;
mod wire;

use std::collections::HashMap;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use api::duration::Period;
use api::monitor_config::{MonitorConfig, DEFAULT_PERIOD};
use clap::Parser;

use crate::document::{Generator, Refresh};
use crate::faults::{Emitter, Faults, Next};
use crate::pod_app::Discovery;
use crate::scenario::{parse_app_spec, GroupName, Scenario, DEFAULT_APP};
use crate::schedule::Plan;

const ABOUT: &str = "Simulates AWS neuron-monitor: writes one JSON report per line on stdout.";

const LONG_ABOUT: &str = "\
Simulates AWS neuron-monitor: same command line, same NDJSON reports on stdout.

Without -c every metric group is reported for every application every 5 s. With -c
the configuration file is honoured like neuron-monitor does: periods (root, runtime
entry or group; the nearest wins), tag_filter regular expressions and the listed groups.
A document is written each time at least one group is due (the first one after its
period) and carries the groups refreshed then, plus instance_info and
neuron_hardware_info. Values are deterministic: only each group's `period` varies.

Every option except -c and --verbose can also be given as an environment variable, so a
supervisor can start the simulator with `-c FILE` alone.";

const AFTER_HELP: &str = "\
App spec: tag=NAME,cores=0-3|0,2,5,util=NN[,rps=NN][,pid=NN][,errors=NN][,error_type=NAME]
          [,host_mem=BYTES][,pod=NAMESPACE/POD/CONTAINER]
  tag       NEURON_PROCESS_TAG of the application; empty or absent: the pid is the tag
  cores     host NeuronCore indices held, a range (0-3) or a list (0,2,5; ranges allowed)
  util      utilization percent on each held core (0 on every other core of the host,
            which every runtime lists, as the real neuron-monitor does)
  rps       completed executions per second (default 0)
  pid       process id (default 1000 + position of the app, from 0)
  errors    execution errors per second (default 0), of error_type
  error_type  error_summary's key for them (default generic; another name is written
            beside the six documented ones, as a newer neuron-monitor would)
  host_mem  host memory in bytes (default 512 MiB + 64 MiB per core)
  pod       the pod running it, listed for its cores (and the devices it holds whole)
            in neuron_k8s_info
Without --app: one app `tag=sim-app,cores=0,util=50,rps=100`.

Groups for --group-error: neuroncore_counters, memory_used, neuron_runtime_vcpu_usage,
execution_stats (runtime groups, failing for every app), vcpu_usage, memory_info,
neuron_hw_counters, neuron_k8s_info (system groups). A failing group carries `error` and
no data.

Exit codes: 0 on --max-documents or a closed stdout, 1 on a startup or write error,
2 on a bad command line, 3 on --exit-after.

Subcommands:
  neuron-monitor-sim app --tag NAME --util PERCENT [--rps N] [--cores LIST]
            a simulated application for a workload pod (cores: NEURON_RT_VISIBLE_CORES),
            reported by a simulator with --discover-apps on the same host
  neuron-monitor-sim hardware [--instance-type T]
            the instance's devices, cores and EFA device names, as one JSON line";

#[derive(Debug, Parser)]
#[command(
    name = "neuron-monitor-sim",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = AFTER_HELP
)]
struct Args {
    /// neuron-monitor configuration file (JSON); default: every group, every app, 5 s.
    #[arg(short = 'c', long = "config-file", value_name = "FILE")]
    config: Option<PathBuf>,

    /// Log level of neuron-monitor (0-4); accepted and ignored.
    #[arg(long, value_name = "LEVEL", default_value_t = 0,
          value_parser = clap::value_parser!(u8).range(0..=4))]
    verbose: u8,

    /// EC2 instance type: decides devices, cores per device, vCPUs and memory.
    #[arg(long, env = "NEURON_SIM_INSTANCE_TYPE", default_value = "trn1.2xlarge")]
    instance_type: String,

    /// trn2, trn3: physical NeuronCores per logical one (1 or 2; neuron-monitor reports
    /// the logical ones, and with 2 their physical cores under `v3d`). Default: the
    /// instance's (2).
    #[arg(long, value_name = "N", env = "NEURON_SIM_LNC")]
    lnc: Option<u32>,

    /// Report neuron_k8s_info (the pods of the apps with `pod=`) even when the
    /// configuration does not ask for it (`{"type": "neuron_k8s_info"}` among its
    /// system_metrics), at the root period.
    #[arg(long, env = "NEURON_SIM_K8S_INFO")]
    k8s_info: bool,

    /// Region written in instance_info (availability zone: REGION + "a").
    #[arg(long, env = "NEURON_SIM_REGION", default_value = "us-west-2")]
    region: String,

    /// A simulated application (repeatable; see App spec below). In the environment,
    /// several specs are separated by ';'. Default: tag=sim-app,cores=0,util=50,rps=100.
    #[arg(long = "app", value_name = "SPEC", env = "NEURON_SIM_APPS", value_delimiter = ';')]
    apps: Vec<String>,

    /// Exit with code 3 after N documents (0: before the first).
    #[arg(long, value_name = "N", env = "NEURON_SIM_EXIT_AFTER")]
    exit_after: Option<u64>,

    /// After N documents stop writing but stay alive until killed (0: write nothing).
    #[arg(long, value_name = "N", env = "NEURON_SIM_HANG_AFTER")]
    hang_after: Option<u64>,

    /// Exit with code 0 after N documents.
    #[arg(long, value_name = "N", env = "NEURON_SIM_MAX_DOCUMENTS")]
    max_documents: Option<u64>,

    /// Write a line that is not JSON before every Nth document.
    #[arg(long, value_name = "N", env = "NEURON_SIM_GARBAGE_EVERY",
          value_parser = clap::value_parser!(u64).range(1..))]
    garbage_every: Option<u64>,

    /// Cut every Nth document in half (no closing brace), then end the line.
    #[arg(long, value_name = "N", env = "NEURON_SIM_TRUNCATE_EVERY",
          value_parser = clap::value_parser!(u64).range(1..))]
    truncate_every: Option<u64>,

    /// Before the Nth document, write one extra line of --oversized-bytes bytes (a JSON
    /// object of padding).
    #[arg(long, value_name = "N", env = "NEURON_SIM_OVERSIZED_AT",
          value_parser = clap::value_parser!(u64).range(1..))]
    oversized_at: Option<u64>,

    /// Length of the --oversized-at line, newline excluded.
    #[arg(long, value_name = "BYTES", env = "NEURON_SIM_OVERSIZED_BYTES",
          default_value_t = 4 << 20,
          value_parser = clap::value_parser!(u64).range(faults::MIN_OVERSIZED_BYTES..=1 << 30))]
    oversized_bytes: u64,

    /// This metric group reports an error and no data (repeatable; ',' separates several
    /// in the environment). neuron_runtime_vcpu_usage reads
    /// "open /proc/<pid>/stat: no such file or directory".
    #[arg(long, value_name = "GROUP", env = "NEURON_SIM_GROUP_ERRORS",
          value_delimiter = ',', value_parser = GroupName::parse)]
    group_error: Vec<GroupName>,

    /// Every Nth refresh of neuron_hw_counters reports mem_ecc_corrected=1 and
    /// sram_ecc_uncorrected=1 on device 0.
    #[arg(long, value_name = "N", env = "NEURON_SIM_ECC_EVERY",
          value_parser = clap::value_parser!(u64).range(1..))]
    ecc_every: Option<u64>,

    /// Write N lines to stderr at start (to exercise log forwarding).
    #[arg(long, value_name = "N", env = "NEURON_SIM_STDERR_LINES", default_value_t = 0)]
    stderr_lines: u64,

    /// Replay recorded reports (pretty-printed or NDJSON) in a loop instead of
    /// simulating, written compact, the first at once and then one per --interval
    /// (repeatable; ';' separates several in the environment). The scenario options
    /// (--app, --instance-type, --group-error, --ecc-every, -c) do not apply.
    #[arg(long, value_name = "FILE", env = "NEURON_SIM_REPLAY", value_delimiter = ';')]
    replay: Vec<PathBuf>,

    /// Time between replayed documents ("500ms", "1s", "2m").
    #[arg(long, value_name = "DURATION", env = "NEURON_SIM_INTERVAL", default_value = "1s")]
    interval: Period,

    /// Write a fake Neuron driver sysfs tree for the instance type under DIR (as under
    /// /sys: devices/virtual/neuron_device/neuron<N>/..., module/neuron/version), and
    /// keep it current (heartbeat, injected faults).
    #[arg(long, value_name = "DIR", env = "NEURON_SIM_SYSFS_ROOT")]
    sysfs_root: Option<PathBuf>,

    /// With --sysfs-root: EFA devices written under DIR/class/infiniband, their counters
    /// advancing every second with the applications' activity. Default: the instance
    /// type's (trn1.32xlarge 8, trn1n.32xlarge and trn2 16, inf1.24xlarge 1, others none);
    /// 0: no EFA.
    #[arg(long, value_name = "N", env = "NEURON_SIM_EFA_DEVICES",
          value_parser = clap::value_parser!(u32).range(0..=64))]
    efa_devices: Option<u32>,

    /// Append the kernel-log records of injected faults to FILE, in /dev/kmsg's format.
    #[arg(long, value_name = "FILE", env = "NEURON_SIM_KMSG")]
    kmsg: Option<PathBuf>,

    /// Inject a hardware fault after a delay: KIND[:DEVICE[:ARG]]@AFTER, e.g.
    /// `hbm-ue:0@2s`, `dma:1:3@500ms` (core 3), `component:2:link_efa@1s`,
    /// `power:0:invalid@1s`, `reset:0:2@1s` (repeatable; ';' separates several in the
    /// environment). Kinds: hbm-ue, sram-ue, nc-ue, dma, repairable-hbm, component,
    /// heartbeat-stall, power, reset, reload, xid (`xid:79:00000000:00:1E.0`: an NVIDIA
    /// Xid record for the GPU at that PCI bus id; needs --kmsg).
    #[arg(long = "health-fault", value_name = "SPEC", env = "NEURON_SIM_HEALTH_FAULTS",
          value_delimiter = ';', value_parser = parse_scheduled_fault)]
    health_faults: Vec<(Duration, driver::Fault)>,

    /// Inject the fault each line appended to FILE names (KIND[:DEVICE[:ARG]]), within
    /// 50 ms: the way to trigger a fault at a chosen moment.
    #[arg(long, value_name = "FILE", env = "NEURON_SIM_HEALTH_CONTROL")]
    health_control: Option<PathBuf>,

    /// A host without Neuron devices (a GPU node): keep only the kernel log (--kmsg,
    /// required) and inject its faults (`xid:CODE:BUS_ID`, the GPU's PCI bus id), writing
    /// no report; any instance type is accepted.
    #[arg(long, env = "NEURON_SIM_NO_DEVICES", requires = "kmsg", conflicts_with = "sysfs_root")]
    no_devices: bool,

    /// Also report the applications started as `neuron-monitor-sim app` on this host
    /// (read from /proc before each document; the host's PID namespace is needed to see
    /// other containers' processes). Without --app, those are the only applications.
    #[arg(long, env = "NEURON_SIM_DISCOVER_APPS")]
    discover_apps: bool,
}

/// The first argument of `neuron-monitor-sim hardware`.
const HARDWARE: &str = "hardware";

#[derive(Debug, Parser)]
#[command(
    name = "neuron-monitor-sim hardware",
    about = "Prints the simulated instance's Neuron devices, NeuronCores and EFA device names as one JSON line."
)]
struct HardwareArgs {
    #[arg(long, env = "NEURON_SIM_INSTANCE_TYPE", default_value = "trn1.2xlarge")]
    instance_type: String,
}

/// `neuron-monitor-sim hardware ...`: what a device plugin advertises on the simulated
/// host, from the same table the reports come from.
fn describe_hardware(args: impl Iterator<Item = std::ffi::OsString>) -> Result<ExitCode> {
    let args = HardwareArgs::parse_from(std::iter::once("neuron-monitor-sim hardware".into()).chain(args));
    let instance = hardware::lookup(&args.instance_type)?;
    let efa: Vec<String> = (0..instance.efa_devices() as usize).map(efa::device_name).collect();
    let description = serde_json::json!({
        "instance_type": instance.name,
        "devices": instance.devices,
        "cores_per_device": instance.cores_per_device,
        "neuroncores": instance.cores(),
        "efa_devices": efa,
    });
    println!("{description}");
    Ok(ExitCode::SUCCESS)
}

fn parse_scheduled_fault(spec: &str) -> Result<(Duration, driver::Fault), String> {
    driver::parse_scheduled(spec).map_err(|e| format!("{e:#}"))
}

impl Args {
    fn faults(&self) -> Faults {
        Faults {
            exit_after: self.exit_after,
            hang_after: self.hang_after,
            max_documents: self.max_documents,
            garbage_every: self.garbage_every,
            truncate_every: self.truncate_every,
            oversized_at: self.oversized_at,
            // Bounded to 1 GiB by the parser.
            oversized_bytes: self.oversized_bytes as usize,
        }
    }

    fn config(&self) -> Result<MonitorConfig> {
        let config = match &self.config {
            None => MonitorConfig::all_groups(DEFAULT_PERIOD),
            Some(path) => {
                let text = fs::read_to_string(path)
                    .with_context(|| format!("cannot read configuration file {}", path.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("configuration file {} is invalid", path.display()))?
            }
        };
        Ok(if self.k8s_info { config.with_k8s_info() } else { config })
    }

    fn scenario(&self) -> Result<Scenario> {
        let mut instance = hardware::lookup(&self.instance_type)?;
        if let Some(lnc) = self.lnc {
            instance = instance.with_lnc(lnc).map_err(anyhow::Error::msg)?;
        }
        let mut specs = Vec::new();
        for (i, spec) in self.apps.iter().filter(|s| !s.trim().is_empty()).enumerate() {
            specs.push(parse_app_spec(spec).with_context(|| format!("--app #{}", i + 1))?);
        }
        if specs.is_empty() && !self.discover_apps {
            specs.push(parse_app_spec(DEFAULT_APP)?);
        }
        Scenario::new(instance, self.region.clone(), specs, self.group_error.clone(), self.ecc_every)
    }
}

fn main() -> ExitCode {
    // An empty NEURON_SIM_* variable means "not set" (test harnesses blank them), not
    // an invalid value. Still single-threaded here, so changing the environment is safe.
    for (name, value) in std::env::vars_os() {
        if value.is_empty() && name.to_string_lossy().starts_with("NEURON_SIM_") {
            std::env::remove_var(name);
        }
    }
    let mut argv = std::env::args_os().skip(1);
    let outcome = match argv.next() {
        Some(first) if first == pod_app::SUBCOMMAND => pod_app::run(argv),
        Some(first) if first == HARDWARE => describe_hardware(argv),
        _ => run(&Args::parse()),
    };
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("neuron-monitor-sim: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<ExitCode> {
    if let (true, Some(kmsg)) = (args.no_devices, &args.kmsg) {
        let control = args.health_control.clone().map(|c| (driver::control_start(&c), c)).map(|(at, c)| (c, at));
        driver::Driver::without_devices(kmsg.clone())?.run(args.health_faults.clone(), control)?;
        return Ok(ExitCode::SUCCESS);
    }
    // Everything is validated before the first byte is written.
    let (source, apps) = if args.replay.is_empty() {
        let plan = Plan::new(&args.config()?)?;
        let scenario = args.scenario()?;
        let (instance, apps) = (scenario.instance, scenario.apps.clone());
        (Source::Generated(Box::new(Generator::new(scenario, plan))), Some((instance, apps)))
    } else {
        (Source::Replay(replay::load(&args.replay)?, args.interval), None)
    };

    if let Some(root) = &args.sysfs_root {
        // Replayed reports have no applications: the EFA devices stay idle.
        let (instance, apps) = match apps {
            Some(scenario) => scenario,
            None => (hardware::lookup(&args.instance_type)?, Vec::new()),
        };
        let count = args.efa_devices.unwrap_or_else(|| instance.efa_devices()) as usize;
        if count > 0 {
            let fake = efa::FakeEfa::new(&instance, root, efa::loads(&instance, &apps, count))?;
            spawn_fake_kernel("fake-efa", move || {
                if let Err(e) = fake.run() {
                    eprintln!("neuron-monitor-sim: error: fake EFA: {e:#}");
                    std::process::exit(1);
                }
            })?;
        }
    }

    if args.sysfs_root.is_some() || args.kmsg.is_some() {
        // The control file's lines count from now on, also those written with the tree.
        let control = args.health_control.clone().map(|c| (driver::control_start(&c), c)).map(|(at, c)| (c, at));
        let fake =
            driver::Driver::new(hardware::lookup(&args.instance_type)?, args.sysfs_root.clone(), args.kmsg.clone())?;
        let schedule = args.health_faults.clone();
        spawn_fake_kernel("fake-driver", move || {
            if let Err(e) = fake.run(schedule, control) {
                eprintln!("neuron-monitor-sim: error: fake driver: {e:#}");
                std::process::exit(1);
            }
        })?;
    }

    for i in 1..=args.stderr_lines {
        eprintln!("level=info msg=\"neuron-monitor-sim stderr line {i} of {}\"", args.stderr_lines);
    }

    let emitter = Emitter::new(io::stdout().lock(), args.faults());
    if let Some(code) = settle(Ok(emitter.start()), 0)? {
        return Ok(code);
    }
    match source {
        Source::Generated(generator) => generate(*generator, emitter, args.discover_apps.then(Discovery::default)),
        Source::Replay(lines, interval) => replay_loop(&lines, interval, emitter),
    }
}

/// Starts a thread that stands in for the kernel (the driver's sysfs tree, its log). Named
/// `fake-*`, so that a measurement can tell its CPU from neuron-monitor's: on a node the
/// kernel writes no files (tests/perf/agent-bench.sh).
fn spawn_fake_kernel(name: &str, work: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new().name(name.to_owned()).spawn(work).with_context(|| format!("starting {name}"))?;
    Ok(())
}

enum Source {
    Generated(Box<Generator>),
    Replay(Vec<String>, Period),
}

/// Writes documents whenever groups are due, on the real clock; with a discovery, the
/// host's applications are read again before each document.
fn generate(
    mut generator: Generator,
    mut emitter: Emitter<impl Write>,
    mut discovery: Option<Discovery>,
) -> Result<ExitCode> {
    let start = Instant::now();
    let mut last_refresh = HashMap::new();
    let mut t_ms = 0;
    let mut written = 0;
    loop {
        let Some(next) = generator.plan().next_tick_after(t_ms) else {
            eprintln!("neuron-monitor-sim: the configuration selects no metric group; nothing to report");
            hang();
        };
        sleep_until(start + Duration::from_millis(next));
        if let Some(discovery) = &mut discovery {
            let found = discovery.scan(Path::new("/proc"));
            generator.set_discovered(found, discovery);
        }
        let now = Instant::now();
        let refreshes: Vec<Refresh> = generator
            .plan()
            .due_at(next)
            .into_iter()
            .map(|(key, nominal)| {
                let since = last_refresh.insert(key, now).unwrap_or(start);
                Refresh { key, nominal, covered: now.duration_since(since).as_secs_f64() }
            })
            .collect();
        let document = serde_json::to_string(&generator.document(&refreshes))?;
        written += 1;
        if let Some(code) = settle(emitter.emit(&document), written)? {
            return Ok(code);
        }
        // Behind schedule (a slow reader): skip the ticks already past instead of bursting.
        t_ms = next.max(start.elapsed().as_millis() as u64);
    }
}

fn replay_loop(lines: &[String], interval: Period, mut emitter: Emitter<impl Write>) -> Result<ExitCode> {
    let start = Instant::now();
    let mut written = 0;
    for line in lines.iter().cycle() {
        sleep_until(start + Duration::from_millis(interval.as_millis() * written));
        written += 1;
        if let Some(code) = settle(emitter.emit(line), written)? {
            return Ok(code);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Turns the outcome of a write into "go on" (`None`) or the exit code.
fn settle(outcome: io::Result<Next>, written: u64) -> Result<Option<ExitCode>> {
    match outcome {
        Ok(Next::Continue) => Ok(None),
        Ok(Next::Exit(code)) => {
            if code != 0 {
                eprintln!("neuron-monitor-sim: exiting with code {code} after {written} documents (--exit-after)");
            }
            Ok(Some(ExitCode::from(code)))
        }
        Ok(Next::Hang) => {
            eprintln!("neuron-monitor-sim: hanging after {written} documents (--hang-after)");
            hang()
        }
        // The reader went away: what neuron-monitor's consumer does on shutdown.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Some(ExitCode::SUCCESS)),
        Err(e) => Err(e).context("cannot write to stdout"),
    }
}

fn hang() -> ! {
    loop {
        sleep(Duration::from_secs(3600));
    }
}

fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        sleep(deadline - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("neuron-monitor-sim").chain(args.iter().copied()))
    }

    #[test]
    fn command_line_is_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn accepts_neuron_monitor_flags_and_every_option() {
        let args = parse(&[
            "-c",
            "monitor.json",
            "--verbose",
            "4",
            "--instance-type",
            "inf2.xlarge",
            "--region",
            "eu-west-1",
            "--app",
            "tag=a,cores=0,util=5",
            "--app",
            "tag=b,cores=1,util=5;tag=c,cores=0,2,util=1",
            "--exit-after",
            "3",
            "--hang-after",
            "4",
            "--max-documents",
            "5",
            "--garbage-every",
            "2",
            "--truncate-every",
            "3",
            "--oversized-at",
            "1",
            "--oversized-bytes",
            "100",
            "--group-error",
            "memory_info",
            "--group-error",
            "neuron_runtime_vcpu_usage",
            "--ecc-every",
            "7",
            "--stderr-lines",
            "2",
            "--efa-devices",
            "0",
        ])
        .unwrap();
        assert_eq!(args.config, Some(PathBuf::from("monitor.json")));
        assert_eq!(args.apps.len(), 3);
        assert_eq!(args.apps[2], "tag=c,cores=0,2,util=1");
        assert_eq!(args.group_error.len(), 2);
        let faults = args.faults();
        assert_eq!(faults.oversized_bytes, 100);
        assert_eq!((faults.exit_after, faults.truncate_every), (Some(3), Some(3)));
        assert_eq!(args.interval, Period::from_secs(1));
        assert_eq!(args.efa_devices, Some(0));
    }

    #[test]
    fn defaults_describe_a_small_trainium_host_with_one_app() {
        let args = parse(&[]).unwrap();
        assert_eq!(args.faults().oversized_bytes, 4 << 20);
        let scenario = args.scenario().unwrap();
        assert_eq!(scenario.instance.name, "trn1.2xlarge");
        assert_eq!(scenario.apps.len(), 1);
        assert_eq!((scenario.apps[0].tag.as_str(), scenario.apps[0].util), ("sim-app", 50.0));
        assert_eq!(args.config().unwrap(), MonitorConfig::all_groups(DEFAULT_PERIOD));
    }

    #[test]
    fn refuses_bad_values_at_startup() {
        assert!(parse(&["--verbose", "5"]).is_err());
        assert!(parse(&["--garbage-every", "0"]).is_err());
        assert!(parse(&["--efa-devices", "65"]).is_err());
        assert!(parse(&["--group-error", "gpu_usage"]).is_err());
        assert!(parse(&["--interval", "soon"]).is_err());
        let err = parse(&["--instance-type", "m5.large"]).unwrap().scenario().unwrap_err();
        assert!(err.to_string().contains("m5.large"));
        let err = parse(&["--app", "tag=a,cores=9,util=1"]).unwrap().scenario().unwrap_err();
        assert!(format!("{err:#}").contains("core 9"));
        let err = parse(&["--app", "tag=a,cores=0,util=1,speed=2"]).unwrap().scenario().unwrap_err();
        assert!(format!("{err:#}").contains("--app #1") && format!("{err:#}").contains("speed"));
        let err = parse(&["-c", "/nonexistent/monitor.json"]).unwrap().config().unwrap_err();
        assert!(format!("{err:#}").contains("/nonexistent/monitor.json"));
    }

    #[test]
    fn generates_parseable_documents_on_the_clock_until_max_documents() {
        let args = parse(&["--app", "tag=a,cores=1,util=25,rps=1000", "--max-documents", "3"]).unwrap();
        let config: MonitorConfig = serde_json::from_str(
            r#"{"period":"5ms","neuron_runtimes":[{"metrics":[{"type":"execution_stats"}]}],
                "system_metrics":[{"type":"memory_info","period":"10ms"}]}"#,
        )
        .unwrap();
        let generator = Generator::new(args.scenario().unwrap(), Plan::new(&config).unwrap());
        let mut out = Vec::new();
        let code = generate(generator, Emitter::new(&mut out, args.faults()), None).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        for line in lines {
            let report = api::report::Report::parse(line).unwrap();
            let api::report::Item::Ok(rt) = &report.neuron_runtime_data[0] else { panic!() };
            let stats = rt.report.as_ref().unwrap().execution_stats.as_ref().unwrap();
            let api::report::Group::Ok(stats) = stats else { panic!() };
            assert!(stats.period.unwrap() > 0.0);
            assert_eq!(stats.execution_summary.as_ref().unwrap().get("completed"), Some(5.0));
        }
    }

    #[test]
    fn replays_in_a_loop_until_max_documents() {
        let faults = Faults { max_documents: Some(5), ..Faults::default() };
        let mut out = Vec::new();
        let lines = vec!["{\"a\":1}".to_owned(), "{\"b\":2}".to_owned()];
        let code = replay_loop(&lines, Period::from_millis(1), Emitter::new(&mut out, faults)).unwrap();
        assert_eq!(code, ExitCode::SUCCESS);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text, "{\"a\":1}\n{\"b\":2}\n{\"a\":1}\n{\"b\":2}\n{\"a\":1}\n");
    }
}
