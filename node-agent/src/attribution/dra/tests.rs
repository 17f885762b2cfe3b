use prost::Message;
use serde_json::json;

use super::{nvidia::GpuDevice, slices::ResourceSlice, *};
use crate::attribution::podresources::{
    proto::{ClaimResource, ContainerResources, DynamicResource, ListPodResourcesResponse, PodResources},
    DeviceOwnership,
};

const POOL: &str = "ip-10-0-0-1.us-west-2.compute.internal";

fn device(driver: &str, pool: &str, name: &str) -> ClaimResource {
    ClaimResource { driver_name: driver.into(), pool_name: pool.into(), device_name: name.into() }
}

fn claim(namespace: &str, name: &str, devices: Vec<ClaimResource>) -> DynamicResource {
    DynamicResource { claim_name: name.into(), claim_namespace: namespace.into(), claim_resources: devices }
}

fn pod(namespace: &str, name: &str, containers: Vec<(&str, Vec<DynamicResource>)>) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: containers
            .into_iter()
            .map(|(c, claims)| ContainerResources { name: c.into(), devices: vec![], dynamic_resources: claims })
            .collect(),
    }
}

/// A slice of the Neuron driver publishing `devices` as (name, deviceId).
fn slice(pool: &str, generation: i64, devices: &[(&str, Option<i64>)]) -> Slice<u32> {
    let devices = devices.iter().map(|(name, id)| {
        let attributes = id.map(|i| (NEURON_DRA_DEVICE_ID, Some(i), None));
        (name.to_string(), device_index(attributes))
    });
    Slice { pool: pool.into(), generation, devices: devices.collect() }
}

fn table() -> DeviceTable<u32> {
    let s = slice(POOL, 1, &[("neurondevice0", Some(0)), ("neurondevice1", Some(1)), ("odd", None)]);
    DeviceTable::from_slices([&s])
}

/// (pod, container, claim name, device index) of each allocation.
fn summary(allocations: &[Allocation]) -> Vec<(String, String, String, u32)> {
    let claim_name = |a: &Allocation| a.claim.as_ref().map(|c| c.name.clone()).unwrap_or_default();
    allocations.iter().map(|a| (a.pod.clone(), a.container.clone(), claim_name(a), a.id)).collect()
}

#[test]
fn claims_of_other_drivers_are_not_read_and_several_claims_per_container_are() {
    let response = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "ml",
            "train",
            vec![(
                "main",
                vec![
                    claim("ml", "neurons", vec![device(NEURON_DRA_DRIVER, POOL, "neurondevice1")]),
                    claim(
                        "ml",
                        "more",
                        vec![
                            device("efa.networking.k8s.aws", POOL, "efa0"),
                            device("gpu.nvidia.com", POOL, "gpu-0"),
                            device(NEURON_DRA_DRIVER, POOL, "neurondevice0"),
                        ],
                    ),
                ],
            )],
        )],
    };
    // Through the wire format, as the kubelet sends it.
    let decoded = ListPodResourcesResponse::decode(&*response.encode_to_vec()).unwrap();
    let claimed = claimed_devices(&decoded, NEURON_DRA_DRIVER);
    let names: Vec<(&str, &str)> = claimed.iter().map(|c| (c.claim.name.as_str(), c.device.as_str())).collect();
    assert_eq!(names, vec![("neurons", "neurondevice1"), ("more", "neurondevice0")]);
    assert!(claimed.iter().all(|c| c.container == "main" && c.claim.namespace == "ml" && !c.malformed));
    let (allocations, unresolvable) = resolve(&claimed, &table());
    assert!(unresolvable.is_empty(), "{unresolvable:?}");
    assert_eq!(
        summary(&allocations),
        vec![("train".into(), "main".into(), "neurons".into(), 1), ("train".into(), "main".into(), "more".into(), 0)]
    );
    // A device allocation covers all cores of its device under the node's LNC.
    assert!(allocations.iter().all(|a| a.unit == Unit::Device));
    assert_eq!(allocations[0].cores(Some(4)), 4..8);
}

#[test]
fn unresolvable_devices_say_why_and_the_others_resolve() {
    let long = "x".repeat(300);
    let response = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "ml",
            "train",
            vec![(
                "main",
                vec![claim(
                    "ml",
                    "neurons",
                    vec![
                        device(NEURON_DRA_DRIVER, POOL, "neurondevice9"),
                        device(NEURON_DRA_DRIVER, "another-node", "neurondevice0"),
                        device(NEURON_DRA_DRIVER, POOL, "odd"),
                        device(NEURON_DRA_DRIVER, POOL, &long),
                        device(NEURON_DRA_DRIVER, POOL, ""),
                        device(NEURON_DRA_DRIVER, POOL, "neurondevice1"),
                    ],
                )],
            )],
        )],
    };
    let claimed = claimed_devices(&response, NEURON_DRA_DRIVER);
    let (allocations, unresolvable) = resolve(&claimed, &table());
    assert_eq!(summary(&allocations), vec![("train".into(), "main".into(), "neurons".into(), 1)]);
    let reasons: Vec<Unresolved> = unresolvable.iter().map(|u| u.reason).collect();
    assert_eq!(
        reasons,
        vec![
            Unresolved::UnknownDevice,
            Unresolved::UnknownDevice,
            Unresolved::NoDeviceId,
            Unresolved::Malformed,
            Unresolved::Malformed
        ]
    );
}

