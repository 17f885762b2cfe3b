//! The test control plane is the real thing: schema and CEL validation, server-side
//! apply, watches, RBAC and garbage collection behave as in a cluster.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::{
    api::{
        core::v1::{ConfigMap, ServiceAccount},
        rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
    },
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    apimachinery::pkg::apis::meta::v1::OwnerReference,
};
use kube::{
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams},
    runtime::{watcher, WatchStreamExt},
    Api, ResourceExt,
};
use neuron_e2e::{random_u32, wait_for, ControlPlane};
use serde_json::json;

fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta { name: Some(name.to_owned()), ..Default::default() },
        data: Some(data.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        ..Default::default()
    }
}

fn api_error_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

#[tokio::test]
async fn a_structurally_invalid_crd_is_refused() {
    let client = ControlPlane::shared().client().await;
    let group = format!("g{:x}.example.com", random_u32());
    // No `type` on a property: not a structural schema.
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("widgets.{group}") },
        "spec": { "group": group, "scope": "Namespaced",
          "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
          "versions": [{ "name": "v1", "served": true, "storage": true,
            "schema": { "openAPIV3Schema": { "type": "object",
              "properties": { "spec": { "properties": { "size": { "type": "integer" } } } } } } }] }
    }))
    .unwrap();
    let err = Api::<CustomResourceDefinition>::all(client).create(&PostParams::default(), &crd).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(422), "{err}");
    assert!(err.to_string().contains("type"), "{err}");
}

#[tokio::test]
async fn a_cel_rule_rejects_a_bad_object() {
    let cp = ControlPlane::shared();
    let client = cp.client().await;
    let group = format!("g{:x}.example.com", random_u32());
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": { "name": format!("ranges.{group}") },
        "spec": { "group": group, "scope": "Namespaced",
          "names": { "plural": "ranges", "singular": "range", "kind": "Range" },
          "versions": [{ "name": "v1", "served": true, "storage": true,
            "schema": { "openAPIV3Schema": { "type": "object", "properties": { "spec": {
              "type": "object",
              "properties": { "min": { "type": "integer" }, "max": { "type": "integer" } },
              "x-kubernetes-validations": [{ "rule": "self.min <= self.max", "message": "min must not exceed max" }]
            } } } } }] }
    }))
    .unwrap();
    let crds = Api::<CustomResourceDefinition>::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let ns = cp.namespace("cel").await;
    let resource = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(&group, "v1", "Range"), "ranges");
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
    let object = |min: i64, max: i64| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": format!("{group}/v1"), "kind": "Range",
            "metadata": { "name": format!("r{min}{max}") }, "spec": { "min": min, "max": max }
        }))
        .unwrap()
    };
    // The CRD is served shortly after creation.
    let good =
        wait_for(Duration::from_secs(30), || async { api.create(&PostParams::default(), &object(1, 2)).await.ok() })
            .await;
    assert!(good.is_some(), "a valid object is accepted");
    let err = api.create(&PostParams::default(), &object(5, 1)).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(422));
    assert!(err.to_string().contains("min must not exceed max"), "{err}");
}

#[tokio::test]
async fn server_side_apply_conflicts_between_managers() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("ssa").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await, &ns);
    let apply = |value: &str| json!({ "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "shared" }, "data": { "key": value } });
    api.patch("shared", &PatchParams::apply("alice"), &Patch::Apply(apply("a"))).await.unwrap();
    let err = api.patch("shared", &PatchParams::apply("bob"), &Patch::Apply(apply("b"))).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(409), "bob may not take alice's field without force: {err}");
    assert!(err.to_string().contains("alice"), "the conflict names the owner: {err}");
    let taken = api.patch("shared", &PatchParams::apply("bob").force(), &Patch::Apply(apply("b"))).await.unwrap();
    assert_eq!(taken.data.unwrap()["key"], "b");
    let managers: Vec<String> = taken.metadata.managed_fields.unwrap().into_iter().filter_map(|m| m.manager).collect();
    assert_eq!(managers, vec!["bob".to_owned()], "ownership moved to bob");
}

#[tokio::test]
async fn a_watch_sees_an_update() {
    let cp = ControlPlane::shared();
    let ns = cp.namespace("watch").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await, &ns);
    api.create(&PostParams::default(), &configmap("watched", &[("v", "1")])).await.unwrap();
    let mut stream = Box::pin(watcher(api.clone(), watcher::Config::default()).applied_objects());
    let first = stream.next().await.unwrap().unwrap();
    assert_eq!(first.data.unwrap()["v"], "1");
    api.patch("watched", &PatchParams::default(), &Patch::Merge(json!({ "data": { "v": "2" } }))).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let cm = stream.next().await.unwrap().unwrap();
            if cm.data.as_ref().map(|d| d["v"].as_str()) == Some("2") {
                return cm;
            }
        }
    })
    .await
    .expect("the update arrives on the watch");
    assert_eq!(seen.name_any(), "watched");
}

#[tokio::test]
async fn rbac_denies_a_service_account_until_it_is_bound() {
    let cp = ControlPlane::shared();
    let admin = cp.client().await;
    let ns = cp.namespace("rbac").await;
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some("reader".into()), ..Default::default() },
        ..Default::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &sa).await.unwrap();
    let as_reader: Api<ConfigMap> = Api::namespaced(cp.service_account_client(&ns, "reader").await, &ns);
    let err = as_reader.list(&Default::default()).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(403), "{err}");

    let role = Role {
        metadata: ObjectMeta { name: Some("read-configmaps".into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns).create(&PostParams::default(), &role).await.unwrap();
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("reader".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "read-configmaps".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(ns.clone()),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &ns).create(&PostParams::default(), &binding).await.unwrap();
    let listed = wait_for(Duration::from_secs(10), || async { as_reader.list(&Default::default()).await.ok() }).await;
    assert!(listed.is_some(), "the bound ServiceAccount may list");
    // The binding grants exactly `list`: writing is still denied.
    let err = as_reader.create(&PostParams::default(), &configmap("nope", &[])).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(403), "{err}");
}

#[tokio::test]
async fn an_object_whose_owner_is_deleted_is_garbage_collected() {
    let cp = ControlPlane::shared();
    assert!(cp.controllers, "the control plane runs the garbage collector");
    let ns = cp.namespace("gc").await;
    let api: Api<ConfigMap> = Api::namespaced(cp.client().await, &ns);
    let owner = api.create(&PostParams::default(), &configmap("owner", &[])).await.unwrap();
    let mut dependent = configmap("dependent", &[]);
    dependent.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.uid().unwrap(),
        ..Default::default()
    }]);
    api.create(&PostParams::default(), &dependent).await.unwrap();
    api.delete("owner", &DeleteParams::default()).await.unwrap();
    let collected = wait_for(Duration::from_secs(60), || async {
        matches!(api.get_opt("dependent").await, Ok(None)).then_some(())
    })
    .await;
    assert!(collected.is_some(), "the dependent of a deleted owner is collected");
}
