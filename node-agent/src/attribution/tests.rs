use std::sync::RwLock;

use api::report::Report;
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

use crate::testdata::TempDir;

use super::{
    podresources::{Allocation, DeviceOwnership, Unit},
    pods::{PodIndex, PodLabelKeys},
    *,
};

/// A fake `/proc` with a cgroup file per PID, removed on drop.
struct FakeProc(TempDir);

impl FakeProc {
    fn new() -> Self {
        FakeProc(TempDir::new("attr-proc"))
    }

    fn process(&self, pid: u32, cgroup: &str) {
        self.0.write(format!("{pid}/cgroup"), cgroup);
    }
}

fn uid(n: u8) -> String {
    format!("{n:08x}-0000-4000-8000-000000000000")
}

fn cid(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

fn in_container(pod: u8, container: u8) -> String {
    let uid = uid(pod).replace('-', "_");
    format!(
        "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{}.scope\n",
        cid(container)
    )
}

fn pod(n: u8, ns: &str, name: &str, phase: &str, containers: &[(&str, u8)]) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"uid": uid(n), "namespace": ns, "name": name, "labels": {"app": name}},
        "spec": {"containers": containers.iter().map(|(c, _)| json!({"name": c})).collect::<Vec<_>>()},
        "status": {"phase": phase, "containerStatuses": containers.iter().map(|(c, id)| json!({
            "name": c, "containerID": format!("containerd://{}", cid(*id)), "image": "", "imageID": "",
            "ready": true, "restartCount": 0})).collect::<Vec<_>>()}
    }))
    .unwrap()
}

fn core(ns: &str, pod: &str, container: &str, unit: Unit, id: u32) -> Allocation {
    Allocation { namespace: ns.into(), pod: pod.into(), container: container.into(), unit, id, claim: None }
}

/// A report of a host with 2 devices × 2 cores; runtimes as (tag, pid, cores).
fn report(runtimes: &[(&str, u32, &[u32])]) -> String {
    let entries: Vec<String> = runtimes
        .iter()
        .map(|(tag, pid, cores)| {
            let counters: Vec<String> =
                cores.iter().map(|c| format!(r#""{c}":{{"neuroncore_utilization":50}}"#)).collect();
            format!(
                r#"{{"pid":{pid},"neuron_runtime_tag":"{tag}","error":"","report":{{
                    "neuroncore_counters":{{"period":1,"error":"","neuroncores_in_use":{{{}}}}}}}}}"#,
                counters.join(",")
            )
        })
        .collect();
    format!(
        r#"{{"neuron_runtime_data":[{}],"system_data":{{}},"instance_info":{{"error":""}},
            "neuron_hardware_info":{{"neuron_device_count":2,"neuroncore_per_device_count":2,"error":""}}}}"#,
        entries.join(",")
    )
}

struct Fixture {
    proc: FakeProc,
    pods: SharedPods,
    devices: SharedDevices,
    ecs: SharedEcs,
    metrics: AttributionMetrics,
    attribution: Attribution,
    state: NodeState,
}

impl Fixture {
    fn new() -> Self {
        let proc = FakeProc::new();
        let pods: SharedPods = Arc::new(RwLock::new(PodIndex::new(PodLabelKeys::new(&["app"]))));
        let devices: SharedDevices = Arc::new(RwLock::new(DeviceOwnership::default()));
        let ecs: SharedEcs = Arc::default();
        let metrics = AttributionMetrics::default();
        let attribution =
            Attribution::new(proc.0.path().to_owned(), pods.clone(), devices.clone(), ecs.clone(), metrics.clone());
        Fixture { proc, pods, devices, ecs, metrics, attribution, state: NodeState::default() }
    }

    fn pods(&self, pods: &[Pod]) {
        self.pods.write().unwrap().replace(pods);
    }

    fn devices(&self, allocations: Vec<Allocation>) {
        self.devices.write().unwrap().set(allocations);
    }

    fn report(&mut self, runtimes: &[(&str, u32, &[u32])]) {
        self.state.apply(&Report::parse(&report(runtimes)).unwrap());
        self.attribution.attribute(&mut self.state);
    }

    /// (namespace, pod, container) of a runtime.
    fn runtime(&self, tag: &str) -> Option<(String, String, String)> {
        let rt = self.state.runtimes.iter().find(|r| r.labels.runtime_tag == tag).unwrap();
        rt.labels.pod.as_ref().map(|p| (p.namespace.clone(), p.pod.clone(), p.container.clone()))
    }

