//! Each compute process on each GPU: `gpu_process_memory_used_bytes` (and, where NVML
//! samples it, `gpu_process_sm_utilization_percent`) with the GPU's
//! `gpu` and `UUID`, the process's `pid`, its MIG GPU instance (`GPU_I_ID`) if any, and
//! the labels of the pod it runs in (by its cgroup, [`crate::attribution::gpus`]) where
//! it runs in one, with the DRA claim through which its container holds the GPU, if any.
//! A process in no pod goes where the operator namespace's series go.
//! Bounded by the processes a collection keeps ([`super::MAX_PROCESSES_PER_GPU`]).

use std::fmt;

use prometheus_client::metrics::MetricType;

use super::{
    dcgm::pod_labels, firsts, keep_firsts, Gpu, GpuHolder, GpuHolders, GpuProcess, GpuProcessPods, GpuSnapshot,
};
use crate::{
    series::{Family, FamilyEncoder, Labels, Scope},
    state::{InstanceLabels, PodRef},
};

pub const MEMORY_USED: &str = "gpu_process_memory_used_bytes";
const MEMORY_USED_HELP: &str = "GPU memory a compute process uses, in bytes (NVML's count of the process)";
pub const SM_UTILIZATION: &str = "gpu_process_sm_utilization_percent";
const SM_UTILIZATION_HELP: &str =
    "Percent of the driver's latest sample the process's kernels ran on the GPU's SMs (NVML's per-process utilization)";

/// One process `scope` sees: its pod, and the labels of its series.
struct Seen<'a> {
    process: &'a GpuProcess,
    pod: Option<&'a PodRef>,
    labels: Vec<(&'static str, String)>,
}

fn labels(gpu: &Gpu, process: &GpuProcess) -> Vec<(&'static str, String)> {
    let mut labels = vec![
        ("gpu", gpu.identity.index.to_string()),
        ("UUID", gpu.identity.uuid.clone()),
        ("pid", process.pid.to_string()),
    ];
    if let Some(instance) = process.gpu_instance_id {
        labels.push(("GPU_I_ID", instance.to_string()));
    }
    labels
}

/// `pod` as a holder of the GPU names it (with the claim it holds the GPU through), else
/// as its cgroup does.
fn as_held<'a>(pod: &'a PodRef, held: &'a [GpuHolder]) -> &'a PodRef {
    let same = |h: &&PodRef| h.namespace == pod.namespace && h.pod == pod.pod && h.container == pod.container;
    held.iter().map(|h| &*h.pod).find(same).unwrap_or(pod)
}

/// The processes `scope` sees, never two with the same labels (the collection merges
/// NVML's listings of a process, [`super::merge_processes`]; any left are counted in the
/// snapshot's `duplicate_series`); a stale snapshot or a lost GPU has none to give.
fn seen<'a>(
    snapshot: &'a GpuSnapshot,
    pods: &'a GpuProcessPods,
    holders: &'a GpuHolders,
    scope: Scope<'_>,
) -> Vec<Seen<'a>> {
    if snapshot.stale {
        return Vec::new();
    }
    let mut seen = Vec::new();
    for gpu in snapshot.gpus.iter().filter(|g| !g.lost) {
        let held = holders.get(&gpu.identity.uuid.to_ascii_uppercase()).map(Vec::as_slice).unwrap_or_default();
        for process in &gpu.processes {
            let pod = pods.get(&process.pid).map(|p| as_held(p, held));
            if scope.sees(pod.map(|p| p.namespace.as_str())) {
                seen.push(Seen { process, pod, labels: labels(gpu, process) });
            }
        }
    }
    let firsts = firsts(&seen, |s| (&s.labels, s.pod.map(pod_labels)));
    keep_firsts(seen, firsts, &snapshot.duplicate_series)
}

