//! Neuron devices allocated through Dynamic Resource Allocation on a real node
//! (`REALNODE_ALLOCATION=dra`: the test DRA driver `neuron.aws.com` instead of the device
//! plugin): a pod whose ResourceClaim holds one device runs the simulated application on
//! its cores (from the claim's CDI device) and is attributed on the agent's /metrics
//! through the kubelet's pod-resources `dynamic_resources` and the node's ResourceSlice;
//! the idle cores of a device another pod claims carry that claim; a device nobody
//! claims keeps reporting, without a pod. The application's pod also claims an EFA device
//! of the test driver's EFA half (AWS's EFA DRA driver's names: `dra.net`,
//! `efa.networking.k8s.aws`), whose series then carry the pod and the claim. The team's
//! own config sends the pod's series to CloudWatch (LocalStack) and to an OTLP receiver,
//! both reached from the agent's pod through the node's bridge. A node migrating to DRA
//! (`REALNODE_ALLOCATION=mixed`: the device plugin half the devices, the DRA driver the
//! rest) attributes both kinds of allocation side by side.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
    time::{Duration, Instant},
};

use api::{
    crd::NeuronMonitorConfig,
    hardware::{EFA_DRA_DEVICE_CLASS, EFA_DRA_DRIVER},
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    api::{ApiResource, DynamicObject, PostParams},
    Api, Client,
};
use neuron_e2e::{
    free_port,
    localstack::CloudWatch,
    otlp::{points, Receiver},
    real_node::{RealNode, POD_GATEWAY},
    relay::Relay,
    wait_for,
};
use neuron_node_agent::attribution::{dra::claimed_devices, podresources};
use serde_json::json;

use super::{
    allocation_counts, component_of, down_leaving_nothing_behind, every_pod_ready, health_series, helm_install_with,
    labels_of, metrics_answer_only_a_token_with_the_reader_role, runtime_cores, workload_pod, AGENT_PORT,
};

