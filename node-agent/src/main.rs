//! `neuron-node-agent`: runs neuron-monitor on a Neuron node and exports its reports.

use std::{
    net::SocketAddr,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use api::{duration::Period, monitor_config::MonitorConfig};
use clap::Parser;
use neuron_node_agent::{
    attribution,
    config::{open_state_dir, standalone, Activator, Launcher, Reloader},
    delivery::backoff::Backoff,
    efa::{self, EfaCollector, EfaMetrics, EfaReader, EfaSource, SharedEfa},
    health::{
        self,
        logs::{self, LogDestination, LogMetrics, LogSink},
        metrics::{HealthCollector, HealthMetrics},
        settings::{HealthDefaults, SettingsReceiver},
        taint::{TaintMetrics, Tainter},
    },
    http::{self, HttpState},
    kubernetes,
    monitor::{group, Supervisor, SupervisorConfig},
    pipeline::Pipeline,
    processes::{self, ProcReader, ProcessMetrics, SharedProcesses},
    sinks::{
        cloudwatch::{self, metrics::CloudWatchMetrics, select::AgentDimensions},
        otlp::{self, encode::Identity, metrics::OtlpMetrics},
        prometheus::Exposition,
    },
    state::NodeState,
    telemetry::AgentMetrics,
};
use prometheus_client::registry::Registry;
use service::{
    auth::{AuthOptions, MetricsAuth},
    tls::CertificateFiles,
};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

/// Runs neuron-monitor, supervises it, and exports its reports as Prometheus metrics.
///
/// Every flag can also be set by the environment variable named in its help. The flags
/// come in one group per component, each turned into that component's configuration.
#[derive(Parser, Debug)]
#[command(version, about, long_about = None)]
struct Args {
    #[command(flatten)]
    monitor: MonitorArgs,
    #[command(flatten)]
    source: SourceArgs,
    #[command(flatten)]
    attribution: AttributionArgs,
    #[command(flatten)]
    cloudwatch: CloudWatchArgs,
    #[command(flatten)]
    otlp: OtlpArgs,
    #[command(flatten)]
    http: HttpArgs,
    #[command(flatten)]
    health: HealthArgs,
    #[command(flatten)]
    efa: EfaArgs,
    #[command(flatten)]
    log: LogArgs,
}

/// neuron-monitor and its supervision.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "neuron-monitor")]
struct MonitorArgs {
    /// neuron-monitor executable (a path, or a name looked up in PATH).
    #[arg(long, env = "NEURON_MONITOR_COMMAND", default_value = "neuron-monitor")]
    monitor_command: PathBuf,

    /// Extra argument for neuron-monitor, before `-c FILE` (repeatable; the environment
    /// variable gives one).
    #[arg(long = "monitor-arg", env = "NEURON_MONITOR_ARG", allow_hyphen_values = true)]
    monitor_args: Vec<String>,

    /// Period of the built-in neuron-monitor configuration (all groups).
    #[arg(long, env = "NEURON_AGENT_PERIOD", default_value = "5s", value_parser = parse_period)]
    period: Period,

    /// Directory for the rendered neuron-monitor configuration (a writable emptyDir in
    /// Kubernetes). Default: <temp dir>/neuron-node-agent. Created (mode 0700) when
    /// missing; refused when it is a symbolic link or owned by another user than the
    /// agent's or root.
    #[arg(long, env = "NEURON_AGENT_STATE_DIR")]
    state_dir: Option<PathBuf>,

    /// Longest accepted report line; longer lines are counted and skipped. A 32-runtime
    /// trn1n.32xlarge writes about 1 MB.
    #[arg(long, env = "NEURON_AGENT_MAX_LINE_BYTES", default_value_t = 8 * 1024 * 1024)]
    max_line_bytes: usize,

    /// Restart neuron-monitor when no report arrives for this long. Default: three
    /// periods of its fastest group, at least 2s.
    #[arg(long, env = "NEURON_AGENT_SILENCE_TIMEOUT", value_parser = parse_duration)]
    silence_timeout: Option<Duration>,

    /// First delay before restarting neuron-monitor; doubles on each failure.
    #[arg(long, env = "NEURON_AGENT_RESTART_BACKOFF_INITIAL", default_value = "1s", value_parser = parse_duration)]
    restart_backoff_initial: Duration,

    /// Longest delay before restarting neuron-monitor.
    #[arg(long, env = "NEURON_AGENT_RESTART_BACKOFF_MAX", default_value = "30s", value_parser = parse_duration)]
    restart_backoff_max: Duration,

    /// Time neuron-monitor gets to exit after SIGTERM before SIGKILL.
    #[arg(long, env = "NEURON_AGENT_STOP_GRACE", default_value = "2s", value_parser = parse_duration)]
    stop_grace: Duration,
}

/// Where the node configuration comes from.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Node configuration")]
struct SourceArgs {
    /// This node's name (from the downward API). With it, the agent follows the
    /// configuration the operator renders for this node; without it, it runs standalone
    /// on the built-in configuration.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,

    /// Namespace of the node ConfigMaps (the operator's namespace).
    #[arg(long, env = "NEURON_CONFIG_NAMESPACE", default_value = "neuron-monitor")]
    config_namespace: String,

    /// Server-side duration of each call of the agent's watches (its ConfigMap, its pods),
    /// 5s to 290s: a quiet call is renewed from where it stopped, a connection that went
    /// silently dead is found within this plus 5 s; every API request is bounded by this
    /// plus 10 s. Each node makes 2 watch requests per period: 100/s per 1,000 nodes at 20 s.
    #[arg(long, env = "NEURON_AGENT_API_WATCH_TIMEOUT", default_value = kubernetes::DEFAULT_WATCH_TIMEOUT_FLAG, value_parser = parse_watch_timeout)]
    api_watch_timeout: Duration,

    /// Run the NeuronMonitorConfig documents of this YAML file (what users
    /// `kubectl apply`), validated and rendered for this host as the operator would,
    /// instead of following a ConfigMap: the agent without Kubernetes. Every document
    /// sees every application of the host. Re-read when the file changes; an invalid
    /// file is refused at start, an invalid edit keeps the last good configuration.
    #[arg(long, env = "NEURON_AGENT_CONFIG", conflicts_with = "node_config_file")]
    config: Option<PathBuf>,

    /// Run the rendered node configuration in this file (the JSON the operator writes
    /// under `node-config.json` of the node's ConfigMap) instead of following the
    /// ConfigMap: routes and sinks without the operator. Read once at start.
    #[arg(long, env = "NEURON_AGENT_NODE_CONFIG_FILE")]
    node_config_file: Option<PathBuf>,
}

/// Which pod a runtime or a core belongs to (with --node-name).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Pod attribution")]
struct AttributionArgs {
    /// Root of the proc filesystem where `<pid>/cgroup` (pods) and `<pid>/stat`, `io`, `fd/`
    /// (the process series) of neuron-monitor's applications are read (the agent runs in
    /// the host PID namespace). Pod attribution needs --node-name.
    #[arg(long, env = "NEURON_AGENT_PROC_ROOT", default_value = "/proc")]
    proc_root: PathBuf,

    /// Pod label exported as a metric label `label_<key, sanitized>` on the series of the
    /// pod's runtimes and cores (repeatable; the environment variable is comma-separated).
    #[arg(long = "pod-label", env = "NEURON_AGENT_POD_LABELS", value_delimiter = ',')]
    pod_labels: Vec<String>,

    /// The kubelet's pod-resources socket: which pod holds which Neuron devices and cores.
    /// Where it is not mounted at start, the agent also asks neuron-monitor for its
    /// `neuron_k8s_info`, which says it while the kubelet does not.
    #[arg(
        long,
        env = "NEURON_AGENT_POD_RESOURCES_SOCKET",
        default_value = "/var/lib/kubelet/pod-resources/kubelet.sock"
    )]
    pod_resources_socket: PathBuf,

    /// How often the kubelet's pod-resources API is read.
    #[arg(long, env = "NEURON_AGENT_POD_RESOURCES_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pod_resources_interval: Duration,

    /// Time limit of one pod-resources call.
    #[arg(long, env = "NEURON_AGENT_POD_RESOURCES_TIMEOUT", default_value = "2s", value_parser = parse_duration)]
    pod_resources_timeout: Duration,

    /// How long the last known device allocations stay in use while the kubelet does not
    /// answer.
    #[arg(long, env = "NEURON_AGENT_POD_RESOURCES_KEEP", default_value = "5m", value_parser = parse_duration)]
    pod_resources_keep: Duration,

    /// On ECS: the ECS agent's introspection API (`http://127.0.0.1:51678` on a container
    /// instance). A runtime in an ECS task's container gets the task's ARN, family and the
    /// container's name as labels and CloudWatch dimensions.
    #[arg(long, env = "NEURON_AGENT_ECS_AGENT_URI", value_parser = attribution::ecs::parse_agent_uri)]
    ecs_agent_uri: Option<::http::Uri>,
}