    /// (task family, container) of a runtime.
    fn ecs_task(&self, tag: &str) -> Option<(String, String)> {
        let rt = self.state.runtimes.iter().find(|r| r.labels.runtime_tag == tag).unwrap();
        rt.labels.ecs.as_ref().map(|e| (e.family.clone(), e.container.clone()))
    }

    fn idle(&self) -> Vec<(u32, Option<String>)> {
        self.state.idle_cores.iter().map(|c| (c.index, c.pod.as_ref().map(|p| p.pod.clone()))).collect()
    }

    fn unattributed(&self, reason: Unattributed) -> i64 {
        self.metrics.unattributed.get_or_create(&ReasonLabel { reason: reason.as_str() }).get()
    }

    fn attributed(&self, source: &'static str) -> i64 {
        self.metrics.attributed.get_or_create(&SourceLabel { source }).get()
    }
}

fn names(ns: &str, pod: &str, container: &str) -> Option<(String, String, String)> {
    Some((ns.into(), pod.into(), container.into()))
}

#[test]
fn runtimes_take_their_process_pod_and_idle_cores_the_device_owner() {
    let mut f = Fixture::new();
    f.proc.process(101, &in_container(1, 11));
    f.proc.process(102, &in_container(2, 21));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)]), pod(2, "b", "serve", "Running", &[("srv", 21)])]);
    // Device 0 (cores 0, 1) to train; cores 2 and 3 to serve.
    f.devices(vec![
        core("a", "train", "main", Unit::Device, 0),
        core("b", "serve", "srv", Unit::Core, 2),
        core("b", "serve", "srv", Unit::Core, 3),
    ]);
    f.report(&[("t", 101, &[0, 1]), ("s", 102, &[2])]);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!(f.runtime("s"), names("b", "serve", "srv"));
    let rt = &f.state.runtimes[1];
    assert_eq!(rt.labels.pod.as_ref().unwrap().labels, vec![("label_app".to_owned(), "train".to_owned())]);
    // Core 3 is idle but held by serve.
    assert_eq!(f.idle(), vec![(3, Some("serve".to_owned()))]);
    assert_eq!(f.attributed("process"), 2);
    assert_eq!(f.metrics.disagreements.get(), 0);
}

#[test]
fn when_process_and_devices_disagree_the_process_wins_and_it_is_counted_once() {
    let mut f = Fixture::new();
    f.proc.process(101, &in_container(1, 11));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)]), pod(2, "b", "serve", "Running", &[("srv", 21)])]);
    f.devices(vec![core("b", "serve", "srv", Unit::Core, 0)]);
    f.report(&[("t", 101, &[0])]);
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!(f.metrics.disagreements.get(), 1);
}

#[test]
fn a_runtime_without_a_readable_process_takes_the_pod_holding_all_its_cores() {
    let mut f = Fixture::new();
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)]), pod(2, "b", "serve", "Running", &[("srv", 21)])]);
    f.devices(vec![core("a", "train", "main", Unit::Device, 0), core("b", "serve", "srv", Unit::Core, 2)]);
    // No /proc entries at all (an agent without the host PID namespace).
    f.report(&[("t", 201, &[0, 1]), ("mixed", 202, &[1, 2]), ("free", 203, &[3])]);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!(f.runtime("mixed"), None, "cores of two pods: no guess");
    assert_eq!(f.runtime("free"), None);
    assert_eq!(f.attributed("devices"), 1);
    assert_eq!(f.unattributed(Unattributed::ProcUnreadable), 2);
}

#[test]
fn unknown_layouts_are_counted_once_and_not_guessed() {
    let mut f = Fixture::new();
    f.proc.process(101, "0::/kubepods.slice/kubepods-burstable.slice/something-else\n");
    f.proc.process(102, "0::/system.slice/app.service\n");
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)])]);
    f.report(&[("x", 101, &[0]), ("h", 102, &[1])]);
    f.report(&[("x", 101, &[0]), ("h", 102, &[1])]);
    assert_eq!(f.runtime("x"), None);
    assert_eq!(f.runtime("h"), None);
    assert_eq!(f.metrics.unknown_layouts.get(), 1);
    assert_eq!(f.unattributed(Unattributed::UnknownLayout), 1);
    assert_eq!(f.unattributed(Unattributed::NotInPod), 1);
}

