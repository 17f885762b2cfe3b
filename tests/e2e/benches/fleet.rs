//! Fleet benchmark: one config change reaching N Neuron nodes on the real control plane.
//!
//! N fake Nodes; for each, an agent following its ConfigMap: a few real agent processes
//! (`neuron-node-agent` on the simulator) and, for the rest, the agent's own follower
//! (`node-agent/src/config/configmap.rs`: the same watch, activation and acknowledgement)
//! in this process, all sharing one client as the agent's ServiceAccount; the operator
//! binary, two replicas with leader election, as the chart's ServiceAccount with its RBAC.
//! It prints, for a config change: when every node's ConfigMap carried it and when every
//! agent acknowledged it (p50/p95/max per node), the operator's writes and the API
//! requests of all clients (429s included), CPU and memory of the operator, of the control
//! plane (etcd + kube-apiserver) and of this process; then a no-op pass and a leader
//! hand-over, which must write nothing.
//!
//! `cargo bench -p neuron-e2e --bench fleet` runs 1,000 nodes (`FLEET_NODES=5000` for
//! more, `FLEET_REAL_AGENTS` real agents, 3 by default; `FLEET_OPERATOR_ARGS` adds flags to
//! the operator, e.g. a baseline). Under `cargo test` (no `--bench`) it runs 50 nodes and
//! fails unless every node is written and acknowledged and the no-op passes write nothing.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use neuron_e2e::{
    fleet::{mib, summary, ApiRequests, Fleet, Observer, Operator, OperatorMetrics, ProcStats, Rollout},
    free_port, wait_for, workspace_bin, Process,
};
use neuron_node_agent::{
    config::{open_state_dir, Activator, Launcher, Reloader},
    health::settings::HealthDefaults,
    kubernetes::{client_from, DEFAULT_WATCH_TIMEOUT},
    telemetry::AgentMetrics,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

struct Settings {
    nodes: usize,
    real_agents: usize,
    /// Extra operator flags.
    operator_args: Vec<String>,
    /// Time a roll-out may take before the run fails.
    limit: Duration,
    test_mode: bool,
}

fn env_number(name: &str, default: usize) -> anyhow::Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v:?} is not a number")),
        Err(_) => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let bench = std::env::args().any(|a| a == "--bench");
    let nodes = env_number("FLEET_NODES", if bench { 1000 } else { 50 })?;
    let settings = Settings {
        nodes,
        real_agents: env_number("FLEET_REAL_AGENTS", if bench { 3 } else { 2 })?.min(nodes),
        operator_args: std::env::var("FLEET_OPERATOR_ARGS")
            .map(|a| a.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default(),
        limit: Duration::from_secs(120 + nodes as u64 / 10),
        test_mode: !bench,
    };
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(run(settings))
}

/// An agent of this process: the real agent's ConfigMap follower, on a state directory
/// of its own, with the agent's metrics shared by all. Returns once its first state is
/// in force.
async fn simulated_agent(
    client: kube::Client,
    fleet: &Fleet,
    node: &str,
    metrics: &AgentMetrics,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let state_dir = fleet.dir.join("agents").join(node);
    open_state_dir(&state_dir).await?;
    let launcher = Launcher {
        program: "neuron-monitor".into(),
        args: Vec::new(),
        state_dir,
        silence_timeout: None,
        refused_files: metrics.state_files_refused.clone(),
        k8s_info: false,
        in_memory: Default::default(),
    };
    let builtin = api::monitor_config::MonitorConfig::all_groups(api::duration::Period::from_secs(5));
    let defaults = HealthDefaults { condition_type: "NeuronHealth".into(), kmsg_look_back: Duration::from_secs(300) };
    // The launch specs would go to neuron-monitor's supervisor: none runs here.
    let (activator, _launch_specs) = Activator::start(launcher, builtin, defaults, metrics.clone()).await?;
    let reloader = Reloader {
        client,
        watch_timeout: DEFAULT_WATCH_TIMEOUT,
        namespace: fleet.namespace.clone(),
        node: node.to_owned(),
        activator: Arc::new(activator),
        metrics: metrics.clone(),
    };
    let (initialized_tx, initialized) = tokio::sync::oneshot::channel();
    tokio::spawn(reloader.run(initialized_tx, shutdown));
    initialized.await.context("the follower stopped before its first state")
}