/// The CloudWatch sinks of the node configuration's routes.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "CloudWatch")]
struct CloudWatchArgs {
    /// Name of the cluster: the CloudWatch dimension `ClusterName` (left out when unset).
    #[arg(long, env = "CLUSTER_NAME")]
    cluster_name: Option<String>,

    /// Datums each CloudWatch sink keeps waiting at most; beyond it the oldest are dropped
    /// (and counted). A trn1.32xlarge sends about 1,000 per flush with the default set.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_QUEUE_DATUMS", default_value_t = 20_000)]
    cloudwatch_queue_datums: usize,

    /// First delay before retrying a throttled or failed PutMetricData; doubles per
    /// failure, jittered.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_RETRY_INITIAL", default_value = "200ms", value_parser = parse_duration)]
    cloudwatch_retry_initial: Duration,

    /// Longest delay between PutMetricData retries.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_RETRY_MAX", default_value = "20s", value_parser = parse_duration)]
    cloudwatch_retry_max: Duration,

    /// Time limit of one PutMetricData attempt.
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    cloudwatch_request_timeout: Duration,

    /// Time the CloudWatch sinks get on SIGTERM to send what they hold (keep it below
    /// the pod's termination grace period).
    #[arg(long, env = "NEURON_AGENT_CLOUDWATCH_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    cloudwatch_shutdown_timeout: Duration,
}