#[test]
fn a_finished_or_deleted_pod_stops_being_credited_even_if_the_kubelet_lists_it() {
    let mut f = Fixture::new();
    f.proc.process(101, &in_container(1, 11));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)])]);
    f.devices(vec![core("a", "train", "main", Unit::Device, 0), core("a", "train", "main", Unit::Device, 1)]);
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!(f.idle()[0], (1, Some("train".to_owned())));
    f.pods.write().unwrap().apply(&pod(1, "a", "train", "Succeeded", &[("main", 11)]));
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), None);
    assert!(f.idle().iter().all(|(_, pod)| pod.is_none()), "{:?}", f.idle());
    assert_eq!(f.unattributed(Unattributed::PodUnknown), 1);
}

#[test]
fn a_pid_is_read_once_and_forgotten_when_it_leaves_the_report() {
    let mut f = Fixture::new();
    f.proc.process(101, &in_container(1, 11));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)]), pod(2, "b", "serve", "Running", &[("srv", 21)])]);
    f.report(&[("t", 101, &[0])]);
    // The file changes under a live PID: the cached answer stands.
    f.proc.process(101, &in_container(2, 21));
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    // The PID leaves and comes back (reused): read again.
    f.report(&[]);
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), names("b", "serve", "srv"));
}

#[test]
fn a_container_not_in_the_statuses_yet_takes_its_name_from_the_kubelet() {
    let mut f = Fixture::new();
    f.proc.process(101, &in_container(1, 99));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)])]);
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), names("a", "train", ""));
    f.devices(vec![core("a", "train", "main", Unit::Core, 0)]);
    f.report(&[("t", 101, &[0])]);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!(f.metrics.disagreements.get(), 0);
}

#[test]
fn pod_labels_follow_pod_changes() {
    let mut f = Fixture::new();
    f.proc.process(101, &in_container(1, 11));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)])]);
    f.report(&[("t", 101, &[0])]);
    let mut relabeled = pod(1, "a", "train", "Running", &[("main", 11)]);
    relabeled.metadata.labels = Some([("app".to_owned(), "train-v2".to_owned())].into());
    f.pods.write().unwrap().apply(&relabeled);
    f.report(&[("t", 101, &[0])]);
    let labels = &f.state.runtimes[0].labels.pod.as_ref().unwrap().labels;
    assert_eq!(labels, &vec![("label_app".to_owned(), "train-v2".to_owned())]);
}

#[test]
fn a_process_in_an_ecs_task_takes_the_task_and_container_the_ecs_agent_lists() {
    let mut f = Fixture::new();
    let listing = include_str!("testdata/ecs/tasks.json");
    let trainer = "5b1e7c2d9f3a4b6c8d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e";
    f.proc.process(700, &format!("3:cpu:/ecs/0f1e2d3c4b5a69788796a5b4c3d2e1f0/{trainer}\n"));
    // A Docker container no task lists, and a host process.
    f.proc.process(701, &format!("0::/system.slice/docker-{}.scope\n", cid(9)));
    f.proc.process(702, "0::/system.slice/sshd.service\n");
    let apps: &[(&str, u32, &[u32])] = &[("train", 700, &[0]), ("other", 701, &[1]), ("host", 702, &[2])];

    // Before the ECS agent answered: no task.
    f.report(apps);
    assert_eq!(f.ecs_task("train"), None);
    assert_eq!(f.unattributed(Unattributed::NotInPod), 3);

    f.ecs.write().unwrap().replace(ecs::parse_tasks(listing.as_bytes()).unwrap().0);
    f.report(apps);
    assert_eq!(f.ecs_task("train"), Some(("bert-training".into(), "trainer".into())));
    assert_eq!(f.runtime("train"), None, "an ECS task is not a pod");
    assert_eq!(f.ecs_task("other"), None);
    assert_eq!(f.ecs_task("host"), None);
    assert_eq!(f.attributed("ecs"), 1);
    assert_eq!(f.unattributed(Unattributed::NotInPod), 2);

    // The task stopped: its label goes with the next listing.
    f.ecs.write().unwrap().replace(Default::default());
    f.report(apps);
    assert_eq!(f.ecs_task("train"), None);
}

