//! CloudWatch and CloudWatch Logs for the tests: LocalStack and each test's namespaces in
//! it (`neuron_e2e::localstack`, shared with the real node's tests); a fault-injecting
//! proxy in front of it; the agent started with AWS settings pointing at either.

use std::{
    collections::VecDeque,
    io::{BufRead, BufReader, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use super::{sim, Agent};

// --- HTTP/1.1, just enough ------------------------------------------------------------

pub struct HttpMessage {
    /// Request line or status line.
    pub start: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpMessage {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Writes the message with a Content-Length body (chunked bodies are re-framed).
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut out = format!("{}\r\n", self.start);
        for (k, v) in &self.headers {
            if !k.eq_ignore_ascii_case("content-length") && !k.eq_ignore_ascii_case("transfer-encoding") {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str(&format!("content-length: {}\r\n\r\n", self.body.len()));
        w.write_all(out.as_bytes())?;
        w.write_all(&self.body)?;
        w.flush()
    }
}

/// Reads one message; `None` at a clean end of the connection.
pub fn read_message(r: &mut impl BufRead) -> std::io::Result<Option<HttpMessage>> {
    let mut start = String::new();
    if r.read_line(&mut start)? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            headers.push((k.trim().to_owned(), v.trim().to_owned()));
        }
    }
    let mut msg = HttpMessage { start: start.trim_end().to_owned(), headers, body: Vec::new() };
    if msg.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            r.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            if n == 0 {
                let mut trailer = String::new();
                r.read_line(&mut trailer)?;
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk)?;
            chunk.truncate(n);
            msg.body.extend(chunk);
        }
    } else if let Some(n) = msg.header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        msg.body = vec![0; n];
        r.read_exact(&mut msg.body)?;
    }
    Ok(Some(msg))
}

/// Which service's writes a [`FaultProxy`] faults.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Service {
    /// PutMetricData (RPC v2 CBOR: the operation is in the path).
    CloudWatch,
    /// PutLogEvents (AWS JSON 1.1: the operation is in `X-Amz-Target`).
    Logs,
}

impl Service {
    fn is_write(self, req: &HttpMessage) -> bool {
        match self {
            Service::CloudWatch => req.start.contains("PutMetricData"),
            Service::Logs => req.header("x-amz-target").is_some_and(|t| t.ends_with(".PutLogEvents")),
        }
    }

    /// The service's error codes for throttling and for a server error.
    fn codes(self) -> (&'static str, &'static str) {
        match self {
            Service::CloudWatch => ("Throttling", "InternalServiceError"),
            Service::Logs => ("ThrottlingException", "ServiceUnavailableException"),
        }
    }

    fn error(self, status: u16, code: &str, message: &str) -> HttpMessage {
        match self {
            Service::CloudWatch => error_response(status, code, message),
            Service::Logs => json_error_response(status, code, message),
        }
    }
}

/// A CloudWatch Logs error as the service sends it over AWS JSON 1.1.
pub fn json_error_response(status: u16, code: &str, message: &str) -> HttpMessage {
    let body = serde_json::json!({ "__type": code, "message": message }).to_string();
    let reason = if status >= 500 { "Internal Server Error" } else { "Bad Request" };
    let headers = [
        ("content-type", "application/x-amz-json-1.1".to_owned()),
        ("x-amzn-requestid", format!("test-{}", fastrand::u64(..))),
    ];
    HttpMessage {
        start: format!("HTTP/1.1 {status} {reason}"),
        headers: headers.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        body: body.into_bytes(),
    }
}

/// A CloudWatch error as the service sends it over RPC v2 CBOR: the code in the body's
/// `__type` and, query-compatible, in a header.
pub fn error_response(status: u16, code: &str, message: &str) -> HttpMessage {
    let mut body = aws_smithy_cbor::Encoder::new(Vec::new());
    body.map(2).str("__type").str(code).str("message").str(message);
    let fault = if status >= 500 { "Receiver" } else { "Sender" };
    let reason = if status >= 500 { "Internal Server Error" } else { "Bad Request" };
    let headers = [
        ("content-type", "application/cbor".to_owned()),
        ("smithy-protocol", "rpc-v2-cbor".to_owned()),
        ("x-amzn-requestid", format!("test-{}", fastrand::u64(..))),
        ("x-amzn-query-error", format!("{code};{fault}")),
    ];
    HttpMessage {
        start: format!("HTTP/1.1 {status} {reason}"),
        headers: headers.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        body: body.into_writer(),
    }
}

