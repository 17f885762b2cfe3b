//! The real agent binary fed hostile neuron-monitor reports by a fake monitor (a shell
//! script that prints prepared lines): absurd hardware counts, huge label values,
//! thousands of runtimes, configurations whose extra labels stack up, and a seeded run
//! of random mutations of the 32-runtime fixture. The agent must stay up, serve
//! `/healthz`, keep its memory and its exposition bounded, and count what it refused.

mod support;

use std::{
    io::Write,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use api::limits::{
    MAX_EXTRA_LABELS_PER_SERIES, MAX_NEURONCORES, MAX_REPORT_LABEL_VALUE_BYTES, MAX_RUNTIMES_PER_REPORT,
};
use neuron_test_support::{fixture, TRN1N_32};
use serde_json::{json, Value};
use support::{http_get, Agent, Metrics, TempDir};

/// neuron-monitor is silent after its lines: no restart for silence while a test reads.
const QUIET: &[&str] = &["--silence-timeout", "1h", "--log", "warn"];

/// The 32-runtime trn1n.32xlarge report as a JSON value.
fn fixture_32() -> Value {
    serde_json::from_str(&fixture(TRN1N_32)).expect("fixture is JSON")
}

/// Writes an executable shell script `neuron-monitor` in `dir` with `body`.
fn script(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("neuron-monitor");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A fake neuron-monitor that prints `lines` once, then stays silent.
fn monitor_printing(dir: &TempDir, lines: &[String]) -> PathBuf {
    let data = dir.0.join("lines.ndjson");
    let mut file = std::fs::File::create(&data).expect("lines file");
    for line in lines {
        writeln!(file, "{line}").expect("write line");
    }
    script(&dir.0, &format!("cat '{}'\nexec sleep 3600", data.display()))
}

/// Waits until the agent has taken `lines` lines (applied or rejected).
fn wait_for_lines(agent: &Agent, lines: f64, limit: Duration) -> Metrics {
    agent.wait_for(&format!("{lines} lines taken"), limit, |m| {
        let taken = m.sum("neuron_agent_reports_total", &[]) + m.sum("neuron_agent_lines_rejected_total", &[]);
        (taken >= lines).then(|| m.clone())
    })
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap_or("VmRSS: 0 kB");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn refused(m: &Metrics, what: &str) -> f64 {
    m.sum("neuron_agent_report_values_refused_total", &[("what", what)])
}

/// Every label value of every sample is bounded (the agent's own labels are short).
fn assert_label_values_bounded(m: &Metrics) {
    for sample in &m.samples {
        for (key, value) in &sample.labels {
            assert!(
                value.len() <= MAX_REPORT_LABEL_VALUE_BYTES + 16,
                "{}: label {key} is {} bytes",
                sample.name,
                value.len()
            );
        }
    }
}

#[test]
fn absurd_hardware_counts_are_refused_not_allocated() {
    let mut lines = Vec::new();
    for (devices, cores) in [(65535, 65535), (1000, 1000), (MAX_NEURONCORES + 1, 1)] {
        let mut doc = fixture_32();
        doc["neuron_hardware_info"]["neuron_device_count"] = json!(devices);
        doc["neuron_hardware_info"]["neuroncore_per_device_count"] = json!(cores);
        lines.push(doc.to_string());
    }
    let dir = TempDir::new("hardware");
    let agent = Agent::start_with(monitor_printing(&dir, &lines).to_str().expect("path"), &[], QUIET);
    let m = wait_for_lines(&agent, 3.0, Duration::from_secs(60));
    assert_eq!(agent.get("/healthz").map(|r| r.0), Some(200));
    assert_eq!(m.sum("neuron_agent_reports_total", &[]), 3.0);
    let out_of_bounds = [("group", "neuron_hardware_info"), ("kind", "out_of_bounds")];
    assert_eq!(m.sum("neuron_agent_group_errors_total", &out_of_bounds), 3.0);
    assert_eq!(m.value("neuron_agent_group_error", &out_of_bounds), Some(1.0));
    assert_eq!(refused(&m, "hardware_counts"), 3.0);
    // No idle cores from refused counts: only the 32 cores the runtimes hold.
    let cores = m.find("neuroncore_utilization_ratio", &[]);
    assert_eq!(cores.len(), 32);
    assert!(cores.iter().all(|s| s.labels.contains_key("runtime_tag")));
    assert!(m.find("neuron_hardware_info", &[]).is_empty());
    println!("hardware: scrape {} bytes, agent RSS {} KiB", m.text.len(), rss_kib(agent.child.id()));
}

#[test]
fn huge_strings_in_a_report_are_cut_in_every_label() {
    let mut doc = fixture_32();
    doc["instance_info"]["instance_region"] = json!("r".repeat(1 << 20));
    doc["instance_info"]["instance_name"] = json!("line\nbreak\u{7}bell");
    doc["neuron_runtime_data"][3]["neuron_runtime_tag"] = json!("t".repeat(100_000));
    let dir = TempDir::new("strings");
    let agent = Agent::start_with(monitor_printing(&dir, &[doc.to_string()]).to_str().expect("path"), &[], QUIET);
    let m = wait_for_lines(&agent, 1.0, Duration::from_secs(60));
    assert_eq!(m.sum("neuron_agent_reports_total", &[]), 1.0);
    assert_eq!(refused(&m, "label_value"), 3.0, "region, name and one tag");
    assert_label_values_bounded(&m);
    let region = "r".repeat(MAX_REPORT_LABEL_VALUE_BYTES);
    assert!(m.value("instance_info", &[("region", &region)]).is_some());
    assert!(m.value("instance_info", &[("instance_name", "line\u{FFFD}break\u{FFFD}bell")]).is_some());
    assert_eq!(m.find("neuroncore_utilization_ratio", &[]).len(), 32);
    // The whole exposition stays near its usual size (hundreds of kB), not hundreds of MB.
    assert!(m.text.len() < 4 << 20, "scrape of {} bytes", m.text.len());
    println!("strings: scrape {} bytes, agent RSS {} KiB", m.text.len(), rss_kib(agent.child.id()));
}

/// A small runtime entry holding core `core`.
fn small_runtime(pid: u32, core: u32) -> Value {
    json!({"pid": pid, "neuron_runtime_tag": format!("rt-{pid:06}"), "error": "", "report": {
        "neuroncore_counters": {"period": 1.0, "error": "",
            "neuroncores_in_use": {core.to_string(): {"neuroncore_utilization": 12.5}}}}})
}

/// [`small_runtime`] as text, written directly (thousands per line in the mutated run).
fn small_runtime_text(pid: u32, core: u32) -> String {
    format!(
        r#"{{"pid":{pid},"neuron_runtime_tag":"rt-{pid:06}","error":"","report":{{"neuroncore_counters":{{"period":1.0,"error":"","neuroncores_in_use":{{"{core}":{{"neuroncore_utilization":12.5}}}}}}}}}}"#
    )
}

#[test]
fn runtimes_beyond_the_cap_are_skipped_and_healthz_stays_responsive() {
    const RUNTIMES: u32 = 20_000;
    let mut doc = fixture_32();
    doc["neuron_runtime_data"] = Value::Array((0..RUNTIMES).map(|i| small_runtime(i + 1, i % 32)).collect());
    let line = doc.to_string();
    let reports = 5;
    let dir = TempDir::new("runtimes");
    let agent = Agent::start_with(monitor_printing(&dir, &vec![line; reports]).to_str().expect("path"), &[], QUIET);
    // While the reports are applied, /healthz answers each time, and promptly.
    let start = Instant::now();
    let mut slowest = Duration::ZERO;
    loop {
        let asked = Instant::now();
        let health = http_get(agent.addr, "/healthz").map(|r| r.0);
        slowest = slowest.max(asked.elapsed());
        assert_eq!(health, Some(200), "/healthz after {:?}", start.elapsed());
        assert!(asked.elapsed() < Duration::from_secs(5), "/healthz took {:?}", asked.elapsed());
        let taken = agent
            .get("/metrics")
            .map(|(_, body)| Metrics::parse(&body).sum("neuron_agent_reports_total", &[]))
            .unwrap_or(0.0);
        if taken >= reports as f64 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(120), "reports not applied in time");
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = Instant::now();
    let m = agent.metrics();
    let scrape = asked.elapsed();
    let skipped = (RUNTIMES as usize - MAX_RUNTIMES_PER_REPORT) * reports;
    assert_eq!(refused(&m, "runtime"), skipped as f64);
    let tags: std::collections::BTreeSet<&String> =
        m.find("neuroncore_utilization_ratio", &[]).iter().filter_map(|s| s.labels.get("runtime_tag")).collect();
    assert_eq!(tags.len(), MAX_RUNTIMES_PER_REPORT);
    assert!(tags.contains(&format!("rt-{:06}", 1)) && tags.contains(&format!("rt-{MAX_RUNTIMES_PER_REPORT:06}")));
    println!(
        "{RUNTIMES} runtimes: slowest /healthz {slowest:?}, scrape {} bytes in {scrape:?}, agent RSS {} KiB",
        m.text.len(),
        rss_kib(agent.child.id())
    );
}

#[test]
fn extra_labels_of_many_configurations_are_capped_per_series() {
    // 60 configurations matching every runtime, 16 labels each with distinct names.
    let routes: Vec<Value> = (0..60)
        .map(|c| {
            let labels: serde_json::Map<String, Value> =
                (0..16).map(|l| (format!("c{c:02}_label_{l:02}"), json!(format!("value-{c}-{l}")))).collect();
            json!({"config": format!("team/config-{c:02}"), "runtimes": [{"groups": ["neuroncore_counters"]}],
                   "prometheus": {"extraLabels": labels}})
        })
        .collect();
    let config = json!({"monitor": {"period": "1s"}, "routes": routes});
    let dir = TempDir::new("labels");
    let monitor = monitor_printing(&dir, &[fixture_32().to_string()]);
    let config_path = dir.0.join("node-config.json");
    std::fs::write(&config_path, config.to_string()).expect("write config");
    let agent = Agent::start_with(
        monitor.to_str().expect("path"),
        &[],
        &[QUIET, &["--node-config-file", config_path.to_str().expect("path")][..]].concat(),
    );
    let m = wait_for_lines(&agent, 1.0, Duration::from_secs(60));
    let series = m.find("neuroncore_utilization_ratio", &[("runtime_tag", "538")]);
    assert_eq!(series.len(), 1);
    let extra = series[0].labels.keys().filter(|k| k.starts_with('c')).count();
    assert_eq!(extra, MAX_EXTRA_LABELS_PER_SERIES, "extra labels on a runtime series");
    let dropped = (60 * 16 - MAX_EXTRA_LABELS_PER_SERIES) * 32;
    assert_eq!(m.sum("neuron_agent_extra_labels_dropped", &[]), dropped as f64);
    println!("extra labels: scrape {} bytes, agent RSS {} KiB", m.text.len(), rss_kib(agent.child.id()));
}

// --- The mutated-report run ------------------------------------------------------------

/// What the agent must make of one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    Report,
    Rejected(&'static str),
    /// Blank: neither a report nor a rejection.
    Ignored,
}

/// Longest line the run's agent accepts (`--max-line-bytes`).
const RUN_MAX_LINE: usize = 3 << 20;

/// A random number, mostly ones that break assumptions.
fn hostile_number(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(..8) {
        0 => json!(u32::MAX),
        1 => json!(-1),
        2 => json!(1e300),
        3 => json!(rng.u32(..)),
        4 => json!(65535),
        5 => json!(rng.u64(..)),
        6 => json!(rng.f64() * 200.0 - 50.0),
        _ => json!(0),
    }
}

/// A random string: long, with control or non-ASCII characters, or empty.
fn hostile_string(rng: &mut fastrand::Rng) -> Value {
    match rng.u8(..5) {
        0 => json!("x".repeat(rng.usize(..200_000))),
        1 => json!("a\u{0}b\nc\u{1b}[31m\u{7f}"),
        2 => json!("é".repeat(rng.usize(100..400))),
        3 => json!(""),
        _ => json!("ok-value"),
    }
}

/// Paths (keys and indices) to every node of `value` but itself.
fn paths(value: &Value, path: &mut Vec<Value>, out: &mut Vec<Vec<Value>>) {
    if !path.is_empty() {
        out.push(path.clone());
    }
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                path.push(json!(key));
                paths(child, path, out);
                path.pop();
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                path.push(json!(i));
                paths(child, path, out);
                path.pop();
            }
        }
        _ => {}
    }
}

