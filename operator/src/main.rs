//! `neuron-operator`: renders NeuronMonitorConfigs into per-node neuron-monitor
//! configurations. `neuron-operator crd` prints the CRD.

mod cli;

use std::sync::Arc;

use anyhow::Context;
use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
use cli::{Command, RunArgs};
use kube::{
    runtime::events::{Recorder, Reporter},
    Client,
};
use neuron_operator::{
    controller::{Controller, Options},
    crdgen,
    leader::LeaderElection,
    nodes::NeuronNodePolicy,
    telemetry::OperatorMetrics,
};
use prometheus_client::registry::Registry;
use service::{
    auth::MetricsAuth,
    http::Routes,
    tasks::{CriticalTasks, Health},
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::info;

fn main() -> anyhow::Result<()> {
    match cli::parse() {
        Command::Crd => {
            print!("{}", crdgen::crd_yaml()?);
            Ok(())
        }
        Command::Run(run_args) => {
            run_args.log.init()?;
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .context("starting the async runtime")?
                .block_on(run(*run_args))
        }
    }
}

struct HttpState {
    registry: Registry,
    controller: Arc<Controller>,
    /// Whether a critical task ended: the probes then answer 503 until the operator exits.
    health: Health,
}

/// The operator's phases: the API client, the controller and its watches, the leader
/// election, HTTP and the reconcile loop, all among the critical tasks; then it waits for
/// SIGTERM or the end of one of them, and shuts down.
async fn run(args: RunArgs) -> anyhow::Result<()> {
    let client = client().await?;
    // In a cluster POD_NAME names the replica; elsewhere the host name and PID do, so that
    // two replicas on one machine never share an identity (and both lead).
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let mut registry = Registry::default();
    let metrics = OperatorMetrics::register(&mut registry);
    let mut tasks = CriticalTasks::new();
    let shutdown = CancellationToken::new();
    let controller = start_controller(&mut tasks, &shutdown, &args, client.clone(), &identity, metrics.clone());
    let leading = elect(&mut tasks, &args, &client, &identity, &metrics, &shutdown);

    let http_state = Arc::new(HttpState { registry, controller: controller.clone(), health: tasks.health() });
    let routes = Routes {
        metrics: Router::new().route("/metrics", get(metrics_handler)).with_state(http_state.clone()),
        probes: Router::new()
            .route("/healthz", get(health_handler))
            .route("/readyz", get(ready_handler))
            .with_state(http_state),
    };
    let auth =
        args.http.auth_options().map(|options| MetricsAuth::new(client.clone(), options, metrics.http.auth.clone()));
    info!(namespace = %args.namespace, %identity, "neuron-operator started");
    let server =
        service::http::start(args.http.settings(), routes, auth, metrics.http.clone(), shutdown.clone()).await?;
    tasks.adopt("HTTP server", server);
    tasks.spawn("reconciler", controller.run(leading, shutdown.clone()));

    let failed = tokio::select! {
        signal = service::process::stop_signal() => { signal?; None }
        ended = tasks.first_end() => Some(ended),
    };
    // Shutdown: every task stops on the one cancel (the reconciler after its pass's
    // writes, the election giving up its lease, the server after its grace); none has to
    // wait for another. A task still running after the server's grace and 2 s is named
    // and aborted.
    info!("shutting down");
    shutdown.cancel();
    let failures = tasks.stop(service::http::SHUTDOWN_GRACE + std::time::Duration::from_secs(2)).await;
    match failed.or(failures.into_iter().next()) {
        // A non-zero exit: the kubelet restarts the operator.
        Some(ended) => Err(ended.into()),
        None => Ok(()),
    }
}

/// The API client. No request may hang forever: a LIST the API server never answers
/// (seen right after a CRD is created or changed) would otherwise stall a watch silently.
/// Watches are renewed well within this bound (controller::WATCH_SECONDS).
async fn client() -> anyhow::Result<Client> {
    let mut config =
        kube::Config::infer().await.context("reading the Kubernetes configuration (in-cluster or KUBECONFIG)")?;
    config.read_timeout = Some(std::time::Duration::from_secs(30));
    Client::try_from(config).context("connecting to Kubernetes")
}

/// The controller, its watches among `tasks`.
fn start_controller(
    tasks: &mut CriticalTasks,
    shutdown: &CancellationToken,
    args: &RunArgs,
    client: Client,
    identity: &str,
    metrics: OperatorMetrics,
) -> Arc<Controller> {
    let recorder = Recorder::new(
        client.clone(),
        Reporter { controller: api::names::OPERATOR_MANAGER.to_owned(), instance: Some(identity.to_owned()) },
    );
    let policy = NeuronNodePolicy {
        resources: args.neuron_resources.clone(),
        instance_type_prefixes: args.neuron_instance_types.clone(),
        gpu_nodes: args.gpu_nodes,
    };
    let options = Options {
        headers_secret: args.otlp_headers_secret.clone(),
        writes_in_flight: args.writes_in_flight as usize,
        policy_configmap: args.tenancy_policy.clone().filter(|name| !name.is_empty()),
        prices: api::cloudwatch::cost::Prices { otlp_usd_per_gb: args.otlp_usd_per_gb },
        nodes: policy,
    };
    Controller::start(tasks, shutdown, client, &args.namespace, metrics, recorder, options)
}

/// Whether this replica leads: through the Lease (the election one of `tasks`), or always
/// with --leader-election=false.
fn elect(
    tasks: &mut CriticalTasks,
    args: &RunArgs,
    client: &Client,
    identity: &str,
    metrics: &OperatorMetrics,
    shutdown: &CancellationToken,
) -> watch::Receiver<bool> {
    let (leading_tx, leading_rx) = watch::channel(!args.leader_election);
    if args.leader_election {
        let election = LeaderElection::new(client.clone(), &args.namespace, &args.lease_name, identity);
        tasks.spawn("leader election", election.run(leading_tx, shutdown.clone()));
    }
    // Not a critical task: it ends with the election (which is one) or at once without it.
    let metrics = metrics.clone();
    let mut leading = leading_rx.clone();
    tokio::spawn(async move {
        loop {
            metrics.leader.set(i64::from(*leading.borrow_and_update()));
            if leading.changed().await.is_err() {
                break;
            }
        }
    });
    leading_rx
}

async fn metrics_handler(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => {
            (StatusCode::OK, [("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
        }
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, [("content-type", "text/plain")], String::new()),
    }
}

async fn health_handler(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    match state.health.failed_task() {
        Some(task) => (StatusCode::SERVICE_UNAVAILABLE, format!("critical task {task} ended\n")),
        None => (StatusCode::OK, "ok\n".to_owned()),
    }
}

async fn ready_handler(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    if let Some(task) = state.health.failed_task() {
        (StatusCode::SERVICE_UNAVAILABLE, format!("critical task {task} ended\n"))
    } else if state.controller.is_synced() {
        (StatusCode::OK, "ok\n".to_owned())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watch caches are not synced yet\n".to_owned())
    }
}