/// Serves connections on a thread each until `stop`.
fn serve(listener: TcpListener, stop: Arc<AtomicBool>, handle: Arc<dyn Fn(HttpMessage) -> HttpMessage + Send + Sync>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let Ok(stream) = stream else { continue };
            let handle = handle.clone();
            std::thread::spawn(move || {
                let Ok(mut writer) = stream.try_clone() else { return };
                let mut reader = BufReader::new(stream);
                while let Ok(Some(request)) = read_message(&mut reader) {
                    let response = handle(request);
                    if response.write_to(&mut writer).is_err() {
                        return;
                    }
                }
            });
        }
    });
}

// --- Fault injection ----------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
pub enum Fault {
    /// 400 `Throttling`, as CloudWatch answers over its rate.
    Throttle,
    /// 500 `InternalServiceError`.
    ServerError,
    /// Hold the request this long, then forward it.
    Slow(Duration),
    /// Hold the request this long, then answer 503 without forwarding it (the client
    /// has given up by then: nothing may be stored twice).
    Stall(Duration),
}

/// A write (PutMetricData, PutLogEvents) that went through the proxy.
#[derive(Clone, Debug)]
pub struct Forwarded {
    /// Body bytes once decompressed (PutMetricData's 1 MB limit applies to them).
    pub bytes: usize,
    pub gzip: bool,
    /// CloudWatch's answer.
    pub status: u16,
    /// A hash of the decompressed body: the same request sent again has the same one.
    pub digest: u64,
}

