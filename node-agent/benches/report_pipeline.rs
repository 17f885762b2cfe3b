//! The per-report cost of the agent on the largest recorded report (32 runtimes on a
//! trn1n.32xlarge, 442 kB as one compact line):
//! - `baseline/serde_json_value`: an untyped `serde_json::Value` parse of the line, the
//!   floor any JSON-based exporter pays; the other numbers read as ratios to it;
//! - `parse_and_update`: typed parse + applying it to the node state (per report);
//! - `render_classic` / `render_openmetrics`: one `/metrics` scrape.
//!
//! Run: `cargo bench -p neuron-node-agent --bench report_pipeline`.

use std::sync::{Arc, Mutex};

use api::report::Report;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use neuron_node_agent::{
    sinks::prometheus::{Exposition, Format},
    state::NodeState,
};
use prometheus_client::registry::Registry;

fn compact_fixture(name: &str) -> String {
    let dir = std::env::var("NEURON_FIXTURES")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared/fixtures/neuron-monitor").to_owned());
    let path = format!("{dir}/{name}");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("fixture {path}: {e}"));
    let value: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    serde_json::to_string(&value).expect("re-encode")
}

fn pipeline(c: &mut Criterion) {
    let line = compact_fixture("trn1n.32xlarge-32runtimes.json");
    let mut group = c.benchmark_group("trn1n_32_runtimes");
    group.throughput(Throughput::Bytes(line.len() as u64));

    group.bench_function("baseline/serde_json_value", |b| {
        b.iter(|| serde_json::from_str::<serde_json::Value>(&line).expect("parse"))
    });

    let mut state = NodeState::default();
    group.bench_function("parse_and_update", |b| {
        b.iter(|| {
            let report = Report::parse(&line).expect("parse");
            state.apply(&report);
        })
    });

    let state = Arc::new(Mutex::new(state));
    let exposition = Exposition::new(Registry::default(), state, Default::default());
    group.bench_function("render_classic", |b| b.iter(|| exposition.render(Format::Classic).expect("render")));
    group.bench_function("render_openmetrics", |b| b.iter(|| exposition.render(Format::OpenMetrics).expect("render")));
    group.finish();
}

criterion_group!(benches, pipeline);
criterion_main!(benches);