#[test]
fn efa_devices_go_to_the_listed_containers_holding_them() {
    let f = Fixture::new();
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 1)]), pod(2, "b", "serve", "Running", &[("srv", 2)])]);
    f.devices.write().unwrap().set_efa(
        vec![
            efa("b", "serve", "srv", "rdmap24s27"),
            efa("a", "train", "main", "rdmap16s27"),
            efa("a", "gone", "main", "rdmap32s27"),
        ],
        Vec::new(),
    );
    let holders = EfaHolders::new(f.pods.clone(), f.devices.clone());
    let current = holders.current();
    assert_eq!(
        summary(&current),
        [("rdmap16s27".into(), "train".into(), "main".into()), ("rdmap24s27".into(), "serve".into(), "srv".into())],
        "a pod the watch does not know holds nothing"
    );
    assert!(Arc::ptr_eq(&current, &holders.current()), "cached while nothing changed");
    // serve finishes: its device is no longer credited to it.
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 1)]), pod(2, "b", "serve", "Succeeded", &[("srv", 2)])]);
    assert_eq!(summary(&holders.current()), [("rdmap16s27".into(), "train".into(), "main".into())]);
}

fn efa(ns: &str, pod: &str, container: &str, device: &str) -> podresources::EfaAllocation {
    podresources::EfaAllocation {
        namespace: ns.into(),
        pod: pod.into(),
        container: container.into(),
        device: device.into(),
        claim: None,
    }
}

/// (device, pod, container) of each EFA holder.
fn summary(h: &[(String, Arc<PodRef>)]) -> Vec<(String, String, String)> {
    h.iter().map(|(d, p)| (d.clone(), p.pod.clone(), p.container.clone())).collect()
}

#[test]
fn efa_devices_claimed_through_dra_carry_their_pods_and_claims_beside_the_device_plugins() {
    use dra::{efa::NetDevice, Claim, ClaimedDevice, DeviceTable, Slice, Unresolved};
    let f = Fixture::new();
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 1)]), pod(2, "b", "serve", "Running", &[("srv", 2)])]);
    let claimed = |pod: &str, device: &str| ClaimedDevice {
        namespace: "a".into(),
        pod: pod.into(),
        container: "main".into(),
        claim: Arc::new(Claim { namespace: "a".into(), name: "efa-pair".into() }),
        pool: "node-a".into(),
        device: device.into(),
        malformed: false,
    };
    // A migration: serve holds one through the device plugin, train two through a claim.
    let claims =
        vec![claimed("train", "pci-0000-20-1b-0"), claimed("train", "pci-0000-10-1b-0"), claimed("train", "gone")];
    let plugin = || vec![efa("b", "serve", "srv", "rdmap48s27")];
    let fresh = f.devices.write().unwrap().set_efa(plugin(), claims.clone());
    assert!(fresh.is_empty(), "nothing is unresolvable before the slices are listed");
    let holders = EfaHolders::new(f.pods.clone(), f.devices.clone());
    assert_eq!(summary(&holders.current()), [("rdmap48s27".into(), "serve".into(), "srv".into())]);

    let slice = Slice {
        pool: "node-a".into(),
        generation: 1,
        devices: vec![
            ("pci-0000-10-1b-0".into(), Some(NetDevice::Rdma("rdmap16s27".into()))),
            ("pci-0000-20-1b-0".into(), Some(NetDevice::Rdma("rdmap32s27".into()))),
            ("pci-0000-30-1b-0".into(), Some(NetDevice::Rdma("rdmap64s27".into()))),
        ],
    };
    let fresh = f.devices.write().unwrap().set_efa_dra_devices(DeviceTable::from_slices([&slice]));
    let reasons: Vec<(&str, Unresolved)> = fresh.iter().map(|u| (u.device.as_str(), u.reason)).collect();
    assert_eq!(reasons, [("gone", Unresolved::UnknownDevice)]);
    let current = holders.current();
    assert_eq!(
        summary(&current),
        [
            ("rdmap16s27".into(), "train".into(), "main".into()),
            ("rdmap32s27".into(), "train".into(), "main".into()),
            ("rdmap48s27".into(), "serve".into(), "srv".into()),
        ],
        "sorted by device; rdmap64s27, claimed by nobody, has no holder"
    );
    let labels =
        |i: usize| -> Vec<(&str, &str)> { current[i].1.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect() };
    // The pod's labels, then the claim's.
    assert_eq!(labels(0), [("label_app", "train"), ("dra_claim_namespace", "a"), ("dra_claim_name", "efa-pair")]);
    assert_eq!(labels(2), [("label_app", "serve")], "the device plugin's holder names no claim");
    // The same answer again changes nothing; a new generation of the slice says nothing twice.
    let generation = f.devices.read().unwrap().generation();
    assert!(f.devices.write().unwrap().set_efa(plugin(), claims).is_empty());
    assert_eq!(f.devices.read().unwrap().generation(), generation, "the holders stay cached");
    let again =
        f.devices.write().unwrap().set_efa_dra_devices(DeviceTable::from_slices([&Slice { generation: 2, ..slice }]));
    assert!(again.is_empty(), "{again:?}");
}

