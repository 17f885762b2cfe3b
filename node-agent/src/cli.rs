//! The agent's flags: one group per component, each turned into that component's
//! settings. The flags of HTTP, TLS, token checks and logs are the `service` crate's,
//! shared with the operator.

use std::{path::PathBuf, time::Duration};

use api::duration::Period;
use clap::{CommandFactory, FromArgMatches, Parser};
use neuron_node_agent::{
    attribution,
    config::Launcher,
    delivery::backoff::Backoff,
    health::{
        self,
        logs::{self, LogDestination},
        settings::{HealthDefaults, SettingsReceiver},
    },
    kubernetes,
    monitor::SupervisorConfig,
    sinks::{
        cloudwatch::{self, select::AgentDimensions},
        otlp::{self, encode::Identity},
    },
    telemetry::AgentMetrics,
};
use service::cli::{parse_duration, Flavor, HttpFlags, LogFlags};

/// The agent's flavor of the shared flags.
const FLAVOR: Flavor = Flavor {
    env_prefix: "NEURON_AGENT",
    listen: "0.0.0.0:9010",
    max_connections: "256",
    max_connections_per_peer: "32",
};

/// The flags and their environment variables (exits with clap's message on an error).
pub fn parse() -> Args {
    let matches = FLAVOR.apply(Args::command()).get_matches();
    Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// Runs neuron-monitor, supervises it, and exports its reports as Prometheus metrics.
///
/// Every flag can also be set by the environment variable named in its help. The flags
/// come in one group per component, each turned into that component's configuration.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
pub struct Args {
    #[command(flatten)]
    pub monitor: MonitorArgs,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub attribution: AttributionArgs,
    #[command(flatten)]
    pub cloudwatch: CloudWatchArgs,
    #[command(flatten)]
    pub otlp: OtlpArgs,
    #[command(flatten)]
    pub http: HttpFlags,
    #[command(flatten)]
    pub health: HealthArgs,
    #[command(flatten)]
    pub efa: EfaArgs,
    #[command(flatten)]
    pub gpu: GpuArgs,
    #[command(flatten)]
    pub log: LogFlags,
}

/// neuron-monitor and its supervision.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "neuron-monitor")]
pub struct MonitorArgs {
    /// neuron-monitor executable (a path, or a name looked up in PATH).
    #[arg(long, env = "NEURON_MONITOR_COMMAND", default_value = "neuron-monitor")]
    pub monitor_command: PathBuf,

    /// Extra argument for neuron-monitor, before `-c FILE` (repeatable; the environment
    /// variable gives one).
    #[arg(long = "monitor-arg", env = "NEURON_MONITOR_ARG", allow_hyphen_values = true)]
    pub monitor_args: Vec<String>,

    /// Period of the built-in neuron-monitor configuration (all groups).
    #[arg(long, env = "NEURON_AGENT_PERIOD", default_value = "5s", value_parser = parse_period)]
    pub period: Period,

    /// Directory for the rendered neuron-monitor configuration (a writable emptyDir in
    /// Kubernetes). Default: <temp dir>/neuron-node-agent. Created (mode 0700) when
    /// missing; refused when it is a symbolic link or owned by another user than the
    /// agent's or root.
    #[arg(long, env = "NEURON_AGENT_STATE_DIR")]
    pub state_dir: Option<PathBuf>,

    /// Longest accepted report line; longer lines are counted and skipped. A 32-runtime
    /// trn1n.32xlarge writes about 1 MB.
    #[arg(long, env = "NEURON_AGENT_MAX_LINE_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_line_bytes: usize,

    /// Restart neuron-monitor when no report arrives for this long (the first report of
    /// a run gets 10s more). Default: three periods of its fastest group, at least 2s.
    #[arg(long, env = "NEURON_AGENT_SILENCE_TIMEOUT", value_parser = parse_duration)]
    pub silence_timeout: Option<Duration>,

    /// First delay before restarting neuron-monitor; doubles on each failure.
    #[arg(long, env = "NEURON_AGENT_RESTART_BACKOFF_INITIAL", default_value = "1s", value_parser = parse_duration)]
    pub restart_backoff_initial: Duration,

    /// Longest delay before restarting neuron-monitor.
    #[arg(long, env = "NEURON_AGENT_RESTART_BACKOFF_MAX", default_value = "30s", value_parser = parse_duration)]
    pub restart_backoff_max: Duration,

    /// Time neuron-monitor gets to exit after SIGTERM before SIGKILL.
    #[arg(long, env = "NEURON_AGENT_STOP_GRACE", default_value = "2s", value_parser = parse_duration)]
    pub stop_grace: Duration,
}

/// Where the node configuration comes from.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Node configuration")]
pub struct SourceArgs {
    /// This node's name (from the downward API). With it, the agent follows the
    /// configuration the operator renders for this node; without it, it runs standalone
    /// on the built-in configuration.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// Namespace of the node ConfigMaps (the operator's namespace).
    #[arg(long, env = "NEURON_CONFIG_NAMESPACE", default_value = "neuron-monitor")]
    pub config_namespace: String,

    /// Server-side duration of each call of the agent's watches (its ConfigMap, its pods),
    /// 5s to 290s: a quiet call is renewed from where it stopped, a connection that went
    /// silently dead is found within this plus 5 s; every API request is bounded by this
    /// plus 10 s. Each node makes 2 watch requests per period: 100/s per 1,000 nodes at 20 s
    /// (3, 150/s, where its ResourceSlices are watched).
    #[arg(long, env = "NEURON_AGENT_API_WATCH_TIMEOUT", default_value = kubernetes::DEFAULT_WATCH_TIMEOUT_FLAG, value_parser = parse_watch_timeout)]
    pub api_watch_timeout: Duration,

    /// Run the NeuronMonitorConfig documents of this YAML file (what users
    /// `kubectl apply`), validated and rendered for this host as the operator would,
    /// instead of following a ConfigMap: the agent without Kubernetes. Every document
    /// sees every application of the host. Re-read when the file changes; an invalid
    /// file is refused at start, an invalid edit keeps the last good configuration.
    #[arg(long, env = "NEURON_AGENT_CONFIG", conflicts_with = "node_config_file")]
    pub config: Option<PathBuf>,

    /// Run the rendered node configuration in this file (the JSON the operator writes
    /// under `node-config.json` of the node's ConfigMap) instead of following the
    /// ConfigMap: routes and sinks without the operator. Read once at start.
    #[arg(long, env = "NEURON_AGENT_NODE_CONFIG_FILE")]
    pub node_config_file: Option<PathBuf>,
}

/// Which pod a runtime or a core belongs to (with --node-name).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Pod attribution")]
pub struct AttributionArgs {
    /// Root of the proc filesystem where `<pid>/cgroup` (pods) and `<pid>/stat`, `io`, `fd/`
    /// (the process series) of neuron-monitor's applications are read (the agent runs in
    /// the host PID namespace). Pod attribution needs --node-name.
    #[arg(long, env = "NEURON_AGENT_PROC_ROOT", default_value = "/proc")]
    pub proc_root: PathBuf,

    /// Pod label exported as a metric label `label_<key, sanitized>` on the series of the
    /// pod's runtimes and cores (repeatable; the environment variable is comma-separated).
    #[arg(long = "pod-label", env = "NEURON_AGENT_POD_LABELS", value_delimiter = ',')]
    pub pod_labels: Vec<String>,

    /// The kubelet's pod-resources socket: which pod holds which Neuron devices and cores.
    /// Where it is not mounted at start, the agent also asks neuron-monitor for its
    /// `neuron_k8s_info`, which says it while the kubelet does not.
    #[arg(
        long,
        env = "NEURON_AGENT_POD_RESOURCES_SOCKET",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pub pod_resources_socket: PathBuf,

    /// How often the kubelet's pod-resources API is read.
    #[arg(long, env = "NEURON_AGENT_POD_RESOURCES_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub pod_resources_interval: Duration,

    /// Time limit of one pod-resources call.
    #[arg(long, env = "NEURON_AGENT_POD_RESOURCES_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pub pod_resources_timeout: Duration,

    /// How long the last known device allocations stay in use while the kubelet does not
    /// answer.
    #[arg(long, env = "NEURON_AGENT_POD_RESOURCES_KEEP", default_value = "5m", value_parser = parse_duration)]
    pub pod_resources_keep: Duration,

    /// Utilization (percent) below which an allocated NeuronCore is idle, for
    /// `neuron_node_neuroncores{state="allocated_idle"}`.
    #[arg(long, env = "NEURON_AGENT_IDLE_CORE_UTILIZATION", default_value = "5",
          value_parser = clap::value_parser!(u8).range(1..=100))]
    pub idle_core_utilization: u8,

    /// How long an allocated NeuronCore stays below that utilization before it counts as
    /// idle (1s to 24h).
    #[arg(long, env = "NEURON_AGENT_IDLE_CORE_WINDOW", default_value = "10m", value_parser = parse_idle_window)]
    pub idle_core_window: Duration,

    /// On ECS: the ECS agent's introspection API (`http://127.0.0.1:51678` on a container
    /// instance). A runtime in an ECS task's container gets the task's ARN, family and the
    /// container's name as labels and CloudWatch dimensions.
    #[arg(long, env = "NEURON_AGENT_ECS_AGENT_URI", value_parser = attribution::ecs::parse_agent_uri)]
    pub ecs_agent_uri: Option<::http::Uri>,
}