/// The OTLP sinks of the node configuration's routes.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "OTLP")]
struct OtlpArgs {
    /// Data points each OTLP sink keeps waiting at most (as compressed requests, a few
    /// bytes a point); beyond it the oldest requests are dropped (and counted). A
    /// trn1.32xlarge with a pod per core sends about 1,350 per flush with every group.
    #[arg(long, env = "NEURON_AGENT_OTLP_QUEUE_POINTS", default_value_t = 100_000,
          value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    otlp_queue_points: u32,

    /// First delay before retrying a throttled or failed OTLP export; doubles per failure,
    /// jittered. A receiver's Retry-After (seconds) is honoured up to --otlp-retry-max.
    #[arg(long, env = "NEURON_AGENT_OTLP_RETRY_INITIAL", default_value = "200ms", value_parser = parse_duration)]
    otlp_retry_initial: Duration,

    /// Longest delay between OTLP export retries.
    #[arg(long, env = "NEURON_AGENT_OTLP_RETRY_MAX", default_value = "20s", value_parser = parse_duration)]
    otlp_retry_max: Duration,

    /// Time limit of one OTLP export (sending the request and reading the answer).
    #[arg(long, env = "NEURON_AGENT_OTLP_REQUEST_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    otlp_request_timeout: Duration,

    /// Time the OTLP sinks get on SIGTERM for a last snapshot and their queue (keep it below
    /// the pod's termination grace period).
    #[arg(long, env = "NEURON_AGENT_OTLP_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    otlp_shutdown_timeout: Duration,

    /// URL the sinks without `endpoint` send to instead of CloudWatch's OTLP endpoint of
    /// their region (a FIPS or private endpoint); still signed for that region.
    #[arg(long, env = "NEURON_AGENT_OTLP_CLOUDWATCH_ENDPOINT", value_parser = parse_endpoint)]
    otlp_cloudwatch_endpoint: Option<api::otlp::Endpoint>,

    /// The Secret of --config-namespace into which the operator mirrors the configs'
    /// OTLP headers (`headersSecret`): the only Secret the agent reads.
    #[arg(long, env = "NEURON_AGENT_OTLP_HEADERS_SECRET", default_value = api::names::OTLP_HEADERS_SECRET)]
    otlp_headers_secret: String,
}

fn parse_endpoint(s: &str) -> Result<api::otlp::Endpoint, String> {
    api::otlp::Endpoint::parse(s)
}

/// /metrics, /healthz and /readyz.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "HTTP")]
struct HttpArgs {
    /// Address of /metrics, and of /healthz and /readyz unless --probe-listen is set.
    #[arg(long, env = "NEURON_AGENT_LISTEN", default_value = "0.0.0.0:9010")]
    listen: SocketAddr,

    /// Address of /healthz and /readyz alone, in plain HTTP (for the kubelet, when
    /// --listen serves HTTPS). Default: none, the probes are served on --listen.
    #[arg(long, env = "NEURON_AGENT_PROBE_LISTEN")]
    probe_listen: Option<SocketAddr>,

