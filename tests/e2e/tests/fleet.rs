//! Robustness of the operator at fleet scale, on the real control plane (sized for CI:
//! 200 nodes; `tests/e2e/benches/fleet.rs` measures 1,000 and more): a crash or a leader
//! hand-over in the middle of a roll-out, an accepted config across a restart after an
//! invalid edit, many nodes deleted at once. The operator runs as the chart runs it
//! (its ServiceAccount and RBAC, leader election), as a process.
//!
//! Operators watch configs cluster-wide, so the tests of this binary run one at a time.

use std::time::{Duration, Instant};

use api::{crd::NeuronMonitorConfig, node_config};
use kube::{Api, ResourceExt};
use neuron_e2e::{
    fleet::{
        ApiRequests, Fleet, NodeHistory, Observer, Operator, APPLIED_HASH_ANNOTATION, CONFIG_HASH_ANNOTATION,
        MANAGED_LABEL, NODE_ANNOTATION,
    },
    wait_for,
};
use serde_json::json;
use tokio::sync::Mutex;

static SERIAL: Mutex<()> = Mutex::const_new(());

const NODES: usize = 200;
/// Where the operator records a config's last accepted spec (operator/src/controller/accepted.rs).
const LAST_ACCEPTED: &str = "neuronmonitor.io/last-accepted";
/// Time any one step may take on a loaded machine.
const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn the_harness_knows_the_annotations_the_operator_writes() {
    assert_eq!(MANAGED_LABEL, node_config::MANAGED_LABEL);
    assert_eq!(CONFIG_HASH_ANNOTATION, node_config::CONFIG_HASH_ANNOTATION);
    assert_eq!(APPLIED_HASH_ANNOTATION, node_config::APPLIED_HASH_ANNOTATION);
    assert_eq!(NODE_ANNOTATION, node_config::NODE_ANNOTATION);
}

/// Nodes whose ConfigMap differs from `before`.
fn written_since(observer: &Observer, before: &std::collections::HashMap<String, NodeHistory>) -> usize {
    let now = observer.snapshot();
    now.iter()
        .filter(|(node, h)| {
            h.config_hash().is_some() && h.config_hash() != before.get(*node).and_then(|b| b.config_hash())
        })
        .count()
}