/// The node at `path`, if an earlier change left it there.
fn at<'v>(value: &'v mut Value, path: &[Value]) -> Option<&'v mut Value> {
    path.iter().try_fold(value, |v, step| match step {
        Value::String(key) => v.get_mut(key.as_str()),
        other => v.get_mut(other.as_u64()? as usize),
    })
}

/// The fixture cut into the parts the agent reads one by one (each runtime entry, each
/// top-level object), serialized once: a mutation re-serializes only the part it changed.
/// Most lines carry a few of the 32 runtimes (as when applications exit), one in eight
/// all of them: the agent's debug build parses a full 440 kB line in tens of ms, and the
/// run must take thousands of lines in well under a minute.
struct Parts {
    runtimes: Vec<(Value, String)>,
    /// Top-level keys other than the runtimes.
    others: Vec<(String, Value, String)>,
    text: String,
    /// Runtimes the line being built carries, by index.
    keep: Vec<usize>,
}

impl Parts {
    fn new(doc: &Value) -> Parts {
        let runtimes: Vec<(Value, String)> = doc["neuron_runtime_data"]
            .as_array()
            .expect("runtimes")
            .iter()
            .map(|rt| (rt.clone(), rt.to_string()))
            .collect();
        let others: Vec<(String, Value, String)> = doc
            .as_object()
            .expect("object")
            .iter()
            .filter(|(key, _)| *key != "neuron_runtime_data")
            .map(|(key, value)| (key.clone(), value.clone(), value.to_string()))
            .collect();
        let keep = (0..runtimes.len()).collect();
        let mut parts = Parts { runtimes, others, text: String::new(), keep };
        parts.text = parts.line(None, None);
        parts
    }

