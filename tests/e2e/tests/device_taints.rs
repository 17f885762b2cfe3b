//! The chart's admission policy for the agent's DeviceTaintRules, on a real API server
//! that serves the alpha DeviceTaintRule API (`ControlPlane::with_device_taints`): the
//! agent's ServiceAccount, with a token bound to a pod on node A, creates and deletes
//! rules of node A's Neuron devices and GPUs, and nothing of node B's, nor of another
//! driver, nor of a whole pool, nor another taint key, nor an update.

use std::time::{Duration, Instant};

use api::device_taints::{rule_name, Rule};
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams},
    Api,
};
use neuron_e2e::{
    chart::{api_answer, assert_refused, documents, find, kind, one, template_as},
    kubectl, random_u32, wait_for, ControlPlane,
};

/// What the chart's admission policy says when it refuses a rule.
const REFUSAL: &str = "DeviceTaintRules of the neuron.aws.com and gpu.nvidia.com devices";

/// A change of a rule's object.
type Edit<'a> = Box<dyn FnOnce(&mut serde_json::Value) + 'a>;

fn rule(node: &str, pool: &str, device: &str) -> Rule {
    Rule {
        name: rule_name(node, device),
        driver: api::hardware::NEURON_DRA_DRIVER,
        pool: pool.to_owned(),
        device: device.to_owned(),
        value: Some("DMA_ERROR".to_owned()),
        effect: "NoSchedule",
    }
}

/// `rule` as the object the agent on `node` writes, changed by `edit`.
fn object(rule: &Rule, node: &str, edit: impl FnOnce(&mut serde_json::Value)) -> DynamicObject {
    let mut o = rule.object(node);
    o["apiVersion"] = "resource.k8s.io/v1alpha3".into();
    edit(&mut o);
    serde_json::from_value(o).expect("a DeviceTaintRule")
}

#[tokio::test]
async fn the_admission_policy_holds_the_agent_to_rules_of_its_own_nodes_devices() {
    let cp = ControlPlane::with_device_taints();
    let admin = cp.client().await;
    let ns = cp.namespace("nm-vap-dt").await;
    let docs = documents(&template_as(&ns, &ns, None, &[]));
    const KINDS: [&str; 5] = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let objects: Vec<String> =
        docs.iter().filter(|d| KINDS.contains(&kind(d))).map(|d| serde_norway::to_string(d).unwrap()).collect();
    assert_eq!(find(&docs, "ValidatingAdmissionPolicy").len(), 1);
    let (ok, out, err) = kubectl(cp, &["apply", "-f", "-"], Some(&objects.join("---\n")));
    assert!(ok, "applying the chart's RBAC and policy: {out}{err}");
    let agent_sa = one(&docs, "DaemonSet")["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap();

    let suffix = random_u32();
    let (node_a, node_b) = (format!("dt-a-{suffix:08x}"), format!("dt-b-{suffix:08x}"));
    let gvk = GroupVersionKind::gvk("resource.k8s.io", "v1alpha3", "DeviceTaintRule");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "devicetaintrules");
    let as_admin: Api<DynamicObject> = Api::all_with(admin.clone(), &resource);
    let agent = cp.service_account_client_on_node(&ns, agent_sa, &node_a).await;
    let as_agent: Api<DynamicObject> = Api::all_with(agent, &resource);
    let post = PostParams::default();

    // Node B's device, as B's agent would write it: refused once the policy is in force
    // (waited for with dry runs, which admission sees and which store nothing).
    let theirs = rule(&node_b, &node_b, "neurondevice0");
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let started = Instant::now();
    wait_for(Duration::from_secs(30), || async {
        let answer = api_answer(as_agent.create(&dry_run, &object(&theirs, &node_b, |_| {})).await);
        (answer.0 != 200).then_some(answer)
    })
    .await
    .expect("the policy in force");
    println!("admission policy in force {:?} after it was applied", started.elapsed());
    assert_refused(
        "node B's device",
        api_answer(as_agent.create(&post, &object(&theirs, &node_b, |_| {})).await),
        REFUSAL,
    );

    // Its own node's device: created, and deleted.
    let ours = rule(&node_a, &node_a, "neurondevice3");
    assert_eq!(api_answer(as_agent.create(&post, &object(&ours, &node_a, |_| {})).await), (200, String::new()));
    // Never updated (RBAC grants no update; the policy refuses it too).
    let update = Patch::Merge(serde_json::json!({ "spec": { "taint": { "effect": "NoExecute" } } }));
    assert_eq!(api_answer(as_agent.patch(&ours.name, &PatchParams::default(), &update).await).0, 403);
    assert_eq!(api_answer(as_agent.delete(&ours.name, &DeleteParams::default()).await), (200, String::new()));
    // Its own node's GPU (NVIDIA's driver), likewise.
    let gpu = Rule { driver: api::hardware::NVIDIA_DRA_DRIVER, ..rule(&node_a, &node_a, "gpu-2") };
    assert_eq!(api_answer(as_agent.create(&post, &object(&gpu, &node_a, |_| {})).await), (200, String::new()));
    assert_eq!(api_answer(as_agent.delete(&gpu.name, &DeleteParams::default()).await), (200, String::new()));

    // Named as its own but selecting B's pool, another driver, the whole pool, or with
    // another taint key: refused.
    let cases: [(&str, Edit<'_>); 5] = [
        ("another node's pool", Box::new(|o| o["spec"]["deviceSelector"]["pool"] = node_b.clone().into())),
        ("another driver", Box::new(|o| o["spec"]["deviceSelector"]["driver"] = "gpu.amd.com".into())),
        ("the whole pool", Box::new(|o| o["spec"]["deviceSelector"]["device"] = serde_json::Value::Null)),
        ("another taint key", Box::new(|o| o["spec"]["taint"]["key"] = "example.com/broken".into())),
        (
            "another node's annotation",
            Box::new(|o| o["metadata"]["annotations"]["neuronmonitor.io/node"] = node_b.clone().into()),
        ),
    ];
    for (what, edit) in cases {
        let answer = api_answer(as_agent.create(&post, &object(&ours, &node_a, edit)).await);
        assert_refused(what, answer, REFUSAL);
    }

    // B's rule, made by an administrator: the agent on A may not delete it.
    as_admin.create(&post, &object(&theirs, &node_b, |_| {})).await.expect("the administrator creates B's rule");
    assert_refused(
        "deleting node B's rule",
        api_answer(as_agent.delete(&theirs.name, &DeleteParams::default()).await),
        REFUSAL,
    );
    as_admin.delete(&theirs.name, &DeleteParams::default()).await.expect("the administrator deletes it");
}
