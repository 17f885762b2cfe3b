//! The flags both binaries share (HTTP, TLS, token checks, logs) and the settings they
//! build. Each binary flattens [`HttpFlags`] and [`LogFlags`] into its own flags and
//! applies its [`Flavor`]: the environment variable of a shared flag is the binary's
//! prefix and the flag's name (`--http-header-timeout` → `NEURON_AGENT_HTTP_HEADER_TIMEOUT`),
//! and the defaults that differ between the binaries are the flavor's.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use crate::{
    auth::AuthOptions,
    http::{Limits, Settings},
    tls::CertificateFiles,
};

/// /metrics, /healthz and /readyz.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "HTTP")]
pub struct HttpFlags {
    /// Address of /metrics, and of /healthz and /readyz unless --probe-listen is set.
    #[arg(long)]
    pub listen: SocketAddr,

    /// Address of /healthz and /readyz alone, in plain HTTP (for the kubelet, when
    /// --listen serves HTTPS). Default: none, the probes are served on --listen.
    #[arg(long)]
    pub probe_listen: Option<SocketAddr>,

    /// Serve --listen over HTTPS with this certificate (PEM, the chain after it), e.g.
    /// `tls.crt` of a mounted Secret: re-read when it changes, no restart.
    #[arg(long, requires = "tls_key_file")]
    pub tls_cert_file: Option<PathBuf>,

    /// The certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tls_cert_file")]
    pub tls_key_file: Option<PathBuf>,

    /// Check every /metrics request's bearer token with the API server (TokenReview) and
    /// its user's permission to get the non-resource URL /metrics (SubjectAccessReview).
    /// Needs HTTPS (--tls-cert-file) and the Kubernetes API (in-cluster or KUBECONFIG).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set, requires_if("true", "tls_cert_file"))]
    pub metrics_auth: bool,

    /// Address of a second /metrics, over HTTPS with the certificate of
    /// --tokenless-tls-cert-file and WITHOUT token checks, for a scraper that sends no
    /// token (the CloudWatch Observability add-on). Only the network decides who reaches
    /// it: admit the scraper alone (the chart's NetworkPolicy). Default: none.
    #[arg(long, requires_all = ["tokenless_tls_cert_file", "tokenless_tls_key_file"])]
    pub tokenless_listen: Option<SocketAddr>,

    /// The certificate of --tokenless-listen (PEM, the chain after it), e.g. one that
    /// chains to the CA the scraper trusts; re-read when it changes.
    #[arg(long, requires = "tokenless_listen")]
    pub tokenless_tls_cert_file: Option<PathBuf>,

    /// Its private key (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, requires = "tokenless_listen")]
    pub tokenless_tls_key_file: Option<PathBuf>,

    /// Audiences a /metrics token must be meant for (comma-separated). Default: the API
    /// server's own, as for any ServiceAccount token.
    #[arg(long, value_delimiter = ',')]
    pub metrics_auth_audiences: Vec<String>,

    /// Time an HTTP client gets to complete its TLS handshake and send a complete request
    /// head, from connecting or from its previous response: half-sent requests and idle
    /// keep-alive connections are closed after it.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub http_header_timeout: Duration,

    /// Time an HTTP client gets to read a response, from its first byte sent: a client
    /// that asks and stops reading is closed after it, and the response freed. The time
    /// the server takes to produce the response does not count.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub http_write_timeout: Duration,

    /// Bytes of HTTP responses produced and not yet written, over every connection of
    /// every port (a page shared by several counts for each). When a response does not
    /// fit, the connections whose responses wait unread the longest (of the source
    /// address holding the most) are closed to make room; a response larger than this
    /// alone is answered 503.
    #[arg(long, default_value_t = 32 << 20, value_parser = clap::value_parser!(u64).range(MIN_UNSENT_BYTES..))]
    pub http_max_unsent_bytes: u64,

    /// The same, over the connections of one source address (an IPv6 /64): a client that
    /// does not read exhausts this share, its own connections closed first. A response
    /// larger than this is still sent, alone.
    #[arg(long, default_value_t = 8 << 20, value_parser = clap::value_parser!(u64).range(MIN_UNSENT_BYTES..))]
    pub http_max_unsent_bytes_per_peer: u64,

    /// The kernel's send buffer of each HTTP connection (SO_SNDBUF, which Linux doubles
    /// for its bookkeeping): what the kernel holds of a response its client does not
    /// read. Left to itself Linux grows it up to net.ipv4.tcp_wmem's maximum (4 MiB by
    /// default) for such a client.
    #[arg(long, default_value_t = 128 << 10, value_parser = clap::value_parser!(u32).range(4096..=16 << 20))]
    pub http_send_buffer_bytes: u32,