/// `report` (2 devices × 2 cores) with a `neuron_k8s_info` group of `cores` and `devices`
/// entries (index, namespace, pod, container).
fn report_with_k8s_info(
    runtimes: &[(&str, u32, &[u32])],
    cores: &[(u32, &str, &str, &str)],
    devices: &[(u32, &str, &str, &str)],
) -> String {
    let entries = |list: &[(u32, &str, &str, &str)]| -> String {
        let owners: Vec<String> = list
            .iter()
            .map(|(i, ns, pod, c)| {
                format!(r#""{i}":{{"pod_name":"{pod}","namespace":"{ns}","container_name":["{c}"]}}"#)
            })
            .collect();
        owners.join(",")
    };
    let k8s = format!(
        r#","neuron_k8s_info":{{"period":1,"error":"","neuroncores_k8s_info":{{{}}},"neurondevices_k8s_info":{{{}}}}}}}"#,
        entries(cores),
        entries(devices)
    );
    let mut line = report(runtimes);
    line.pop(); // the closing brace
    line + &k8s
}

#[test]
fn without_the_kubelet_neuron_monitors_k8s_info_credits_cores_by_the_same_rules() {
    let mut f = Fixture::new();
    f.proc.process(102, &in_container(2, 21));
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)]), pod(2, "b", "serve", "Running", &[("srv", 21)])]);
    // train's process is not readable: its cores say whose it is. serve's process is in
    // pod b, but neuron-monitor credits its core to train: the process wins, counted.
    let line = report_with_k8s_info(
        &[("t", 201, &[0]), ("s", 102, &[2])],
        &[(2, "a", "train", "main")],
        &[(0, "a", "train", "main")],
    );
    for _ in 0..2 {
        f.state.apply(&Report::parse(&line).unwrap());
        f.attribution.attribute(&mut f.state);
    }
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!(f.runtime("s"), names("b", "serve", "srv"));
    assert_eq!((f.attributed("devices"), f.attributed("process")), (1, 1));
    assert_eq!(f.metrics.disagreements.get(), 1);
    // Core 1 (device 0) is idle and train's; core 3 nobody's.
    assert_eq!(f.idle(), vec![(1, Some("train".to_owned())), (3, None)]);
    let source = |s: &'static str| f.metrics.device_source.get_or_create(&SourceLabel { source: s }).get();
    assert_eq!((source("neuron_monitor"), source("kubelet")), (1, 0));

    // The group in error (and the runtimes gone): no owners from it any more.
    let broken = r#"{"neuron_k8s_info":{"error":"kubelet not reachable"}}"#;
    f.state.apply(&Report::parse(broken).unwrap());
    f.attribution.attribute(&mut f.state);
    assert!(f.devices.read().unwrap().allocations().is_empty());
    assert_eq!(f.idle(), vec![(0, None), (1, None), (2, None), (3, None)]);
    assert_eq!((source("neuron_monitor"), source("kubelet")), (0, 0));
}

#[test]
fn the_kubelets_answer_wins_over_k8s_info_until_it_expires() {
    let mut f = Fixture::new();
    f.pods(&[pod(1, "a", "train", "Running", &[("main", 11)])]);
    // The kubelet answered: nobody holds a device. neuron-monitor says otherwise.
    f.devices(vec![]);
    let line = report_with_k8s_info(&[("t", 201, &[0])], &[(0, "a", "train", "main")], &[]);
    f.state.apply(&Report::parse(&line).unwrap());
    f.attribution.attribute(&mut f.state);
    assert_eq!(f.runtime("t"), None);
    let source = |s: &'static str| f.metrics.device_source.get_or_create(&SourceLabel { source: s }).get();
    assert_eq!((source("kubelet"), source("neuron_monitor")), (1, 0));
    // The kubelet's answer expires: neuron-monitor's account is used.
    f.devices.write().unwrap().forget_kubelet();
    f.attribution.attribute(&mut f.state);
    assert_eq!(f.runtime("t"), names("a", "train", "main"));
    assert_eq!((source("kubelet"), source("neuron_monitor")), (0, 1));
}

fn pod_ref(namespace: &str, name: &str, container: &str) -> Arc<PodRef> {
    Arc::new(PodRef {
        namespace: namespace.to_owned(),
        pod: name.to_owned(),
        container: container.to_owned(),
        ..PodRef::default()
    })
}