/// The CloudWatch sinks of the node configuration's routes.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "CloudWatch")]
pub struct CloudWatchArgs {
    /// Name of the cluster: the CloudWatch dimension `ClusterName` (left out when unset).
    #[arg(long, env = "CLUSTER_NAME")]
    pub cluster_name: Option<String>,

    /// Datums each CloudWatch sink keeps waiting at most; beyond it the oldest are dropped
    /// (and counted). A trn1.32xlarge sends about 1,000 per flush with the default set.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_QUEUE_DATUMS", default_value_t = 20_000)]
    pub cloudwatch_queue_datums: usize,

    /// First delay before retrying a throttled or failed PutMetricData; doubles per
    /// failure, jittered.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_RETRY_INITIAL", default_value = "200ms", value_parser = parse_duration)]
    pub cloudwatch_retry_initial: Duration,

    /// Longest delay between PutMetricData retries.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_RETRY_MAX", default_value = "20s", value_parser = parse_duration)]
    pub cloudwatch_retry_max: Duration,

    /// Time limit of one PutMetricData attempt.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub cloudwatch_request_timeout: Duration,

    /// Time the CloudWatch sinks get on SIGTERM to send what they hold (keep it below
    /// the pod's termination grace period).
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub cloudwatch_shutdown_timeout: Duration,
}

