//! A test OTLP/HTTP receiver on loopback: it records every request (headers, the body as
//! sent) and answers what the test scripts, then `200` with an empty export response.
//! Written here, apart from the agent's code, so that the two check each other: the body
//! is decoded with the OpenTelemetry proto crate's messages after gunzip.

use std::{
    collections::{BTreeMap, VecDeque},
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use opentelemetry_proto::tonic::{
    collector::metrics::v1::{ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse},
    common::v1::{any_value, KeyValue},
    metrics::v1::{metric::Data, number_data_point},
};
use prost::Message;

/// What the receiver answers to one request.
#[derive(Clone, Debug)]
pub enum Answer {
    /// A status with these headers and no body (e.g. 429 with `Retry-After`).
    Status(u16, Vec<(String, String)>),
    /// 200 with a partial success: `rejected` points refused, and why.
    Partial { rejected: i64, message: String },
    /// No answer for this long, then the connection is closed.
    Stall(Duration),
    /// A status with a body of this many bytes (`x`), written until the client stops
    /// reading: an answer that never ends, for any client of this server.
    Filler { status: u16, bytes: u64 },
}

/// One request as received.
#[derive(Clone, Debug)]
pub struct Received {
    pub at: Instant,
    pub method: String,
    pub path: String,
    /// Names in lower case.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl Received {
    /// The export request: the body, gunzipped when `content-encoding: gzip`.
    pub fn decode(&self) -> anyhow::Result<ExportMetricsServiceRequest> {
        let raw = if self.headers.get("content-encoding").map(String::as_str) == Some("gzip") {
            let mut raw = Vec::new();
            flate2::read::GzDecoder::new(self.body.as_slice()).read_to_end(&mut raw).context("gunzip")?;
            raw
        } else {
            self.body.clone()
        };
        ExportMetricsServiceRequest::decode(raw.as_slice()).context("an ExportMetricsServiceRequest")
    }
}

/// One data point of a request: its metric's name, its attributes, its resource's
/// attributes, its value (every attribute a string, as the agent sends them).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub name: String,
    pub attributes: BTreeMap<String, String>,
    pub resource: BTreeMap<String, String>,
    pub value: f64,
    /// A counter (a cumulative monotonic sum) rather than a gauge.
    pub counter: bool,
    pub start_time_unix_nano: u64,
}

