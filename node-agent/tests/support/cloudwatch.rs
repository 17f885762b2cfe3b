//! CloudWatch for the tests: a store that speaks the protocol the Rust SDK speaks (Smithy
//! RPC v2 CBOR, gzip-compressed bodies included), the kumo emulator when it is installed,
//! a fault-injecting proxy, and the agent started with AWS settings pointing at them.
//!
//! The store is ours because kumo could not be installed here (the Go module proxy
//! refuses `github.com/sivchari/kumo`), and because kumo drops what these tests check
//! (Counts, StatisticValues' min/max/count, StorageResolution; it does not read gzip
//! bodies). It decodes the SDK's real requests, enforces PutMetricData's limits (1,000
//! datums, 1 MB, 150 values, 30 dimensions, the namespace rule, resolution 1 or 60) and
//! answers ListMetrics and GetMetricData from what it stored.
//! `NEURON_CLOUDWATCH_BACKEND=kumo` runs the tests against kumo instead.

use std::{
    collections::{BTreeMap, VecDeque},
    io::{BufRead, BufReader, Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use super::{free_port, sim, tool, Agent, TempDir};

// --- CBOR ---------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
pub enum Cbor {
    Int(i128),
    Bytes(Vec<u8>),
    Text(String),
    Array(Vec<Cbor>),
    Map(Vec<(Cbor, Cbor)>),
    Tag(u64, Box<Cbor>),
    Float(f64),
    Bool(bool),
    Null,
}

impl Cbor {
    pub fn get(&self, key: &str) -> Option<&Cbor> {
        match self {
            Cbor::Map(entries) => entries.iter().find(|(k, _)| k.as_str() == Some(key)).map(|(_, v)| v),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Cbor::Text(t) => Some(t),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Cbor::Int(i) => Some(*i as f64),
            Cbor::Float(f) => Some(*f),
            Cbor::Tag(1, inner) => inner.as_f64(),
            _ => None,
        }
    }
    pub fn as_array(&self) -> &[Cbor] {
        match self {
            Cbor::Array(a) => a,
            _ => &[],
        }
    }
    fn text(s: &str) -> Cbor {
        Cbor::Text(s.to_owned())
    }
    fn map(entries: Vec<(&str, Cbor)>) -> Cbor {
        Cbor::Map(entries.into_iter().map(|(k, v)| (Cbor::text(k), v)).collect())
    }
}

pub fn cbor_decode(buf: &[u8]) -> Result<Cbor, String> {
    let mut pos = 0;
    let v = decode_item(buf, &mut pos)?.ok_or("unexpected break")?;
    Ok(v)
}

fn byte(buf: &[u8], pos: &mut usize) -> Result<u8, String> {
    let b = *buf.get(*pos).ok_or("truncated CBOR")?;
    *pos += 1;
    Ok(b)
}

fn uint(buf: &[u8], pos: &mut usize, info: u8) -> Result<Option<u64>, String> {
    let n = match info {
        0..=23 => return Ok(Some(u64::from(info))),
        24 => 1,
        25 => 2,
        26 => 4,
        27 => 8,
        31 => return Ok(None),
        _ => return Err(format!("bad additional info {info}")),
    };
    let mut v = 0u64;
    for _ in 0..n {
        v = (v << 8) | u64::from(byte(buf, pos)?);
    }
    Ok(Some(v))
}

/// `None`: a break (end of an indefinite-length item).
fn decode_item(buf: &[u8], pos: &mut usize) -> Result<Option<Cbor>, String> {
    let b = byte(buf, pos)?;
    let (major, info) = (b >> 5, b & 0x1f);
    if b == 0xff {
        return Ok(None);
    }
    let arg = if major == 7 { None } else { uint(buf, pos, info)? };
    Ok(Some(match major {
        0 => Cbor::Int(i128::from(arg.ok_or("indefinite int")?)),
        1 => Cbor::Int(-1 - i128::from(arg.ok_or("indefinite int")?)),
        2 | 3 => {
            let bytes = match arg {
                Some(n) => {
                    let end = *pos + n as usize;
                    let s = buf.get(*pos..end).ok_or("truncated string")?.to_vec();
                    *pos = end;
                    s
                }
                None => {
                    let mut all = Vec::new();
                    while let Some(chunk) = decode_item(buf, pos)? {
                        match chunk {
                            Cbor::Bytes(b) => all.extend(b),
                            Cbor::Text(t) => all.extend(t.into_bytes()),
                            _ => return Err("bad string chunk".into()),
                        }
                    }
                    all
                }
            };
            if major == 2 {
                Cbor::Bytes(bytes)
            } else {
                Cbor::Text(String::from_utf8(bytes).map_err(|e| e.to_string())?)
            }
        }
        4 => {
            let mut items = Vec::new();
            match arg {
                Some(n) => {
                    for _ in 0..n {
                        items.push(decode_item(buf, pos)?.ok_or("break in array")?);
                    }
                }
                None => {
                    while let Some(item) = decode_item(buf, pos)? {
                        items.push(item);
                    }
                }
            }
            Cbor::Array(items)
        }
        5 => {
            let mut entries = Vec::new();
            match arg {
                Some(n) => {
                    for _ in 0..n {
                        let k = decode_item(buf, pos)?.ok_or("break in map")?;
                        let v = decode_item(buf, pos)?.ok_or("break in map")?;
                        entries.push((k, v));
                    }
                }
                None => {
                    while let Some(k) = decode_item(buf, pos)? {
                        let v = decode_item(buf, pos)?.ok_or("break after key")?;
                        entries.push((k, v));
                    }
                }
            }
            Cbor::Map(entries)
        }
        6 => Cbor::Tag(arg.ok_or("indefinite tag")?, Box::new(decode_item(buf, pos)?.ok_or("break in tag")?)),
        _ => match info {
            20 => Cbor::Bool(false),
            21 => Cbor::Bool(true),
            22 | 23 => Cbor::Null,
            25 => {
                let h = (u16::from(byte(buf, pos)?) << 8) | u16::from(byte(buf, pos)?);
                Cbor::Float(half(h))
            }
            26 => {
                let mut b = [0u8; 4];
                for x in &mut b {
                    *x = byte(buf, pos)?;
                }
                Cbor::Float(f64::from(f32::from_be_bytes(b)))
            }
            27 => {
                let mut b = [0u8; 8];
                for x in &mut b {
                    *x = byte(buf, pos)?;
                }
                Cbor::Float(f64::from_be_bytes(b))
            }
            _ => return Err(format!("unsupported simple value {info}")),
        },
    }))
}

fn half(h: u16) -> f64 {
    let exp = (h >> 10) & 0x1f;
    let mant = f64::from(h & 0x3ff);
    let v = match exp {
        0 => mant * 2f64.powi(-24),
        31 => {
            if mant == 0.0 {
                f64::INFINITY
            } else {
                f64::NAN
            }
        }
        _ => (mant + 1024.0) * 2f64.powi(i32::from(exp) - 25),
    };
    if h & 0x8000 != 0 {
        -v
    } else {
        v
    }
}

pub fn cbor_encode(v: &Cbor, out: &mut Vec<u8>) {
    fn head(out: &mut Vec<u8>, major: u8, n: u64) {
        let m = major << 5;
        match n {
            0..=23 => out.push(m | n as u8),
            24..=0xff => out.extend([m | 24, n as u8]),
            0x100..=0xffff => {
                out.push(m | 25);
                out.extend((n as u16).to_be_bytes());
            }
            0x1_0000..=0xffff_ffff => {
                out.push(m | 26);
                out.extend((n as u32).to_be_bytes());
            }
            _ => {
                out.push(m | 27);
                out.extend(n.to_be_bytes());
            }
        }
    }
    match v {
        Cbor::Int(i) if *i >= 0 => head(out, 0, *i as u64),
        Cbor::Int(i) => head(out, 1, (-1 - *i) as u64),
        Cbor::Bytes(b) => {
            head(out, 2, b.len() as u64);
            out.extend(b);
        }
        Cbor::Text(t) => {
            head(out, 3, t.len() as u64);
            out.extend(t.as_bytes());
        }
        Cbor::Array(items) => {
            head(out, 4, items.len() as u64);
            items.iter().for_each(|i| cbor_encode(i, out));
        }
        Cbor::Map(entries) => {
            head(out, 5, entries.len() as u64);
            for (k, v) in entries {
                cbor_encode(k, out);
                cbor_encode(v, out);
            }
        }
        Cbor::Tag(t, inner) => {
            head(out, 6, *t);
            cbor_encode(inner, out);
        }
        Cbor::Float(f) => {
            out.push(0xfb);
            out.extend(f.to_be_bytes());
        }
        Cbor::Bool(b) => out.push(if *b { 0xf5 } else { 0xf4 }),
        Cbor::Null => out.push(0xf6),
    }
}

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

fn cbor_response(status: u16, reason: &str, body: &Cbor, extra: &[(&str, &str)]) -> HttpMessage {
    let mut bytes = Vec::new();
    cbor_encode(body, &mut bytes);
    let mut headers = vec![
        ("content-type".to_owned(), "application/cbor".to_owned()),
        ("smithy-protocol".to_owned(), "rpc-v2-cbor".to_owned()),
        ("x-amzn-requestid".to_owned(), format!("test-{}", fastrand::u64(..))),
    ];
    headers.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
    HttpMessage { start: format!("HTTP/1.1 {status} {reason}"), headers, body: bytes }
}

/// A CloudWatch error as the service sends it (query-compatible code in a header).
pub fn error_response(status: u16, code: &str, message: &str) -> HttpMessage {
    let body = Cbor::map(vec![("__type", Cbor::text(code)), ("message", Cbor::text(message))]);
    let fault = if status >= 500 { "Receiver" } else { "Sender" };
    let reason = if status >= 500 { "Internal Server Error" } else { "Bad Request" };
    cbor_response(status, reason, &body, &[("x-amzn-query-error", &format!("{code};{fault}"))])
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

// --- The store --------------------------------------------------------------------------

/// One datum as CloudWatch received it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredDatum {
    pub namespace: String,
    pub name: String,
    pub dimensions: BTreeMap<String, String>,
    pub unit: Option<String>,
    /// Values with their counts (a lone `Value` has count 1).
    pub values: Vec<(f64, f64)>,
    /// count, sum, min, max.
    pub statistics: Option<[f64; 4]>,
    pub timestamp: f64,
    pub storage_resolution: Option<i64>,
}

impl StoredDatum {
    fn stats(&self) -> [f64; 4] {
        if let Some(s) = self.statistics {
            return s;
        }
        let count = self.values.iter().map(|(_, c)| c).sum();
        let sum = self.values.iter().map(|(v, c)| v * c).sum();
        let min = self.values.iter().map(|(v, _)| *v).fold(f64::INFINITY, f64::min);
        let max = self.values.iter().map(|(v, _)| *v).fold(f64::NEG_INFINITY, f64::max);
        [count, sum, min, max]
    }
}

/// One PutMetricData request as received.
#[derive(Clone, Debug)]
pub struct RequestLog {
    pub namespace: String,
    pub datums: usize,
    /// Uncompressed body bytes.
    pub bytes: usize,
    pub gzip: bool,
    pub status: u16,
}

#[derive(Default)]
pub struct Store {
    pub datums: Vec<StoredDatum>,
    pub requests: Vec<RequestLog>,
}

/// A CloudWatch speaking RPC v2 CBOR, in this process.
pub struct CloudWatchStore {
    pub addr: SocketAddr,
    pub store: Arc<Mutex<Store>>,
    stop: Arc<AtomicBool>,
}

impl CloudWatchStore {
    pub fn start() -> CloudWatchStore {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the CloudWatch store");
        let addr = listener.local_addr().expect("addr");
        let store = Arc::new(Mutex::new(Store::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let s = store.clone();
        serve(listener, stop.clone(), Arc::new(move |req| handle(&s, req)));
        CloudWatchStore { addr, store, stop }
    }

    pub fn datums(&self) -> Vec<StoredDatum> {
        self.store.lock().unwrap().datums.clone()
    }

    pub fn requests(&self) -> Vec<RequestLog> {
        self.store.lock().unwrap().requests.clone()
    }
}

impl Drop for CloudWatchStore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = TcpStream::connect(self.addr);
    }
}

fn handle(store: &Mutex<Store>, req: HttpMessage) -> HttpMessage {
    let path = req.start.split_whitespace().nth(1).unwrap_or("").to_owned();
    let Some(operation) = path.strip_prefix("/service/GraniteServiceVersion20100801/operation/") else {
        return error_response(404, "UnknownOperation", &format!("no such path {path}"));
    };
    if req.header("smithy-protocol") != Some("rpc-v2-cbor") {
        return error_response(400, "InvalidProtocol", "missing smithy-protocol: rpc-v2-cbor");
    }
    let gzip = req.header("content-encoding").is_some_and(|e| e.contains("gzip"));
    let body = if gzip {
        let mut out = Vec::new();
        if let Err(e) = flate2::read::GzDecoder::new(&req.body[..]).read_to_end(&mut out) {
            return error_response(400, "InvalidParameterValue", &format!("bad gzip body: {e}"));
        }
        out
    } else {
        req.body.clone()
    };
    let input = if body.is_empty() { Ok(Cbor::Map(vec![])) } else { cbor_decode(&body) };
    let input = match input {
        Ok(v) => v,
        Err(e) => return error_response(400, "SerializationException", &e),
    };
    match operation {
        "PutMetricData" => {
            let result = put_metric_data(&input, body.len());
            let mut s = store.lock().unwrap();
            let namespace = input.get("Namespace").and_then(Cbor::as_str).unwrap_or_default().to_owned();
            let datums = input.get("MetricData").map_or(0, |d| d.as_array().len());
            let status = if result.is_ok() { 200 } else { 400 };
            s.requests.push(RequestLog { namespace, datums, bytes: body.len(), gzip, status });
            match result {
                Ok(stored) => {
                    s.datums.extend(stored);
                    cbor_response(200, "OK", &Cbor::Map(vec![]), &[])
                }
                Err(message) => error_response(400, "InvalidParameterValue", &message),
            }
        }
        "ListMetrics" => list_metrics(&store.lock().unwrap(), &input),
        "GetMetricData" => get_metric_data(&store.lock().unwrap(), &input),
        other => error_response(400, "UnknownOperation", other),
    }
}

fn valid_namespace(ns: &str) -> bool {
    (1..=255).contains(&ns.len())
        && !ns.starts_with("AWS/")
        && ns.chars().all(|c| c.is_ascii_alphanumeric() || "._/#: -".contains(c))
}

/// Checks a request against the service limits; its datums when it passes.
fn put_metric_data(input: &Cbor, bytes: usize) -> Result<Vec<StoredDatum>, String> {
    let namespace = input.get("Namespace").and_then(Cbor::as_str).ok_or("Namespace is required")?;
    if !valid_namespace(namespace) {
        return Err(format!("invalid namespace {namespace:?}"));
    }
    if bytes > 1_000_000 {
        return Err(format!("request of {bytes} bytes is over 1 MB"));
    }
    let data = input.get("MetricData").map(Cbor::as_array).unwrap_or_default();
    if data.is_empty() || data.len() > 1000 {
        return Err(format!("MetricData has {} datums, not 1..=1000", data.len()));
    }
    let mut out = Vec::with_capacity(data.len());
    for d in data {
        let name = d.get("MetricName").and_then(Cbor::as_str).ok_or("MetricName is required")?;
        let dims = d.get("Dimensions").map(Cbor::as_array).unwrap_or_default();
        if dims.len() > 30 {
            return Err(format!("{name}: {} dimensions", dims.len()));
        }
        let mut dimensions = BTreeMap::new();
        for dim in dims {
            let n = dim.get("Name").and_then(Cbor::as_str).ok_or("dimension without Name")?;
            let v = dim.get("Value").and_then(Cbor::as_str).ok_or("dimension without Value")?;
            if n.is_empty() || v.is_empty() || v.chars().count() > 1024 {
                return Err(format!("{name}: bad dimension {n:?}={v:?}"));
            }
            if dimensions.insert(n.to_owned(), v.to_owned()).is_some() {
                return Err(format!("{name}: dimension {n} twice"));
            }
        }
        let nums = |key: &str| -> Vec<f64> {
            d.get(key).map(Cbor::as_array).unwrap_or_default().iter().filter_map(Cbor::as_f64).collect()
        };
        let (values, counts) = (nums("Values"), nums("Counts"));
        if values.len() > 150 || (!counts.is_empty() && counts.len() != values.len()) {
            return Err(format!("{name}: {} values, {} counts", values.len(), counts.len()));
        }
        let mut pairs: Vec<(f64, f64)> =
            values.iter().enumerate().map(|(i, v)| (*v, counts.get(i).copied().unwrap_or(1.0))).collect();
        if let Some(v) = d.get("Value").and_then(Cbor::as_f64) {
            pairs.push((v, 1.0));
        }
        let statistics = match d.get("StatisticValues") {
            Some(s) => {
                let f = |k: &str| s.get(k).and_then(Cbor::as_f64).ok_or(format!("{name}: StatisticValues.{k} missing"));
                let stats = [f("SampleCount")?, f("Sum")?, f("Minimum")?, f("Maximum")?];
                if stats[0] <= 0.0 || stats[2] > stats[3] {
                    return Err(format!("{name}: bad StatisticValues {stats:?}"));
                }
                Some(stats)
            }
            None => None,
        };
        if pairs.is_empty() == statistics.is_none() {
            return Err(format!("{name}: exactly one of Value, Values, StatisticValues"));
        }
        let storage_resolution = d.get("StorageResolution").and_then(Cbor::as_f64).map(|r| r as i64);
        if storage_resolution.is_some_and(|r| r != 1 && r != 60) {
            return Err(format!("{name}: StorageResolution {storage_resolution:?}"));
        }
        out.push(StoredDatum {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            dimensions,
            unit: d.get("Unit").and_then(Cbor::as_str).map(str::to_owned),
            values: pairs,
            statistics,
            timestamp: d.get("Timestamp").and_then(Cbor::as_f64).unwrap_or(0.0),
            storage_resolution,
        });
    }
    Ok(out)
}

fn dimension_list(dims: &BTreeMap<String, String>) -> Cbor {
    Cbor::Array(dims.iter().map(|(n, v)| Cbor::map(vec![("Name", Cbor::text(n)), ("Value", Cbor::text(v))])).collect())
}

fn list_metrics(store: &Store, input: &Cbor) -> HttpMessage {
    let namespace = input.get("Namespace").and_then(Cbor::as_str);
    let name = input.get("MetricName").and_then(Cbor::as_str);
    let filters: Vec<(String, Option<String>)> = input
        .get("Dimensions")
        .map(Cbor::as_array)
        .unwrap_or_default()
        .iter()
        .filter_map(|f| {
            Some((f.get("Name")?.as_str()?.to_owned(), f.get("Value").and_then(Cbor::as_str).map(str::to_owned)))
        })
        .collect();
    let mut metrics: Vec<(&str, &str, &BTreeMap<String, String>)> = Vec::new();
    for d in &store.datums {
        if namespace.is_some_and(|n| n != d.namespace) || name.is_some_and(|n| n != d.name) {
            continue;
        }
        if !filters.iter().all(|(k, v)| d.dimensions.get(k).is_some_and(|dv| v.as_ref().is_none_or(|v| v == dv))) {
            continue;
        }
        let m = (d.namespace.as_str(), d.name.as_str(), &d.dimensions);
        if !metrics.contains(&m) {
            metrics.push(m);
        }
    }
    metrics.sort();
    // 500 per page, as CloudWatch does.
    let start: usize = input.get("NextToken").and_then(Cbor::as_str).and_then(|t| t.parse().ok()).unwrap_or(0);
    let page: Vec<Cbor> = metrics
        .iter()
        .skip(start)
        .take(500)
        .map(|(ns, n, dims)| {
            Cbor::map(vec![
                ("Namespace", Cbor::text(ns)),
                ("MetricName", Cbor::text(n)),
                ("Dimensions", dimension_list(dims)),
            ])
        })
        .collect();
    let mut out = vec![("Metrics", Cbor::Array(page))];
    if start + 500 < metrics.len() {
        out.push(("NextToken", Cbor::text(&(start + 500).to_string())));
    }
    cbor_response(200, "OK", &Cbor::map(out), &[])
}

fn get_metric_data(store: &Store, input: &Cbor) -> HttpMessage {
    let start = input.get("StartTime").and_then(Cbor::as_f64).unwrap_or(0.0);
    let end = input.get("EndTime").and_then(Cbor::as_f64).unwrap_or(f64::MAX);
    let mut results = Vec::new();
    for q in input.get("MetricDataQueries").map(Cbor::as_array).unwrap_or_default() {
        let id = q.get("Id").and_then(Cbor::as_str).unwrap_or_default();
        let Some(stat) = q.get("MetricStat") else {
            results.push(Cbor::map(vec![("Id", Cbor::text(id)), ("StatusCode", Cbor::text("InternalError"))]));
            continue;
        };
        let metric = stat.get("Metric").cloned().unwrap_or(Cbor::Null);
        let ns = metric.get("Namespace").and_then(Cbor::as_str).unwrap_or_default();
        let name = metric.get("MetricName").and_then(Cbor::as_str).unwrap_or_default();
        let dims: BTreeMap<String, String> = metric
            .get("Dimensions")
            .map(Cbor::as_array)
            .unwrap_or_default()
            .iter()
            .filter_map(|d| Some((d.get("Name")?.as_str()?.to_owned(), d.get("Value")?.as_str()?.to_owned())))
            .collect();
        let period = stat.get("Period").and_then(Cbor::as_f64).unwrap_or(60.0).max(1.0);
        let which = stat.get("Stat").and_then(Cbor::as_str).unwrap_or("Average");
        let mut buckets: BTreeMap<i64, [f64; 4]> = BTreeMap::new();
        for d in &store.datums {
            if d.namespace != ns || d.name != name || d.dimensions != dims || d.timestamp < start || d.timestamp >= end
            {
                continue;
            }
            let bucket = ((d.timestamp - start) / period).floor() as i64;
            let s = d.stats();
            let b = buckets.entry(bucket).or_insert([0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY]);
            b[0] += s[0];
            b[1] += s[1];
            b[2] = b[2].min(s[2]);
            b[3] = b[3].max(s[3]);
        }
        let mut timestamps = Vec::new();
        let mut values = Vec::new();
        for (bucket, [count, sum, min, max]) in buckets.iter().rev() {
            timestamps.push(Cbor::Tag(1, Box::new(Cbor::Float(start + *bucket as f64 * period))));
            values.push(Cbor::Float(match which {
                "Sum" => *sum,
                "SampleCount" => *count,
                "Minimum" => *min,
                "Maximum" => *max,
                _ => sum / count,
            }));
        }
        results.push(Cbor::map(vec![
            ("Id", Cbor::text(id)),
            ("Label", Cbor::text(name)),
            ("Timestamps", Cbor::Array(timestamps)),
            ("Values", Cbor::Array(values)),
            ("StatusCode", Cbor::text("Complete")),
        ]));
    }
    cbor_response(200, "OK", &Cbor::map(vec![("MetricDataResults", Cbor::Array(results))]), &[])
}

// --- kumo -------------------------------------------------------------------------------

/// The kumo emulator (`tests/tools/install.sh`), on a free port, killed on drop.
pub struct Kumo {
    child: Child,
    pub addr: SocketAddr,
    _dir: TempDir,
}

impl Kumo {
    pub fn start() -> Kumo {
        let port = free_port();
        let dir = TempDir::new("kumo");
        let child = Command::new(tool("kumo"))
            .env("KUMO_PORT", port.to_string())
            .env("KUMO_HOST", "127.0.0.1")
            .env("KUMO_DATA_DIR", &dir.0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start kumo");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let start = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "kumo did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(100));
        }
        Kumo { child, addr, _dir: dir }
    }
}

impl Drop for Kumo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CloudWatch a test talks to: our store, or kumo with `NEURON_CLOUDWATCH_BACKEND=kumo`.
pub enum Backend {
    Store(CloudWatchStore),
    Kumo(Kumo),
}

impl Backend {
    pub fn start() -> Backend {
        match std::env::var("NEURON_CLOUDWATCH_BACKEND").as_deref() {
            Ok("kumo") => Backend::Kumo(Kumo::start()),
            _ => Backend::Store(CloudWatchStore::start()),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Backend::Store(s) => s.addr,
            Backend::Kumo(k) => k.addr,
        }
    }

    /// The requests received, when the backend keeps them (our store).
    pub fn requests(&self) -> Option<Vec<RequestLog>> {
        match self {
            Backend::Store(s) => Some(s.requests()),
            Backend::Kumo(_) => None,
        }
    }
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

/// An HTTP proxy on 127.0.0.1 in front of CloudWatch that answers PutMetricData requests
/// with the planned faults, one per request, then forwards the rest.
pub struct FaultProxy {
    pub addr: SocketAddr,
    plan: Arc<Mutex<VecDeque<Fault>>>,
    pub injected: Arc<AtomicUsize>,
    pub forwarded: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl FaultProxy {
    pub fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("addr");
        let plan: Arc<Mutex<VecDeque<Fault>>> = Arc::default();
        let injected = Arc::new(AtomicUsize::new(0));
        let forwarded = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, i, f) = (plan.clone(), injected.clone(), forwarded.clone());
        serve(
            listener,
            stop.clone(),
            Arc::new(move |req: HttpMessage| {
                let fault = if req.start.contains("PutMetricData") { p.lock().unwrap().pop_front() } else { None };
                match fault {
                    Some(Fault::Throttle) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        return error_response(400, "Throttling", "Rate exceeded");
                    }
                    Some(Fault::ServerError) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        return error_response(500, "InternalServiceError", "injected");
                    }
                    Some(Fault::Slow(d)) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(d);
                    }
                    Some(Fault::Stall(d)) => {
                        i.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(d);
                        return error_response(503, "ServiceUnavailable", "stalled");
                    }
                    None => {}
                }
                f.fetch_add(1, Ordering::Relaxed);
                forward(upstream, &req).unwrap_or_else(|e| error_response(502, "BadGateway", &e.to_string()))
            }),
        );
        FaultProxy { addr, plan, injected, forwarded, stop }
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

/// The agent following the node ConfigMap the operator renders (no configuration file):
/// `args` name the node and the operator's namespace, `env` carries `KUBECONFIG`.
pub fn start_agent_following_operator(
    sim_args: &[&str],
    endpoint: SocketAddr,
    args: &[&str],
    env: &[(&str, &std::ffi::OsStr)],
) -> Agent {
    spawn_agent(sim_args, None, endpoint, args, env)
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