/// A real agent process for `node`, on the simulator, as the agent's ServiceAccount with
/// a token bound to its node.
fn real_agent(fleet: &Fleet, node: &str) -> anyhow::Result<Process> {
    let kubeconfig = fleet.dir.join(format!("agent-{node}.kubeconfig"));
    fleet.cp.service_account_kubeconfig(&fleet.namespace, &fleet.agent_service_account(), Some(node), &kubeconfig)?;
    let state_dir = fleet.dir.join("agents").join(node);
    let args = [
        "--node-name",
        node,
        "--config-namespace",
        &fleet.namespace,
        "--monitor-command",
        &workspace_bin("neuron-monitor-sim").display().to_string(),
        "--listen",
        &format!("127.0.0.1:{}", free_port()),
        "--state-dir",
        &state_dir.display().to_string(),
        "--stop-grace",
        "1s",
        "--otlp-headers-secret",
        &fleet.otlp_headers_secret(),
    ]
    .map(String::from);
    let env = [("KUBECONFIG", kubeconfig.display().to_string()), ("NEURON_AGENT_LOG", "error".to_owned())];
    Ok(Process::start("neuron-node-agent", &args, &env, fleet.cp))
}

/// The one client all simulated agents share: the agent's ServiceAccount (without a
/// node in its token: the chart's admission policy is not installed here), tuned as the
/// agent tunes its own.
async fn agents_client(fleet: &Fleet) -> anyhow::Result<kube::Client> {
    let path = fleet.dir.join("agents.kubeconfig");
    fleet.cp.service_account_kubeconfig(&fleet.namespace, &fleet.agent_service_account(), None, &path)?;
    let kubeconfig = kube::config::Kubeconfig::read_from(&path)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
    Ok(client_from(config, DEFAULT_WATCH_TIMEOUT)?)
}

/// Everything measured around one change.
struct Measured {
    rollout: Rollout,
    writes: neuron_e2e::fleet::Writes,
    reconciles: f64,
    requests: ApiRequests,
    operator: (ProcStats, ProcStats),
    control_plane: (ProcStats, ProcStats),
    harness: (ProcStats, ProcStats),
}

struct Probe {
    metrics: OperatorMetrics,
    requests: ApiRequests,
    operator: ProcStats,
    control_plane: ProcStats,
    harness: ProcStats,
}

async fn probe(fleet: &Fleet, leader: &Operator) -> anyhow::Result<Probe> {
    Ok(Probe {
        metrics: leader.metrics().context("the leader's /metrics")?,
        requests: ApiRequests::read(&fleet.admin).await?,
        operator: leader.stats().context("the leader's /proc")?,
        control_plane: ProcStats::of(fleet.cp.pid).context("the control plane's /proc")?,
        harness: ProcStats::of(std::process::id()).context("this process's /proc")?,
    })
}

fn measured(rollout: Rollout, before: &Probe, after: &Probe) -> Measured {
    Measured {
        rollout,
        writes: after.metrics.writes() - before.metrics.writes(),
        reconciles: after.metrics.value("neuron_operator_reconciles_total", &[])
            - before.metrics.value("neuron_operator_reconciles_total", &[]),
        requests: after.requests.since(&before.requests),
        operator: (before.operator, after.operator),
        control_plane: (before.control_plane, after.control_plane),
        harness: (before.harness, after.harness),
    }
}

