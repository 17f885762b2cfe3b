//! A real Prometheus server (the `prometheus` test tool) with a scrape configuration of
//! the test's choosing, or Prometheus 3 (`prometheus3`) receiving OTLP; PromQL over its
//! HTTP API.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::SocketAddr,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context};

use crate::{free_port, random_u32, spawn_tied, tool};

/// One sample of a query result: its labels and value.
pub type Sample = (BTreeMap<String, String>, f64);

/// A running Prometheus; stopped and its data removed on drop.
pub struct Prometheus {
    pid: u32,
    pub addr: SocketAddr,
    dir: PathBuf,
}

impl Prometheus {
    /// Starts Prometheus on `scrape_configs` (the YAML list under that key, indented as
    /// its items), evaluating and scraping every second by default, and waits until it is
    /// ready.
    pub fn start(scrape_configs: &str) -> anyhow::Result<Prometheus> {
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\nscrape_configs:\n{scrape_configs}"
        );
        Self::launch("prometheus", &config, &[])
    }

    /// Starts Prometheus 3 with its OTLP receiver (`--web.enable-otlp-receiver`) and
    /// nothing to scrape; `otlp` is the YAML under its `otlp:` key (e.g. the
    /// `translation_strategy`), empty for the defaults.
    pub fn start_otlp_receiver(otlp: &str) -> anyhow::Result<Prometheus> {
        let config = format!("global:\n  evaluation_interval: 1s\n{otlp}");
        Self::launch("prometheus3", &config, &["--web.enable-otlp-receiver"])
    }

    /// The URL of its OTLP/HTTP metrics receiver.
    pub fn otlp_url(&self) -> String {
        format!("http://{}/api/v1/otlp/v1/metrics", self.addr)
    }

    fn launch(binary: &str, config: &str, args: &[&str]) -> anyhow::Result<Prometheus> {
        let dir = std::env::temp_dir().join(format!("neuron-e2e-prometheus-{:08x}", random_u32()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config).context("writing prometheus.yml")?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse()?;
        let mut command = Command::new(tool(binary));
        command
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit());
        let (pid, _stdout) = spawn_tied(command, libc::SIGTERM)?;
        let prometheus = Prometheus { pid, addr, dir };
        let started = Instant::now();
        while get(addr, "/-/ready").map(|r| r.0) != Some(200) {
            if started.elapsed() > Duration::from_secs(60) {
                bail!("{binary} (pid {pid}) was not ready after 60 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(prometheus)
    }

    /// Runs an instant query. `Err` when Prometheus refuses it (a syntax error, say).
    pub fn query(&self, promql: &str) -> anyhow::Result<Vec<Sample>> {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let (status, body) = get(self.addr, &path).context("prometheus did not answer")?;
        let json: serde_json::Value =
            serde_json::from_str(&body).with_context(|| format!("query response (HTTP {status}): {body}"))?;
        if json["status"] != "success" {
            bail!("{promql}: {} {}", json["errorType"], json["error"]);
        }
        let result = &json["data"]["result"];
        let vector = match json["data"]["resultType"].as_str() {
            Some("vector") => result.as_array().cloned().unwrap_or_default(),
            Some("scalar") => vec![serde_json::json!({ "metric": {}, "value": result })],
            other => bail!("{promql}: unexpected result type {other:?}"),
        };
        Ok(vector
            .iter()
            .filter_map(|r| {
                let labels = r["metric"]
                    .as_object()?
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect();
                let value = r["value"][1].as_str()?.parse().ok()?;
                Some((labels, value))
            })
            .collect())
    }

    /// Polls `promql` until `check` accepts the result, or fails after `limit` with the
    /// last result.
    pub fn wait_for<T>(
        &self,
        promql: &str,
        limit: Duration,
        check: impl Fn(&[Sample]) -> Option<T>,
    ) -> anyhow::Result<T> {
        let started = Instant::now();
        loop {
            let last = self.query(promql)?;
            if let Some(found) = check(&last) {
                return Ok(found);
            }
            if started.elapsed() > limit {
                bail!("timed out after {limit:?} on {promql}; last result: {last:?}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        // SAFETY: signalling the process we started (reaped by its supervising thread).
        unsafe {
            libc::kill(self.pid as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::path::Path::new(&format!("/proc/{}", self.pid)).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter.
pub fn url_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// HTTP/1.1 GET on loopback, chunked bodies included (Prometheus chunks large answers).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).ok()?;
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let body = &raw[split + 4..];
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let body = if head.contains("transfer-encoding: chunked") { crate::https::dechunk(body) } else { body.to_vec() };
    Some((status, String::from_utf8_lossy(&body).into_owned()))
}