/// The OTLP sinks of the node configuration's routes.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "OTLP")]
pub struct OtlpArgs {
    /// Data points each OTLP sink keeps waiting at most (as compressed requests, a few
    /// bytes a point); beyond it the oldest requests are dropped (and counted). A
    /// trn1.32xlarge with a pod per core sends about 1,350 per flush with every group.
    #[arg(long, env = "NEURON_AGENT_OTLP_QUEUE_POINTS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub otlp_queue_points: u32,

    /// First delay before retrying a throttled or failed OTLP export; doubles per failure,
    /// jittered. A receiver's Retry-After (seconds) is honoured up to --otlp-retry-max.
    #[arg(long, env = "NEURON_AGENT_OTLP_RETRY_INITIAL", default_value = "200ms", value_parser = parse_duration)]
    pub otlp_retry_initial: Duration,

    /// Longest delay between OTLP export retries.
    #[arg(long, env = "NEURON_AGENT_OTLP_RETRY_MAX", default_value = "20s", value_parser = parse_duration)]
    pub otlp_retry_max: Duration,

    /// Time limit of one OTLP export (sending the request and reading the answer).
    #[arg(long, env = "NEURON_AGENT_OTLP_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub otlp_request_timeout: Duration,

    /// Time the OTLP sinks get on SIGTERM for a last snapshot and their queue (keep it below
    /// the pod's termination grace period).
    #[arg(long, env = "NEURON_AGENT_OTLP_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub otlp_shutdown_timeout: Duration,

