//! `neuron-operator`: renders NeuronMonitorConfigs into per-node neuron-monitor
//! configurations. `neuron-operator crd` prints the CRD.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use axum::{extract::State, http::StatusCode, response::IntoResponse, routing::get, Router};
use clap::{Args, Parser, Subcommand};
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
    auth::{AuthOptions, MetricsAuth},
    http::{Limits, Routes, Settings},
    tls::CertificateFiles,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{error, info};

#[derive(Parser)]
#[command(version, about = "Renders NeuronMonitorConfigs into per-node neuron-monitor configurations")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the NeuronMonitorConfig CRD (YAML), exactly as committed in crds/.
    Crd,
    /// Run the controller (the default).
    Run(Box<RunArgs>),
}

/// Every flag can also be set by the environment variable in its help.
#[derive(Args, Debug)]
struct RunArgs {
    /// The operator's namespace: node ConfigMaps and the leader lease live here, and
    /// configs here see every application and the node-level groups.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "neuron-monitor")]
    namespace: String,

    /// Address of /metrics, and of /healthz and /readyz unless --probe-listen is set.
    #[arg(long, env = "NEURON_OPERATOR_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,

    /// Address of /healthz and /readyz alone, in plain HTTP (for the kubelet, when
    /// --listen serves HTTPS). Default: none, the probes are served on --listen.
    #[arg(long, env = "NEURON_OPERATOR_PROBE_LISTEN")]
    probe_listen: Option<SocketAddr>,

    /// Serve --listen over HTTPS with this certificate (PEM, the chain after it), e.g.
    /// `tls.crt` of a mounted Secret: re-read when it changes, no restart.
    #[arg(long, env = "NEURON_OPERATOR_TLS_CERT_FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,

    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "NEURON_OPERATOR_TLS_KEY_FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,

    /// Check every /metrics request's bearer token with the API server (TokenReview) and
    /// its user's permission to get the non-resource URL /metrics (SubjectAccessReview).
    /// Needs HTTPS (--tls-cert-file).
    #[arg(long, env = "NEURON_OPERATOR_METRICS_AUTH", default_value_t = false, action = clap::ArgAction::Set,
          requires_if("true", "tls_cert_file"))]
    metrics_auth: bool,

    /// Audiences a /metrics token must be meant for (comma-separated). Default: the API
    /// server's own, as for any ServiceAccount token.
    #[arg(long, env = "NEURON_OPERATOR_METRICS_AUTH_AUDIENCES", value_delimiter = ',')]
    metrics_auth_audiences: Vec<String>,

    /// Time an HTTP client gets to complete its TLS handshake and send a complete request
    /// head, from connecting or from its previous response: half-sent requests and idle
    /// keep-alive connections are closed after it.
    #[arg(long, env = "NEURON_OPERATOR_HTTP_HEADER_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    http_header_timeout: Duration,

    /// HTTP connections served at once (per port); more are refused (503) and counted.
    #[arg(
        long,
        env = "NEURON_OPERATOR_HTTP_MAX_CONNECTIONS",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..=65_536)
    )]
    http_max_connections: u32,

    /// ConfigMap writes in flight at once in a pass (each a server-side apply of one
    /// node's ConfigMap): a config change reaches N nodes in about N / this round trips.
    #[arg(
        long,
        env = "NEURON_OPERATOR_WRITES_IN_FLIGHT",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..=256)
    )]
    writes_in_flight: u32,

    /// Elect a leader through a Lease (off only for a single replica in development).
    #[arg(long, env = "NEURON_OPERATOR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,

    /// Name of the Lease.
    #[arg(long, env = "NEURON_OPERATOR_LEASE", default_value = "neuron-operator")]
    lease_name: String,

    /// This replica's identity in the Lease. Default: the pod name (`POD_NAME`) or host name.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,

    /// Extended resources that make a node a Neuron node (comma-separated).
    #[arg(
        long,
        env = "NEURON_NODE_RESOURCES",
        value_delimiter = ',',
        default_values_t = api::hardware::NEURON_RESOURCES.map(String::from)
    )]
    neuron_resources: Vec<String>,

    /// Instance-type prefixes (label node.kubernetes.io/instance-type) that make a node a
    /// Neuron node (comma-separated).
    #[arg(
        long,
        env = "NEURON_NODE_INSTANCE_TYPES",
        value_delimiter = ',',
        default_values_t = api::hardware::NEURON_INSTANCE_FAMILIES.map(String::from)
    )]
    neuron_instance_types: Vec<String>,

    /// ConfigMap of the operator's namespace whose key `policy.yaml` holds the tenancy
    /// policy: which CloudWatch namespaces, regions and OTLP endpoints each namespace's
    /// configs may use, and their monthly cost ceiling. Followed while running. Default:
    /// the built-in policy (a team publishes under `Teams/<namespace>/`, to its nodes'
    /// partition, to CloudWatch's OTLP endpoint only, without a ceiling).
    #[arg(long, env = "NEURON_OPERATOR_TENANCY_POLICY")]
    tenancy_policy: Option<String>,

    /// Price of CloudWatch OpenTelemetry metrics, USD per GB ingested, for the OTLP
    /// cost estimate (the public rate of us-east-1 by default).
    #[arg(long, env = "NEURON_OPERATOR_OTLP_USD_PER_GB", default_value_t = api::cloudwatch::cost::otlp::DEFAULT_USD_PER_GB, value_parser = parse_price)]
    otlp_usd_per_gb: f64,

    /// The Secret of --namespace into which the configs' OTLP headers (`headersSecret`)
    /// are mirrored for the agents (the chart creates it).
    #[arg(long, env = "NEURON_OPERATOR_OTLP_HEADERS_SECRET", default_value = api::names::OTLP_HEADERS_SECRET)]
    otlp_headers_secret: String,

    /// Log format.
    #[arg(long, env = "NEURON_OPERATOR_LOG_FORMAT", default_value = "text", value_parser = ["text", "json"])]
    log_format: String,

    /// Log filter, in tracing's EnvFilter syntax.
    #[arg(long, env = "NEURON_OPERATOR_LOG", default_value = "info")]
    log: String,
}