#[test]
fn a_pod_holds_a_runtime_s_cores_only_when_it_holds_them_all() {
    let (a, b) = (pod_ref("ns", "a", "c"), pod_ref("ns", "b", "c"));
    assert_eq!(holder_of_all([Some(&a), Some(&a)].into_iter()), Some(&a));
    assert_eq!(holder_of_all([Some(&a), Some(&b)].into_iter()), None);
    assert_eq!(holder_of_all([Some(&a), None].into_iter()), None);
    assert_eq!(holder_of_all([None, Some(&a)].into_iter()), None);
    assert_eq!(holder_of_all(std::iter::empty()), None);
}

#[test]
fn the_process_s_pod_wins_then_the_cores_holder_then_the_ecs_container() {
    let process = pod_ref("ns", "a", "trainer");
    let holder = pod_ref("ns", "b", "worker");
    let task = Arc::new(EcsContainer { task_arn: "arn".to_owned(), ..EcsContainer::default() });
    // The process's pod wins a disagreement with the kubelet.
    assert_eq!(choose(Ok(&process), Some(&holder), None), Choice::Process(process.clone()));
    // A process whose container is not listed yet takes the kubelet's name in the same pod.
    let unnamed = pod_ref("ns", "b", "");
    assert_eq!(choose(Ok(&unnamed), Some(&holder), None), Choice::Process(holder.clone()));
    // ... but not another pod's.
    let elsewhere = pod_ref("ns", "c", "");
    assert_eq!(choose(Ok(&elsewhere), Some(&holder), None), Choice::Process(elsewhere.clone()));
    // Without the process's pod: the cores' holder, then the ECS container, else why not.
    assert_eq!(choose(Err(Unattributed::NoPid), Some(&holder), Some(task.clone())), Choice::Devices(holder.clone()));
    assert_eq!(choose(Err(Unattributed::NoPid), None, Some(task.clone())), Choice::Ecs(task.clone()));
    assert_eq!(choose(Err(Unattributed::NoPid), None, None), Choice::Unattributed(Unattributed::NoPid));
    assert_eq!(Choice::Ecs(task.clone()).labels(), (None, Some(task)));
    assert_eq!(Choice::Devices(holder.clone()).labels(), (Some(holder), None));
}

/// Device 0 held through a DRA claim, device 1 through the device plugin: a runtime on
/// device 0 whose process cannot be placed takes the claim's pod (its series carry no
/// claim: they are not per device), the claim's idle core carries the pod and the claim,
/// the device plugin's idle core the pod alone.
#[test]
fn a_dra_claims_device_attributes_its_runtime_and_names_the_claim_on_its_idle_cores() {
    let mut f = Fixture::new();
    f.pods(&[pod(1, "ml", "train", "Running", &[("main", 1)]), pod(2, "b", "serve", "Running", &[("srv", 2)])]);
    let claim = Arc::new(dra::Claim { namespace: "ml".into(), name: "neurons".into() });
    let claimed = Allocation { claim: Some(claim), ..core("ml", "train", "main", Unit::Device, 0) };
    f.devices(vec![claimed, core("b", "serve", "srv", Unit::Device, 1)]);
    f.report(&[("t", 4242, &[0])]);
    assert_eq!(f.runtime("t"), names("ml", "train", "main"));
    let rt = f.state.runtimes.iter().find(|r| r.labels.runtime_tag == "t").unwrap();
    let rt_labels = &rt.labels.pod.as_ref().unwrap().labels;
    assert!(!rt_labels.iter().any(|(k, _)| k.starts_with("dra_")), "{rt_labels:?}");
    let idle_labels = |index: u32| {
        let core = f.state.idle_cores.iter().find(|c| c.index == index).unwrap();
        core.pod.as_ref().map(|p| (p.pod.clone(), p.labels.clone())).unwrap()
    };
    let app = |v: &str| ("label_app".to_owned(), v.to_owned());
    assert_eq!(
        idle_labels(1),
        (
            "train".to_owned(),
            vec![
                app("train"),
                (dra::CLAIM_NAMESPACE_LABEL.to_owned(), "ml".to_owned()),
                (dra::CLAIM_NAME_LABEL.to_owned(), "neurons".to_owned())
            ]
        )
    );
    assert_eq!(idle_labels(2), ("serve".to_owned(), vec![app("serve")]));
    assert_eq!(idle_labels(3), ("serve".to_owned(), vec![app("serve")]));
}