    /// URL the sinks without `endpoint` send to instead of CloudWatch's OTLP endpoint of
    /// their region (a FIPS or private endpoint); still signed for that region.
    #[arg(long, env = "NEURON_AGENT_OTLP_CLOUDWATCH_ENDPOINT", value_parser = parse_endpoint)]
    pub otlp_cloudwatch_endpoint: Option<api::otlp::Endpoint>,

    /// The Secret of --config-namespace into which the operator mirrors the configs'
    /// OTLP headers (`headersSecret`): the only Secret the agent reads.
    #[arg(long, env = "NEURON_AGENT_OTLP_HEADERS_SECRET", default_value = api::names::OTLP_HEADERS_SECRET)]
    pub otlp_headers_secret: String,
}

fn parse_endpoint(s: &str) -> Result<api::otlp::Endpoint, String> {
    api::otlp::Endpoint::parse(s)
}

/// Neuron hardware health: the driver's sysfs tree and the kernel log, read off the
/// report path (never written).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Hardware health")]
pub struct HealthArgs {
    /// Root of the sysfs tree where the Neuron driver's devices
    /// (`devices/virtual/neuron_device/`) and version (`module/neuron/version`) are read.
    #[arg(long, env = "NEURON_AGENT_SYSFS_ROOT", default_value = "/sys")]
    pub sysfs_root: PathBuf,

    /// The kernel log: `/dev/kmsg`, or a regular file followed as it grows.
    #[arg(long, env = "NEURON_AGENT_KMSG_PATH", default_value = "/dev/kmsg")]
    pub kmsg_path: PathBuf,

    /// Kernel-log records this old are still taken at start-up (a fault just before the
    /// agent started is not lost).
    #[arg(long, env = "NEURON_AGENT_KMSG_LOOKBACK", default_value = "5m", value_parser = parse_duration)]
    pub kmsg_lookback: Duration,

    /// Re-read of the whole driver tree when no `hw_error_event` notification woke the
    /// reader (drivers before 2.28 have none; a fake tree never notifies).
    #[arg(long, env = "NEURON_AGENT_HEALTH_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub health_interval: Duration,

    /// A device's `healthcheck_heartbeat` unchanged for longer makes its health unknown.
    #[arg(long, env = "NEURON_AGENT_HEARTBEAT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,

    /// Type of the Node condition that carries the devices' health (with --node-name):
    /// status False / reason NeuronHasNoError while every device is healthy, True /
    /// NeuronHasError_<NAME> after a fault.
    #[arg(long, env = "NEURON_AGENT_HEALTH_CONDITION_TYPE", default_value = health::node::CONDITION_TYPE,
          value_parser = parse_condition_type)]
    pub health_condition_type: String,

    /// CloudWatch Logs group of the hardware-health event stream: one JSON event per new
    /// fault and per device or node state change, one stream per instance id. Unset: no
    /// stream. (The NeuronMonitorConfig's `health.logs` names one too; its usual name is
    /// /aws/neuron/hardware-events.)
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_GROUP", value_parser = parse_log_group)]
    pub health_log_group: Option<String>,

    /// Region of the log group. Default: the instance's region (neuron-monitor's
    /// instance_info).
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_REGION", requires = "health_log_group", value_parser = parse_region)]
    pub health_log_region: Option<String>,

    /// Events of the stream kept waiting at most (during a CloudWatch Logs outage);
    /// beyond it the oldest are dropped and counted.
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_QUEUE_EVENTS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub health_log_queue_events: u32,

    /// How long an event may wait for others to share its PutLogEvents request.
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_FLUSH_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub health_log_flush_interval: Duration,
}

/// The EFA devices' counters (`class/infiniband/` under --sysfs-root), read off the
/// report path.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "EFA")]
pub struct EfaArgs {
    /// The EFA counters are read after each report, and after this long without one
    /// (neuron-monitor restarting or silent).
    #[arg(long, env = "NEURON_AGENT_EFA_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub efa_interval: Duration,
}