const TEAM: &str = "team-dra";
const TAG: &str = "realnode-dra";
const DRIVER: &str = "neuron.aws.com";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn neuron_devices_claimed_through_dra_are_attributed_on_a_real_node() {
    let mut node = RealNode::up_with("trn1.32xlarge", "dra").expect("a real node with the test DRA driver");
    let t = &node.info.timings;
    eprintln!("DRA node up in {:.1}s (kubelet to Ready node and ResourceSlice {:.1}s)", t.total_s, t.node_ready_s);
    assert_eq!(node.info.allocation, "dra", "{:?}", node.info);
    let hardware = node.hardware();
    let cores_per_device = node.cores_per_device();
    let client = node.client().await;
    let slice = published_devices(&client, &node.info.node).await;
    assert_eq!(slice.len() as u64, hardware["devices"].as_u64().expect("devices"), "the ResourceSlice: {slice:?}");
    let efa_slice = published_efa_devices(&client, &node.info.node).await;
    let efa_names: BTreeSet<&str> = efa_slice.values().map(String::as_str).collect();
    let efa_hardware = hardware["efa_devices"].as_array().expect("efa_devices");
    assert_eq!(efa_names, efa_hardware.iter().filter_map(|d| d.as_str()).collect(), "the EFA ResourceSlice");

    // The team's sinks, on the bridge (made with the first pod) at ports chosen now for the
    // agent's environment and the tenancy policy: its CloudWatch, LocalStack (which
    // listens on loopback only) through a relay, and its OTLP collector, which the
    // cluster's policy admits.
    let cw = CloudWatch::start();
    let (relay_port, otlp_port) = (free_port(), free_port());
    let cloudwatch = format!("http://{POD_GATEWAY}:{relay_port}");
    let otlp_endpoint = format!("http://{POD_GATEWAY}:{otlp_port}/v1/metrics");
    let aws = [
        ("AWS_ENDPOINT_URL_CLOUDWATCH", cloudwatch.as_str()),
        ("AWS_ACCESS_KEY_ID", "AKIDTEST"),
        ("AWS_SECRET_ACCESS_KEY", "test-secret"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ];
    let values = values_for_team_sinks(&node, &aws, &otlp_endpoint);
    let values = values.to_str().expect("a UTF-8 path");
    // Allocated cores count as idle after 2 s (not 10 minutes) in this test.
    helm_install_with(&node, &["--values", values, "--set", "agent.idleCores.window=2s"]);
    let pods = every_pod_ready(&client).await;
    let to_localstack = SocketAddr::new(POD_GATEWAY.into(), relay_port);
    let _relay = Relay::start(to_localstack, cw.addr()).expect("a relay from the bridge to LocalStack");
    let otlp = Receiver::start_on(SocketAddr::new(POD_GATEWAY.into(), otlp_port)).expect("an OTLP receiver");
    let scraper = metrics_answer_only_a_token_with_the_reader_role(&client, &pods).await;
    let agent = pods.iter().find(|p| component_of(p) == "node-agent").expect("the agent's pod").clone();
    let page = || scraper.metrics(&agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({ "metadata": { "name": TEAM } })).expect("a Namespace");
    namespaces.create(&PostParams::default(), &ns).await.expect("the team's namespace");

    // The application's pod, with a Neuron device and an EFA device: attributed from the
    // claim's allocation on.
    let created = Instant::now();
    claim_pod(
        &client,
        "trainer",
        &node.info.images.agent,
        &["neuron-monitor-sim", "app", "--tag", TAG, "--util", "70"],
        true,
    )
    .await;
    let device = allocated_device(&client, "trainer-neuron", DRIVER).await;
    let allocated = Instant::now();
    let index = *slice.get(&device).unwrap_or_else(|| panic!("{device} is not in the ResourceSlice {slice:?}"));
    let cores: Vec<u32> = (index * cores_per_device..(index + 1) * cores_per_device).collect();
    let expected: BTreeSet<(String, String, String, String)> =
        cores.iter().map(|c| (c.to_string(), TEAM.into(), "trainer".into(), "app".into())).collect();
    let seen = wait_for(Duration::from_secs(90), || {
        std::future::ready((runtime_cores(&page(), TAG) == expected).then_some(()))
    })
    .await;
    let latency = allocated.elapsed();
    assert!(
        seen.is_some(),
        "{TAG}'s cores on /metrics {:?}, the claim's device {device} holds {expected:?}\n{}",
        runtime_cores(&page(), TAG),
        node.diagnostics()
    );
    eprintln!(
        "the claim's pod attributed on /metrics {:.2}s after its claim was allocated ({:.2}s after the pod was created)",
        latency.as_secs_f64(),
        created.elapsed().as_secs_f64()
    );
    the_kubelet_lists_the_claim(&node, "trainer", "trainer-neuron", &device).await;
    the_teams_sinks_get_its_pods_series(&client, &cw, &otlp).await;
    // The device's own series name the pod holding it.
    let holders = health_series(&page()).into_iter().find(|(d, ..)| *d == index.to_string()).map(|(_, _, p, _)| p);
    assert_eq!(holders.as_deref(), Some(format!("{TEAM}/trainer").as_str()), "device {index}'s health series");

    // The claimed EFA device's series carry the pod and the claim; the others neither.
    let efa_device = allocated_device(&client, "trainer-efa", EFA_DRA_DRIVER).await;
    let rdma = efa_slice.get(&efa_device).unwrap_or_else(|| panic!("{efa_device} is not in {efa_slice:?}")).clone();
    let want = [TEAM, "trainer", "app", TEAM, "trainer-efa"].map(str::to_owned);
    let efa_seen = wait_for(Duration::from_secs(30), || {
        std::future::ready((efa_holders(&page()).get(&rdma) == Some(&want)).then_some(()))
    })
    .await;
    let holders = efa_holders(&page());
    assert!(efa_seen.is_some(), "EFA device {rdma} (claimed {efa_device}): {:?}, want {want:?}", holders.get(&rdma));
    assert_eq!(holders.len(), efa_names.len(), "every EFA device reports: {holders:?}");
    let others = holders.iter().filter(|(d, _)| **d != rdma);
    assert!(others.clone().all(|(_, labels)| labels.iter().all(String::is_empty)), "{holders:?}");
    let listed = podresources::list(&node.info.kubelet_root.join("pod-resources/kubelet.sock")).await;
    let listed = claimed_devices(&listed.expect("the kubelet's pod-resources answer"), EFA_DRA_DRIVER);
    assert_eq!(
        listed.iter().map(|c| (c.claim.name.as_str(), c.device.as_str())).collect::<Vec<_>>(),
        [("trainer-efa", efa_device.as_str())]
    );

    // A pod that holds its claimed device idle: the device's idle cores carry the pod and
    // the claim.
    claim_pod(&client, "holder", &node.info.images.pause, &["/pause"], false).await;
    let held = allocated_device(&client, "holder-neuron", DRIVER).await;
    let held_index = slice[&held];
    let held_cores: BTreeSet<String> =
        (held_index * cores_per_device..(held_index + 1) * cores_per_device).map(|c| c.to_string()).collect();
    let claim_labels = |labels: &BTreeMap<String, String>| {
        ["namespace", "pod", "container", "dra_claim_namespace", "dra_claim_name"]
            .map(|k| labels.get(k).cloned().unwrap_or_default())
    };
    let want = [TEAM, "holder", "idle", TEAM, "holder-neuron"].map(str::to_owned);
    let idle = wait_for(Duration::from_secs(60), || {
        let idle = idle_cores(&page());
        let ours = held_cores.iter().all(|c| idle.get(c).map(claim_labels).as_ref() == Some(&want));
        std::future::ready(ours.then_some(()))
    })
    .await;
    let last: Vec<_> = idle_cores(&page()).into_iter().filter(|(c, _)| held_cores.contains(c)).collect();
    assert!(idle.is_some(), "the idle cores of {held} (claim holder-neuron): {last:?}, want {want:?} on each");
    the_kubelet_lists_the_claim(&node, "holder", "holder-neuron", &held).await;

    // What can be allocated comes from the ResourceSlice (the node has no device plugin);
    // the two claimed devices are allocated, the holder's idle, the trainer's busy.
    let devices = slice.len() as f64;
    let per_device = f64::from(cores_per_device);
    let want: BTreeMap<String, f64> =
        [("allocatable", devices * per_device), ("allocated", 2.0 * per_device), ("allocated_idle", per_device)]
            .map(|(k, v)| (k.to_owned(), v))
            .into();
    let counted =
        wait_for(Duration::from_secs(30), || std::future::ready((allocation_counts(&page()) == want).then_some(())))
            .await;
    assert!(counted.is_some(), "neuron_node_neuroncores {:?}, want {want:?}", allocation_counts(&page()));

    // A device nobody claims keeps reporting its cores, without a pod or a claim.
    let free = slice.values().copied().find(|i| ![index, held_index].contains(i)).expect("an unclaimed device");
    let idle = idle_cores(&page());
    for core in free * cores_per_device..(free + 1) * cores_per_device {
        let labels = idle.get(&core.to_string()).unwrap_or_else(|| panic!("core {core} of unclaimed device {free}"));
        assert!(!labels.contains_key("pod") && !labels.contains_key("dra_claim_name"), "core {core}: {labels:?}");
    }

    down_leaving_nothing_behind(&mut node);
}

/// A node migrating to DRA (`REALNODE_ALLOCATION=mixed`): the device plugin advertises
/// the first half of the devices, the test DRA driver publishes the other half. A pod
/// holding cores through the device plugin and a pod claiming a device are attributed
/// side by side, and what can be allocated is every device, from both, before any claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_plugin_and_dra_allocations_are_attributed_side_by_side_on_a_real_node() {
    const PLUGIN_TAG: &str = "realnode-mixed-plugin";
    const CLAIM_TAG: &str = "realnode-mixed-claim";
    let mut node = RealNode::up_with("trn1.32xlarge", "mixed").expect("a real node with the device plugin and DRA");
    assert_eq!(node.info.allocation, "mixed", "{:?}", node.info);
    let devices = node.hardware()["devices"].as_u64().expect("devices") as u32;
    let cores_per_device = node.cores_per_device();
    let client = node.client().await;
    let slice = published_devices(&client, &node.info.node).await;
    let half = devices / 2;
    assert_eq!(slice.values().copied().collect::<BTreeSet<u32>>(), (half..devices).collect(), "the DRA half");
    helm_install_with(&node, &[]);
    let pods = every_pod_ready(&client).await;
    let scraper = metrics_answer_only_a_token_with_the_reader_role(&client, &pods).await;
    let agent = pods.iter().find(|p| component_of(p) == "node-agent").expect("the agent's pod").clone();
    let page = || scraper.metrics(&agent, "node-agent", AGENT_PORT, Some(&scraper.token)).body;

    // Before any claim, the DRA half counts as allocatable beside the device plugin's.
    let all = f64::from(devices * cores_per_device);
    let counted = wait_for(Duration::from_secs(30), || {
        std::future::ready((allocation_counts(&page()).get("allocatable") == Some(&all)).then_some(()))
    })
    .await;
    assert!(counted.is_some(), "neuron_node_neuroncores {:?}, want {all} allocatable", allocation_counts(&page()));

    // One pod holds 2 cores through the device plugin, one claims a device through DRA.
    workload_pod(&client, TEAM, "plugin-app", &node.info.images.agent, PLUGIN_TAG, 2).await;
    let socket = node.info.kubelet_root.join("pod-resources/kubelet.sock");
    let answer = podresources::list(&socket).await.expect("the kubelet's pod-resources answer");
    let plugin_cores: Vec<u32> =
        podresources::allocations(&answer).0.iter().filter(|a| a.pod == "plugin-app").map(|a| a.id).collect();
    assert_eq!(plugin_cores.len(), 2, "the device plugin's 2 cores: {plugin_cores:?}");
    assert!(plugin_cores.iter().all(|c| *c < half * cores_per_device), "the device plugin's half: {plugin_cores:?}");
    let command = ["neuron-monitor-sim", "app", "--tag", CLAIM_TAG, "--util", "70"];
    claim_pod(&client, "trainer", &node.info.images.agent, &command, false).await;
    let device = allocated_device(&client, "trainer-neuron", DRIVER).await;
    let index = slice[&device];
    let claimed_cores: Vec<u32> = (index * cores_per_device..(index + 1) * cores_per_device).collect();
    let held = |cores: &[u32], pod: &str| -> BTreeSet<(String, String, String, String)> {
        cores.iter().map(|c| (c.to_string(), TEAM.into(), pod.into(), "app".into())).collect()
    };
    let (want_plugin, want_claim) = (held(&plugin_cores, "plugin-app"), held(&claimed_cores, "trainer"));
    let both = wait_for(Duration::from_secs(90), || {
        let page = page();
        let seen = runtime_cores(&page, PLUGIN_TAG) == want_plugin && runtime_cores(&page, CLAIM_TAG) == want_claim;
        std::future::ready(seen.then_some(()))
    })
    .await;
    let last = page();
    assert!(
        both.is_some(),
        "device plugin's pod {:?}, want {want_plugin:?}; the claim's pod {:?}, want {want_claim:?}\n{}",
        runtime_cores(&last, PLUGIN_TAG),
        runtime_cores(&last, CLAIM_TAG),
        node.diagnostics()
    );
    the_kubelet_lists_the_claim(&node, "trainer", "trainer-neuron", &device).await;
    let want = f64::from(2 + cores_per_device);
    let counted = wait_for(Duration::from_secs(30), || {
        let counts = allocation_counts(&page());
        std::future::ready(
            (counts.get("allocatable") == Some(&all) && counts.get("allocated") == Some(&want)).then_some(()),
        )
    })
    .await;
    assert!(
        counted.is_some(),
        "neuron_node_neuroncores {:?}, want {all} allocatable, {want} allocated",
        allocation_counts(&page())
    );

    down_leaving_nothing_behind(&mut node);
}