    /// Serve --listen over HTTPS with this certificate (PEM, the chain after it), e.g.
    /// `tls.crt` of a mounted Secret: re-read when it changes, no restart.
    #[arg(long, env = "NEURON_AGENT_TLS_CERT_FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,

    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "NEURON_AGENT_TLS_KEY_FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,

    /// Check every /metrics request's bearer token with the API server (TokenReview) and
    /// its user's permission to get the non-resource URL /metrics (SubjectAccessReview).
    /// Needs HTTPS (--tls-cert-file) and the Kubernetes API (in-cluster or KUBECONFIG).
    #[arg(long, env = "NEURON_AGENT_METRICS_AUTH", default_value_t = false, action = clap::ArgAction::Set,
          requires_if("true", "tls_cert_file"))]
    metrics_auth: bool,

    /// Audiences a /metrics token must be meant for (comma-separated). Default: the API
    /// server's own, as for any ServiceAccount token.
    #[arg(long, env = "NEURON_AGENT_METRICS_AUTH_AUDIENCES", value_delimiter = ',')]
    metrics_auth_audiences: Vec<String>,

    /// Time an HTTP client gets to complete its TLS handshake and send a complete request
    /// head, from connecting or from its previous response: half-sent requests and idle
    /// keep-alive connections are closed after it.
    #[arg(long, env = "NEURON_AGENT_HTTP_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    http_header_timeout: Duration,

    /// HTTP connections served at once (per port); more are refused (503) and counted.
    #[arg(
        long,
        env = "NEURON_AGENT_HTTP_MAX_CONNECTIONS",
        default_value_t = 256,
        value_parser = clap::value_parser!(u32).range(1..=65_536)
    )]
    http_max_connections: u32,
}

/// Neuron hardware health: the driver's sysfs tree and the kernel log, read off the
/// report path (never written).
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Hardware health")]
struct HealthArgs {
    /// Root of the sysfs tree where the Neuron driver's devices
    /// (`devices/virtual/neuron_device/`) and version (`module/neuron/version`) are read.
    #[arg(long, env = "NEURON_AGENT_SYSFS_ROOT", default_value = "/sys")]
    sysfs_root: PathBuf,

    /// The kernel log: `/dev/kmsg`, or a regular file followed as it grows.
    #[arg(long, env = "NEURON_AGENT_KMSG_PATH", default_value = "/dev/kmsg")]
    kmsg_path: PathBuf,

    /// Kernel-log records this old are still taken at start-up (a fault just before the
    /// agent started is not lost).
    #[arg(long, env = "NEURON_AGENT_KMSG_LOOKBACK", default_value = "5m", value_parser = parse_duration)]
    kmsg_lookback: Duration,

    /// Re-read of the whole driver tree when no `hw_error_event` notification woke the
    /// reader (drivers before 2.28 have none; a fake tree never notifies).
    #[arg(long, env = "NEURON_AGENT_HEALTH_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    health_interval: Duration,

    /// A device's `healthcheck_heartbeat` unchanged for longer makes its health unknown.
    #[arg(long, env = "NEURON_AGENT_HEARTBEAT_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    heartbeat_timeout: Duration,

    /// Type of the Node condition that carries the devices' health (with --node-name):
    /// status False / reason NeuronHasNoError while every device is healthy, True /
    /// NeuronHasError_<NAME> after a fault.
    #[arg(long, env = "NEURON_AGENT_HEALTH_CONDITION_TYPE", default_value = health::node::CONDITION_TYPE,
          value_parser = parse_condition_type)]
    health_condition_type: String,

    /// CloudWatch Logs group of the hardware-health event stream: one JSON event per new
    /// fault and per device or node state change, one stream per instance id. Unset: no
    /// stream. (The NeuronMonitorConfig's `health.logs` names one too; its usual name is
    /// /aws/neuron/hardware-events.)
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_GROUP", value_parser = parse_log_group)]
    health_log_group: Option<String>,

    /// Region of the log group. Default: the instance's region (neuron-monitor's
    /// instance_info).
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_REGION", requires = "health_log_group", value_parser = parse_region)]
    health_log_region: Option<String>,

    /// Events of the stream kept waiting at most (during a CloudWatch Logs outage);
    /// beyond it the oldest are dropped and counted.
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_QUEUE_EVENTS", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    health_log_queue_events: u32,

    /// How long an event may wait for others to share its PutLogEvents request.
    #[arg(long, env = "NEURON_AGENT_HEALTH_LOG_FLUSH_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    health_log_flush_interval: Duration,
}