/// NVIDIA GPUs, read through NVML off the report path.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "NVIDIA GPUs")]
pub struct GpuArgs {
    /// The NVML library to load (default: the driver's `libnvidia-ml.so.1`, found by the
    /// dynamic loader). A node without it has no GPU collector.
    #[arg(long, env = "NEURON_AGENT_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,
}

fn parse_log_group(s: &str) -> Result<String, String> {
    api::validate::check_log_group(s)?;
    Ok(s.to_owned())
}

fn parse_region(s: &str) -> Result<String, String> {
    if !api::cloudwatch::sink::valid_region(s) {
        return Err("a region name, e.g. us-west-2".to_owned());
    }
    Ok(s.to_owned())
}

/// A condition type: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters; not one of the kubelet's (the rule of `spec.health.conditionType`).
fn parse_condition_type(s: &str) -> Result<String, String> {
    api::validate::check_condition_type(s)?;
    Ok(s.to_owned())
}

impl HealthArgs {
    /// What the flags give when no configuration sets health.
    pub fn defaults(&self) -> HealthDefaults {
        HealthDefaults { condition_type: self.health_condition_type.clone(), kmsg_look_back: self.kmsg_lookback }
    }

    pub fn options(
        &self,
        proc_root: &std::path::Path,
        state_dir: &std::path::Path,
        settings: SettingsReceiver,
    ) -> health::Options {
        health::Options {
            sysfs_root: self.sysfs_root.clone(),
            kmsg_path: self.kmsg_path.clone(),
            proc_root: proc_root.to_owned(),
            state_dir: state_dir.to_owned(),
            interval: self.health_interval.max(Duration::from_millis(50)),
            heartbeat_timeout: self.heartbeat_timeout,
            settings,
            gpus: None,
        }
    }

    /// The stream's destination from the flags (`None`: off).
    pub fn log_destination(&self) -> Option<LogDestination> {
        let group = self.health_log_group.clone()?;
        Some(LogDestination { group, region: self.health_log_region.clone() })
    }

    /// The stream sends as the CloudWatch sinks do: their retry and time limits.
    pub fn log_options(&self, cloudwatch: &CloudWatchArgs) -> logs::LogOptions {
        logs::LogOptions {
            queue_events: self.health_log_queue_events as usize,
            flush_interval: self.health_log_flush_interval,
            backoff: Backoff { initial: cloudwatch.cloudwatch_retry_initial, max: cloudwatch.cloudwatch_retry_max },
            request_timeout: cloudwatch.cloudwatch_request_timeout,
            shutdown_timeout: cloudwatch.cloudwatch_shutdown_timeout,
        }
    }
}

impl MonitorArgs {
    pub fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("neuron-node-agent"))
    }

    pub fn launcher(&self, state_dir: PathBuf, metrics: &AgentMetrics, k8s_info: bool) -> Launcher {
        Launcher {
            program: self.monitor_command.clone(),
            args: self.monitor_args.clone(),
            state_dir,
            silence_timeout: self.silence_timeout,
            refused_files: metrics.state_files_refused.clone(),
            k8s_info,
            in_memory: Default::default(),
        }
    }

    pub fn supervisor_config(&self) -> SupervisorConfig {
        SupervisorConfig {
            max_line_bytes: self.max_line_bytes,
            backoff_initial: self.restart_backoff_initial,
            backoff_max: self.restart_backoff_max,
            stop_grace: self.stop_grace,
        }
    }
}

