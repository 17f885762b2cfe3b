//! `neuron-node-agent`: runs neuron-monitor on a Neuron node and exports its reports.
//!
//! [`run`] goes through the agent's phases in order: configuration, pipeline, cluster
//! tasks, readers, sinks, HTTP, neuron-monitor, then waits for SIGTERM or the end of a
//! critical task, and shuts down ([`stop`]).

mod cli;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime},
};

use anyhow::Context;
use api::monitor_config::MonitorConfig;
use cli::{Args, ConfigSource};
use neuron_node_agent::{
    attribution::{self, podresources::SharedDevices},
    config::{standalone, Activator, Reloader},
    efa::{self, EfaCollector, EfaMetrics, EfaReader, EfaSource, SharedEfa},
    gpu::{self, GpuCollector, GpuMetrics, GpuSnapshot, GpuSource},
    health::{
        self,
        device_taint::{DeviceTaintMetrics, DeviceTainter},
        logs::{self, LogDestination, LogMetrics, LogSink},
        metrics::HealthCollector,
        settings::SettingsReceiver,
        taint::{TaintMetrics, Tainter},
        telemetry::HealthMetrics,
        SharedHealth,
    },
    http::{self, HttpState},
    identity::NodeIdentity,
    kubernetes,
    monitor::{group, LaunchSpec, Supervisor},
    pipeline::Pipeline,
    processes::{self, ProcReader, ProcessMetrics, SharedProcesses},
    series::Exported,
    sinks::{
        cloudwatch::{self, telemetry::CloudWatchMetrics},
        otlp::{self, encode::Identity, telemetry::OtlpMetrics},
        prometheus::Exposition,
    },
    state::NodeState,
    state_dir,
    telemetry::AgentMetrics,
};
use prometheus_client::registry::Registry;
use service::{auth::MetricsAuth, tasks::CriticalTasks};
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

fn main() -> anyhow::Result<()> {
    // The monitor's group guard is this binary too (see monitor::group).
    if let Some(code) = group::run_guard_if_requested() {
        std::process::exit(code);
    }
    one_malloc_arena();
    let args = cli::parse();
    args.log.init()?;
    // A runtime sized for a DaemonSet, not for the host's cores: the agent shares the node
    // with the workloads it watches (docs/performance.md counts its threads).
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = runtime.block_on(run(args));
    // A health reader on a blocking thread stuck in a read (a wedged driver file) must not
    // hold the exit: dropping the runtime would wait for it without end.
    runtime.shutdown_timeout(Duration::from_secs(1));
    outcome
}

/// glibc gives each thread that allocates its own arena (up to 8 per core), and keeps
/// what each one freed: the agent's memory grew with its thread count, and an 8 MiB
/// report held 216 MB against 74 MB with one arena (the `cores` case of
/// node-agent/benches/hostile_inputs.sh, debug build).
/// The agent allocates on few threads at a time, so one arena costs it little contention.
/// Before any thread starts (mallopt is not synchronised with allocation elsewhere).
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: called at the start of main, on the only thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Async worker threads.
const WORKER_THREADS: usize = 2;

/// Threads of the blocking pool: the health readers that live as long as the agent (3,
/// 5 with NVML), and room beside them for the short jobs (a render of `/metrics`, a
/// report being applied, the process reads, an OTLP snapshot, a GPU collection),
/// which wait their turn beyond it. Tokio's default, 512, let the pool follow bursts.
const MAX_BLOCKING_THREADS: usize = 8;

/// What every phase shares: the flags, the registry, the sources of `/metrics`, the
/// agent's metrics, the critical tasks and the shutdown they all follow.
struct Agent {
    args: Args,
    started: SystemTime,
    /// The agent's own metrics.
    registry: Registry,
    /// The readers' families on `/metrics`, after the node state's.
    exported: Vec<Box<dyn Exported>>,
    metrics: AgentMetrics,
    tasks: CriticalTasks,
    shutdown: CancellationToken,
}

/// The configuration phase's result.
struct Configured {
    state_dir: std::path::PathBuf,
    activator: Arc<Activator>,
    launch_specs: watch::Receiver<LaunchSpec>,
}

/// Reports → node state (→ pods, on a node) → sinks.
struct Flow {
    state: Arc<Mutex<NodeState>>,
    attribution: Option<attribution::Sources>,
    pipeline: Arc<Pipeline>,
}

