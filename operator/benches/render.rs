//! Rendering a 5,000-node, 500-config cluster (`support/scale.rs`), against a baseline
//! in the same run: rendering each node on its own (what `render_all` avoids by
//! rendering once per distinct set of matching configs), on a tenth of the nodes.
//!
//! `cargo bench -p neuron-operator --bench render`

use std::hint::black_box;

use api::node_config::content_hash;
use api::{render, validate};
use criterion::{criterion_group, criterion_main, Criterion};

#[path = "support/scale.rs"]
mod scale;

fn bench(c: &mut Criterion) {
    let (nodes, configs) = scale::cluster();
    let valid: Vec<validate::ValidConfig> =
        configs.iter().map(|c| validate::validate(c, scale::OPERATOR_NS).unwrap()).collect();
    let rendering = render::render_all(&nodes, &valid).unwrap();
    let routes: usize = rendering.groups().iter().map(|g| g.rendered.config.routes.len()).sum();
    let bytes: usize = rendering.groups().iter().map(|g| g.rendered.json.len()).sum();
    eprintln!(
        "{} nodes, {} configs: {} rendered nodes in {} groups ({} routes, {} JSON bytes rendered)",
        nodes.len(),
        valid.len(),
        rendering.len(),
        rendering.groups().len(),
        routes,
        bytes
    );

    let mut group = c.benchmark_group("render");
    group.sample_size(10);
    group.bench_function("validate 500 configs", |b| {
        b.iter(|| configs.iter().filter(|c| validate::validate(black_box(c), scale::OPERATOR_NS).is_ok()).count())
    });
    group.bench_function("render_all 5000 nodes x 500 configs", |b| {
        b.iter(|| render::render_all(black_box(&nodes), black_box(&valid)).unwrap())
    });
    // Baseline: every node on its own (selectors, merge, JSON, hash), 500 nodes.
    group.bench_function("baseline: per-node render, 500 nodes", |b| {
        b.iter(|| {
            nodes[..500]
                .iter()
                .filter_map(|(_, labels)| render::render_node(labels, &valid))
                .map(|config| content_hash(serde_json::to_string(&config).unwrap().as_bytes()))
                .collect::<Vec<_>>()
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