    /// Picks the runtimes of the next line: all of them, or a few.
    fn choose_runtimes(&mut self, rng: &mut fastrand::Rng) {
        let all = self.runtimes.len();
        self.keep = if rng.u8(..8) == 0 {
            (0..all).collect()
        } else {
            let mut keep: Vec<usize> = (0..rng.usize(1..=4)).map(|_| rng.usize(..all)).collect();
            keep.sort_unstable();
            keep.dedup();
            keep
        };
    }

    /// A runtime the next line carries.
    fn some_runtime(&self, rng: &mut fastrand::Rng) -> usize {
        self.keep[rng.usize(..self.keep.len())]
    }

    /// The document with runtime `i` or top-level part `key` replaced by `text`; `runtimes`
    /// replaces the whole runtime array.
    fn line(&self, runtime: Option<(usize, &str)>, other: Option<(&str, &str)>) -> String {
        let mut line = String::with_capacity(self.text.len() + 1024);
        line.push_str("{\"neuron_runtime_data\":[");
        for (n, i) in self.keep.iter().enumerate() {
            if n > 0 {
                line.push(',');
            }
            line.push_str(runtime.filter(|(r, _)| r == i).map_or(&self.runtimes[*i].1, |(_, t)| t));
        }
        line.push(']');
        for (key, _, text) in &self.others {
            line.push_str(&format!(",{}:", json!(key)));
            line.push_str(other.filter(|(k, _)| k == key).map_or(text, |(_, t)| t));
        }
        line.push('}');
        line
    }