/// The per-process families of every GPU process `scope` sees.
pub fn encode_processes(
    snapshot: &GpuSnapshot,
    instance: &InstanceLabels,
    pods: &GpuProcessPods,
    holders: &GpuHolders,
    scope: Scope<'_>,
    encoder: &mut dyn FamilyEncoder,
) -> Result<(), fmt::Error> {
    let seen = seen(snapshot, pods, holders, scope);
    let mut memory = Family::new(MEMORY_USED, MEMORY_USED_HELP, MetricType::Gauge);
    let mut utilization = Family::new(SM_UTILIZATION, SM_UTILIZATION_HELP, MetricType::Gauge);
    for s in &seen {
        let labels = || Labels::held_by(instance, s.pod).fields(&s.labels);
        memory.push(labels(), s.process.used_memory_bytes.map(|b| b as f64));
        utilization.push(labels(), s.process.sm_utilization.map(f64::from));
    }
    memory.write(encoder)?;
    utilization.write(encoder)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use api::node_config::{NodeConfig, PrometheusRoute, Route, RouteRuntimes};

    use super::*;
    use crate::{
        gpu::{GpuIdentity, MigInstance},
        routing::Routing,
    };

    fn gpu(index: u32, processes: Vec<GpuProcess>) -> Gpu {
        Gpu {
            identity: GpuIdentity { index, uuid: format!("GPU-{index}aaa"), ..GpuIdentity::default() },
            processes,
            ..Gpu::default()
        }
    }

    fn process(pid: u32, mib: Option<u64>, gpu_instance_id: Option<u32>) -> GpuProcess {
        GpuProcess { pid, used_memory_bytes: mib.map(|m| m * 1024 * 1024), gpu_instance_id, sm_utilization: None }
    }

    fn pod(namespace: &str, name: &str) -> Arc<PodRef> {
        Arc::new(PodRef { namespace: namespace.into(), pod: name.into(), container: "c".into(), ..PodRef::default() })
    }

    fn snapshot(gpus: Vec<Gpu>) -> GpuSnapshot {
        GpuSnapshot { driver_version: "550".into(), gpus, collections: 1, ..GpuSnapshot::default() }
    }

    /// Each series as `name labels value`, labels `k=v` joined by commas.
    fn render(snapshot: &GpuSnapshot, pods: &GpuProcessPods, scope: Scope<'_>) -> Vec<String> {
        render_held(snapshot, pods, &GpuHolders::new(), scope)
    }

    fn render_held(
        snapshot: &GpuSnapshot,
        pods: &GpuProcessPods,
        holders: &GpuHolders,
        scope: Scope<'_>,
    ) -> Vec<String> {
        struct Text(Vec<String>);
        impl FamilyEncoder for Text {
            fn encode_family(&mut self, family: &Family<'_>) -> Result<(), fmt::Error> {
                for (labels, value) in family.series() {
                    let mut pairs = Vec::new();
                    labels.try_for_each(|k, v| {
                        pairs.push(format!("{k}={v}"));
                        Ok::<_, fmt::Error>(())
                    })?;
                    self.0.push(format!("{} {} {value}", family.classic_name(), pairs.join(",")));
                }
                Ok(())
            }
        }
        let mut text = Text(Vec::new());
        encode_processes(snapshot, &InstanceLabels::default(), pods, holders, scope, &mut text).unwrap();
        text.0
    }

    #[test]
    fn each_process_has_its_gpu_pid_memory_and_pod() {
        let s = snapshot(vec![
            gpu(0, vec![process(10, Some(512), None), process(11, None, None)]),
            gpu(1, vec![process(12, Some(1), Some(3))]),
        ]);
        let pods = GpuProcessPods::from([(10, pod("team-a", "train"))]);
        let routing = Routing::default();
        let lines = render(&s, &pods, Scope::Exposition(&routing));
        // Process 11 gave no memory: left out, not zero.
        assert_eq!(lines.len(), 2, "{lines:#?}");
        let p10 = &lines[0];
        for label in ["gpu=0", "UUID=GPU-0aaa", "pid=10", "namespace=team-a", "pod=train", "container=c"] {
            assert!(p10.contains(label), "{label} missing in {p10}");
        }
        assert!(p10.starts_with("gpu_process_memory_used_bytes ") && p10.ends_with(" 536870912"), "{p10}");
        let p12 = &lines[1];
        assert!(p12.contains("pid=12") && p12.contains("GPU_I_ID=3") && !p12.contains("namespace="), "{p12}");
    }

    #[test]
    fn a_sampled_process_has_its_sm_utilization_with_the_same_labels() {
        let sampled = GpuProcess { sm_utilization: Some(70), ..process(10, Some(512), None) };
        let s = snapshot(vec![gpu(0, vec![sampled, process(11, Some(1), None)])]);
        let pods = GpuProcessPods::from([(10, pod("team-a", "train"))]);
        let routing = Routing::default();
        let lines = render(&s, &pods, Scope::Exposition(&routing));
        let utilization: Vec<_> =
            lines.iter().filter(|l| l.starts_with("gpu_process_sm_utilization_percent ")).collect();
        // Process 11 has no sample: left out, not zero.
        assert_eq!(utilization.len(), 1, "{lines:#?}");
        assert!(utilization[0].contains("pid=10") && utilization[0].contains("pod=train"), "{utilization:?}");
        assert!(utilization[0].ends_with(" 70"), "{utilization:?}");
    }

    #[test]
    fn a_process_of_a_container_holding_its_gpu_through_a_claim_names_the_claim() {
        let s = snapshot(vec![gpu(0, vec![process(10, Some(1), None), process(11, Some(1), None)])]);
        let pods = GpuProcessPods::from([(10, pod("team-a", "train")), (11, pod("team-a", "other"))]);
        let mut claimed = (*pod("team-a", "train")).clone();
        claimed.labels.push(("dra_claim_name".into(), "gpus".into()));
        let holders =
            GpuHolders::from([("GPU-0AAA".to_owned(), vec![GpuHolder { pod: Arc::new(claimed), replica: None }])]);
        let routing = Routing::default();
        let lines = render_held(&s, &pods, &holders, Scope::Exposition(&routing));
        assert!(lines[0].contains("pid=10") && lines[0].contains("dra_claim_name=gpus"), "{lines:#?}");
        // A process of a container not holding the GPU keeps its cgroup's pod alone.
        assert!(lines[1].contains("pod=other") && !lines[1].contains("dra_claim"), "{lines:#?}");
    }

    #[test]
    fn a_teams_route_takes_its_pods_processes_only() {
        let processes = vec![process(10, Some(1), None), process(11, Some(2), None), process(12, Some(3), None)];
        let s = snapshot(vec![gpu(0, processes)]);
        let pods = GpuProcessPods::from([(10, pod("team-a", "train")), (11, pod("team-b", "serve"))]);
        let route = Route {
            config: "team-a/c".into(),
            namespace: Some("team-a".into()),
            runtimes: vec![RouteRuntimes { tag_filter: None, groups: vec![] }],
            prometheus: Some(PrometheusRoute::default()),
            ..Route::default()
        };
        let routing =
            Routing::compile(&NodeConfig { monitor: Default::default(), routes: vec![route], health: None, gpu: None });
        let lines = render(&s, &pods, Scope::Exposition(&routing.unwrap()));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].contains("pid=10"), "{lines:#?}");
    }

    #[test]
    fn a_process_listed_twice_is_one_series_and_counted() {
        // Never from the collection (it merges NVML's listings): the last guard of the page.
        let s = snapshot(vec![gpu(0, vec![process(10, Some(1), Some(3)), process(10, Some(2), Some(3))])]);
        let routing = Routing::default();
        let lines = render(&s, &GpuProcessPods::new(), Scope::Exposition(&routing));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        assert!(lines[0].ends_with(" 1048576"), "the first kept: {lines:?}");
        assert_eq!(s.duplicate_series.get(), 1);
    }

    #[test]
    fn a_stale_snapshot_or_a_lost_gpu_gives_no_process() {
        let mut lost = gpu(1, vec![process(20, Some(1), None)]);
        lost.lost = true;
        lost.mig = vec![MigInstance::default()];
        let routing = Routing::default();
        let s = snapshot(vec![gpu(0, vec![process(10, Some(1), None)]), lost]);
        let lines = render(&s, &GpuProcessPods::new(), Scope::Exposition(&routing));
        assert_eq!(lines.len(), 1, "{lines:#?}");
        let stale = GpuSnapshot { stale: true, ..s };
        assert!(render(&stale, &GpuProcessPods::new(), Scope::Exposition(&routing)).is_empty());
    }
}
