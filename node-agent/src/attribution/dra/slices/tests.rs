use serde_json::json;

use super::*;

const NODE: &str = "ip-10-0-0-1.us-west-2.compute.internal";
const UUID: &str = "GPU-0a1b2c3d-0000-1111-2222-333344445555";

/// A slice of NVIDIA's driver named `name`, of `pool` at `generation`, publishing `devices`.
fn slice(name: &str, pool: &str, generation: i64, devices: &[&str]) -> ResourceSlice {
    let devices: Vec<_> = devices
        .iter()
        .map(|d| json!({"name": d, "attributes": {"type": {"string": "gpu"}, "uuid": {"string": UUID}}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"driver": Nvidia::NAME, "nodeName": NODE,
                 "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap()
}

/// The claims of `gpu-0` of the node's pool.
fn claim_of(pool: &str, device: &str) -> ClaimedNames {
    let devices = BTreeSet::from([device.to_owned()]);
    ClaimedNames::from([(Nvidia::NAME.to_owned(), BTreeMap::from([(pool.to_owned(), devices)]))])
}

/// The names of the kept slices.
fn names(kept: &Kept) -> Vec<&str> {
    kept.names.keys().map(String::as_str).collect()
}

fn nvidia_table(kept: &Kept) -> DeviceTable<GpuDevice> {
    DeviceTable::from_slices(kept.summaries().filter_map(|s| if let Summary::Nvidia(s) = s { Some(s) } else { None }))
}

#[test]
fn decoys_of_other_pools_fill_the_driver_but_give_way_to_the_claimed_pool() {
    let claimed = claim_of(NODE, "gpu-0");
    let mut kept = Kept::default();
    let mut left_out = 0;
    for n in 0..MAX_SLICES_PER_DRIVER + 10 {
        left_out += kept.apply(&slice(&format!("decoy-{n:02}"), &format!("pool-{n:02}"), 1, &["gpu-0"]), &claimed);
    }
    assert_eq!(kept.names.len(), MAX_SLICES_PER_DRIVER);
    assert_eq!(left_out, 10);
    // Listed last, the real slice pushes out a decoy.
    assert_eq!(kept.apply(&slice("real", NODE, 1, &["gpu-0", "gpu-1"]), &claimed), 1);
    assert!(names(&kept).contains(&"real") && kept.names.len() == MAX_SLICES_PER_DRIVER);
    assert_eq!(nvidia_table(&kept).device(NODE, "gpu-0"), Ok(&GpuDevice::Uuid(UUID.into())));
    // Without claims, a late slice finds no room.
    let mut unclaimed = Kept::default();
    for n in 0..MAX_SLICES_PER_DRIVER {
        unclaimed.apply(&slice(&format!("decoy-{n:02}"), &format!("pool-{n:02}"), 1, &["gpu-0"]), &ClaimedNames::new());
    }
    assert_eq!(unclaimed.apply(&slice("real", NODE, 1, &["gpu-0"]), &ClaimedNames::new()), 1);
    assert!(!names(&unclaimed).contains(&"real"));
}

#[test]
fn in_a_full_pool_the_slice_of_a_claimed_device_pushes_out_one_of_none() {
    let claimed = claim_of(NODE, "gpu-0");
    let mut kept = Kept::default();
    for n in 0..MAX_SLICES_PER_POOL {
        assert_eq!(kept.apply(&slice(&format!("decoy-{n}"), NODE, 1, &[&format!("decoy-{n}")]), &claimed), 0);
    }
    // Of the claimed pool, but publishing no claimed device: no room.
    assert_eq!(kept.apply(&slice("another", NODE, 1, &["other"]), &claimed), 1);
    assert_eq!(kept.apply(&slice("real", NODE, 1, &["gpu-0"]), &claimed), 1);
    assert_eq!(kept.names.len(), MAX_SLICES_PER_POOL);
    assert!(names(&kept).contains(&"real") && !names(&kept).contains(&"another"));
}

#[test]
fn only_the_newest_generation_of_a_pool_is_kept() {
    let claimed = ClaimedNames::new();
    let mut kept = Kept::default();
    kept.apply(&slice("old", NODE, 1, &["gpu-0"]), &claimed);
    kept.apply(&slice("new", NODE, 2, &["gpu-1"]), &claimed);
    assert_eq!(names(&kept), vec!["new"], "the older generation is forgotten");
    assert_eq!(kept.apply(&slice("stale", NODE, 1, &["gpu-2"]), &claimed), 0, "stale: not counted as cut");
    assert_eq!(names(&kept), vec!["new"]);
    // A slice that moves to another pool, then goes.
    kept.apply(&slice("new", "elsewhere", 1, &["gpu-1"]), &claimed);
    assert_eq!(kept.pools.keys().map(|(_, p)| p.as_str()).collect::<Vec<_>>(), vec!["elsewhere"]);
    kept.remove("new");
    assert!(kept.pools.is_empty() && kept.names.is_empty());
}

#[test]
fn drivers_have_a_bound_each() {
    let neuron = |name: &str| -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"driver": Neuron::NAME, "nodeName": NODE, "pool": {"name": NODE, "generation": 1},
                     "devices": [{"name": "neurondevice0", "attributes": {"deviceId": {"int": 0}}}]}
        }))
        .unwrap()
    };
    let mut kept = Kept::default();
    for n in 0..MAX_SLICES_PER_DRIVER {
        kept.apply(&slice(&format!("gpu-{n:02}"), &format!("pool-{n:02}"), 1, &["gpu-0"]), &ClaimedNames::new());
    }
    assert_eq!(kept.apply(&neuron("neuron"), &ClaimedNames::new()), 0, "NVIDIA's slices leave Neuron's room");
}