/// A values file that adds `env` to the agent's environment of the node's values (`--set`
/// would replace that list, and with it the simulator's settings) and lets every team's
/// configs send to `otlp_endpoint`.
fn values_for_team_sinks(node: &RealNode, env: &[(&str, &str)], otlp_endpoint: &str) -> PathBuf {
    let text = std::fs::read_to_string(&node.info.values).expect("the node's chart values");
    let values: serde_norway::Value = serde_norway::from_str(&text).expect("YAML values");
    let mut list = values["agent"]["extraEnv"].as_sequence().cloned().unwrap_or_default();
    list.extend(
        env.iter().map(|(name, value)| serde_norway::to_value(json!({ "name": name, "value": value })).expect("YAML")),
    );
    let path = node.dir.join("agent-env-values.yaml");
    let extra = json!({
        "agent": { "extraEnv": list },
        "tenancy": { "default": { "otlpEndpoints": [otlp_endpoint] } },
    });
    let extra = serde_norway::to_string(&extra).expect("YAML");
    std::fs::write(&path, extra).expect("the values file");
    path
}

/// The team's own config sends its pod's series, attributed through the claim, to its
/// CloudWatch namespace (classic naming, by namespace and pod) and to its OTLP receiver.
async fn the_teams_sinks_get_its_pods_series(client: &Client, cw: &CloudWatch, otlp: &Receiver) {
    let config: NeuronMonitorConfig = serde_json::from_value(json!({
        "apiVersion": "neuronmonitor.io/v1alpha1", "kind": "NeuronMonitorConfig",
        "metadata": { "name": "team", "namespace": TEAM },
        "spec": { "period": "1s", "sinks": {
            "cloudwatch": {
                // Where the chart's tenancy policy lets a team publish.
                "namespace": cw.namespace(&format!("Teams/{TEAM}")), "dimensions": ["Namespace", "PodName"],
                "flushInterval": "1s",
            },
            "otlp": { "endpoint": otlp.url("/v1/metrics"), "flushInterval": "1s" },
        } },
    }))
    .expect("a NeuronMonitorConfig");
    let configs: Api<NeuronMonitorConfig> = Api::namespaced(client.clone(), TEAM);
    configs.create(&PostParams::default(), &config).await.expect("the team's config");
    let ours = |dimensions: &BTreeMap<String, String>| {
        dimensions.get("Namespace").map(String::as_str) == Some(TEAM)
            && dimensions.get("PodName").map(String::as_str) == Some("trainer")
    };
    let stored = wait_for(Duration::from_secs(90), || {
        let found = cw.stored().into_iter().find(|s| s.name == "neuroncore_utilization" && ours(&s.dimensions));
        std::future::ready(found)
    })
    .await;
    assert!(stored.is_some(), "the pod's utilization in LocalStack: {:?}", cw.stored());
    let point = otlp.wait_for("the pod's series over OTLP", Duration::from_secs(90), |received| {
        let mut all = received.iter().filter_map(|r| r.decode().ok()).flat_map(|r| points(&r));
        all.find(|p| p.name == "neuroncore_utilization_ratio" && p.attributes.contains_key("runtime_tag"))
    });
    let point = point.expect("an OTLP point of the application");
    let pod = ["k8s.namespace.name", "k8s.pod.name"].map(|k| point.resource.get(k).cloned().unwrap_or_default());
    assert_eq!(pod, [TEAM, "trainer"].map(str::to_owned), "{point:?}");
}