/// What the readers beside the report path give the sinks.
struct Readers {
    health: SharedHealth,
    devices: Option<SharedDevices>,
    processes: SharedProcesses,
    efa: EfaSource,
    /// With an NVIDIA driver and a GPU: the GPUs' latest collection.
    gpu: Option<GpuSource>,
}

impl Readers {
    /// The health series, as /metrics and the OTLP sinks encode them; the Neuron devices'
    /// only where the node may have some (`neuron`).
    fn health_families(&self, flow: &Flow, neuron: bool) -> HealthCollector {
        HealthCollector {
            health: self.health.clone(),
            state: flow.state.clone(),
            devices: self.devices.clone(),
            gpu_hostname: self.gpu.as_ref().map(|g| g.hostname.clone()),
            neuron,
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let mut registry = Registry::default();
    let metrics = AgentMetrics::register(&mut registry);
    state_dir::status().register(&mut registry);
    let mut agent = Agent {
        args,
        started: SystemTime::now(),
        registry,
        exported: Vec::new(),
        metrics,
        tasks: CriticalTasks::new(),
        shutdown: CancellationToken::new(),
    };
    let configured = agent.configure().await?;
    let flow = agent.pipeline();
    // On a node: the node's ConfigMap (its health settings too) before the health readers
    // start, so the kernel-log look-back a configuration sets applies from the start.
    let client = match agent.args.source.node_name.clone() {
        Some(node) => agent.follow_cluster(&node, &flow, &configured.activator).await?,
        None => None,
    };
    let (readers, log_sink) = agent.readers(&configured, &flow);
    agent.sinks(&configured, &flow, &readers, log_sink, client.as_ref());
    let taint_metrics =
        (TaintMetrics::register(&mut agent.registry), DeviceTaintMetrics::register(&mut agent.registry));
    let gpu_only = agent.gpu_only(&readers);
    agent.serve(&configured, &flow, &readers, gpu_only, client.as_ref()).await?;
    if let (Some(node), Some(client)) = (agent.args.source.node_name.clone(), client) {
        agent.node_tasks(client, node, taint_metrics, &configured, &flow, &readers);
    }
    if gpu_only {
        info!("GPUs and no Neuron device on this node: neuron-monitor is not started");
    } else {
        let supervisor = Supervisor {
            config: agent.args.monitor.supervisor_config(),
            pipeline: flow.pipeline,
            metrics: agent.metrics,
        };
        let launches = configured.launch_specs;
        agent.tasks.spawn("neuron-monitor supervisor", supervisor.run(launches, agent.shutdown.clone()));
    }

    let failed = tokio::select! {
        signal = service::process::stop_signal() => { signal?; None }
        ended = agent.tasks.first_end() => Some(ended),
    };
    let limit = agent.args.cloudwatch.cloudwatch_shutdown_timeout.max(agent.args.otlp.otlp_shutdown_timeout);
    let failures = stop(agent.tasks, agent.shutdown, configured.activator, limit).await;
    match failed.or(failures.into_iter().next()) {
        // A non-zero exit: the kubelet restarts the agent.
        Some(ended) => Err(ended.into()),
        None => {
            info!("stopped");
            Ok(())
        }
    }
}

/// The shutdown, in the order it depends on:
/// 1. `shutdown` is cancelled: every critical task stops at once. The supervisor stops
///    neuron-monitor (within its stop grace); the sinks, flushing side by side, bound their
///    own final flush (`sinks_limit`); the HTTP server gives open requests their grace.
/// 2. The tasks are awaited, 2 s beyond the sinks' limit and the server's grace at most:
///    this only guards against a stuck task, which is named and aborted.
/// 3. Only then does the launch channel (`activator`) close: its closing means "stop" to a
///    supervisor still running.
async fn stop(
    tasks: CriticalTasks,
    shutdown: CancellationToken,
    activator: Arc<Activator>,
    sinks_limit: Duration,
) -> Vec<service::tasks::Ended> {
    info!("shutting down");
    shutdown.cancel();
    let failures = tasks.stop(sinks_limit.max(service::http::SHUTDOWN_GRACE) + Duration::from_secs(2)).await;
    drop(activator);
    failures
}

impl Agent {
    /// Configuration: the state directory, and the node configuration in force (the
    /// built-in one until a file's or the ConfigMap's is).
    async fn configure(&mut self) -> anyhow::Result<Configured> {
        let args = &self.args;
        // On a node without the kubelet's socket, neuron-monitor itself says which pod holds
        // which device (while the kubelet does not answer).
        let k8s_info = args.source.node_name.is_some() && !args.attribution.kubelet_socket_mounted().await;
        if k8s_info {
            info!(socket = %args.attribution.pod_resources_socket.display(),
                  "the kubelet's pod-resources socket is not mounted: devices are attributed by neuron-monitor's \
                   neuron_k8s_info");
        }
        let state_dir = args.monitor.state_dir();
        // A full or read-only directory leaves the agent running, degraded.
        state_dir::open_state_dir_at_start(&state_dir).await?;
        let launcher = args.monitor.launcher(state_dir.clone(), &self.metrics, k8s_info);
        let builtin = MonitorConfig::all_groups(args.monitor.period);
        let (activator, launch_specs) =
            Activator::start(launcher, builtin, args.health.defaults(), self.metrics.clone())
                .await
                .with_context(|| format!("writing the neuron-monitor configuration in {}", state_dir.display()))?;
        match args.source.source() {
            ConfigSource::File(path) => activator.activate_file(path).await?,
            ConfigSource::Config(path) => standalone::activate_file(&activator, path).await?,
            ConfigSource::Builtin | ConfigSource::ConfigMap => {}
        }
        let activator = Arc::new(activator);
        if let ConfigSource::Config(path) = args.source.source() {
            let follower = standalone::Follower {
                path: path.to_owned(),
                activator: activator.clone(),
                metrics: self.metrics.clone(),
            };
            self.tasks.spawn("configuration file follower", follower.run(self.shutdown.clone()));
        }
        Ok(Configured { state_dir, activator, launch_specs })
    }

    /// The pipeline: reports into the node state, attributed to pods or ECS tasks where
    /// the agent can tell.
    fn pipeline(&mut self) -> Flow {
        let args = &self.args;
        let state = Arc::new(Mutex::new(NodeState::default()));
        let attributes = args.source.node_name.is_some() || args.attribution.ecs_agent_uri.is_some();
        let attribution =
            attributes.then(|| attribution::Sources::new(args.attribution.settings(), &mut self.registry));
        let mut pipeline = Pipeline::new(state.clone(), self.metrics.clone());
        if let Some(sources) = &attribution {
            pipeline = pipeline.with_attribution(sources.attribution());
            sources.spawn_ecs_feed(&mut self.tasks, &self.shutdown);
        }
        Flow { state, attribution, pipeline: Arc::new(pipeline) }
    }

    /// Cluster tasks, on a node: pod attribution's feeds and, unless a file gives the
    /// configuration, the node's ConfigMap (waiting briefly for its first state, so
    /// neuron-monitor starts on it rather than restarts a moment later). Returns the API
    /// client, if any.
    async fn follow_cluster(
        &mut self,
        node: &str,
        flow: &Flow,
        activator: &Arc<Activator>,
    ) -> anyhow::Result<Option<kube::Client>> {
        let watch_timeout = self.args.source.api_watch_timeout;
        let from_file = matches!(self.args.source.source(), ConfigSource::File(_) | ConfigSource::Config(_));
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
        if let Some(sources) = &flow.attribution {
            sources.spawn_feeds(&mut self.tasks, client.clone(), node, watch_timeout, &self.shutdown);
        }
        if from_file {
            return Ok(Some(client));
        }
        let reloader = Reloader {
            client: client.clone(),
            watch_timeout,
            namespace: self.args.source.config_namespace.clone(),
            node: node.to_owned(),
            activator: activator.clone(),
            metrics: self.metrics.clone(),
        };
        let (initialized_tx, initialized_rx) = oneshot::channel();
        self.tasks.spawn("node configuration reloader", reloader.run(initialized_tx, self.shutdown.clone()));
        // An unreachable API server does not hold neuron-monitor back for long.
        if tokio::time::timeout(Duration::from_secs(5), initialized_rx).await.is_err() {
            warn!("the node configuration is not readable yet; starting on the built-in one");
        }
        Ok(Some(client))
    }

    /// Readers beside the report path: hardware health (on threads of its own, handing
    /// its changes to the CloudWatch Logs stream without waiting), the applications'
    /// processes and the EFA devices' counters (each read after every report by a task).
    fn readers(&mut self, configured: &Configured, flow: &Flow) -> (Readers, LogSink) {
        let (args, shutdown) = (&self.args, &self.shutdown);
        let activator = &configured.activator;
        let mut health_options =
            args.health.options(&args.attribution.proc_root, &configured.state_dir, activator.health_settings());
        // NVML first: the health model reads the GPUs' collections and events.
        let gpu_metrics = GpuMetrics::register(&mut self.registry);
        let nvml = gpu::open(args.gpu.nvml_library.as_deref(), gpu_metrics).map(Arc::new);
        let (gpu_tx, gpu_snapshots) = watch::channel(Arc::new(GpuSnapshot::default()));
        health_options.gpus = nvml.clone().map(|nvml| health::gpu_readers::GpuInputs {
            snapshots: gpu_snapshots.clone(),
            nvml,
            period: activator.gpu_collection(),
        });
        let health_metrics = HealthMetrics::register(&mut self.registry);
        let log_metrics = LogMetrics::register(&mut self.registry);
        // The stream goes where the node configuration's `health.logs` says, else where
        // the flags say.
        let log_destination = follow_log_destination(
            &mut self.tasks,
            activator.health_settings(),
            args.health.log_destination(),
            shutdown,
        );
        let (feed, log_records) = logs::channel(log_destination.clone(), &log_metrics);
        let reports = health::Reports { state: flow.state.clone(), applied: flow.pipeline.subscribe() };
        let health =
            health::start(health_options, reports, health_metrics, Some(feed), &mut self.tasks, shutdown.clone());
        let devices = flow.attribution.as_ref().map(attribution::Sources::devices);
        let log_sink = LogSink {
            destination: log_destination,
            records: log_records,
            state: flow.state.clone(),
            health: health.clone(),
            devices: devices.clone(),
            node_name: args.source.node_name.clone(),
            options: args.health.log_options(&args.cloudwatch),
            metrics: log_metrics,
        };

        let processes = SharedProcesses::default();
        let process_reader =
            ProcReader::new(args.attribution.proc_root.clone(), ProcessMetrics::register(&mut self.registry));
        let follow_processes = processes::follow(
            process_reader,
            flow.state.clone(),
            flow.pipeline.subscribe(),
            processes.clone(),
            shutdown.clone(),
        );
        let efa_table = SharedEfa::default();
        let efa_reader = EfaReader::new(args.health.sysfs_root.clone(), EfaMetrics::register(&mut self.registry));
        let follow_efa = efa::follow(
            efa_reader,
            flow.pipeline.subscribe(),
            args.efa.efa_interval,
            efa_table.clone(),
            shutdown.clone(),
        );
        let efa =
            EfaSource { table: efa_table, holders: flow.attribution.as_ref().map(attribution::Sources::efa_holders) };
        self.exported.push(Box::new(EfaCollector {
            source: efa.clone(),
            state: flow.state.clone(),
            routing: activator.routing(),
        }));
        self.tasks.spawn("processes follower", follow_processes);
        self.tasks.spawn("EFA follower", follow_efa);
        let gpu = nvml.and_then(|reader| self.gpus(flow, activator, reader, gpu_tx, gpu_snapshots));
        let readers = Readers { health, devices, processes, efa, gpu };
        let neuron = !self.gpu_only(&readers);
        self.exported.push(Box::new(readers.health_families(flow, neuron)));
        (readers, log_sink)
    }

    /// The GPU collector, where NVML loads and sees a GPU: a task reading every GPU at
    /// the configuration's period, and its series on `/metrics`.
    fn gpus(
        &mut self,
        flow: &Flow,
        activator: &Activator,
        reader: Arc<gpu::nvml::NvmlReader>,
        tx: watch::Sender<Arc<GpuSnapshot>>,
        snapshot: watch::Receiver<Arc<GpuSnapshot>>,
    ) -> Option<GpuSource> {
        // The node configuration's GPU period, as its Neuron groups' are followed.
        let period = activator.gpu_collection();
        let hostname = self.args.source.node_name.clone().unwrap_or_else(host_name);
        let (holders, process_pods) = match &flow.attribution {
            Some(sources) => sources.gpus(snapshot.clone(), &mut self.tasks, &self.shutdown),
            None => Default::default(),
        };
        let source = GpuSource { snapshot, holders, process_pods, hostname: hostname.into() };
        self.tasks.spawn("GPU collector", gpu::follow(reader, period, tx, self.shutdown.clone()));
        self.exported.push(Box::new(GpuCollector {
            source: source.clone(),
            state: flow.state.clone(),
            routing: activator.routing(),
        }));
        Some(source)
    }

    /// Sinks: CloudWatch, OTLP (with the configs' headers, on Kubernetes) and the
    /// CloudWatch Logs stream, each flushing on shutdown.
    fn sinks(
        &mut self,
        configured: &Configured,
        flow: &Flow,
        readers: &Readers,
        log_sink: LogSink,
        client: Option<&kube::Client>,
    ) {
        let (args, shutdown) = (&self.args, &self.shutdown);
        let routing = configured.activator.routing();
        let cloudwatch_sinks = cloudwatch::Sinks {
            state: flow.state.clone(),
            routing: routing.clone(),
            reports: flow.pipeline.subscribe(),
            options: args.cloudwatch.options(args.source.node_name.clone()),
            metrics: CloudWatchMetrics::register(&mut self.registry),
            health: readers.health.clone(),
            gpus: readers.gpu.clone(),
        };
        let otlp_metrics = OtlpMetrics::register(&mut self.registry);
        let headers = client.map(|client| {
            let (namespace, secret) = (&args.source.config_namespace, &args.otlp.otlp_headers_secret);
            let timeout = args.source.api_watch_timeout;
            let metrics = otlp_metrics.clone();
            otlp::headers::follow(
                &mut self.tasks,
                client.clone(),
                namespace,
                secret,
                routing.clone(),
                timeout,
                metrics,
                shutdown.clone(),
            )
        });
        let identity = Identity {
            node_name: args.source.node_name.clone(),
            cluster_name: args.cloudwatch.cluster_name.clone(),
            platform: platform(args),
        };
        let otlp_sinks = otlp::Sinks {
            sources: otlp::Sources {
                state: flow.state.clone(),
                processes: readers.processes.clone(),
                efa: readers.efa.clone(),
                gpu: readers.gpu.clone(),
                health: Some(Arc::new(readers.health_families(flow, !self.gpu_only(readers)))),
            },
            routing,
            reports: node_data_changes(&mut self.tasks, flow, readers, shutdown),
            headers,
            options: args.otlp.options(identity, self.started),
            metrics: otlp_metrics,
        };
        self.tasks.spawn("CloudWatch sinks", cloudwatch_sinks.run(shutdown.clone()));
        self.tasks.spawn("OTLP sinks", otlp_sinks.run(shutdown.clone()));
        self.tasks.spawn("CloudWatch Logs stream", log_sink.run(shutdown.clone()));
    }

    /// HTTP: /metrics (with token checks when the flags ask), /healthz and /readyz,
    /// which answer 503 once a critical task ended.
    async fn serve(
        &mut self,
        configured: &Configured,
        flow: &Flow,
        readers: &Readers,
        gpu_only: bool,
        client: Option<&kube::Client>,
    ) -> anyhow::Result<()> {
        let registry = std::mem::take(&mut self.registry);
        let state = flow.state.clone();
        let mut exposition =
            Exposition::new(registry, state, readers.processes.clone(), configured.activator.routing());
        for source in std::mem::take(&mut self.exported) {
            exposition.export(source);
        }
        let http_state = Arc::new(HttpState {
            exposition,
            pipeline: flow.pipeline.clone(),
            gpu_only: readers.gpu.clone().filter(|_| gpu_only),
            health: self.tasks.health(),
        });
        let auth = self.metrics_auth(client).await?;
        let routes = http::routes(http_state);
        let server = service::http::start(
            self.args.http.settings(),
            routes,
            auth,
            self.metrics.http.clone(),
            self.shutdown.clone(),
        )
        .await?;
        self.tasks.adopt("HTTP server", server);
        Ok(())
    }

    /// The token checks of /metrics, with the agent's API client or, without one (no
    /// --node-name), a client of their own.
    async fn metrics_auth(&self, client: Option<&kube::Client>) -> anyhow::Result<Option<MetricsAuth>> {
        let Some(options) = self.args.http.auth_options() else {
            return Ok(None);
        };
        let client = match client {
            Some(client) => client.clone(),
            None => kubernetes::client(self.args.source.api_watch_timeout)
                .await
                .context("--metrics-auth reviews tokens with the Kubernetes API (in-cluster or KUBECONFIG)")?,
        };
        Ok(Some(MetricsAuth::new(client, options, self.metrics.http.auth.clone())))
    }

    /// A node with GPUs and no Neuron device: no neuron-monitor, no `NeuronHealth`.
    fn gpu_only(&self, readers: &Readers) -> bool {
        readers.gpu.is_some() && !neuron_devices_present(&self.args.health.sysfs_root)
    }

    /// Cluster tasks of the node's health: its Node condition and Events, and its taint.
    fn node_tasks(
        &mut self,
        client: kube::Client,
        node: String,
        (metrics, device_metrics): (TaintMetrics, DeviceTaintMetrics),
        configured: &Configured,
        flow: &Flow,
        readers: &Readers,
    ) {
        let gpu_only = self.gpu_only(readers);
        let settings = || configured.activator.health_settings();
        let devices = || flow.attribution.as_ref().map(attribution::Sources::devices);
        let reporter = health::node::NodeReporter {
            client: client.clone(),
            node: node.clone(),
            settings: settings(),
            health: readers.health.clone(),
            devices: devices(),
            neuron: !gpu_only,
            gpu_holders: readers.gpu.as_ref().map(|g| g.holders.clone()),
        };
        self.tasks.spawn("node health reporter", reporter.run(self.shutdown.clone()));
        let identity = NodeIdentity { client: client.clone(), node: node.clone(), state: flow.state.clone() };
        self.tasks.spawn("node identity", identity.run(self.shutdown.clone()));
        let device_tainter = DeviceTainter {
            client: client.clone(),
            node: node.clone(),
            health: readers.health.clone(),
            settings: settings(),
            devices: devices(),
            gpus: flow.attribution.as_ref().map(attribution::Sources::gpu_holding),
            dra_wanted: flow.attribution.as_ref().map(attribution::Sources::dra_wanted),
            metrics: device_metrics,
        };
        self.tasks.spawn("device tainter", device_tainter.run(self.shutdown.clone()));
        let tainter = Tainter { client, node, health: readers.health.clone(), settings: settings(), metrics };
        self.tasks.spawn("tainter", tainter.run(self.shutdown.clone()));
    }
}

/// Changes after each report and, on a node with GPUs, each GPU collection: what the
/// sinks wake on (a node with GPUs and no Neuron device has no report).
fn node_data_changes(
    tasks: &mut CriticalTasks,
    flow: &Flow,
    readers: &Readers,
    shutdown: &CancellationToken,
) -> watch::Receiver<u64> {
    let mut reports = flow.pipeline.subscribe();
    let Some(mut gpus) = readers.gpu.as_ref().map(|g| g.snapshot.clone()) else {
        return reports;
    };
    let (tx, rx) = watch::channel(0u64);
    let shutdown = shutdown.clone();
    tasks.spawn("node data changes", async move {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = reports.changed() => if changed.is_err() { return },
                changed = gpus.changed() => if changed.is_err() { return },
            }
            tx.send_modify(|n| *n += 1);
        }
    });
    rx
}