/// An HTTP proxy on 127.0.0.1 in front of CloudWatch that answers the writes of one
/// service (PutMetricData or PutLogEvents) with the planned faults, one per request, then
/// forwards the rest (and logs them).
pub struct FaultProxy {
    pub addr: SocketAddr,
    plan: Arc<Mutex<VecDeque<Fault>>>,
    pub injected: Arc<AtomicUsize>,
    pub forwarded: Arc<AtomicUsize>,
    log: Arc<Mutex<Vec<Forwarded>>>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    /// In front of CloudWatch's PutMetricData.
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        Self::start_for(upstream, Service::CloudWatch)
    }

    pub fn start_for(upstream: SocketAddr, service: Service) -> FaultProxy {
        let (throttling, server_error) = service.codes();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("addr");
        let plan: Arc<Mutex<VecDeque<Fault>>> = Arc::default();
        let injected = Arc::new(AtomicUsize::new(0));
        let forwarded = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let log: Arc<Mutex<Vec<Forwarded>>> = Arc::default();
        let (p, i, f, l) = (plan.clone(), injected.clone(), forwarded.clone(), log.clone());
        serve(
            listener,
            stop.clone(),
            Arc::new(move |req: HttpMessage| {
                let put = service.is_write(&req);
                let fault = if put { p.lock().unwrap().pop_front() } else { None };
                match fault {
                    Some(Fault::Throttle) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        return service.error(400, throttling, "Rate exceeded");
                    }
                    Some(Fault::ServerError) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        return service.error(500, server_error, "injected");
                    }
                    Some(Fault::Slow(d)) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(d);
                    }
                    Some(Fault::Stall(d)) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(d);
                        return service.error(503, "ServiceUnavailable", "stalled");
                    }
                    None => {}
                }
                f.fetch_add(1, Ordering::Relaxed);
                let response =
                    forward(upstream, &req).unwrap_or_else(|e| error_response(502, "BadGateway", &e.to_string()));
                if put {
                    let status = response.start.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
                    let gzip = req.header("content-encoding").is_some_and(|e| e.contains("gzip"));
                    let body = if gzip {
                        let mut plain = Vec::new();
                        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&req.body[..]), &mut plain)
                            .map(|_| plain)
                            .ok()
                    } else {
                        Some(req.body.clone())
                    };
                    let bytes = body.as_ref().map_or(usize::MAX, Vec::len);
                    let digest = {
                        let mut h = std::collections::hash_map::DefaultHasher::new();
                        std::hash::Hash::hash(&body, &mut h);
                        std::hash::Hasher::finish(&h)
                    };
                    l.lock().unwrap().push(Forwarded { bytes, gzip, status, digest });
                }
                response
            }),
        );
        FaultProxy { addr, plan, injected, forwarded, log, stop }
    }

    /// The writes forwarded so far.
    pub fn requests(&self) -> Vec<Forwarded> {
        self.log.lock().unwrap().clone()
    }

    /// Writes that reached CloudWatch again after an earlier, identical one: a retry of a
    /// request the client gave up on (timed out) while CloudWatch stored it.
    pub fn resent(&self) -> usize {
        let mut seen = std::collections::HashSet::new();
        self.log.lock().unwrap().iter().filter(|r| !seen.insert(r.digest)).count()
    }

    pub fn plan(&self, faults: impl IntoIterator<Item = Fault>) {
        self.plan.lock().unwrap().extend(faults);
    }

    pub fn pending(&self) -> usize {
        self.plan.lock().unwrap().len()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

/// A CloudWatch stand-in on 127.0.0.1 for rates: it answers every PutMetricData with
/// success (storing nothing) and notes when each arrived, with its body.
pub struct CountingEndpoint {
    pub addr: SocketAddr,
    arrivals: Arc<Mutex<Vec<Arrival>>>,
    stop: Arc<AtomicBool>,
}

/// One PutMetricData as the counting endpoint received it.
#[derive(Clone, Debug)]
pub struct Arrival {
    pub at: Instant,
    /// The request body, decompressed (CBOR).
    pub body: Vec<u8>,
}

impl CountingEndpoint {
    pub fn start() -> CountingEndpoint {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the counting endpoint");
        let addr = listener.local_addr().expect("addr");
        let arrivals: Arc<Mutex<Vec<Arrival>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = arrivals.clone();
        serve(
            listener,
            stop.clone(),
            Arc::new(move |req: HttpMessage| {
                let at = Instant::now();
                if !Service::CloudWatch.is_write(&req) {
                    return error_response(400, "UnknownOperationException", "only PutMetricData here");
                }
                let mut body = Vec::new();
                if req.header("content-encoding").is_some_and(|e| e.contains("gzip")) {
                    let mut gz = flate2::read::GzDecoder::new(&req.body[..]);
                    if std::io::Read::read_to_end(&mut gz, &mut body).is_err() {
                        return error_response(400, "InvalidParameterValue", "not gzip");
                    }
                } else {
                    body.clone_from(&req.body);
                }
                seen.lock().unwrap().push(Arrival { at, body });
                // PutMetricData has no output: an empty CBOR map.
                let headers = [
                    ("content-type", "application/cbor".to_owned()),
                    ("smithy-protocol", "rpc-v2-cbor".to_owned()),
                    ("x-amzn-requestid", format!("test-{}", fastrand::u64(..))),
                ];
                HttpMessage {
                    start: "HTTP/1.1 200 OK".to_owned(),
                    headers: headers.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
                    body: vec![0xa0],
                }
            }),
        );
        CountingEndpoint { addr, arrivals, stop }
    }

    /// The PutMetricData requests so far, in arrival order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        self.arrivals.lock().unwrap().clone()
    }
}

impl Drop for CountingEndpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn forward(upstream: SocketAddr, req: &HttpMessage) -> std::io::Result<HttpMessage> {
    let stream = TcpStream::connect(upstream)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let mut headers = req.headers.clone();
    headers.retain(|(k, _)| !k.eq_ignore_ascii_case("connection"));
    headers.push(("connection".to_owned(), "close".to_owned()));
    HttpMessage { start: req.start.clone(), headers, body: req.body.clone() }.write_to(&mut writer)?;
    read_message(&mut BufReader::new(stream))?.ok_or_else(|| std::io::Error::other("upstream closed"))
}

// --- The agent and the SDK ------------------------------------------------------------------

