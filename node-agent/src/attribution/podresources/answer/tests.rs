use prost::Message;

use super::*;
use crate::attribution::podresources::{
    proto::{
        AllocatableResourcesResponse, ClaimResource, ContainerDevices, ContainerResources, DynamicResource,
        ListPodResourcesResponse, PodResources,
    },
    NEURON, NEURONCORE, NEURONDEVICE,
};

const MAX: usize = MAX_POD_RESOURCES_DEVICES_PER_KIND;

fn devices(resource: &str, ids: impl IntoIterator<Item = String>) -> ContainerDevices {
    ContainerDevices { resource_name: resource.to_owned(), device_ids: ids.into_iter().collect() }
}

fn numbered(n: usize) -> impl Iterator<Item = String> {
    (0..n).map(|i| i.to_string())
}

fn claimed(driver: &str, names: impl IntoIterator<Item = String>) -> DynamicResource {
    let device = |name| ClaimResource { driver_name: driver.to_owned(), pool_name: "pool".into(), device_name: name };
    DynamicResource {
        claim_name: "claim".into(),
        claim_namespace: "ns".into(),
        claim_resources: names.into_iter().map(device).collect(),
    }
}

fn container(name: &str, devices: Vec<ContainerDevices>, claims: Vec<DynamicResource>) -> ContainerResources {
    ContainerResources { name: name.into(), devices, dynamic_resources: claims }
}

fn pod(name: &str, containers: Vec<ContainerResources>) -> PodResources {
    PodResources { name: name.into(), namespace: "ns".into(), containers }
}

fn read(answer: &ListPodResourcesResponse) -> Bounded<ListPodResourcesResponse> {
    decode(Bytes::from(answer.encode_to_vec())).unwrap()
}

#[test]
fn what_is_read_comes_through_as_prost_decodes_it() {
    let answer = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "train",
            vec![container(
                "main",
                vec![
                    devices(NEURONDEVICE, numbered(2)),
                    devices(EFA, ["rdmap16s27".to_owned()]),
                    devices("nvidia.com/mig-1g.10gb", ["MIG-abc".to_owned()]),
                ],
                vec![claimed(NEURON_DRA_DRIVER, ["neurondevice1".to_owned()])],
            )],
        )],
    };
    let read = read(&answer);
    assert_eq!(read.answer, answer);
    assert_eq!(read.cuts, Cuts::default());
}

#[test]
fn what_no_reader_wants_is_left_out_and_so_are_the_entries_left_empty() {
    let answer = ListPodResourcesResponse {
        pod_resources: vec![
            // Only other resources and drivers: the pod goes whole.
            pod(
                "cpu-only",
                vec![container(
                    "c",
                    vec![devices("example.com/fpga", numbered(3))],
                    vec![claimed("fpga.example.com", ["f0".to_owned()])],
                )],
            ),
            pod(
                "mixed",
                vec![
                    container("sidecar", vec![], vec![]),
                    container(
                        "main",
                        vec![devices("example.com/fpga", numbered(3)), devices(NEURONCORE, numbered(1))],
                        vec![claimed(NEURON_DRA_DRIVER, ["neurondevice0".to_owned()]), claimed("other", numbered(2))],
                    ),
                ],
            ),
        ],
    };
    let read = read(&answer);
    let want = ListPodResourcesResponse {
        pod_resources: vec![pod(
            "mixed",
            vec![container(
                "main",
                vec![devices(NEURONCORE, numbered(1))],
                vec![claimed(NEURON_DRA_DRIVER, ["neurondevice0".to_owned()])],
            )],
        )],
    };
    assert_eq!(read.answer, want);
    assert_eq!(read.cuts, Cuts::default(), "left out is not cut");
}

#[test]
fn each_kind_keeps_its_own_bound_and_the_rest_is_counted() {
    let flood = container(
        "flood",
        vec![
            devices(NEURONCORE, numbered(MAX + 100)),
            devices(NEURON, numbered(50)),
            devices(EFA, numbered(MAX + 1)),
            devices("nvidia.com/gpu", numbered(3)),
        ],
        vec![claimed(NVIDIA_DRA_DRIVER, numbered(MAX + 7)), claimed(EFA_DRA_DRIVER, numbered(2))],
    );
    let read = read(&ListPodResourcesResponse { pod_resources: vec![pod("p", vec![flood])] });
    let kept = &read.answer.pod_resources[0].containers[0];
    let ids: Vec<(&str, usize)> = kept.devices.iter().map(|d| (d.resource_name.as_str(), d.device_ids.len())).collect();
    // The Neuron resources share one bound; `neuron` had no room left.
    assert_eq!(ids, vec![(NEURONCORE, MAX), (EFA, MAX), ("nvidia.com/gpu", 3)]);
    let claims: Vec<usize> = kept.dynamic_resources.iter().map(|c| c.claim_resources.len()).collect();
    assert_eq!(claims, vec![MAX, 2]);
    assert_eq!(read.cuts.get(List::DeviceIds), 100 + 50 + 1);
    assert_eq!(read.cuts.get(List::ClaimedDevices), 7);
}