fn print_process(what: &str, (before, after): (ProcStats, ProcStats)) {
    println!(
        "  {what}: CPU {:.2} s, RSS {:.1} MiB (peak so far {:.1} MiB)",
        after.cpu_seconds - before.cpu_seconds,
        mib(after.rss_bytes),
        mib(after.peak_rss_bytes)
    );
}

fn print_measured(what: &str, m: &Measured, nodes: usize) {
    let total = |v: &[Duration]| v.iter().max().copied().unwrap_or_default().as_secs_f64();
    println!("{what}:");
    println!(
        "  written to all {nodes} ConfigMaps in {:.2} s (per node {})",
        total(&m.rollout.written),
        summary(&m.rollout.written)
    );
    if !m.rollout.applied.is_empty() {
        println!(
            "  acknowledged by all in {:.2} s (per node {})",
            total(&m.rollout.applied),
            summary(&m.rollout.applied)
        );
    }
    println!(
        "  operator: {:.0} passes, ConfigMaps written {:.0}, deleted {:.0}, statuses written {:.0}, write failures {:.0}",
        m.reconciles, m.writes.configmaps, m.writes.deletes, m.writes.statuses, m.writes.failures
    );
    let requests: Vec<String> = m
        .requests
        .by_verb_and_resource()
        .into_iter()
        .map(|((verb, resource), n)| format!("{verb} {resource} {n:.0}"))
        .collect();
    println!("  API requests (every client): {}", requests.join(", "));
    println!(
        "  answered 429: {:.0}; rejected by priority and fairness: {:.0}",
        m.requests.throttled(),
        m.requests.rejected
    );
    print_process("operator (leader)", m.operator);
    print_process("control plane (etcd + kube-apiserver + GC)", m.control_plane);
    print_process("this process (simulated agents, observer)", m.harness);
}

/// The index of the replica that leads, once it has reconciled.
async fn leader(replicas: &[Operator], limit: Duration) -> anyhow::Result<usize> {
    wait_for(limit, || async {
        replicas.iter().position(|r| {
            r.metrics().is_some_and(|m| {
                m.value("neuron_operator_leader", &[]) == 1.0 && m.value("neuron_operator_reconciles_total", &[]) >= 1.0
            })
        })
    })
    .await
    .context("no operator replica leads")
}

/// Waits for a pass after the scrape `before`, then `quiet` more (for the writes the
/// pass's own events cause).
async fn settle(leader: &Operator, before: &OperatorMetrics, quiet: Duration, limit: Duration) -> anyhow::Result<()> {
    let passes = before.value("neuron_operator_reconciles_total", &[]);
    leader.wait_reconciled(passes + 1.0, limit).await.context("no pass after the change")?;
    tokio::time::sleep(quiet).await;
    Ok(())
}