fn parse_price(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(usd) if usd.is_finite() && (0.0..=1000.0).contains(&usd) => Ok(usd),
        _ => Err("a price in USD from 0 to 1000, e.g. 0.50".to_owned()),
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<api::duration::Period>().map(api::duration::Period::as_duration).map_err(|e| e.to_string())
}

fn main() -> anyhow::Result<()> {
    // `neuron-operator` alone, or with flags only, means `run`.
    let mut args: Vec<String> = std::env::args().collect();
    let explicit =
        matches!(args.get(1).map(String::as_str), Some("crd" | "run" | "help" | "-h" | "--help" | "-V" | "--version"));
    if !explicit {
        args.insert(1, "run".to_owned());
    }
    match Cli::parse_from(args).command {
        Command::Crd => {
            print!("{}", crdgen::crd_yaml()?);
            Ok(())
        }
        Command::Run(run_args) => {
            service::process::init_logs(&run_args.log, run_args.log_format == "json")?;
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
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let mut config =
        kube::Config::infer().await.context("reading the Kubernetes configuration (in-cluster or KUBECONFIG)")?;
    // No request may hang forever: a LIST the API server never answers (seen right after
    // a CRD is created or changed) would otherwise stall a watch silently. Watches are
    // renewed well within this bound (controller::WATCH_SECONDS).
    config.read_timeout = Some(std::time::Duration::from_secs(30));
    let client = Client::try_from(config).context("connecting to Kubernetes")?;
    // In a cluster POD_NAME names the replica; elsewhere the host name and PID do, so that
    // two replicas on one machine never share an identity (and both lead).
    let identity = args.identity.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        format!("{}-{}", host.trim(), std::process::id())
    });
    let mut registry = Registry::default();
    let metrics = OperatorMetrics::register(&mut registry);
    let recorder = Recorder::new(
        client.clone(),
        Reporter { controller: api::names::OPERATOR_MANAGER.to_owned(), instance: Some(identity.clone()) },
    );
    let policy = NeuronNodePolicy {
        resources: args.neuron_resources.clone(),
        instance_type_prefixes: args.neuron_instance_types.clone(),
    };
    let options = Options {
        headers_secret: args.otlp_headers_secret.clone(),
        writes_in_flight: args.writes_in_flight as usize,
        policy_configmap: args.tenancy_policy.clone().filter(|name| !name.is_empty()),
        prices: api::cloudwatch::cost::Prices { otlp_usd_per_gb: args.otlp_usd_per_gb },
    };
    let controller = Controller::start(client.clone(), &args.namespace, policy, metrics.clone(), recorder, options);
    let shutdown = CancellationToken::new();

    let (leading_tx, leading_rx) = watch::channel(!args.leader_election);
    let election = if args.leader_election {
        let election = LeaderElection::new(client.clone(), &args.namespace, &args.lease_name, &identity);
        Some(tokio::spawn(election.run(leading_tx, shutdown.clone())))
    } else {
        drop(leading_tx);
        None
    };
    {
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
    }

    let http_state = Arc::new(HttpState { registry, controller: controller.clone() });
    let routes = Routes {
        metrics: Router::new().route("/metrics", get(metrics_handler)).with_state(http_state.clone()),
        probes: Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(ready_handler))
            .with_state(http_state),
    };
    let settings = Settings {
        listen: args.listen,
        probe_listen: args.probe_listen,
        tls: CertificateFiles::from_flags(args.tls_cert_file.as_ref(), args.tls_key_file.as_ref()),
        limits: Limits { header_timeout: args.http_header_timeout, max_connections: args.http_max_connections },
    };
    let auth = args.metrics_auth.then(|| {
        let options = AuthOptions { audiences: args.metrics_auth_audiences.clone() };
        MetricsAuth::new(client.clone(), options, metrics.http.auth.clone())
    });
    info!(namespace = %args.namespace, %identity, "neuron-operator started");
    let server = service::http::start(settings, routes, auth, metrics.http.clone(), shutdown.clone()).await?;
    let reconciler = tokio::spawn(controller.run(leading_rx, shutdown.clone()));

    service::process::stop_signal().await?;
    info!("shutting down");
    shutdown.cancel();
    let _ = reconciler.await;
    if let Some(election) = election {
        let _ = election.await;
    }
    if let Err(e) = server.await {
        error!(error = %e, "HTTP server task failed");
    }
    Ok(())
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

async fn ready_handler(State(state): State<Arc<HttpState>>) -> impl IntoResponse {
    if state.controller.is_synced() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "watch caches are not synced yet\n")
    }
}