#[test]
fn allocatable_answers_have_the_same_bounds() {
    let answer = AllocatableResourcesResponse {
        devices: vec![devices(NEURONCORE, numbered(MAX + 3)), devices("example.com/fpga", numbered(2))],
    };
    let read: Bounded<AllocatableResourcesResponse> = decode(Bytes::from(answer.encode_to_vec())).unwrap();
    assert_eq!(read.answer.devices.len(), 1);
    assert_eq!(read.answer.devices[0].device_ids.len(), MAX);
    assert_eq!(read.cuts.get(List::DeviceIds), 3);
}

#[test]
fn long_strings_stay_too_long_for_every_check_and_are_counted() {
    let long = "é".repeat(MAX_POD_RESOURCES_STRING_BYTES);
    let answer = ListPodResourcesResponse {
        pod_resources: vec![pod(&long, vec![container("c", vec![devices(NEURONCORE, [long.clone()])], vec![])])],
    };
    let read = read(&answer);
    let pod = &read.answer.pod_resources[0];
    for cut in [&pod.name, &pod.containers[0].devices[0].device_ids[0]] {
        assert!(cut.len() > MAX_POD_RESOURCES_STRING_BYTES && cut.len() <= MAX_POD_RESOURCES_STRING_BYTES + 3, "{cut}");
        assert!(long.starts_with(cut.trim_end_matches('\u{FFFD}')));
    }
    assert_eq!(read.cuts.get(List::Strings), 2);
}

#[test]
fn fields_in_any_order_and_fields_of_newer_kubelets_are_read_or_skipped() {
    // ContainerDevices: an id (2), a topology (3), then the resource name (1).
    let mut entry = Vec::new();
    prost::encoding::string::encode(2, &"7".to_owned(), &mut entry);
    prost::encoding::bytes::encode(3, &vec![0x0a, 0x02, 0x08, 0x01], &mut entry);
    prost::encoding::string::encode(1, &NEURONCORE.to_owned(), &mut entry);
    // ContainerResources: cpu ids (3, packed), the entry (2), memory (4), its name (1).
    let mut container = Vec::new();
    prost::encoding::bytes::encode(3, &vec![0x01, 0x02], &mut container);
    prost::encoding::bytes::encode(2, &entry, &mut container);
    prost::encoding::bytes::encode(4, &vec![0x0a, 0x00], &mut container);
    prost::encoding::string::encode(1, &"c".to_owned(), &mut container);
    let mut pod = Vec::new();
    prost::encoding::bytes::encode(3, &container, &mut pod);
    prost::encoding::string::encode(1, &"p".to_owned(), &mut pod);
    let mut answer = Vec::new();
    prost::encoding::bytes::encode(1, &pod, &mut answer);
    let read: Bounded<ListPodResourcesResponse> = decode(Bytes::from(answer)).unwrap();
    let want = vec![PodResources {
        name: "p".into(),
        namespace: String::new(),
        containers: vec![container_of("c", devices(NEURONCORE, ["7".to_owned()]))],
    }];
    assert_eq!(read.answer.pod_resources, want);
}

fn container_of(name: &str, entry: ContainerDevices) -> ContainerResources {
    container(name, vec![entry], vec![])
}

#[test]
fn a_broken_message_is_refused_whole() {
    let answer = ListPodResourcesResponse {
        pod_resources: vec![pod("p", vec![container("c", vec![devices(NEURONCORE, numbered(3))], vec![])])],
    };
    let bytes = answer.encode_to_vec();
    let truncated = Bytes::copy_from_slice(&bytes[..bytes.len() - 2]);
    assert!(decode::<ListPodResourcesResponse>(truncated).is_err());
    let mut not_utf8 = Vec::new();
    prost::encoding::bytes::encode(1, &vec![0xff, 0xfe], &mut not_utf8);
    let mut answer = Vec::new();
    prost::encoding::bytes::encode(1, &not_utf8, &mut answer);
    assert!(matches!(decode::<ListPodResourcesResponse>(Bytes::from(answer)), Err(AnswerError::NotUtf8)));
}