fn resource(kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: "resource.k8s.io".into(),
        version: "v1".into(),
        api_version: "resource.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The devices `driver` publishes in the node's ResourceSlices.
async fn slice_devices(client: &Client, node: &str, driver: &str) -> Vec<serde_json::Value> {
    let slices: Api<DynamicObject> = Api::all_with(client.clone(), &resource("ResourceSlice", "resourceslices"));
    let list = slices
        .list(&kube::api::ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await
        .expect("the node's ResourceSlices");
    let ours = list.items.into_iter().filter(|s| s.data["spec"]["driver"] == driver);
    ours.flat_map(|s| s.data["spec"]["devices"].as_array().cloned().unwrap_or_default()).collect()
}

/// The node's published Neuron devices: name → `deviceId`.
async fn published_devices(client: &Client, node: &str) -> BTreeMap<String, u32> {
    let mut devices = BTreeMap::new();
    for device in slice_devices(client, node, DRIVER).await {
        let name = device["name"].as_str().unwrap_or_default().to_owned();
        let id = device["attributes"]["deviceId"]["int"].as_u64().expect("a deviceId") as u32;
        let kind = &device["attributes"]["resourceType"]["string"];
        assert_eq!(kind, "neuron_device", "{name}'s resourceType");
        for group in ["resource.aws.com/devicegroup4_id", "resource.aws.com/devicegroup8_id"] {
            assert!(device["attributes"][group]["int"].is_u64(), "{name} lacks {group}: {device}");
        }
        devices.insert(name, id);
    }
    devices
}

/// The node's published EFA devices (the EFA half's slice): name → `dra.net/rdmaDevice`.
async fn published_efa_devices(client: &Client, node: &str) -> BTreeMap<String, String> {
    let devices = slice_devices(client, node, EFA_DRA_DRIVER).await;
    let rdma = |d: &serde_json::Value| d["attributes"]["dra.net/rdmaDevice"]["string"].as_str().map(str::to_owned);
    devices.iter().filter_map(|d| Some((d["name"].as_str()?.to_owned(), rdma(d)?))).collect()
}

/// Each EFA device's (namespace, pod, container, claim namespace, claim name) on its
/// `efa_tx_bytes_total` (empty where absent).
fn efa_holders(page: &str) -> BTreeMap<String, [String; 5]> {
    page.lines()
        .filter_map(|line| line.strip_prefix("efa_tx_bytes_total{"))
        .filter_map(|rest| rest.split_once('}').map(|(labels, _)| labels_of(labels)))
        .filter_map(|labels| {
            let holder = ["namespace", "pod", "container", "dra_claim_namespace", "dra_claim_name"]
                .map(|k| labels.get(k).cloned().unwrap_or_default());
            Some((labels.get("efa_device")?.clone(), holder))
        })
        .collect()
}

/// Pod `name` of TEAM, its container (`app`, the holder's `idle`) holding ResourceClaim
/// `<name>-neuron` (one device of class neuron.aws.com), and with `efa` also
/// `<name>-efa` (one of class efa.networking.k8s.aws), running `command` of `image`.
async fn claim_pod(client: &Client, name: &str, image: &str, command: &[&str], efa: bool) {
    let claims: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), TEAM, &resource("ResourceClaim", "resourceclaims"));
    let mut wanted = vec![("neuron", DRIVER)];
    if efa {
        wanted.push(("efa", EFA_DRA_DEVICE_CLASS));
    }
    for (request, class) in &wanted {
        let claim: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": { "name": format!("{name}-{request}") },
            "spec": { "devices": { "requests": [
                { "name": request, "exactly": { "deviceClassName": class, "count": 1 } }
            ] } },
        }))
        .expect("a ResourceClaim");
        claims.create(&PostParams::default(), &claim).await.expect("creating the ResourceClaim");
    }
    let container = if name == "holder" { "idle" } else { "app" };
    let pod_claims: Vec<_> =
        wanted.iter().map(|(r, _)| json!({ "name": r, "resourceClaimName": format!("{name}-{r}") })).collect();
    let container_claims: Vec<_> = wanted.iter().map(|(r, _)| json!({ "name": r })).collect();
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "resourceClaims": pod_claims,
            "containers": [{
                "name": container,
                "image": image,
                "imagePullPolicy": "Never",
                "command": command,
                "resources": { "claims": container_claims },
                "securityContext": { "runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                     "readOnlyRootFilesystem": true, "capabilities": { "drop": ["ALL"] } },
            }],
        },
    }))
    .expect("a Pod");
    Api::<Pod>::namespaced(client.clone(), TEAM).create(&PostParams::default(), &pod).await.expect("creating the pod");
}