async fn run(s: Settings) -> anyhow::Result<()> {
    let started = Instant::now();
    let fleet = Fleet::new("nm-fleet", s.nodes).await?;
    println!(
        "fleet: {} nodes ({} real agent processes, {} agents in this process), 2 operator replicas{}",
        s.nodes,
        s.real_agents,
        s.nodes - s.real_agents,
        if s.operator_args.is_empty() { String::new() } else { format!(" with {}", s.operator_args.join(" ")) }
    );
    println!("  nodes created in {:.1} s", started.elapsed().as_secs_f64());
    let observer = Observer::start(fleet.admin.clone(), &fleet.namespace).await;

    let shutdown = CancellationToken::new();
    let _stop_agents = shutdown.clone().drop_guard();
    let (real_nodes, simulated_nodes) = fleet.nodes.split_at(s.real_agents);
    let mut real = Vec::new();
    for node in real_nodes {
        real.push(real_agent(&fleet, node)?);
    }
    let agents_started = Instant::now();
    let client = agents_client(&fleet).await?;
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = AgentMetrics::register(&mut registry);
    futures::stream::iter(simulated_nodes)
        .map(|node| simulated_agent(client.clone(), &fleet, node, &metrics, shutdown.clone()))
        .buffer_unordered(32)
        .try_collect::<Vec<()>>()
        .await?;
    println!("  agents following their ConfigMaps in {:.1} s", agents_started.elapsed().as_secs_f64());

    let extra: Vec<&str> = s.operator_args.iter().map(String::as_str).collect();
    let mut replicas = vec![fleet.operator("operator-a", &extra), fleet.operator("operator-b", &extra)];
    let leader_index = leader(&replicas, s.limit).await?;
    let first_leader = &replicas[leader_index];

    // The first roll-out creates every ConfigMap.
    let before = observer.snapshot();
    let p0 = probe(&fleet, first_leader).await?;
    let t0 = Instant::now();
    fleet.apply_config("fleet", json!({ "period": "5s" })).await?;
    let rollout = observer.rollout(&fleet.nodes, &before, t0, true, s.limit).await.map_err(anyhow::Error::msg)?;
    let p1 = probe(&fleet, first_leader).await?;
    print_measured("first config (every ConfigMap created)", &measured(rollout, &p0, &p1), s.nodes);

    // The measured change: every node's content changes.
    settle(first_leader, &p1.metrics, Duration::from_secs(2), s.limit).await?;
    let before = observer.snapshot();
    let p0 = probe(&fleet, first_leader).await?;
    let t0 = Instant::now();
    fleet.apply_config("fleet", json!({ "period": "10s" })).await?;
    let rollout = observer.rollout(&fleet.nodes, &before, t0, true, s.limit).await.map_err(anyhow::Error::msg)?;
    // The status counts the last acknowledgements once the pass after them has run.
    settle(first_leader, &probe(&fleet, first_leader).await?.metrics, Duration::from_secs(1), s.limit).await?;
    let p1 = probe(&fleet, first_leader).await?;
    let change = measured(rollout, &p0, &p1);
    print_measured("config change", &change, s.nodes);
    let hash = change.rollout.hashes.iter().next().cloned().unwrap_or_default();
    let snapshot = observer.snapshot();
    let real_acks: Vec<Duration> = real_nodes
        .iter()
        .filter_map(|n| snapshot.get(n)?.applied_at(&hash).map(|t| t.saturating_duration_since(t0)))
        .collect();
    let simulated_acks: Vec<Duration> = simulated_nodes
        .iter()
        .filter_map(|n| snapshot.get(n)?.applied_at(&hash).map(|t| t.saturating_duration_since(t0)))
        .collect();
    println!(
        "  acknowledged by the real agents: {:?}; by the simulated ones: {}",
        real_acks.iter().map(|d| format!("{:.2} s", d.as_secs_f64())).collect::<Vec<_>>(),
        summary(&simulated_acks)
    );

    // A pass that finds nothing to change (a config's metadata touched) writes nothing.
    let before = observer.snapshot();
    let p0 = probe(&fleet, first_leader).await?;
    let touched = json!({ "metadata": { "labels": { "fleet-touched": "yes" } } });
    fleet.configs().patch("fleet", &Default::default(), &kube::api::Patch::Merge(&touched)).await?;
    settle(first_leader, &p0.metrics, Duration::from_secs(2), s.limit).await?;
    let p1 = probe(&fleet, first_leader).await?;
    let noop = measured(Rollout::default(), &p0, &p1);
    let noop_events = observer.events_since(&before);
    println!(
        "no-op pass: {:.0} passes, ConfigMaps written {:.0}, statuses written {:.0}, ConfigMap events {noop_events}, \
         ConfigMap requests APPLY {:.0} PATCH {:.0}",
        noop.reconciles,
        noop.writes.configmaps,
        noop.writes.statuses,
        noop.requests.count("APPLY", "configmaps"),
        noop.requests.count("PATCH", "configmaps")
    );
    print_process("operator (leader)", noop.operator);
    print_process("control plane", noop.control_plane);

    // Leader hand-over: the leader stops (releasing its Lease), the standby takes over
    // and does a full pass over everything, which must write nothing.
    let before = observer.snapshot();
    let requests_before = ApiRequests::read(&fleet.admin).await?;
    let mut old = replicas.remove(leader_index);
    let handover = Instant::now();
    old.process.terminate(Duration::from_secs(30));
    let new_leader = &replicas[leader(&replicas, s.limit).await?];
    let took_over = handover.elapsed();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m = new_leader.metrics().context("the new leader's /metrics")?;
    let requests = ApiRequests::read(&fleet.admin).await?.since(&requests_before);
    let handover_events = observer.events_since(&before);
    println!(
        "leader hand-over: the standby led and reconciled {:.2} s after the leader stopped; it wrote ConfigMaps {:.0}, \
         statuses {:.0}; ConfigMap events {handover_events}, ConfigMap requests APPLY {:.0} PATCH {:.0}",
        took_over.as_secs_f64(),
        m.writes().configmaps,
        m.writes().statuses,
        requests.count("APPLY", "configmaps"),
        requests.count("PATCH", "configmaps")
    );
    print_process("new leader, since it started", (ProcStats::default(), new_leader.stats().unwrap_or_default()));

    for mut agent in real {
        agent.terminate(Duration::from_secs(10));
    }
    shutdown.cancel();

    // Every node deleted at once: their ConfigMaps go (garbage collector, operator).
    let deleting = Instant::now();
    fleet.delete_nodes(&fleet.nodes).await?;
    let deleted = deleting.elapsed();
    let gone = wait_for(s.limit, || async { (fleet.configmaps_left().await.ok()? == 0).then_some(()) }).await;
    println!(
        "all {} nodes deleted in {:.2} s; every ConfigMap gone {:.2} s after the first deletion{}",
        s.nodes,
        deleted.as_secs_f64(),
        deleting.elapsed().as_secs_f64(),
        if gone.is_some() { String::new() } else { format!(": NOT, {} left", fleet.configmaps_left().await?) }
    );
    println!("total run: {:.1} s", started.elapsed().as_secs_f64());

    if s.test_mode {
        check(&change, &real_acks, &simulated_acks, s.real_agents)?;
        if gone.is_none() {
            bail!("node ConfigMaps left after every node was deleted");
        }
        let noop_requests = noop.requests.count("APPLY", "configmaps") + noop.requests.count("PATCH", "configmaps");
        if noop.writes.configmaps != 0.0 || noop.writes.statuses != 0.0 || noop_events != 0 || noop_requests != 0.0 {
            bail!("the no-op pass wrote: {:?}, {noop_events} ConfigMap events", noop.writes);
        }
        if m.writes().configmaps != 0.0 || handover_events != 0 || requests.count("APPLY", "configmaps") != 0.0 {
            bail!("the new leader rewrote ConfigMaps: {:?}, {handover_events} events", m.writes());
        }
    }
    Ok(())
}

/// What the test mode requires of the change: one content everywhere, every node
/// written once and acknowledged, the real agents no slower than the simulated ones
/// by more than a loaded machine explains.
fn check(change: &Measured, real: &[Duration], simulated: &[Duration], real_agents: usize) -> anyhow::Result<()> {
    if change.rollout.hashes.len() != 1 {
        bail!("the nodes got different contents: {:?}", change.rollout.hashes);
    }
    let nodes = change.rollout.written.len() as f64;
    if change.writes.configmaps != nodes {
        bail!("{} ConfigMap writes for {nodes} nodes", change.writes.configmaps);
    }
    if real.len() != real_agents {
        bail!("{} of {real_agents} real agents acknowledged", real.len());
    }
    let slowest = simulated.iter().max().copied().unwrap_or_default();
    if let Some(r) = real.iter().find(|r| **r > slowest * 2 + Duration::from_secs(2)) {
        bail!("a real agent acknowledged after {r:?}, the simulated ones by {slowest:?}");
    }
    Ok(())
}
