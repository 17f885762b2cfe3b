//! Renders the benchmark's cluster once (5,000 nodes, 500 configs) and prints the time
//! of each step and the peak resident memory of the process (VmHWM), inputs included.
//!
//! `cargo run --release -p neuron-operator --example render_scale`

use std::time::Instant;

use api::{render, validate};

#[path = "../benches/support/scale.rs"]
mod scale;

fn status_kib(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn main() {
    let started = Instant::now();
    let (nodes, configs) = scale::cluster();
    let generated = started.elapsed();
    let baseline = status_kib("VmHWM:").unwrap_or(0);

    let started = Instant::now();
    let valid: Vec<validate::ValidConfig> =
        configs.iter().map(|c| validate::validate(c, scale::OPERATOR_NS).expect("the fixture is valid")).collect();
    let validated = started.elapsed();

    let started = Instant::now();
    let rendering = render::render_all(&nodes, &valid).expect("rendering serializes");
    let rendered = started.elapsed();

    let bytes: usize = rendering.groups().iter().map(|g| g.rendered.json.len()).sum();
    let largest = rendering.groups().iter().map(|g| g.rendered.json.len()).max().unwrap_or(0);
    let routes: usize = rendering.groups().iter().map(|g| g.rendered.config.routes.len()).sum();
    println!("nodes: {}, configs: {}", nodes.len(), valid.len());
    println!(
        "rendered nodes: {}, distinct renderings: {}, routes in them: {routes}, JSON: {bytes} bytes (largest {largest})",
        rendering.len(),
        rendering.groups().len()
    );
    println!("configs refused for lack of room on their nodes: {}", rendering.refused().len());
    println!("generate inputs: {:.1} ms", generated.as_secs_f64() * 1e3);
    println!("validate: {:.1} ms", validated.as_secs_f64() * 1e3);
    println!("render_all: {:.1} ms", rendered.as_secs_f64() * 1e3);
    println!(
        "VmHWM after generating inputs: {:.1} MiB; at the end: {:.1} MiB",
        baseline as f64 / 1024.0,
        status_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0
    );
}