/// Whether the driver's sysfs tree shows a Neuron device (`neuron<N>`).
fn neuron_devices_present(sysfs_root: &std::path::Path) -> bool {
    let Ok(entries) = std::fs::read_dir(sysfs_root.join(health::sysfs::DEVICES_DIR)) else {
        return false;
    };
    entries.flatten().any(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("neuron")))
}

/// The host's name (`Hostname` of the GPU series off Kubernetes), bounded like a label.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    name.trim().chars().filter(|c| !c.is_control()).take(253).collect()
}

/// The platform the OTLP resource names.
fn platform(args: &Args) -> &'static str {
    if args.source.node_name.is_some() {
        "aws_eks"
    } else if args.attribution.ecs_agent_uri.is_some() {
        "aws_ecs"
    } else {
        "aws_ec2"
    }
}

/// The CloudWatch Logs destination in force: the health settings' (a node configuration's
/// `health.logs`), else the flags'; kept current until `shutdown` by a task of `tasks`.
fn follow_log_destination(
    tasks: &mut CriticalTasks,
    mut settings: SettingsReceiver,
    flags: Option<LogDestination>,
    shutdown: &CancellationToken,
) -> watch::Receiver<Option<LogDestination>> {
    let in_force = move |settings: &health::settings::HealthSettings| settings.logs.clone().or_else(|| flags.clone());
    let (tx, rx) = watch::channel(in_force(&settings.borrow_and_update()));
    let shutdown = shutdown.clone();
    tasks.spawn("log destination follower", async move {
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
