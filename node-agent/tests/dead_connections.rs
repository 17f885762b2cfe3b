//! The real agent talking to the real API server through a proxy whose connections go
//! silently dead (no RST, no FIN): the agent's watches are renewed (or found dead)
//! within a bounded time, so a new node configuration and a new pod reach it through
//! fresh connections, long before the 5-minute read timeout the agent once relied on.

mod support;

use std::{
    ffi::OsStr,
    net::SocketAddr,
    time::{Duration, Instant},
};

use api::{
    duration::Period,
    monitor_config::MonitorConfig,
    node_config::{configmap_name, content_hash, NodeConfig, CONFIG_HASH_ANNOTATION, NODE_CONFIG_KEY},
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{ObjectMeta, Patch, PatchParams},
    Api,
};
use neuron_e2e::{random_u32, ControlPlane};
use support::{blackhole::BlackholeProxy, sim, Agent, TempDir};

/// The agent must have followed the change within this; with the old 290 s watches and
/// 300 s read timeout it took about 5 minutes.
const BOUND: Duration = Duration::from_secs(90);

/// The node's ConfigMap running every group at `period`, and its hash.
fn node_configmap(node: &str, namespace: &str, period: &str) -> (ConfigMap, String) {
    let config = NodeConfig {
        monitor: MonitorConfig::all_groups(period.parse::<Period>().expect("period")),
        routes: Vec::new(),
        health: None,
        gpu: None,
    };
    let body = serde_json::to_string(&config).expect("json");
    let hash = content_hash(body.as_bytes());
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(configmap_name(node)),
            namespace: Some(namespace.to_owned()),
            annotations: Some([(CONFIG_HASH_ANNOTATION.to_owned(), hash.clone())].into()),
            ..Default::default()
        },
        data: Some([(NODE_CONFIG_KEY.to_owned(), body)].into()),
        ..Default::default()
    };
    (cm, hash)
}

/// A copy of the control plane's kubeconfig pointing at `proxy`.
fn kubeconfig_through(cp: &ControlPlane, proxy: SocketAddr, dir: &TempDir) -> std::path::PathBuf {
    let text = std::fs::read_to_string(&cp.kubeconfig).expect("kubeconfig");
    let upstream = cp.server.trim_end_matches('/');
    assert!(text.contains(upstream), "the kubeconfig names {upstream}");
    let path = dir.0.join("kubeconfig");
    std::fs::write(&path, text.replace(upstream, &format!("https://{proxy}"))).expect("write kubeconfig");
    path
}

fn upstream_addr(cp: &ControlPlane) -> SocketAddr {
    let authority = cp.server.trim_start_matches("https://").trim_end_matches('/');
    authority.parse().unwrap_or_else(|e| panic!("API server address {authority}: {e}"))
}

#[test]
fn changes_reach_the_agent_after_its_connections_go_silently_dead() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let cp = ControlPlane::shared();
    let client = rt.block_on(cp.client());
    let namespace = rt.block_on(cp.namespace("dead-conn"));
    let node = format!("dead-conn-{:08x}", random_u32());
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), &namespace);
    let apply = |cm: &ConfigMap| {
        let params = PatchParams::apply("dead-connection-test").force();
        rt.block_on(configmaps.patch(&configmap_name(&node), &params, &Patch::Apply(cm))).expect("apply ConfigMap");
    };
    let (first, first_hash) = node_configmap(&node, &namespace, "1s");
    apply(&first);

    let proxy = BlackholeProxy::start(upstream_addr(cp));
    let dir = TempDir::new("dead-conn");
    let kubeconfig = kubeconfig_through(cp, proxy.addr, &dir);
    let args = ["--node-name", &node, "--config-namespace", &namespace, "--period", "1s"];
    let agent = Agent::start_with_env(sim(), &[], &args, &[("KUBECONFIG", OsStr::new(&kubeconfig))]);
    let in_force = |m: &support::Metrics, hash: &str| m.value("neuron_agent_config", &[("hash", hash)]) == Some(1.0);
    agent.wait_for("the first configuration", Duration::from_secs(30), |m| in_force(m, &first_hash).then_some(()));
    agent.wait_for("the pods of the node listed", Duration::from_secs(30), |m| {
        m.value("neuron_agent_pods", &[]).is_some_and(|n| n == 0.0).then_some(())
    });
    // Past the start-up requests, so that both watches are idle on the connections that die.
    std::thread::sleep(Duration::from_secs(3));
    assert!(proxy.connections() >= 2, "the agent talks through the proxy");

    proxy.blackhole();
    let dead_at = Instant::now();
    let (second, second_hash) = node_configmap(&node, &namespace, "2s");
    apply(&second);
    rt.block_on(support::kubelet::running_pod(&client, &namespace, "app", &node, "main", &"c".repeat(64)));

    agent.wait_for("the new configuration and the new pod", BOUND, |m| {
        let pods = m.value("neuron_agent_pods", &[]).unwrap_or(0.0);
        (in_force(m, &second_hash) && pods == 1.0).then_some(())
    });
    println!("configuration and pod followed {:?} after the connections died", dead_at.elapsed());
}