/// The EFA devices' counters (`class/infiniband/` under --sysfs-root), read off the
/// report path.
#[derive(clap::Args, Debug)]
#[command(next_help_heading = "EFA")]
struct EfaArgs {
    /// The EFA counters are read after each report, and after this long without one
    /// (neuron-monitor restarting or silent).
    #[arg(long, env = "NEURON_AGENT_EFA_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    efa_interval: Duration,
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
    fn defaults(&self) -> HealthDefaults {
        HealthDefaults { condition_type: self.health_condition_type.clone(), kmsg_look_back: self.kmsg_lookback }
    }

    fn options(
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
        }
    }

    /// The stream's destination from the flags (`None`: off).
    fn log_destination(&self) -> Option<LogDestination> {
        let group = self.health_log_group.clone()?;
        Some(LogDestination { group, region: self.health_log_region.clone() })
    }

    /// The stream sends as the CloudWatch sinks do: their retry and time limits.
    fn log_options(&self, cloudwatch: &CloudWatchArgs) -> logs::LogOptions {
        logs::LogOptions {
            queue_events: self.health_log_queue_events as usize,
            flush_interval: self.health_log_flush_interval,
            backoff: Backoff { initial: cloudwatch.cloudwatch_retry_initial, max: cloudwatch.cloudwatch_retry_max },
            request_timeout: cloudwatch.cloudwatch_request_timeout,
            shutdown_timeout: cloudwatch.cloudwatch_shutdown_timeout,
        }
    }
}

#[derive(clap::Args, Debug)]
#[command(next_help_heading = "Logs")]
struct LogArgs {
    /// Log format.
    #[arg(long, env = "NEURON_AGENT_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,

    /// Log filter, in tracing's EnvFilter syntax (e.g. `info,neuron_monitor=warn`).
    #[arg(long, env = "NEURON_AGENT_LOG", default_value = "info")]
    log: String,
}

impl MonitorArgs {
    fn state_dir(&self) -> PathBuf {
        self.state_dir.clone().unwrap_or_else(|| std::env::temp_dir().join("neuron-node-agent"))
    }

    fn launcher(&self, state_dir: PathBuf, metrics: &AgentMetrics, k8s_info: bool) -> Launcher {
        Launcher {
            program: self.monitor_command.clone(),
            args: self.monitor_args.clone(),
            state_dir,
            silence_timeout: self.silence_timeout,
            refused_files: metrics.state_files_refused.clone(),
            k8s_info,
        }
    }