#[test]
fn a_claim_shared_by_two_pods_credits_both() {
    let shared = || claim("ml", "shared", vec![device(NEURON_DRA_DRIVER, POOL, "neurondevice0")]);
    let response = ListPodResourcesResponse {
        pod_resources: vec![pod("ml", "a", vec![("c", vec![shared()])]), pod("ml", "b", vec![("c", vec![shared()])])],
    };
    let (allocations, _) = resolve(&claimed_devices(&response, NEURON_DRA_DRIVER), &table());
    assert_eq!(
        summary(&allocations),
        vec![("a".into(), "c".into(), "shared".into(), 0), ("b".into(), "c".into(), "shared".into(), 0)]
    );
}

#[test]
fn the_index_is_the_drivers_device_id_on_a_device() {
    let index = |attributes: &[(&str, Option<i64>, Option<&str>)]| device_index(attributes.iter().copied());
    assert_eq!(index(&[("deviceId", Some(3), None)]), Some(3));
    assert_eq!(
        index(&[("neuron.aws.com/deviceId", Some(5), None), ("resourceType", None, Some("neuron_device"))]),
        Some(5)
    );
    // Another domain's attribute of the same name is not the driver's.
    assert_eq!(index(&[("example.com/deviceId", Some(3), None)]), None);
    // Not an integer, out of range, or an UltraServer node entry.
    assert_eq!(index(&[("deviceId", None, Some("3"))]), None);
    assert_eq!(index(&[("deviceId", Some(-1), None)]), None);
    assert_eq!(index(&[("deviceId", Some(i64::from(MAX_NEURON_DEVICES)), None)]), None);
    assert_eq!(index(&[("deviceId", Some(0), None), ("resourceType", None, Some("neuron_node"))]), None);
}