/// Starts the agent on the simulator with a rendered node configuration and the AWS
/// settings of a test: static credentials, CloudWatch at `endpoint`, no instance metadata.
pub fn start_agent(sim_args: &[&str], node_config: &serde_json::Value, endpoint: SocketAddr, args: &[&str]) -> Agent {
    start_agent_with_env(sim_args, node_config, endpoint, args, &[])
}

/// [`start_agent`] with more environment (e.g. `KUBECONFIG` for pod attribution).
pub fn start_agent_with_env(
    sim_args: &[&str],
    node_config: &serde_json::Value,
    endpoint: SocketAddr,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Agent {
    spawn_agent(sim_args, Some(node_config), endpoint, args, env)
}

/// The agent without a configuration file, with the AWS settings of a test: following the
/// node ConfigMap the operator renders when `args` name the node and the operator's
/// namespace (`env` carries `KUBECONFIG`), else on its built-in configuration.
pub fn start_agent_without_file(
    sim_args: &[&str],
    endpoint: SocketAddr,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Agent {
    spawn_agent(sim_args, None, endpoint, args, env)
}

/// The agent running the NeuronMonitorConfig documents of `file` (`--config`), without
/// Kubernetes.
pub fn start_agent_with_config_file(
    sim_args: &[&str],
    file: &std::path::Path,
    endpoint: SocketAddr,
    args: &[&str],
) -> Agent {
    let file = file.to_str().expect("a UTF-8 path");
    let args: Vec<&str> = ["--config", file].iter().chain(args).copied().collect();
    spawn_agent(sim_args, None, endpoint, &args, &[])
}

fn spawn_agent(
    sim_args: &[&str],
    node_config: Option<&serde_json::Value>,
    endpoint: SocketAddr,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Agent {
    Agent::start_configured(sim(), sim_args, args, |command, state_dir| {
        if let Some(node_config) = node_config {
            let config_path = state_dir.join("node-config.json");
            std::fs::write(&config_path, serde_json::to_vec_pretty(node_config).expect("json"))
                .expect("write node config");
            command.arg("--node-config-file").arg(&config_path);
        }
        // Static test credentials and nothing else of the machine's AWS or Kubernetes setup.
        command
            .env("NEURON_AGENT_LOG", "info,aws_config=warn,aws_smithy_runtime=warn")
            .env("AWS_ACCESS_KEY_ID", "AKIDTEST")
            .env("AWS_SECRET_ACCESS_KEY", "test-secret")
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/aws-credentials")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_ENDPOINT_URL_CLOUDWATCH", format!("http://{endpoint}"))
            .env("AWS_ENDPOINT_URL_CLOUDWATCH_LOGS", format!("http://{endpoint}"))
            // LocalStack on a loaded 2-core machine can take seconds for a request of
            // 1,000 datums; one timed out while LocalStack still stores it would be stored
            // twice by the retry. (A test's own --cloudwatch-request-timeout wins.)
            .env("NEURON_AGENT_CLOUDWATCH_REQUEST_TIMEOUT", "60s")
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST");
        for (k, v) in env {
            command.env(k, v);
        }
    })
}

/// An SDK client of the CloudWatch at `addr`, as a user would read their metrics.
pub fn sdk_client(addr: SocketAddr) -> aws_sdk_cloudwatch::Client {
    use aws_sdk_cloudwatch::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_cloudwatch::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-west-2"))
        .endpoint_url(format!("http://{addr}"))
        .credentials_provider(Credentials::new("AKIDTEST", "test-secret", None, None, "tests"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_cloudwatch::Client::from_conf(config)
}

/// An SDK client of the CloudWatch Logs at `addr`, as a user would read the events.
pub fn logs_client(addr: SocketAddr, region: &str) -> aws_sdk_cloudwatchlogs::Client {
    use aws_sdk_cloudwatchlogs::config::{BehaviorVersion, Credentials, Region};
    let config = aws_sdk_cloudwatchlogs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.to_owned()))
        .endpoint_url(format!("http://{addr}"))
        .credentials_provider(Credentials::new("AKIDTEST", "test-secret", None, None, "tests"))
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    aws_sdk_cloudwatchlogs::Client::from_conf(config)
}
