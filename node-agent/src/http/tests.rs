use std::{sync::Mutex, time::Duration};

use prometheus_client::registry::Registry;

use super::*;
use crate::{state::NodeState, telemetry::AgentMetrics};

fn state() -> Arc<HttpState> {
    let mut registry = Registry::default();
    let metrics = AgentMetrics::register(&mut registry);
    let node = Arc::new(Mutex::new(NodeState::default()));
    let pipeline = Arc::new(Pipeline::new(node.clone(), metrics));
    let exposition = Exposition::new(registry, node, Default::default(), Default::default());
    Arc::new(HttpState { exposition, pipeline, gpu_only: None, health: Default::default() })
}

/// The attack report's finding 7: 32 scrapers on the token-free port held the render
/// slots the main port shared with it, and Prometheus waited (p50 0.07 s → 2.25 s). Here
/// the token-free port's slots are all taken (as a flood takes them), and a scrape of the
/// main port renders in a slot of its own. With one set of slots it would wait for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_whose_render_slots_are_all_taken_holds_up_no_other_port() {
    let state = state();
    let _flood =
        [state.exposition.render_slot(Port::Tokenless).await, state.exposition.render_slot(Port::Tokenless).await];
    let main = tokio::time::timeout(Duration::from_secs(60), page(&state, Port::Main, Format::Classic)).await;
    let main = main.expect("the main port renders in its own slots").expect("a page");
    let text = String::from_utf8(main.parts.concat()).unwrap();
    assert!(
        text.contains("neuron_agent_reports_total") && text.contains("neuron_agent_metrics_renders_total 1"),
        "{text}"
    );
}