/// Starts a roll-out (a new period for every node) and stops the leader, by `signal`,
/// once a fifth to a half of the nodes have it: returns how many had it then.
async fn interrupt_rollout(
    fleet: &Fleet,
    observer: &Observer,
    leader: &mut Operator,
    period: &str,
    signal: i32,
) -> usize {
    let before = observer.snapshot();
    fleet.apply_config("fleet", json!({ "period": period })).await.unwrap();
    let started = Instant::now();
    loop {
        let written = written_since(observer, &before);
        if written >= NODES / 5 {
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(leader.process.pid() as libc::pid_t, signal) };
            let _ = leader.process.child.wait();
            let written = written_since(observer, &before);
            assert!(written < NODES, "the roll-out ended before the leader could be stopped in its middle");
            return written;
        }
        assert!(started.elapsed() < LIMIT, "the roll-out did not start: {written} nodes written");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every node ends with one content, and the writes of both operators together are
/// those the roll-out needs: at most the writes the stopped one had in flight on top.
async fn assert_finished_without_duplicates(fleet: &Fleet, observer: &Observer, requests_before: &ApiRequests) {
    let done = wait_for(LIMIT, || async {
        let now = observer.snapshot();
        let hashes: std::collections::BTreeSet<&str> =
            fleet.nodes.iter().filter_map(|n| now.get(n)?.config_hash()).collect();
        let every_node = fleet.nodes.iter().all(|n| now.get(n).is_some_and(|h| h.written.len() == 2));
        (every_node && hashes.len() == 1).then_some(())
    })
    .await;
    assert!(done.is_some(), "not every node got the new content");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let requests = ApiRequests::read(&fleet.admin).await.unwrap().since(requests_before);
    // Server-side applies (the agents' acknowledgements, merge patches, run nowhere here).
    let patches = requests.count("APPLY", "configmaps");
    // One write per node, plus those in flight when the leader stopped (--writes-in-flight 2),
    // plus a standby's cache lagging a few events behind when it takes over.
    assert!(
        patches >= NODES as f64 && patches <= NODES as f64 + 8.0,
        "{patches} ConfigMap writes for a roll-out to {NODES} nodes"
    );
}

async fn fleet_and_observer(prefix: &str) -> (Fleet, Observer) {
    let fleet = Fleet::new(prefix, NODES).await.unwrap();
    let observer = Observer::start(fleet.admin.clone(), &fleet.namespace).await;
    (fleet, observer)
}

/// A crash (SIGKILL) of the only operator in the middle of a roll-out: the restarted
/// operator (the same pod, so the same identity in the Lease) finishes it, rewriting
/// none of the nodes already done.
#[tokio::test]
async fn a_crash_in_the_middle_of_a_rollout_is_finished_by_the_restarted_operator() {
    let _serial = SERIAL.lock().await;
    let (fleet, observer) = fleet_and_observer("nm-crash").await;
    // Two writes in flight: the roll-out lasts long enough to be interrupted.
    let slow = ["--writes-in-flight", "2"];
    let mut operator = fleet.operator("operator-0", &slow);
    fleet.apply_config("fleet", json!({ "period": "5s" })).await.unwrap();
    observer.rollout(&fleet.nodes, &Default::default(), Instant::now(), false, LIMIT).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let requests_before = ApiRequests::read(&fleet.admin).await.unwrap();
    let written = interrupt_rollout(&fleet, &observer, &mut operator, "10s", libc::SIGKILL).await;
    println!("killed the operator with {written} of {NODES} nodes written");
    let restarted = fleet.operator("operator-0", &slow);
    assert_finished_without_duplicates(&fleet, &observer, &requests_before).await;
    let writes = restarted.metrics().unwrap().writes();
    assert!(
        writes.configmaps <= (NODES - written) as f64 + 2.0,
        "the restarted operator wrote {} ConfigMaps; {} were left",
        writes.configmaps,
        NODES - written
    );
    fleet.delete_nodes(&fleet.nodes).await.unwrap();
}

/// A leader hand-over (SIGTERM: the lease is released) in the middle of a roll-out: the
/// standby takes over at once and finishes it.
#[tokio::test]
async fn a_leader_hand_over_in_the_middle_of_a_rollout_finishes_it() {
    let _serial = SERIAL.lock().await;
    let (fleet, observer) = fleet_and_observer("nm-handover").await;
    let slow = ["--writes-in-flight", "2"];
    let mut replicas = vec![fleet.operator("operator-a", &slow), fleet.operator("operator-b", &slow)];
    fleet.apply_config("fleet", json!({ "period": "5s" })).await.unwrap();
    observer.rollout(&fleet.nodes, &Default::default(), Instant::now(), false, LIMIT).await.unwrap();
    let leader = wait_for(LIMIT, || async {
        replicas.iter().position(|r| r.metrics().is_some_and(|m| m.value("neuron_operator_leader", &[]) == 1.0))
    })
    .await
    .expect("a leader");
    tokio::time::sleep(Duration::from_secs(1)).await;

    let requests_before = ApiRequests::read(&fleet.admin).await.unwrap();
    let mut old = replicas.remove(leader);
    let stopped = Instant::now();
    let written = interrupt_rollout(&fleet, &observer, &mut old, "10s", libc::SIGTERM).await;
    println!("stopped the leader with {written} of {NODES} nodes written, in {:?}", stopped.elapsed());
    let standby = &replicas[0];
    standby.wait_reconciled(1.0, LIMIT).await.expect("the standby leads");
    assert_finished_without_duplicates(&fleet, &observer, &requests_before).await;
    assert!(
        standby.metrics().unwrap().writes().configmaps <= (NODES - written) as f64 + 2.0,
        "the standby rewrote nodes the leader had done"
    );
    fleet.delete_nodes(&fleet.nodes).await.unwrap();
}

/// A config accepted, then edited into one the operator refuses while no operator runs:
/// the next operator keeps the nodes on the accepted version (recorded on the config),
/// rather than taking the config off them.
#[tokio::test]
async fn an_accepted_config_survives_a_restart_after_an_invalid_edit() {
    let _serial = SERIAL.lock().await;
    let fleet = Fleet::new("nm-persist", 3).await.unwrap();
    let observer = Observer::start(fleet.admin.clone(), &fleet.namespace).await;
    let mut operator = fleet.operator("operator-0", &[]);
    let good = json!({ "runtimes": [{ "tagFilter": "^serve-", "metrics": [{ "type": "memory_used" }] }] });
    fleet.apply_config("fleet", good).await.unwrap();
    let rollout = observer.rollout(&fleet.nodes, &Default::default(), Instant::now(), false, LIMIT).await.unwrap();
    let configs: Api<NeuronMonitorConfig> = Api::namespaced(fleet.admin.clone(), &fleet.namespace);
    let recorded = wait_for(LIMIT, || async {
        let c = configs.get("fleet").await.ok()?;
        let text = c.annotations().get(LAST_ACCEPTED).cloned()?;
        let value: serde_json::Value = serde_json::from_str(&text).ok()?;
        (value["generation"].as_i64() == c.metadata.generation).then_some(value)
    })
    .await
    .expect("the accepted spec recorded on the config");
    assert_eq!(recorded["spec"]["runtimes"][0]["tagFilter"], "^serve-");
    assert!(operator.process.terminate(Duration::from_secs(30)).is_some_and(|s| s.success()));

    // A regex that does not compile: the schema accepts it, the operator does not.
    let bad = json!({ "runtimes": [{ "tagFilter": "serve-((", "metrics": [{ "type": "memory_used" }] }] });
    fleet.apply_config("fleet", bad).await.unwrap();
    let before = observer.snapshot();
    let restarted = fleet.operator("operator-1", &[]);
    let refused = wait_for(LIMIT, || async {
        let c = configs.get("fleet").await.ok()?;
        let status = c.status?;
        let accepted = status.conditions.iter().find(|c| c.type_ == "Accepted")?;
        (status.observed_generation == c.metadata.generation && accepted.status == "False").then(|| accepted.clone())
    })
    .await
    .expect("Accepted=False for the invalid edit");
    assert_eq!(refused.reason, "InvalidSpec");
    restarted.wait_reconciled(2.0, LIMIT).await.expect("passes of the restarted operator");
    let after = observer.snapshot();
    for node in &fleet.nodes {
        let hash = after.get(node).and_then(NodeHistory::config_hash);
        assert!(hash.is_some_and(|h| rollout.hashes.contains(h)), "{node} left the accepted version: {hash:?}");
        assert!(after[node].deleted.is_none(), "{node}'s ConfigMap was deleted");
    }
    assert_eq!(observer.events_since(&before), 0, "the nodes' ConfigMaps were rewritten");
    // The recorded version is still the accepted one, not the refused edit.
    let c = configs.get("fleet").await.unwrap();
    let text = c.annotations().get(LAST_ACCEPTED).cloned().unwrap_or_default();
    assert!(text.contains("^serve-") && !text.contains("serve-(("), "{text}");
    fleet.delete_nodes(&fleet.nodes).await.unwrap();
}

/// Every node deleted at once, the operator running: no node ConfigMap is left (the
/// garbage collector follows the owner references; the operator deletes those of
/// nodes it no longer renders).
#[tokio::test]
async fn deleting_every_node_at_once_leaves_no_configmap() {
    let _serial = SERIAL.lock().await;
    let (fleet, observer) = fleet_and_observer("nm-delete").await;
    let _operator = fleet.operator("operator-0", &[]);
    fleet.apply_config("fleet", json!({ "period": "5s" })).await.unwrap();
    observer.rollout(&fleet.nodes, &Default::default(), Instant::now(), false, LIMIT).await.unwrap();
    assert_eq!(fleet.configmaps_left().await.unwrap(), NODES);

    let started = Instant::now();
    fleet.delete_nodes(&fleet.nodes).await.unwrap();
    let gone = wait_for(LIMIT, || async { (fleet.configmaps_left().await.ok()? == 0).then_some(()) }).await;
    let left = fleet.configmaps_left().await.unwrap();
    assert!(gone.is_some(), "{left} of {NODES} node ConfigMaps left after {LIMIT:?}");
    println!("{NODES} nodes deleted: every ConfigMap gone in {:.2} s", started.elapsed().as_secs_f64());
    // And none comes back (an operator writing from a stale cache would re-create one).
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(fleet.configmaps_left().await.unwrap(), 0);
}
