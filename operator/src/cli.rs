//! The operator's flags. The flags of HTTP, TLS, token checks and logs are the `service`
//! crate's, shared with the agent.

use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use service::cli::{Flavor, HttpFlags, LogFlags};

/// The operator's flavor of the shared flags.
const FLAVOR: Flavor = Flavor {
    env_prefix: "NEURON_OPERATOR",
    listen: "0.0.0.0:8080",
    max_connections: "64",
    max_connections_per_peer: "16",
};

/// The command line and the environment (exits with clap's message on an error).
/// `neuron-operator` alone, or with flags only, means `run`.
pub fn parse() -> Command {
    let mut args: Vec<String> = std::env::args().collect();
    let explicit =
        matches!(args.get(1).map(String::as_str), Some("crd" | "run" | "help" | "-h" | "--help" | "-V" | "--version"));
    if !explicit {
        args.insert(1, "run".to_owned());
    }
    let matches = command().get_matches_from(args);
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()).command
}

fn command() -> clap::Command {
    Cli::command().mut_subcommand("run", |run| FLAVOR.apply(run))
}

#[derive(Parser)]
#[command(version, about = "Renders NeuronMonitorConfigs into per-node neuron-monitor configurations")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Print the NeuronMonitorConfig CRD (YAML), exactly as committed in crds/.
    Crd,
    /// Run the controller (the default).
    Run(Box<RunArgs>),
}

/// Every flag can also be set by the environment variable in its help.
#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub http: HttpFlags,

    #[command(flatten)]
    pub log: LogFlags,

    /// The operator's namespace: node ConfigMaps and the leader lease live here, and
    /// configs here see every application and the node-level groups.
    #[arg(long, env = "OPERATOR_NAMESPACE", default_value = "neuron-monitor")]
    pub namespace: String,

    /// ConfigMap writes in flight at once in a pass (each a server-side apply of one
    /// node's ConfigMap): a config change reaches N nodes in about N / this round trips.
    #[arg(
        long,
        env = "NEURON_OPERATOR_WRITES_IN_FLIGHT",
        default_value_t = 16,
        value_parser = clap::value_parser!(u32).range(1..=256)
    )]
    pub writes_in_flight: u32,

    /// Elect a leader through a Lease (off only for a single replica in development).
    #[arg(long, env = "NEURON_OPERATOR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Name of the Lease.
    #[arg(long, env = "NEURON_OPERATOR_LEASE", default_value = "neuron-operator")]
    pub lease_name: String,

    /// This replica's identity in the Lease. Default: the pod name (`POD_NAME`) or host name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// Extended resources that make a node a Neuron node (comma-separated).
    #[arg(
        long,
        env = "NEURON_NODE_RESOURCES",
        value_delimiter = ',',
        default_values_t = api::hardware::NEURON_RESOURCES.map(String::from)
    )]
    pub neuron_resources: Vec<String>,

    /// Instance-type prefixes (label node.kubernetes.io/instance-type) that make a node a
    /// Neuron node (comma-separated).
    #[arg(
        long,
        env = "NEURON_NODE_INSTANCE_TYPES",
        value_delimiter = ',',
        default_values_t = api::hardware::NEURON_INSTANCE_FAMILIES.map(String::from)
    )]
    pub neuron_instance_types: Vec<String>,

    /// Render a configuration for NVIDIA GPU nodes too (a node with the `nvidia.com/gpu`
    /// resource, the GPU Operator's or EKS's GPU label, or an NVIDIA instance type), and
    /// count them in the configs' status. On only where the agent runs on GPU nodes (the
    /// chart's `gpu.enabled`): a node without an agent never applies its configuration.
    #[arg(long, env = "NEURON_OPERATOR_GPU_NODES", default_value_t = false, action = clap::ArgAction::Set)]
    pub gpu_nodes: bool,

    /// ConfigMap of the operator's namespace whose key `policy.yaml` holds the tenancy
    /// policy: which CloudWatch namespaces, regions and OTLP endpoints each namespace's
    /// configs may use, and their monthly cost ceiling. Followed while running. Default:
    /// the built-in policy (a team publishes under `Teams/<namespace>/`, to its nodes'
    /// partition, to CloudWatch's OTLP endpoint only, without a ceiling).
    #[arg(long, env = "NEURON_OPERATOR_TENANCY_POLICY")]
    pub tenancy_policy: Option<String>,

    /// Price of CloudWatch OpenTelemetry metrics, USD per GB ingested, for the OTLP
    /// cost estimate (the public rate of us-east-1 by default).
    #[arg(long, env = "NEURON_OPERATOR_OTLP_USD_PER_GB", default_value_t = api::cloudwatch::cost::otlp::DEFAULT_USD_PER_GB, value_parser = parse_price)]
    pub otlp_usd_per_gb: f64,

    /// The Secret of --namespace into which the configs' OTLP headers (`headersSecret`)
    /// are mirrored for the agents (the chart creates it).
    #[arg(long, env = "NEURON_OPERATOR_OTLP_HEADERS_SECRET", default_value = api::names::OTLP_HEADERS_SECRET)]
    pub otlp_headers_secret: String,
}

fn parse_price(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(usd) if usd.is_finite() && (0.0..=1000.0).contains(&usd) => Ok(usd),
        _ => Err("a price in USD from 0 to 1000, e.g. 0.50".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_are_consistent() {
        command().debug_assert();
    }

    #[test]
    fn the_shared_flags_keep_the_operator_s_defaults_and_variables() {
        let matches = command().try_get_matches_from(["neuron-operator", "run"]).expect("defaults");
        let Command::Run(args) = Cli::from_arg_matches(&matches).expect("run").command else {
            panic!("not run");
        };
        assert_eq!(args.http.listen.to_string(), "0.0.0.0:8080");
        assert_eq!(args.http.http_max_connections, 64);
        assert_eq!(args.http.http_max_connections_per_peer, 16);
        assert_eq!(FLAVOR.env_name("listen"), "NEURON_OPERATOR_LISTEN");
    }
}