#[test]
fn resource_slices_resolve_by_pool_and_name_in_the_newest_generation() {
    // As the API server serves a slice (resource.k8s.io/v1).
    let api_slice = |name: &str, driver: &str, generation: i64, devices: serde_json::Value| -> ResourceSlice {
        serde_json::from_value(json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": "n1",
                     "pool": {"name": POOL, "generation": generation, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap()
    };
    let dev = |name: &str, id: i64| {
        json!({"name": name, "attributes": {
            "deviceId": {"int": id}, "instanceType": {"string": "trn2.48xlarge"},
            "resourceType": {"string": "neuron_device"}, "draDriverVersion": {"version": "1.2.0"}}})
    };
    let old = api_slice("s-old", NEURON_DRA_DRIVER, 1, json!([dev("neurondevice0", 7)]));
    let new = api_slice("s-new", NEURON_DRA_DRIVER, 2, json!([dev("neurondevice0", 0), dev("neurondevice1", 1)]));
    let fpga = api_slice("s-fpga", "fpga.example.com", 3, json!([{"name": "fpga-0"}]));
    assert!(slices::summary(&fpga).is_none(), "a driver not read");
    let neuron = |s: &ResourceSlice| match slices::summary(s) {
        Some(slices::Summary::Neuron(s)) => Some(s),
        _ => None,
    };
    let summaries: Vec<Slice<u32>> = [&old, &new].iter().filter_map(|s| neuron(s)).collect();
    let table = DeviceTable::from_slices(&summaries);
    assert_eq!(table.len(), 2);
    assert_eq!(table.device(POOL, "neurondevice0"), Ok(&0), "the older generation is ignored");
    assert_eq!(table.device(POOL, "neurondevice1"), Ok(&1));
    assert_eq!(table.device(POOL, "neurondevice2"), Err(Unresolved::UnknownDevice));
    assert_eq!(table.device("other", "neurondevice0"), Err(Unresolved::UnknownDevice));
    // NVIDIA's driver: a whole GPU and a MIG device, by their attributes.
    let gpus = api_slice(
        "s-gpu",
        "gpu.nvidia.com",
        1,
        json!([
            {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0a"},
                                             "driverVersion": {"version": "580.1.2"}}},
            {"name": "gpu-1-mig-9-4-1", "attributes": {"type": {"string": "mig"}, "uuid": {"string": "MIG-1b"},
                                                       "parentUUID": {"string": "GPU-1a"}}},
            {"name": "gpu-vfio-0", "attributes": {"type": {"string": "vfio"}, "uuid": {"string": "GPU-2a"}}}
        ]),
    );
    let Some(slices::Summary::Nvidia(gpus)) = slices::summary(&gpus) else { panic!("NVIDIA's slice is read") };
    let table = DeviceTable::from_slices([&gpus]);
    assert_eq!(table.device(POOL, "gpu-0"), Ok(&GpuDevice::Uuid("GPU-0a".into())));
    assert_eq!(table.device(POOL, "gpu-1-mig-9-4-1"), Ok(&GpuDevice::Uuid("GPU-1a".into())));
    assert_eq!(table.device(POOL, "gpu-vfio-0"), Err(Unresolved::NoDeviceId));
}

#[test]
fn both_kinds_of_allocation_feed_one_ownership_and_unresolvable_ones_are_told_once() {
    let plugin = vec![Allocation {
        namespace: "legacy".into(),
        pod: "old".into(),
        container: "c".into(),
        unit: Unit::Device,
        id: 5,
        claim: None,
    }];
    let response = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "ml",
            "train",
            vec![(
                "main",
                vec![claim(
                    "ml",
                    "neurons",
                    vec![device(NEURON_DRA_DRIVER, POOL, "neurondevice1"), device(NEURON_DRA_DRIVER, POOL, "gone")],
                )],
            )],
        )],
    };
    let mut ownership = DeviceOwnership::default();
    // Before the slices are listed: the device plugin's only, and nothing said.
    let fresh = ownership.set_kubelet(plugin.clone(), claimed_devices(&response, NEURON_DRA_DRIVER));
    assert!(fresh.is_empty());
    assert_eq!(summary(ownership.allocations()), vec![("old".into(), "c".into(), String::new(), 5)]);
    let generation = ownership.generation();
    let fresh = ownership.set_dra_devices(table());
    assert!(ownership.generation() > generation);
    assert_eq!(
        fresh.iter().map(|u| (u.device.as_str(), u.reason)).collect::<Vec<_>>(),
        vec![("gone", Unresolved::UnknownDevice)]
    );
    assert_eq!(
        summary(ownership.allocations()),
        vec![("train".into(), "main".into(), "neurons".into(), 1), ("old".into(), "c".into(), String::new(), 5)]
    );
    // The same answer again: nothing new to tell; the device published later resolves.
    assert!(ownership.set_kubelet(plugin.clone(), claimed_devices(&response, NEURON_DRA_DRIVER)).is_empty());
    let later = slice(POOL, 1, &[("neurondevice1", Some(1)), ("gone", Some(2))]);
    assert!(ownership.set_dra_devices(DeviceTable::from_slices([&later])).is_empty());
    assert_eq!(ownership.allocations().len(), 3);
    // Unpublished again: told again.
    assert_eq!(ownership.set_dra_devices(table()).len(), 1);
}

#[test]
fn a_claim_holder_names_the_claim_after_the_pod_labels() {
    let owner = PodRef {
        namespace: "ml".into(),
        pod: "train".into(),
        owner: "train".into(),
        container: "main".into(),
        labels: vec![("label_app".into(), "train".into())],
    };
    let holder = claim_holder(&owner, &Claim { namespace: "ml".into(), name: "neurons".into() });
    assert_eq!(
        holder.labels,
        vec![
            ("label_app".to_owned(), "train".to_owned()),
            (CLAIM_NAMESPACE_LABEL.to_owned(), "ml".to_owned()),
            (CLAIM_NAME_LABEL.to_owned(), "neurons".to_owned())
        ]
    );
    assert_eq!((holder.namespace.as_str(), holder.container.as_str()), ("ml", "main"));
}

#[test]
fn a_device_index_is_named_back_by_its_pool_and_name() {
    let t = table();
    assert_eq!(t.name_of(&1), Some((POOL, "neurondevice1")));
    let twice = slice("other", 1, &[("zz", Some(1)), ("b", Some(1))]);
    let s = slice(POOL, 1, &[("neurondevice1", Some(1))]);
    assert_eq!(
        DeviceTable::from_slices([&s, &twice]).name_of(&1),
        Some(("ip-10-0-0-1.us-west-2.compute.internal", "neurondevice1")),
        "the first in name order"
    );
    assert_eq!(t.name_of(&63), None, "listed by no slice");
    let mut ownership = DeviceOwnership::default();
    assert_eq!(ownership.dra_name(1), None, "before the slices are listed");
    ownership.set_dra_devices(t);
    assert_eq!(ownership.dra_name(1), Some((POOL.to_owned(), "neurondevice1".to_owned())));
}