    fn other(&self, key: &str) -> Value {
        self.others.iter().find(|(k, _, _)| k == key).map(|(_, v, _)| v.clone()).unwrap_or(json!({}))
    }
}

/// A few random nodes of `value` replaced or removed (never `value` itself).
fn scramble(rng: &mut fastrand::Rng, value: &mut Value) {
    let mut all = Vec::new();
    paths(value, &mut Vec::new(), &mut all);
    if all.is_empty() {
        return;
    }
    for _ in 0..rng.usize(1..6) {
        let path = &all[rng.usize(..all.len())];
        let (parent, last) = path.split_at(path.len() - 1);
        let replacement = match rng.u8(..6) {
            0 => hostile_number(rng),
            1 => hostile_string(rng),
            2 => json!(null),
            3 => json!([1, "two", {"three": 3}]),
            4 => json!({"unexpected": {"nested": [true]}}),
            _ => {
                let map = at(value, parent).and_then(Value::as_object_mut);
                if let (Some(map), Some(key)) = (map, last[0].as_str()) {
                    map.remove(key);
                }
                continue;
            }
        };
        // Gone when an earlier step replaced or removed a parent.
        if let Some(node) = at(value, path) {
            *node = replacement;
        }
    }
}

/// One mutated line of the fixture and what the agent must make of it. Every document
/// mutation stays inside one runtime entry or one group, which the agent reads on its
/// own: the document remains a report, however odd that part.
fn mutate(rng: &mut fastrand::Rng, parts: &mut Parts) -> (Vec<u8>, Expect) {
    parts.choose_runtimes(rng);
    let parts = &*parts;
    let plain = parts.line(None, None);
    let base_text = plain.as_str();
    let cut_at = |rng: &mut fastrand::Rng| {
        let mut cut = rng.usize(1..base_text.len());
        while !base_text.is_char_boundary(cut) {
            cut -= 1;
        }
        cut
    };
    let report = |line: String| (line.into_bytes(), Expect::Report);
    match rng.u8(..20) {
        // Broken lines.
        0 => (base_text.as_bytes()[..cut_at(rng)].to_vec(), Expect::Rejected("truncated")),
        1 => {
            let garbage = ["garbage", "}", "{\"neuron_runtime_data\": 5}", "[1,2]", "null", "\"text\""][rng.usize(..6)];
            let line = if rng.bool() { format!("{garbage}{base_text}") } else { garbage.to_owned() };
            (line.into_bytes(), Expect::Rejected("malformed"))
        }
        2 => {
            let mut bytes = base_text.as_bytes().to_vec();
            bytes.insert(rng.usize(1..bytes.len()), 0xff);
            (bytes, Expect::Rejected("not_utf8"))
        }
        3 if rng.u8(..8) == 0 => {
            // Rare: each costs a few MB through the pipe.
            let mut info = parts.other("instance_info");
            info["instance_name"] = json!("n".repeat(RUN_MAX_LINE));
            (parts.line(None, Some(("instance_info", &info.to_string()))).into_bytes(), Expect::Rejected("oversized"))
        }
        4 => (b"   ".to_vec(), Expect::Ignored),
        // Documents that are reports, however odd.
        5 => {
            let mut hw = parts.other("neuron_hardware_info");
            hw["neuron_device_count"] = json!(rng.u32(..70_000));
            hw["neuroncore_per_device_count"] = json!(rng.u32(..70_000));
            report(parts.line(None, Some(("neuron_hardware_info", &hw.to_string()))))
        }
        6 => {
            // Many runtimes: small entries, up to three times the cap.
            let n = rng.u32(..3 * MAX_RUNTIMES_PER_REPORT as u32);
            let runtimes: Vec<String> = (0..n).map(|i| small_runtime_text(i, rng.u32(..1024))).collect();
            let others: Vec<String> = parts.others.iter().map(|(k, _, t)| format!("{}:{t}", json!(k))).collect();
            report(format!("{{\"neuron_runtime_data\":[{}],{}}}", runtimes.join(","), others.join(",")))
        }
        7 => {
            // Core indices anywhere in u32.
            let i = parts.some_runtime(rng);
            let mut rt = parts.runtimes[i].0.clone();
            let maps = [
                "/report/neuroncore_counters/neuroncores_in_use",
                "/report/memory_used/neuron_runtime_used_bytes/usage_breakdown/neuroncore_memory_usage",
            ];
            for pointer in maps {
                if let Some(cores) = rt.pointer_mut(pointer).and_then(Value::as_object_mut) {
                    let value = cores.values().next().cloned().unwrap_or(json!({}));
                    cores.insert(rng.u32(..).to_string(), value);
                }
            }
            report(parts.line(Some((i, &rt.to_string())), None))
        }
        8 => {
            let mut system = parts.other("system_data");
            if let Some(devices) =
                system.pointer_mut("/neuron_hw_counters/neuron_devices").and_then(Value::as_array_mut)
            {
                for device in devices.iter_mut().take(rng.usize(..4)) {
                    device["neuron_device_index"] = hostile_number(rng);
                }
            }
            report(parts.line(None, Some(("system_data", &system.to_string()))))
        }
        9..=13 => {
            // A runtime entry scrambled, or replaced as a whole.
            let i = parts.some_runtime(rng);
            let mut rt = parts.runtimes[i].0.clone();
            if rng.u8(..10) == 0 {
                rt = [hostile_number(rng), hostile_string(rng), json!(null), json!([1])][rng.usize(..4)].clone();
            } else {
                scramble(rng, &mut rt);
            }
            report(parts.line(Some((i, &rt.to_string())), None))
        }
        _ => {
            // A top-level object scrambled: inside one of system_data's groups, or
            // anywhere in (or instead of) instance_info and neuron_hardware_info.
            let (key, value, _) = &parts.others[rng.usize(..parts.others.len())];
            let mut value = value.clone();
            match key.as_str() {
                "system_data" => {
                    if let Some(groups) = value.as_object_mut() {
                        let names: Vec<String> = groups.keys().cloned().collect();
                        if let Some(group) = names.get(rng.usize(..names.len().max(1))).and_then(|n| groups.get_mut(n))
                        {
                            scramble(rng, group);
                        }
                    }
                }
                "instance_info" | "neuron_hardware_info" if rng.u8(..8) == 0 => value = hostile_number(rng),
                _ => scramble(rng, &mut value),
            }
            report(parts.line(None, Some((key, &value.to_string()))))
        }
    }
}

