//! The node's ConfigMap as the operator writes it, for tests that run the agent without
//! an operator.

use api::{
    crd::NeuronMonitorConfig,
    node_config::{configmap_name, CONFIG_HASH_ANNOTATION, NODE_CONFIG_KEY},
    render::{render, RenderedNode},
    validate::validate,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};

/// Writes the node's ConfigMap in `namespace` as the operator renders it for one config of
/// the operator's namespace with this `health` section.
pub async fn write_node_config(client: &Client, namespace: &str, node: &str, health: serde_json::Value) {
    let spec = serde_json::json!({ "health": health });
    let mut config = NeuronMonitorConfig::new("fleet", serde_json::from_value(spec).expect("spec"));
    config.metadata.namespace = Some(namespace.to_owned());
    let valid = validate(&config, namespace).expect("a valid config");
    let rendered = RenderedNode::new(render(&[&valid])).expect("rendered");
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": { "name": configmap_name(node), "namespace": namespace,
                      "annotations": { CONFIG_HASH_ANNOTATION: rendered.hash } },
        "data": { NODE_CONFIG_KEY: rendered.json },
    });
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(&configmap_name(node), &PatchParams::apply("e2e").force(), &Patch::Apply(&cm))
        .await
        .expect("write the node ConfigMap");
}