fn strings(attributes: &[KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(any_value::Value::StringValue(s)) => s.clone(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

/// Every data point of a request.
pub fn points(request: &ExportMetricsServiceRequest) -> Vec<Point> {
    let mut out = Vec::new();
    for rm in &request.resource_metrics {
        let resource = rm.resource.as_ref().map(|r| strings(&r.attributes)).unwrap_or_default();
        for metric in rm.scope_metrics.iter().flat_map(|s| &s.metrics) {
            let (points, counter) = match &metric.data {
                Some(Data::Gauge(g)) => (&g.data_points, false),
                Some(Data::Sum(s)) => (&s.data_points, s.is_monotonic),
                _ => continue,
            };
            for p in points {
                let value = match p.value {
                    Some(number_data_point::Value::AsDouble(v)) => v,
                    Some(number_data_point::Value::AsInt(v)) => v as f64,
                    None => f64::NAN,
                };
                out.push(Point {
                    name: metric.name.clone(),
                    attributes: strings(&p.attributes),
                    resource: resource.clone(),
                    value,
                    counter,
                    start_time_unix_nano: p.start_time_unix_nano,
                });
            }
        }
    }
    out
}

struct Shared {
    received: Mutex<Vec<Received>>,
    script: Mutex<VecDeque<Answer>>,
    stop: AtomicBool,
}

/// A running receiver; stopped on drop.
pub struct Receiver {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Bounds of what one request may be here: larger is a test failure, not a hang.
const MAX_HEAD_BYTES: usize = 64 * 1024;
const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

impl Receiver {
    pub fn start() -> anyhow::Result<Receiver> {
        Self::start_on(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
    }

    /// A receiver on `addr`: loopback, or an address of the test node's own network (the
    /// real node's bridge, which its pods reach); port 0: a free one.
    pub fn start_on(addr: SocketAddr) -> anyhow::Result<Receiver> {
        let listener = TcpListener::bind(addr).with_context(|| format!("binding the OTLP receiver on {addr}"))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared =
            Arc::new(Shared { received: Mutex::default(), script: Mutex::default(), stop: AtomicBool::new(false) });
        let accepting = shared.clone();
        let thread = std::thread::Builder::new().name("otlp-receiver".into()).spawn(move || {
            while !accepting.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let shared = accepting.clone();
                        let _ = std::thread::Builder::new()
                            .name("otlp-connection".into())
                            .spawn(move || serve(stream, &shared));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        })?;
        Ok(Receiver { addr, shared, thread: Some(thread) })
    }

    /// The URL of `path` on this receiver.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Answers the next requests so, in order (then 200 again).
    pub fn script(&self, answers: impl IntoIterator<Item = Answer>) {
        self.shared.script.lock().unwrap_or_else(|p| p.into_inner()).extend(answers);
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Polls until `check` accepts the requests so far, or fails after `limit`.
    pub fn wait_for<T>(
        &self,
        what: &str,
        limit: Duration,
        check: impl Fn(&[Received]) -> Option<T>,
    ) -> anyhow::Result<T> {
        let started = Instant::now();
        loop {
            if let Some(found) = check(&self.received()) {
                return Ok(found);
            }
            if started.elapsed() > limit {
                bail!("timed out after {limit:?} waiting for {what}; {} request(s) received", self.received().len());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Serves one connection's requests (HTTP/1.1 keep-alive) until it closes or the
/// receiver stops.
fn serve(mut stream: TcpStream, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let Some(request) = read_request(&mut stream, &mut buffer, shared) else { return };
        let answer = shared.script.lock().unwrap_or_else(|p| p.into_inner()).pop_front();
        shared.received.lock().unwrap_or_else(|p| p.into_inner()).push(request);
        let (status, headers, body) = match answer {
            None => (200, Vec::new(), ExportMetricsServiceResponse::default().encode_to_vec()),
            Some(Answer::Status(status, headers)) => (status, headers, Vec::new()),
            Some(Answer::Partial { rejected, message }) => {
                let partial = ExportMetricsPartialSuccess { rejected_data_points: rejected, error_message: message };
                (200, Vec::new(), ExportMetricsServiceResponse { partial_success: Some(partial) }.encode_to_vec())
            }
            Some(Answer::Filler { status, bytes }) => {
                let _ = write_filler(&mut stream, status, bytes);
                return;
            }
            Some(Answer::Stall(duration)) => {
                let until = Instant::now() + duration;
                while Instant::now() < until && !shared.stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                return;
            }
        };
        let mut head = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/x-protobuf\r\ncontent-length: {}\r\n",
            body.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        if stream.write_all(head.as_bytes()).and_then(|()| stream.write_all(&body)).is_err() {
            return;
        }
    }
}

/// A status and a body of `bytes` filler bytes, until the client stops reading.
fn write_filler(stream: &mut TcpStream, status: u16, bytes: u64) -> std::io::Result<()> {
    let head = format!("HTTP/1.1 {status} X\r\ncontent-type: text/xml\r\ncontent-length: {bytes}\r\n\r\n");
    stream.write_all(head.as_bytes())?;
    let chunk = vec![b'x'; 64 * 1024];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        stream.write_all(&chunk[..n])?;
        left -= n as u64;
    }
    Ok(())
}

/// Reads one request; `None` when the connection closed, broke the bounds, or the
/// receiver stops.
fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>, shared: &Shared) -> Option<Received> {
    let mut chunk = [0u8; 16 * 1024];
    let head_end = loop {
        if let Some(i) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
        if buffer.len() > MAX_HEAD_BYTES || !fill(stream, buffer, &mut chunk, shared)? {
            return None;
        }
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split_whitespace();
    let (method, path) = (first.next()?.to_owned(), first.next()?.to_owned());
    let headers: BTreeMap<String, String> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers.get("content-length").and_then(|l| l.parse().ok()).unwrap_or(0);
    if length > MAX_BODY_BYTES {
        return None;
    }
    let body_start = head_end + 4;
    while buffer.len() < body_start + length {
        if !fill(stream, buffer, &mut chunk, shared)? {
            return None;
        }
    }
    let body = buffer[body_start..body_start + length].to_vec();
    buffer.drain(..body_start + length);
    Some(Received { at: Instant::now(), method, path, headers, body })
}

/// Reads more of the connection: `Some(false)` at its end, `None` when stopping.
fn fill(stream: &mut TcpStream, buffer: &mut Vec<u8>, chunk: &mut [u8], shared: &Shared) -> Option<bool> {
    loop {
        if shared.stop.load(Ordering::Relaxed) {
            return None;
        }
        match stream.read(chunk) {
            Ok(0) => return Some(false),
            Ok(n) => {
                buffer.extend_from_slice(&chunk[..n]);
                return Some(true);
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => continue,
            Err(_) => return Some(false),
        }
    }
}