    fn supervisor_config(&self) -> SupervisorConfig {
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
enum ConfigSource<'a> {
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
    fn source(&self) -> ConfigSource<'_> {
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
    async fn kubelet_socket_mounted(&self) -> bool {
        tokio::fs::try_exists(&self.pod_resources_socket).await.unwrap_or(false)
    }

    fn settings(&self) -> attribution::Settings {
        attribution::Settings {
            proc_root: self.proc_root.clone(),
            pod_labels: self.pod_labels.clone(),
            kubelet_socket: self.pod_resources_socket.clone(),
            kubelet_interval: self.pod_resources_interval,
            kubelet_timeout: self.pod_resources_timeout,
            kubelet_keep: self.pod_resources_keep,
            ecs_agent: self.ecs_agent_uri.clone(),
        }
    }
}

impl CloudWatchArgs {
    fn options(&self, node_name: Option<String>) -> cloudwatch::Options {
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
    fn options(&self, identity: Identity, agent_started: std::time::SystemTime) -> otlp::Options {
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

impl HttpArgs {
    fn settings(&self) -> service::http::Settings {
        service::http::Settings {
            listen: self.listen,
            probe_listen: self.probe_listen,
            tls: CertificateFiles::from_flags(self.tls_cert_file.as_ref(), self.tls_key_file.as_ref()),
            limits: service::http::Limits {
                header_timeout: self.http_header_timeout,
                max_connections: self.http_max_connections,
            },
        }
    }

    /// The token checks of /metrics, with the agent's API client or, without one (no
    /// --node-name), a client of their own.
    async fn auth(
        &self,
        client: Option<&kube::Client>,
        watch_timeout: Duration,
        metrics: &AgentMetrics,
    ) -> anyhow::Result<Option<MetricsAuth>> {
        if !self.metrics_auth {
            return Ok(None);
        }
        let client = match client {
            Some(client) => client.clone(),
            None => kubernetes::client(watch_timeout)
                .await
                .context("--metrics-auth reviews tokens with the Kubernetes API (in-cluster or KUBECONFIG)")?,
        };
        let options = AuthOptions { audiences: self.metrics_auth_audiences.clone() };
        Ok(Some(MetricsAuth::new(client, options, metrics.http.auth.clone())))
    }
}

fn parse_period(s: &str) -> Result<Period, String> {
    s.parse().map_err(|e: api::duration::PeriodError| e.to_string())
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    parse_period(s).map(Period::as_duration)
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

fn main() -> anyhow::Result<()> {
    // The monitor's group guard is this binary too (see monitor::group).
    if let Some(code) = group::run_guard_if_requested() {
        std::process::exit(code);
    }
    let args = Args::parse();
    service::process::init_logs(&args.log.log, args.log.log_format == "json")?;
    // Two worker threads at most: the agent shares the node with the workloads it watches.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let started = std::time::SystemTime::now();
    let source = args.source.source();
    let mut registry = Registry::default();
    let metrics = AgentMetrics::register(&mut registry);
    let cloudwatch_metrics = CloudWatchMetrics::register(&mut registry);
    let otlp_metrics = OtlpMetrics::register(&mut registry);

    // On a node without the kubelet's socket, neuron-monitor itself says which pod holds
    // which device (while the kubelet does not answer).
    let k8s_info = args.source.node_name.is_some() && !args.attribution.kubelet_socket_mounted().await;
    if k8s_info {
        info!(socket = %args.attribution.pod_resources_socket.display(),
              "the kubelet's pod-resources socket is not mounted: devices are attributed by neuron-monitor's \
               neuron_k8s_info");
    }

    // The node configuration: the built-in one until a file's or the ConfigMap's is in force.
    let state_dir = args.monitor.state_dir();
    open_state_dir(&state_dir).await?;
    let launcher = args.monitor.launcher(state_dir.clone(), &metrics, k8s_info);
    let builtin = MonitorConfig::all_groups(args.monitor.period);
    let (activator, launch_specs) = Activator::start(launcher, builtin, args.health.defaults(), metrics.clone())
        .await
        .with_context(|| format!("writing the neuron-monitor configuration in {}", state_dir.display()))?;
    match source {
        ConfigSource::File(path) => activator.activate_file(path).await?,
        ConfigSource::Config(path) => standalone::activate_file(&activator, path).await?,
        ConfigSource::Builtin | ConfigSource::ConfigMap => {}
    }
    let activator = Arc::new(activator);

    // Reports → node state (→ pods, on a node) → sinks.
    let state = Arc::new(Mutex::new(NodeState::default()));
    let attributes = args.source.node_name.is_some() || args.attribution.ecs_agent_uri.is_some();
    let attribution = attributes.then(|| attribution::Sources::new(args.attribution.settings(), &mut registry));
    let mut pipeline = Pipeline::new(state.clone(), metrics.clone());
    if let Some(sources) = &attribution {
        pipeline = pipeline.with_attribution(sources.attribution());
    }
    let pipeline = Arc::new(pipeline);
    let shutdown = CancellationToken::new();
    if let Some(sources) = &attribution {
        sources.spawn_ecs_feed(&shutdown);
    }
    // On a node: the node's ConfigMap (its health settings too) before the health readers
    // start, so the kernel-log look-back a configuration sets applies from the start.
    let client = match &args.source.node_name {
        Some(node) => {
            follow_cluster(&args, node, source, attribution.as_ref(), &activator, &metrics, &shutdown).await?
        }
        None => None,
    };
    // Hardware health: its readers run on threads of their own, off the report path, and
    // hand their changes to the CloudWatch Logs stream without waiting. The stream goes
    // where the node configuration's `health.logs` says, else where the flags say.
    let health_options = args.health.options(&args.attribution.proc_root, &state_dir, activator.health_settings());
    let health_metrics = HealthMetrics::register(&mut registry);
    let log_metrics = LogMetrics::register(&mut registry);
    let log_destination = follow_log_destination(activator.health_settings(), args.health.log_destination(), &shutdown);
    let (feed, log_records) = logs::channel(log_destination.clone(), &log_metrics);
    let reports = health::Reports { state: state.clone(), applied: pipeline.subscribe() };
    let health = health::start(health_options, reports, health_metrics, Some(feed), shutdown.clone());
    let cloudwatch_sinks = cloudwatch::Sinks {
        state: state.clone(),
        routing: activator.routing(),
        reports: pipeline.subscribe(),
        options: args.cloudwatch.options(args.source.node_name.clone()),
        metrics: cloudwatch_metrics,
        health: health.clone(),
    };
    let devices = attribution.as_ref().map(attribution::Sources::devices);
    // The configs' OTLP headers, as the operator mirrors them (Kubernetes only).
    let otlp_headers = client.as_ref().map(|client| {
        let (namespace, secret) = (&args.source.config_namespace, &args.otlp.otlp_headers_secret);
        otlp::headers::follow(
            client.clone(),
            namespace,
            secret,
            activator.routing(),
            args.source.api_watch_timeout,
            otlp_metrics.clone(),
            shutdown.clone(),
        )
    });
    let platform = if args.source.node_name.is_some() {
        "aws_eks"
    } else if args.attribution.ecs_agent_uri.is_some() {
        "aws_ecs"
    } else {
        "aws_ec2"
    };
    let identity = Identity {
        node_name: args.source.node_name.clone(),
        cluster_name: args.cloudwatch.cluster_name.clone(),
        platform,
    };
    let health_families = HealthCollector { health: health.clone(), state: state.clone(), devices: devices.clone() };
    let log_sink = LogSink {
        destination: log_destination,
        records: log_records,
        state: state.clone(),
        health: health.clone(),
        devices: devices.clone(),
        node_name: args.source.node_name.clone(),
        options: args.health.log_options(&args.cloudwatch),
        metrics: log_metrics,
    };
    registry.register_collector(Box::new(HealthCollector { health: health.clone(), state: state.clone(), devices }));
    // The applications' processes: read after each report by a task of their own.
    let processes = SharedProcesses::default();
    let process_reader = ProcReader::new(args.attribution.proc_root.clone(), ProcessMetrics::register(&mut registry));
    tokio::spawn(processes::follow(
        process_reader,
        state.clone(),
        pipeline.subscribe(),
        processes.clone(),
        shutdown.clone(),
    ));
    // The EFA devices' counters: read after each report by a task of their own.
    let efa_table = SharedEfa::default();
    let efa_reader =
        EfaReader { sysfs_root: args.health.sysfs_root.clone(), metrics: EfaMetrics::register(&mut registry) };
    tokio::spawn(efa::follow(
        efa_reader,
        pipeline.subscribe(),
        args.efa.efa_interval,
        efa_table.clone(),
        shutdown.clone(),
    ));
    let efa_source =
        EfaSource { table: efa_table, holders: attribution.as_ref().map(attribution::Sources::efa_holders) };
    registry.register_collector(Box::new(EfaCollector {
        source: efa_source.clone(),
        state: state.clone(),
        routing: activator.routing(),
    }));
    let otlp_sinks = otlp::Sinks {
        sources: otlp::Sources {
            state: state.clone(),
            processes: processes.clone(),
            efa: efa_source,
            health: Some(Arc::new(health_families)),
        },
        routing: activator.routing(),
        reports: pipeline.subscribe(),
        headers: otlp_headers,
        options: args.otlp.options(identity, started),
        metrics: otlp_metrics,
    };
    let taint_metrics = TaintMetrics::register(&mut registry);
    let http_state = Arc::new(HttpState {
        exposition: Exposition::new(registry, state, processes, activator.routing()),
        pipeline: pipeline.clone(),
    });

    let auth = args.http.auth(client.as_ref(), args.source.api_watch_timeout, &metrics).await?;
    let server = service::http::start(
        args.http.settings(),
        http::routes(http_state),
        auth,
        metrics.http.clone(),
        shutdown.clone(),
    )
    .await?;
    let cloudwatch_sinks = tokio::spawn(cloudwatch_sinks.run(shutdown.clone()));
    let otlp_sinks = tokio::spawn(otlp_sinks.run(shutdown.clone()));
    let log_sink = tokio::spawn(log_sink.run(shutdown.clone()));
    if let ConfigSource::Config(path) = source {
        let follower =
            standalone::Follower { path: path.to_owned(), activator: activator.clone(), metrics: metrics.clone() };
        tokio::spawn(follower.run(shutdown.clone()));
    }
    if let (Some(node), Some(client)) = (&args.source.node_name, client) {
        let reporter = health::node::NodeReporter {
            client: client.clone(),
            node: node.clone(),
            settings: activator.health_settings(),
            health: health.clone(),
            devices: attribution.as_ref().map(attribution::Sources::devices),
        };
        tokio::spawn(reporter.run(shutdown.clone()));
        let tainter = Tainter {
            client,
            node: node.clone(),
            health: health.clone(),
            settings: activator.health_settings(),
            metrics: taint_metrics,
        };
        tokio::spawn(tainter.run(shutdown.clone()));
    }
    let supervisor = Supervisor { config: args.monitor.supervisor_config(), pipeline, metrics };
    let supervisor = tokio::spawn(supervisor.run(launch_specs, shutdown.clone()));

    service::process::stop_signal().await?;
    info!("shutting down");
    shutdown.cancel();
    if let Err(e) = supervisor.await {
        error!(error = %e, "supervisor task failed");
    }
    // The launch channel stays open until the supervisor stopped: its closing means "stop".
    drop(activator);
    // The sinks (flushing since the cancel, side by side) bound their own final flush;
    // this only guards against a stuck task.
    let limit =
        args.cloudwatch.cloudwatch_shutdown_timeout.max(args.otlp.otlp_shutdown_timeout) + Duration::from_secs(2);
    let flushed = futures::future::join3(cloudwatch_sinks, log_sink, otlp_sinks);
    match tokio::time::timeout(limit, flushed).await {
        Ok((cloudwatch, logs, otlp)) => {
            if let Err(e) = cloudwatch {
                error!(error = %e, "CloudWatch sinks task failed");
            }
            if let Err(e) = logs {
                error!(error = %e, "CloudWatch Logs stream task failed");
            }
            if let Err(e) = otlp {
                error!(error = %e, "OTLP sinks task failed");
            }
        }
        Err(_) => warn!("the CloudWatch and OTLP sinks did not stop in time"),
    }
    if let Err(e) = server.await {
        error!(error = %e, "HTTP server task failed");
    }
    info!("stopped");
    Ok(())
}

/// The CloudWatch Logs destination in force: the health settings' (a node configuration's
/// `health.logs`), else the flags'; kept current until `shutdown`.
fn follow_log_destination(
    mut settings: health::settings::SettingsReceiver,
    flags: Option<LogDestination>,
    shutdown: &CancellationToken,
) -> watch::Receiver<Option<LogDestination>> {
    let in_force = move |settings: &health::settings::HealthSettings| settings.logs.clone().or_else(|| flags.clone());
    let (tx, rx) = watch::channel(in_force(&settings.borrow_and_update()));
    let shutdown = shutdown.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = settings.changed() => if changed.is_err() { return },
            }
            let destination = in_force(&settings.borrow_and_update());
            tx.send_if_modified(|current| {
                let changed = *current != destination;
                *current = destination;
                changed
            });
        }
    });
    rx
}

/// On a node: starts pod attribution's feeds and, unless a file gives the configuration,
/// follows the node's ConfigMap (waiting briefly for its first state, so neuron-monitor
/// starts on it rather than restarts a moment later). Returns the API client, if any.
async fn follow_cluster(
    args: &Args,
    node: &str,
    source: ConfigSource<'_>,
    attribution: Option<&attribution::Sources>,
    activator: &Arc<Activator>,
    metrics: &AgentMetrics,
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<kube::Client>> {
    let watch_timeout = args.source.api_watch_timeout;
    let from_file = matches!(source, ConfigSource::File(_) | ConfigSource::Config(_));
    let client = match kubernetes::client(watch_timeout).await {
        Ok(client) => client,
        // With a configuration file, Kubernetes only serves pod attribution.
        Err(e) if from_file => {
            warn!(error = %e, "no Kubernetes API: runtimes are not attributed to pods, no Node condition");
            return Ok(None);
        }
        Err(e) => {
            return Err(e)
                .context("connecting to Kubernetes (in-cluster or KUBECONFIG) to follow the node configuration")
        }
    };
    if let Some(sources) = attribution {
        sources.spawn_feeds(client.clone(), node, watch_timeout, shutdown);
    }
    if from_file {
        return Ok(Some(client));
    }
    let reloader = Reloader {
        client: client.clone(),
        watch_timeout,
        namespace: args.source.config_namespace.clone(),
        node: node.to_owned(),
        activator: activator.clone(),
        metrics: metrics.clone(),
    };
    let (initialized_tx, initialized_rx) = oneshot::channel();
    tokio::spawn(reloader.run(initialized_tx, shutdown.clone()));
    // An unreachable API server does not hold neuron-monitor back for long.
    if tokio::time::timeout(Duration::from_secs(5), initialized_rx).await.is_err() {
        warn!("the node configuration is not readable yet; starting on the built-in one");
    }
    Ok(Some(client))
}