/// The device of `driver` the scheduler allocated to claim TEAM/`claim`, once it has.
async fn allocated_device(client: &Client, claim: &str, driver: &str) -> String {
    let claims: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), TEAM, &resource("ResourceClaim", "resourceclaims"));
    let device = wait_for(Duration::from_secs(60), || {
        let claims = claims.clone();
        async move {
            let c = claims.get(claim).await.ok()?;
            let results = c.data["status"]["allocation"]["devices"]["results"].as_array()?.clone();
            assert_eq!(results.len(), 1, "claim {claim} of one device: {results:?}");
            assert_eq!(results[0]["driver"], driver, "{results:?}");
            results[0]["device"].as_str().map(str::to_owned)
        }
    })
    .await;
    let last = claims.get(claim).await.map(|c| c.data["status"].clone());
    device.unwrap_or_else(|| panic!("claim {TEAM}/{claim} never allocated: {last:?}"))
}

/// The kubelet's pod-resources answer lists the claim's device for the pod's container.
async fn the_kubelet_lists_the_claim(node: &RealNode, pod: &str, claim: &str, device: &str) {
    let socket = node.info.kubelet_root.join("pod-resources/kubelet.sock");
    let answer = podresources::list(&socket).await.expect("the kubelet's pod-resources answer");
    let listed: Vec<_> = claimed_devices(&answer, DRIVER)
        .into_iter()
        .filter(|c| (c.namespace.as_str(), c.pod.as_str()) == (TEAM, pod))
        .map(|c| (c.claim.namespace.clone(), c.claim.name.clone(), c.pool.clone(), c.device.clone()))
        .collect();
    let want = (TEAM.to_owned(), claim.to_owned(), node.info.node.clone(), device.to_owned());
    assert_eq!(listed, vec![want], "the kubelet's dynamic_resources of {TEAM}/{pod}");
}

/// The `neuroncore_utilization_ratio` series without a runtime (idle cores): core → labels.
fn idle_cores(page: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    page.lines()
        .filter_map(|line| line.strip_prefix("neuroncore_utilization_ratio{"))
        .filter_map(|rest| rest.split_once('}').map(|(labels, _)| labels_of(labels)))
        .filter(|labels| !labels.contains_key("runtime_tag"))
        .filter_map(|labels| Some((labels.get("neuroncore")?.clone(), labels)))
        .collect()
}