    /// HTTP connections served at once (per port); more are refused (503) and counted.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub http_max_connections: u32,

    /// HTTP connections served at once from one source address (an IPv6 /64), per port;
    /// more are refused (503) and counted, so that no single client takes every slot.
    /// The probe port allows at most 4 per address whatever this says.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub http_max_connections_per_peer: u32,
}

/// The process's own logs.
#[derive(clap::Args, Debug, Clone)]
#[command(next_help_heading = "Logs")]
pub struct LogFlags {
    /// Log format.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub log_format: String,

    /// Log filter, in tracing's EnvFilter syntax (e.g. `debug`, `info,kube=warn`).
    #[arg(long, default_value = "info")]
    pub log: String,
}

/// What the shared flags differ in from one binary to the other.
pub struct Flavor {
    /// Prefix of the shared flags' environment variables, e.g. `NEURON_AGENT`.
    pub env_prefix: &'static str,
    /// Default of --listen.
    pub listen: &'static str,
    /// Default of --http-max-connections.
    pub max_connections: &'static str,
    /// Default of --http-max-connections-per-peer.
    pub max_connections_per_peer: &'static str,
}

/// The least budget of unsent bytes: a probe's or a refusal's answer fits many times.
const MIN_UNSENT_BYTES: u64 = 64 << 10;

/// The ids of the shared flags (their field names).
const SHARED: [&str; 18] = [
    "listen",
    "probe_listen",
    "tls_cert_file",
    "tls_key_file",
    "metrics_auth",
    "metrics_auth_audiences",
    "tokenless_listen",
    "tokenless_tls_cert_file",
    "tokenless_tls_key_file",
    "http_header_timeout",
    "http_write_timeout",
    "http_max_unsent_bytes",
    "http_max_unsent_bytes_per_peer",
    "http_send_buffer_bytes",
    "http_max_connections",
    "http_max_connections_per_peer",
    "log_format",
    "log",
];

impl Flavor {
    /// The environment variable of the shared flag `id`.
    pub fn env_name(&self, id: &str) -> String {
        format!("{}_{}", self.env_prefix, id.to_ascii_uppercase())
    }

    /// `command` (which flattens the shared flags) with this binary's environment
    /// variables and defaults.
    pub fn apply(&self, mut command: clap::Command) -> clap::Command {
        for id in SHARED {
            // Built once per process, at start: clap keeps `&'static str`s.
            let env: &'static str = Box::leak(self.env_name(id).into_boxed_str());
            command = command.mut_arg(id, |arg| arg.env(env));
        }
        command
            .mut_arg("listen", |arg| arg.default_value(self.listen).required(false))
            .mut_arg("http_max_connections", |arg| arg.default_value(self.max_connections).required(false))
            .mut_arg("http_max_connections_per_peer", |arg| {
                arg.default_value(self.max_connections_per_peer).required(false)
            })
    }
}

impl HttpFlags {
    /// The server's settings.
    pub fn settings(&self) -> Settings {
        Settings {
            listen: self.listen,
            probe_listen: self.probe_listen,
            tls: CertificateFiles::from_flags(self.tls_cert_file.as_ref(), self.tls_key_file.as_ref()),
            tokenless: self.tokenless_listen.zip(CertificateFiles::from_flags(
                self.tokenless_tls_cert_file.as_ref(),
                self.tokenless_tls_key_file.as_ref(),
            )),
            limits: Limits {
                header_timeout: self.http_header_timeout,
                write_timeout: self.http_write_timeout,
                max_connections: self.http_max_connections,
                max_connections_per_peer: self.http_max_connections_per_peer,
                max_unsent_bytes: self.http_max_unsent_bytes,
                max_unsent_bytes_per_peer: self.http_max_unsent_bytes_per_peer,
                send_buffer_bytes: self.http_send_buffer_bytes as usize,
            },
        }
    }

    /// The token checks of /metrics, if the flags ask for them.
    pub fn auth_options(&self) -> Option<AuthOptions> {
        self.metrics_auth.then(|| AuthOptions { audiences: self.metrics_auth_audiences.clone() })
    }
}

impl LogFlags {
    /// Sets up the process's logs (see [`crate::process::init_logs`]).
    pub fn init(&self) -> anyhow::Result<()> {
        crate::process::init_logs(&self.log, self.log_format == "json")
    }
}

/// A duration flag: a number and a unit (`200ms`, `5s`, `5m`), the syntax of the
/// configuration's periods.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<api::duration::Period>().map(api::duration::Period::as_duration).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests;