#[test]
fn a_claim_of_a_device_left_out_calls_for_a_listing_again() {
    let mut kept = Kept::default();
    kept.apply(&slice("real", NODE, 1, &["gpu-0"]), &ClaimedNames::new());
    assert!(!kept.misses(&claim_of(NODE, "gpu-9")), "nothing was left out: gpu-9 is published nowhere");
    for n in 0..MAX_SLICES_PER_DRIVER {
        kept.apply(&slice(&format!("decoy-{n:02}"), &format!("pool-{n:02}"), 1, &["gpu-0"]), &ClaimedNames::new());
    }
    assert!(kept.left_out);
    assert!(!kept.misses(&claim_of(NODE, "gpu-0")), "kept");
    assert!(kept.misses(&claim_of("pool-40", "gpu-0")), "its slice may have been left out");
}

#[test]
fn the_devices_claims_name_are_read_from_the_answer_of_the_read_drivers() {
    use crate::attribution::podresources::proto::{ClaimResource, ContainerResources, DynamicResource, PodResources};
    let device = |driver: &str, pool: &str, name: &str| ClaimResource {
        driver_name: driver.into(),
        pool_name: pool.into(),
        device_name: name.into(),
    };
    let claim = DynamicResource {
        claim_name: "c".into(),
        claim_namespace: "ns".into(),
        claim_resources: vec![
            device(Nvidia::NAME, NODE, "gpu-0"),
            device(Nvidia::NAME, NODE, "gpu-1"),
            device(Neuron::NAME, "p", "neurondevice0"),
            device("fpga.example.com", "p", "f0"),
        ],
    };
    let container = ContainerResources { name: "c".into(), devices: vec![], dynamic_resources: vec![claim] };
    let pod = PodResources { name: "p".into(), namespace: "ns".into(), containers: vec![container] };
    let names = claimed_names(&ListPodResourcesResponse { pod_resources: vec![pod] });
    assert_eq!(names.keys().collect::<Vec<_>>(), vec![Nvidia::NAME, Neuron::NAME], "in name order");
    assert_eq!(names[Nvidia::NAME][NODE].len(), 2);
}