/// Thousands of random mutations of the 32-runtime fixture through the real agent, within
/// a time budget: zero panics, every line accounted for exactly, RSS bounded.
#[test]
fn mutated_reports_never_take_the_agent_down() {
    let seed = std::env::var("MUTATION_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_2026_u64);
    let budget = Duration::from_secs(std::env::var("MUTATION_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40));
    println!("seed {seed} (MUTATION_SEED), budget {budget:?} (MUTATION_SECONDS)");
    let mut rng = fastrand::Rng::with_seed(seed);
    assert_eq!(serde_json::from_str::<Value>(&small_runtime_text(7, 3)).expect("JSON"), small_runtime(7, 3));
    let mut parts = Parts::new(&fixture_32());
    let base_text = parts.text.clone();

    let dir = TempDir::new("mutations");
    let fifo = dir.0.join("reports.fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    let monitor = script(&dir.0, &format!("exec cat '{}'", fifo.display()));
    let log = dir.0.join("agent.log");
    let max_line = RUN_MAX_LINE.to_string();
    let agent = Agent::start_configured(
        monitor.to_str().expect("path"),
        &[],
        &[QUIET, &["--max-line-bytes", max_line.as_str()][..]].concat(),
        |command, _| {
            command.stderr(std::fs::File::create(&log).expect("log file"));
        },
    );
    // Opening blocks until the monitor (cat) opened the other end.
    let mut pipe = std::fs::OpenOptions::new().write(true).open(&fifo).expect("open fifo");

    let mut expected: std::collections::BTreeMap<&str, f64> = Default::default();
    let (mut reports, mut lines, mut max_rss) = (0.0, 0usize, 0u64);
    let start = Instant::now();
    let mut gen_time = Duration::ZERO;
    while start.elapsed() < budget {
        let t = Instant::now();
        let (line, expect) = mutate(&mut rng, &mut parts);
        gen_time += t.elapsed();
        pipe.write_all(&line).and_then(|_| pipe.write_all(b"\n")).expect("the agent reads its monitor");
        lines += 1;
        match expect {
            Expect::Report => reports += 1.0,
            Expect::Rejected(reason) => *expected.entry(reason).or_default() += 1.0,
            Expect::Ignored => {}
        }
        if lines % 50 == 0 {
            max_rss = max_rss.max(rss_kib(agent.child.id()));
            assert!(agent.child.id() > 0 && support::alive(agent.child.id()), "the agent died after {lines} lines");
        }
    }
    // One plain report last: it must be applied like any other.
    pipe.write_all(base_text.as_bytes()).and_then(|_| pipe.write_all(b"\n")).expect("write");
    reports += 1.0;
    let fed = reports + expected.values().sum::<f64>();
    let m = wait_for_lines(&agent, fed, Duration::from_secs(120));
    max_rss = max_rss.max(rss_kib(agent.child.id()));

    let got_rejected = |reason| m.sum("neuron_agent_lines_rejected_total", &[("reason", reason)]);
    println!(
        "{lines} lines in {:?} (generating {gen_time:?}): {reports} reports, rejected {expected:?}; max agent RSS {} MiB",
        start.elapsed(),
        max_rss / 1024
    );
    assert_eq!(m.sum("neuron_agent_reports_total", &[]), reports, "reports applied");
    for reason in ["truncated", "malformed", "not_utf8", "oversized"] {
        assert_eq!(got_rejected(reason), expected.get(reason).copied().unwrap_or(0.0), "lines rejected as {reason}");
    }
    assert_eq!(agent.get("/healthz").map(|r| r.0), Some(200));
    assert_eq!(m.sum("neuron_agent_monitor_restarts_total", &[]), 0.0, "no line is fatal");
    assert_eq!(m.find("neuroncore_utilization_ratio", &[]).len(), 32, "the last plain report is exported");
    assert_label_values_bounded(&m);
    assert!(max_rss < 200 * 1024, "agent RSS reached {max_rss} KiB");
    drop(pipe);
    let log = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!log.contains("panicked"), "the agent panicked:\n{log}");
}