/// Where the node configuration comes from, decided once from the flags.
#[derive(Clone, Copy, Debug)]
pub enum ConfigSource<'a> {
    /// Every group at `--period`, Prometheus only.
    Builtin,
    /// A rendered node configuration in a file (routes and sinks without the operator).
    File(&'a std::path::Path),
    /// NeuronMonitorConfig documents in a YAML file, rendered by the agent and followed.
    Config(&'a std::path::Path),
    /// The ConfigMap of the node `--node-name` names, followed through the API.
    ConfigMap,
}

impl SourceArgs {
    pub fn source(&self) -> ConfigSource<'_> {
        match (&self.config, &self.node_config_file, &self.node_name) {
            (Some(file), _, _) => ConfigSource::Config(file),
            (None, Some(file), _) => ConfigSource::File(file),
            (None, None, Some(_)) => ConfigSource::ConfigMap,
            (None, None, None) => ConfigSource::Builtin,
        }
    }
}

impl AttributionArgs {
    /// Whether the kubelet's pod-resources socket is mounted (checked once, at start).
    pub async fn kubelet_socket_mounted(&self) -> bool {
        tokio::fs::try_exists(&self.pod_resources_socket).await.unwrap_or(false)
    }

    pub fn settings(&self) -> attribution::Settings {
        attribution::Settings {
            proc_root: self.proc_root.clone(),
            pod_labels: self.pod_labels.clone(),
            kubelet_socket: self.pod_resources_socket.clone(),
            kubelet_interval: self.pod_resources_interval,
            kubelet_timeout: self.pod_resources_timeout,
            kubelet_keep: self.pod_resources_keep,
            ecs_agent: self.ecs_agent_uri.clone(),
            idle: attribution::allocation::IdlePolicy {
                below_percent: f64::from(self.idle_core_utilization),
                window: self.idle_core_window,
            },
        }
    }
}

impl CloudWatchArgs {
    pub fn options(&self, node_name: Option<String>) -> cloudwatch::Options {
        cloudwatch::Options {
            agent: AgentDimensions { cluster_name: self.cluster_name.clone(), node_name },
            queue_datums: self.cloudwatch_queue_datums,
            backoff: Backoff { initial: self.cloudwatch_retry_initial, max: self.cloudwatch_retry_max },
            request_timeout: self.cloudwatch_request_timeout,
            shutdown_timeout: self.cloudwatch_shutdown_timeout,
        }
    }
}

impl OtlpArgs {
    pub fn options(&self, identity: Identity, agent_started: std::time::SystemTime) -> otlp::Options {
        otlp::Options {
            identity,
            queue_points: self.otlp_queue_points as usize,
            backoff: Backoff { initial: self.otlp_retry_initial, max: self.otlp_retry_max },
            request_timeout: self.otlp_request_timeout,
            shutdown_timeout: self.otlp_shutdown_timeout,
            cloudwatch_endpoint: self.otlp_cloudwatch_endpoint.clone(),
            agent_started,
        }
    }
}

fn parse_period(s: &str) -> Result<Period, String> {
    s.parse().map_err(|e: api::duration::PeriodError| e.to_string())
}

/// Bounds of `--api-watch-timeout`: below 5 s the renewals cost more than they find; 290 s
/// is the usual longest watch call.
const WATCH_TIMEOUT_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(5)..=Duration::from_secs(290);

fn parse_watch_timeout(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !WATCH_TIMEOUT_RANGE.contains(&d) || d.subsec_nanos() != 0 {
        return Err("whole seconds from 5s to 290s".to_owned());
    }
    Ok(d)
}

/// Bounds of `--idle-core-window`: a day is as long as anyone waits to be told.
const IDLE_WINDOW_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(86_400);

fn parse_idle_window(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if !IDLE_WINDOW_RANGE.contains(&d) {
        return Err("a duration from 1s to 24h".to_owned());
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chart's schema takes whole s, m or h from 1s to 24h: the agent takes each edge.
    #[test]
    fn the_idle_window_takes_what_the_chart_schema_lets_through() {
        for ok in ["1s", "9999s", "1440m", "24h"] {
            assert!(parse_idle_window(ok).is_ok(), "{ok}");
        }
        for refused in ["0s", "500ms", "25h", "1441m"] {
            assert!(parse_idle_window(refused).is_err(), "{refused}");
        }
    }

    #[test]
    fn the_flags_are_consistent() {
        FLAVOR.apply(Args::command()).debug_assert();
    }
}
