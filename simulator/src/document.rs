//! The generator that fills a report document (see [`crate::wire`]) from the scenario
//! for the groups refreshed in one tick.
//!
//! Every value is a function of the scenario and the group's nominal period, never of
//! the clock, so that tests can assert exactly what a scrape returns; only each group's
//! `period` (seconds actually covered) varies.

use std::collections::BTreeMap;

use api::duration::Period;
use api::monitor_config::{RuntimeGroup, SystemGroup};

use crate::hardware::HostDocuments;
use crate::pod_app::Discovery;
use crate::scenario::{place, App, AppSpec, GroupName, Scenario};
use crate::schedule::{GroupKey, Plan};
use crate::wire::*;
use api::hash::fnv1a;

const MIB: u64 = 1 << 20;

/// A group refreshed in this tick.
#[derive(Clone, Copy, Debug)]
pub struct Refresh {
    pub key: GroupKey,
    /// The configured period: what per-period counts are computed from.
    pub nominal: Period,
    /// Seconds actually covered, written as the group's `period`.
    pub covered: f64,
}

/// Builds the documents of a run; remembers only how many times the hardware counters
/// were refreshed (for `--ecc-every`).
pub struct Generator {
    scenario: Scenario,
    /// The apps of the command line: the first this many of `scenario.apps`; the rest
    /// were discovered (`--discover-apps`) and are replaced at each scan.
    given_apps: usize,
    plan: Plan,
    hw_refreshes: u64,
    instance_info: InstanceInfo,
    hardware_info: HardwareInfo,
}

impl Generator {
    pub fn new(scenario: Scenario, plan: Plan) -> Generator {
        Generator {
            instance_info: scenario.instance.instance_info(&scenario.region),
            hardware_info: scenario.instance.hardware_info(),
            given_apps: scenario.apps.len(),
            scenario,
            plan,
            hw_refreshes: 0,
        }
    }

    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Replaces the discovered apps with those of the last scan; one that cannot run
    /// beside the others (a core held twice, a core the host lacks) is said and left out.
    pub fn set_discovered(&mut self, specs: Vec<AppSpec>, discovery: &mut Discovery) {
        self.scenario.apps.truncate(self.given_apps);
        for spec in specs {
            let pid = spec.pid.unwrap_or_default();
            match place(&self.scenario.instance, &self.scenario.apps, spec, pid) {
                Ok(app) => self.scenario.apps.push(app),
                Err(e) => discovery.say(pid, &format!("{e:#}")),
            }
        }
    }

    /// The document of one tick, carrying exactly the refreshed groups.
    pub fn document(&mut self, refreshes: &[Refresh]) -> Document {
        let mut runtimes = Vec::new();
        for app in &self.scenario.apps {
            let Some(selector) = self.plan.selector_for(&app.tag) else {
                continue;
            };
            let mut report = RuntimeReport::default();
            for r in refreshes {
                if let GroupKey::Runtime { selector: s, group } = r.key {
                    if s == selector {
                        self.runtime_group(&mut report, app, group, r);
                    }
                }
            }
            let refreshed = report.execution_stats.is_some()
                || report.memory_used.is_some()
                || report.neuron_runtime_vcpu_usage.is_some()
                || report.neuroncore_counters.is_some();
            if refreshed {
                runtimes.push(RuntimeEntry {
                    pid: app.pid,
                    neuron_runtime_tag: app.tag.clone(),
                    error: String::new(),
                    report,
                });
            }
        }

        let mut system = SystemData::default();
        let mut k8s_info = None;
        for r in refreshes {
            match r.key {
                GroupKey::System(SystemGroup::NeuronK8sInfo) => {
                    let error = self.scenario.group_fails(GroupName::System(SystemGroup::NeuronK8sInfo));
                    let error = error.then(|| injected_error(SystemGroup::NeuronK8sInfo.as_str()));
                    k8s_info = Some(wrap(r, error, || self.k8s_info()));
                }
                GroupKey::System(group) => self.system_group(&mut system, group, r),
                GroupKey::Runtime { .. } => {}
            }
        }

        Document {
            neuron_runtime_data: runtimes,
            system_data: system,
            instance_info: self.instance_info.clone(),
            neuron_hardware_info: self.hardware_info.clone(),
            neuron_k8s_info: k8s_info,
        }
    }

    /// The pods of the apps with `pod=`: each of their cores, and each device all of
    /// whose cores one of them holds.
    fn k8s_info(&self) -> K8sInfo {
        let mut cores = BTreeMap::new();
        let mut devices = BTreeMap::new();
        let instance = &self.scenario.instance;
        for app in &self.scenario.apps {
            let Some(pod) = &app.pod else { continue };
            let entry = K8sEntry {
                pod_name: pod.pod.clone(),
                namespace: pod.namespace.clone(),
                container_name: vec![pod.container.clone()],
            };
            for &core in &app.cores {
                cores.insert(core, entry.clone());
                let device = instance.device_of(core);
                let first = device * instance.cores_per_device;
                if (first..first + instance.cores_per_device).all(|c| app.cores.contains(&c)) {
                    devices.insert(device, entry.clone());
                }
            }
        }
        K8sInfo { neuroncores_k8s_info: cores, neurondevices_k8s_info: devices }
    }

    fn runtime_group(&self, report: &mut RuntimeReport, app: &App, group: RuntimeGroup, r: &Refresh) {
        let error = self.scenario.group_fails(GroupName::Runtime(group)).then(|| match group {
            // What neuron-monitor says in a container without the host PID namespace.
            RuntimeGroup::NeuronRuntimeVcpuUsage => {
                format!("open /proc/{}/stat: no such file or directory", app.pid)
            }
            _ => injected_error(group.as_str()),
        });
        let seconds = r.nominal.as_millis() as f64 / 1000.0;
        match group {
            RuntimeGroup::NeuroncoreCounters => {
                report.neuroncore_counters = Some(wrap(r, error, || self.neuroncore_counters(app)))
            }
            RuntimeGroup::MemoryUsed => report.memory_used = Some(wrap(r, error, || self.memory_used(app))),
            RuntimeGroup::NeuronRuntimeVcpuUsage => {
                report.neuron_runtime_vcpu_usage = Some(wrap(r, error, || runtime_vcpu_usage(app)))
            }
            RuntimeGroup::ExecutionStats => {
                report.execution_stats = Some(wrap(r, error, || execution_stats(app, seconds)))
            }
        }
    }

    fn system_group(&mut self, system: &mut SystemData, group: SystemGroup, r: &Refresh) {
        let error = self.scenario.group_fails(GroupName::System(group)).then(|| injected_error(group.as_str()));
        let seconds = r.nominal.as_millis() as f64 / 1000.0;
        match group {
            SystemGroup::VcpuUsage => {
                let vcpus = self.scenario.instance.vcpus;
                system.vcpu_usage = Some(wrap(r, error, || system_vcpu_usage(vcpus, seconds)))
            }
            SystemGroup::MemoryInfo => system.memory_info = Some(wrap(r, error, || self.memory_info())),
            SystemGroup::NeuronHwCounters => {
                self.hw_refreshes += 1;
                let ecc = self.scenario.ecc_every.is_some_and(|n| self.hw_refreshes.is_multiple_of(n));
                let devices = self.scenario.instance.devices;
                system.neuron_hw_counters = Some(wrap(r, error, || hw_counters(devices, ecc)))
            }
            // Written at the top level (see `document`).
            SystemGroup::NeuronK8sInfo => {}
        }
    }

    fn neuroncore_counters(&self, app: &App) -> NeuroncoreCounters {
        let physical = self.scenario.instance.hardware_info().logical_neuroncore_config.unwrap_or(1);
        let neuroncores_in_use = (0..self.scenario.instance.cores())
            .map(|core| {
                let util = if app.cores.contains(&core) { app.util } else { 0.0 };
                // 10 TFLOPS per core at full use; 80% of it effective.
                let flops = (util * 1e11).round() as u64;
                let v3d = (physical > 1).then(|| V3d { nc_v3: physical_cores(util, physical) });
                let counters =
                    CoreCounters { neuroncore_utilization: util, flops, effective_flops: flops / 5 * 4, v3d };
                (core, counters)
            })
            .collect();
        NeuroncoreCounters { neuroncores_in_use }
    }

    fn memory_used(&self, app: &App) -> MemoryUsed {
        let per_core: BTreeMap<u32, CoreMemory> = (0..self.scenario.instance.cores())
            .map(|core| {
                let memory = match app.cores.iter().position(|&c| c == core) {
                    Some(local) => core_memory(local),
                    None => CoreMemory::default(),
                };
                (core, memory)
            })
            .collect();
        let dma_buffers = (MIB * app.cores.len() as u64).min(app.host_mem);
        let loaded_models = app.cores.iter().enumerate().map(|(local, &core)| self.model(app, local, core)).collect();
        MemoryUsed {
            neuron_runtime_used_bytes: RuntimeUsedBytes {
                host: app.host_mem,
                neuron_device: per_core.values().map(CoreMemory::total).sum(),
                usage_breakdown: UsageBreakdown {
                    host: HostMemory {
                        application_memory: app.host_mem - dma_buffers,
                        constants: 0,
                        dma_buffers,
                        tensors: 0,
                    },
                    neuroncore_memory_usage: per_core,
                },
            },
            loaded_models,
        }
    }

    /// One model per core of the app, its single subgraph placed on that core.
    fn model(&self, app: &App, local: usize, core: u32) -> LoadedModel {
        let memory = core_memory(local);
        let host = HostMemory { application_memory: 20_480, constants: 0, dma_buffers: 524_288, tensors: 0 };
        let device =
            DeviceMemory { constants: memory.constants, model_code: memory.model_code, runtime_memory: 0, tensors: 0 };
        let subgraph = Subgraph {
            memory_used_bytes: SubgraphMemory {
                host: host.application_memory + host.dma_buffers,
                neuron_device: device.constants + device.model_code,
                usage_breakdown: SubgraphBreakdown { host, neuron_device: device },
            },
            neuroncore_index: local as u32,
            neuron_device_index: self.scenario.instance.device_of(core),
        };
        let seed = format!("{}/{}/{local}", app.pid, app.tag);
        LoadedModel {
            name: format!("/tmp/neuron-sim/{}/model-{local}.neff", app.tag),
            uuid: format!("{:016x}{:016x}", fnv1a(seed.as_bytes()), fnv1a(app.tag.as_bytes())),
            model_id: 10_001 + local as u64,
            is_running: app.util > 0.0,
            subgraphs: BTreeMap::from([("sg_00".to_owned(), subgraph)]),
        }
    }

    fn memory_info(&self) -> MemoryInfo {
        let total = self.scenario.instance.memory_bytes();
        let apps: u64 = self.scenario.apps.iter().map(|a| a.host_mem).sum();
        MemoryInfo {
            memory_total_bytes: total,
            memory_used_bytes: (total / 5).saturating_add(apps).min(total),
            swap_total_bytes: 0,
            swap_used_bytes: 0,
        }
    }
}

fn wrap<T>(r: &Refresh, error: Option<String>, data: impl FnOnce() -> T) -> Group<T> {
    match error {
        Some(error) => Group { period: r.covered, data: None, error },
        None => Group { period: r.covered, data: Some(data()), error: String::new() },
    }
}

fn injected_error(group: &str) -> String {
    format!("failed to collect {group}: injected by neuron-monitor-sim --group-error")
}

/// The physical cores of a logical one at `util`: the first a little busier, the others
/// making up the logical core's mean.
fn physical_cores(util: f64, physical: u32) -> BTreeMap<u32, PhysicalCoreCounters> {
    let first = (util * 1.05).min(100.0);
    let rest = if physical > 1 { (util * f64::from(physical) - first) / f64::from(physical - 1) } else { util };
    (0..physical)
        .map(|p| (p, PhysicalCoreCounters { neuroncore_utilization: if p == 0 { first } else { rest } }))
        .collect()
}

/// Device memory held on the app's `local`-th core (never zero).
fn core_memory(local: usize) -> CoreMemory {
    CoreMemory {
        constants: 64 * MIB,
        model_code: 100 * MIB + local as u64 * MIB,
        model_shared_scratchpad: 32 * MIB,
        runtime_memory: 1088,
        tensors: 256 * MIB,
    }
}

fn runtime_vcpu_usage(app: &App) -> RuntimeVcpuUsage {
    RuntimeVcpuUsage {
        vcpu_usage: UserSystem { user: round2(5.0 + app.util / 10.0), system: round2(1.0 + app.util / 50.0) },
    }
}

/// Total latency percentiles; device latency is 80% of them.
const TOTAL_LATENCY: Percentiles =
    Percentiles { p0: 0.005, p1: 0.006, p25: 0.009, p50: 0.01, p75: 0.012, p99: 0.02, p100: 0.03 };

fn execution_stats(app: &App, seconds: f64) -> ExecutionStats {
    let completed = (app.rps * seconds).round() as u64;
    let latency = |scale: f64| {
        let l = TOTAL_LATENCY;
        let s = |v: f64| round6(v * scale);
        (completed > 0).then_some(Percentiles {
            p0: s(l.p0),
            p1: s(l.p1),
            p25: s(l.p25),
            p50: s(l.p50),
            p75: s(l.p75),
            p99: s(l.p99),
            p100: s(l.p100),
        })
    };
    let errors = (app.errors * seconds).round() as u64;
    let mut error_summary = ErrorSummary::default();
    match app.error_type.as_str() {
        "generic" => error_summary.generic = errors,
        "numerical" => error_summary.numerical = errors,
        "transient" => error_summary.transient = errors,
        "model" => error_summary.model = errors,
        "runtime" => error_summary.runtime = errors,
        "hardware" => error_summary.hardware = errors,
        other => {
            error_summary.other.insert(other.to_owned(), errors);
        }
    }
    ExecutionStats {
        error_summary,
        execution_summary: ExecutionSummary { completed, ..ExecutionSummary::default() },
        latency_stats: LatencyStats { total_latency: latency(1.0), device_latency: latency(0.8) },
    }
}

fn system_vcpu_usage(vcpus: u32, seconds: f64) -> SystemVcpuUsage {
    let usage = |cpu: u32| {
        let user = 10.0 + f64::from(cpu % 4) * 2.5;
        let system = 3.0;
        CpuUsage { user, system, idle: 100.0 - user - system, ..CpuUsage::default() }
    };
    let usage_data: BTreeMap<u32, CpuUsage> = (0..vcpus).map(|c| (c, usage(c))).collect();
    let n = f64::from(vcpus.max(1));
    let mean = |f: fn(&CpuUsage) -> f64| round2(usage_data.values().map(f).sum::<f64>() / n);
    SystemVcpuUsage {
        average_usage: CpuUsage {
            user: mean(|u| u.user),
            system: mean(|u| u.system),
            idle: mean(|u| u.idle),
            ..CpuUsage::default()
        },
        usage_data,
        context_switch_count: (2000.0 * f64::from(vcpus) * seconds).round() as u64,
    }
}

fn hw_counters(devices: u32, ecc: bool) -> HwCounters {
    let neuron_devices = (0..devices)
        .map(|d| {
            let event = u64::from(ecc && d == 0);
            DeviceEcc {
                neuron_device_index: d,
                mem_ecc_corrected: event,
                mem_ecc_uncorrected: 0,
                sram_ecc_uncorrected: event,
                sram_ecc_corrected: 0,
            }
        })
        .collect();
    HwCounters { neuron_devices }
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}

fn round6(v: f64) -> f64 {
    (v * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;
    use crate::scenario::parse_app_spec;
    use api::hardware::INSTANCE_TYPES;
    use api::monitor_config::MonitorConfig;
    use api::report::{Group as G, Item, Report};

    fn generator(instance: &str, apps: &[&str], config: &str, errors: &[&str]) -> Generator {
        generator_with_ecc(instance, apps, config, errors, None)
    }

    fn generator_with_ecc(
        instance: &str,
        apps: &[&str],
        config: &str,
        errors: &[&str],
        ecc_every: Option<u64>,
    ) -> Generator {
        let specs = apps.iter().map(|s| parse_app_spec(s).unwrap()).collect();
        let errors = errors.iter().map(|g| GroupName::parse(g).unwrap()).collect();
        let instance = hardware::lookup(instance).unwrap();
        let scenario = Scenario::new(instance, "us-west-2".into(), specs, errors, ecc_every).unwrap();
        let config: MonitorConfig = serde_json::from_str(config).unwrap();
        Generator::new(scenario, Plan::new(&config).unwrap())
    }

    const ALL: &str = r#"{"period":"1s","neuron_runtimes":[{"metrics":[{"type":"neuroncore_counters"},
        {"type":"memory_used"},{"type":"neuron_runtime_vcpu_usage"},{"type":"execution_stats"}]}],
        "system_metrics":[{"type":"vcpu_usage"},{"type":"memory_info"},{"type":"neuron_hw_counters"}]}"#;

    /// The line written at simulated time `t_ms` (every group covering its nominal period).
    fn line_at(g: &mut Generator, t_ms: u64) -> String {
        let refreshes: Vec<Refresh> = g
            .plan()
            .due_at(t_ms)
            .into_iter()
            .map(|(key, nominal)| Refresh { key, nominal, covered: nominal.as_millis() as f64 / 1000.0 })
            .collect();
        serde_json::to_string(&g.document(&refreshes)).unwrap()
    }

    fn runtimes<'a>(report: &'a Report<'a>) -> Vec<&'a api::report::RuntimeEntry<'a>> {
        report
            .neuron_runtime_data
            .iter()
            .map(|item| match item {
                Item::Ok(r) => r,
                Item::Malformed(e) => panic!("malformed runtime: {e}"),
            })
            .collect()
    }

    #[test]
    fn every_instance_type_writes_documents_the_parser_reads_fully() {
        for t in INSTANCE_TYPES {
            let last = t.cores() - 1;
            let apps = ["tag=a,cores=0,util=50,rps=100".to_owned(), format!("tag=,cores={last},util=20,rps=0")];
            let apps: Vec<&str> = apps.iter().map(String::as_str).collect();
            let mut g = generator(t.name, &apps, ALL, &[]);
            let line = line_at(&mut g, 1000);
            assert!(!line.contains('\n'));
            let report = Report::parse(&line).unwrap();
            let rts = runtimes(&report);
            assert_eq!(rts.len(), 2, "{}", t.name);
            for rt in &rts {
                let groups = rt.report.as_ref().unwrap();
                assert!(matches!(groups.neuroncore_counters, Some(G::Ok(_))));
                let G::Ok(mem) = groups.memory_used.as_ref().unwrap() else { panic!() };
                assert_eq!(mem.loaded_models().unwrap().len(), 1);
                assert!(matches!(groups.neuron_runtime_vcpu_usage, Some(G::Ok(_))));
                assert!(matches!(groups.execution_stats, Some(G::Ok(_))));
            }
            assert_eq!(rts[1].neuron_runtime_tag.as_deref(), Some("1001"));
            let system = report.system_data.as_ref().unwrap();
            let G::Ok(vcpu) = system.vcpu_usage.as_ref().unwrap() else { panic!() };
            assert_eq!(vcpu.usage_data.as_ref().unwrap().len(), t.vcpus as usize);
            assert!(matches!(system.memory_info, Some(G::Ok(_))));
            let G::Ok(hw) = system.neuron_hw_counters.as_ref().unwrap() else { panic!() };
            assert_eq!(hw.neuron_devices.as_ref().unwrap().len(), t.devices as usize);
            let G::Ok(info) = report.neuron_hardware_info.as_ref().unwrap() else { panic!() };
            assert_eq!(info.core_count(), Some(t.cores()));
            let G::Ok(inst) = report.instance_info.as_ref().unwrap() else { panic!() };
            assert_eq!(inst.instance_type.as_deref(), Some(t.name));
        }
    }

    #[test]
    fn each_runtime_lists_every_host_core_with_zeros_on_the_others() {
        let mut g = generator("trn1.32xlarge", &["tag=a,cores=2-3,util=40", "tag=b,cores=7,util=90"], ALL, &[]);
        let line = line_at(&mut g, 1000);
        let report = Report::parse(&line).unwrap();
        let expected: [(&[u32], f64); 2] = [(&[2, 3], 40.0), (&[7], 90.0)];
        for (rt, (own, util)) in runtimes(&report).into_iter().zip(expected) {
            let groups = rt.report.as_ref().unwrap();
            let G::Ok(nc) = groups.neuroncore_counters.as_ref().unwrap() else { panic!() };
            let cores = nc.neuroncores_in_use.as_ref().unwrap();
            assert_eq!(cores.len(), 32);
            for (core, c) in cores.iter() {
                let expect = if own.contains(&core) { util } else { 0.0 };
                assert_eq!(c.neuroncore_utilization, Some(expect), "core {core}");
                assert_eq!(c.flops.unwrap() > 0.0, own.contains(&core));
            }
            let G::Ok(mem) = groups.memory_used.as_ref().unwrap() else { panic!() };
            let usage = mem.neuron_runtime_used_bytes.as_ref().unwrap();
            let per_core = usage.usage_breakdown.as_ref().unwrap().neuroncore_memory_usage.as_ref().unwrap();
            assert_eq!(per_core.len(), 32);
            for (core, m) in per_core.iter() {
                assert_eq!(m.is_held(), own.contains(&core), "core {core}");
            }
        }
    }

    #[test]
    fn subgraph_core_indices_are_runtime_local() {
        let mut g = generator("trn1.32xlarge", &["tag=a,cores=5,9,util=10"], ALL, &[]);
        let line = line_at(&mut g, 1000);
        let report = Report::parse(&line).unwrap();
        let rts = runtimes(&report);
        let G::Ok(mem) = rts[0].report.as_ref().unwrap().memory_used.as_ref().unwrap() else { panic!() };
        let models: Vec<api::report::LoadedModel> = mem
            .loaded_models()
            .unwrap()
            .items
            .into_iter()
            .map(|m| match m {
                Item::Ok(m) => m,
                Item::Malformed(e) => panic!("malformed model: {e}"),
            })
            .collect();
        let placed: Vec<(Option<u32>, Option<u32>)> = models
            .iter()
            .flat_map(|m| m.subgraphs().unwrap().0)
            .map(|(_, sg)| (sg.neuroncore_index, sg.neuron_device_index))
            .collect();
        // Host cores 5 and 9 sit on devices 2 and 4; the runtime counts them 0 and 1.
        assert_eq!(placed, vec![(Some(0), Some(2)), (Some(1), Some(4))]);
        assert!(models.iter().all(|m| m.is_running == Some(true) && m.name.as_deref().unwrap().ends_with(".neff")));
        assert_eq!(models.iter().map(|m| m.model_id).collect::<Vec<_>>(), [Some(10_001), Some(10_002)]);
    }

    #[test]
    fn an_error_type_of_a_newer_release_is_written_beside_the_documented_ones() {
        let config = r#"{"period":"1s","neuron_runtimes":[{"metrics":[{"type":"execution_stats"}]}]}"#;
        let mut g =
            generator("trn1.2xlarge", &["tag=a,cores=0,util=5,errors=2,error_type=memory_pressure"], config, &[]);
        let line = line_at(&mut g, 1000);
        let report = Report::parse(&line).unwrap();
        let rts = runtimes(&report);
        let G::Ok(stats) = rts[0].report.as_ref().unwrap().execution_stats.as_ref().unwrap() else { panic!() };
        let errors = stats.error_summary.as_ref().unwrap();
        assert_eq!(errors.get("memory_pressure"), Some(2.0));
        assert_eq!(errors.get("generic"), Some(0.0));
        assert_eq!((errors.entries.len(), errors.refused), (7, 0));
    }

    #[test]
    fn k8s_info_lists_the_pods_cores_and_whole_devices_when_asked_for() {
        let apps =
            ["tag=a,cores=0-2,util=50,pod=team/train/main", "tag=b,cores=4,util=5", "tag=c,cores=6,util=5,pod=x/y/z"];
        let asked = r#"{"period":"1s","system_metrics":[{"type":"neuron_k8s_info"}]}"#;
        let mut g = generator("trn1.32xlarge", &apps, asked, &[]);
        let line = line_at(&mut g, 1000);
        let report = Report::parse(&line).unwrap();
        let G::Ok(info) = report.k8s_info().unwrap() else { panic!("{line}") };
        let cores = info.neuroncores_k8s_info.as_ref().unwrap();
        let listed: Vec<(u32, &str)> = cores.iter().map(|(c, o)| (c, o.pod_name.as_deref().unwrap())).collect();
        assert_eq!(listed, [(0, "train"), (1, "train"), (2, "train"), (6, "y")]);
        let first = cores.get(0).unwrap();
        assert_eq!(first.namespace.as_deref(), Some("team"));
        assert_eq!(first.container_name.as_ref().unwrap().names, ["main"]);
        // trn1: two cores per device; only device 0 (cores 0 and 1) is held whole.
        let devices = info.neurondevices_k8s_info.as_ref().unwrap();
        assert_eq!(devices.iter().map(|(d, _)| d).collect::<Vec<_>>(), [0]);

        let mut not_asked = generator("trn1.32xlarge", &apps, ALL, &[]);
        assert!(!line_at(&mut not_asked, 1000).contains("neuron_k8s_info"));
        let mut failing = generator("trn1.32xlarge", &apps, asked, &["neuron_k8s_info"]);
        let line = line_at(&mut failing, 1000);
        assert!(matches!(Report::parse(&line).unwrap().k8s_info(), Some(G::Error(_))));
    }

    #[test]
    fn execution_counts_follow_rps_and_the_period() {
        let config = r#"{"period":"2s","neuron_runtimes":[{"metrics":[{"type":"execution_stats"}]}]}"#;
        let mut g = generator(
            "trn1.2xlarge",
            &["tag=busy,cores=0,util=50,rps=12.5,errors=0.5", "tag=idle,cores=1,util=0"],
            config,
            &[],
        );
        let line = line_at(&mut g, 2000);
        let report = Report::parse(&line).unwrap();
        let rts = runtimes(&report);
        let G::Ok(busy) = rts[0].report.as_ref().unwrap().execution_stats.as_ref().unwrap() else { panic!() };
        assert_eq!(busy.execution_summary.as_ref().unwrap().get("completed"), Some(25.0));
        assert_eq!(busy.error_summary.as_ref().unwrap().get("generic"), Some(1.0));
        let latency = busy.latency_stats.as_ref().unwrap();
        assert_eq!(latency.total_latency.as_ref().unwrap().get("p50"), Some(0.01));
        assert_eq!(latency.device_latency.as_ref().unwrap().get("p50"), Some(0.008));
        let G::Ok(idle) = rts[1].report.as_ref().unwrap().execution_stats.as_ref().unwrap() else { panic!() };
        assert_eq!(idle.execution_summary.as_ref().unwrap().get("completed"), Some(0.0));
        assert_eq!(idle.latency_stats.as_ref().unwrap().total_latency, None);
        // Only the configured group is written.
        assert!(rts[0].report.as_ref().unwrap().memory_used.is_none());
        assert!(report.system_data.unwrap().memory_info.is_none());
    }

    #[test]
    fn documents_carry_only_the_groups_due_in_their_tick() {
        let config = r#"{"period":"1s",
            "neuron_runtimes":[{"tag_filter":"^a$","period":"500ms","metrics":[{"type":"neuroncore_counters"}]},
                               {"tag_filter":"^b$","metrics":[{"type":"memory_used"}]}],
            "system_metrics":[{"type":"memory_info","period":"2s"}]}"#;
        let mut g = generator(
            "trn1.32xlarge",
            &["tag=a,cores=0,util=1", "tag=b,cores=1,util=1", "tag=c,cores=2,util=1"],
            config,
            &[],
        );
        let shape = |line: &str| {
            let report = Report::parse(line).unwrap();
            let rts: Vec<String> = runtimes(&report)
                .iter()
                .map(|r| {
                    let g = r.report.as_ref().unwrap();
                    format!(
                        "{}:{}{}",
                        r.neuron_runtime_tag.as_deref().unwrap(),
                        if g.neuroncore_counters.is_some() { "nc" } else { "" },
                        if g.memory_used.is_some() { "mem" } else { "" }
                    )
                })
                .collect();
            let sys = report.system_data.as_ref().unwrap().memory_info.is_some();
            (rts, sys)
        };
        assert_eq!(shape(&line_at(&mut g, 500)), (vec!["a:nc".to_owned()], false));
        assert_eq!(shape(&line_at(&mut g, 1000)), (vec!["a:nc".to_owned(), "b:mem".to_owned()], false));
        assert_eq!(shape(&line_at(&mut g, 2000)), (vec!["a:nc".to_owned(), "b:mem".to_owned()], true));
    }

    #[test]
    fn group_errors_carry_a_message_and_no_data() {
        let mut g = generator(
            "trn1.2xlarge",
            &["tag=a,cores=0,util=50,pid=4321"],
            ALL,
            &["neuron_runtime_vcpu_usage", "neuron_hw_counters"],
        );
        let line = line_at(&mut g, 1000);
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        let vcpu = &value["neuron_runtime_data"][0]["report"]["neuron_runtime_vcpu_usage"];
        assert_eq!(vcpu["error"], "open /proc/4321/stat: no such file or directory");
        assert!(vcpu.get("vcpu_usage").is_none());
        assert_eq!(vcpu["period"], 1.0);
        let hw = &value["system_data"]["neuron_hw_counters"];
        assert!(hw["error"].as_str().unwrap().contains("neuron_hw_counters"));
        assert!(hw.get("neuron_devices").is_none());

        let report = Report::parse(&line).unwrap();
        let rts = runtimes(&report);
        let groups = rts[0].report.as_ref().unwrap();
        assert!(matches!(groups.neuron_runtime_vcpu_usage, Some(G::Error(_))));
        assert!(matches!(groups.neuroncore_counters, Some(G::Ok(_))));
        assert!(matches!(report.system_data.unwrap().neuron_hw_counters, Some(G::Error(_))));
    }

    #[test]
    fn ecc_events_appear_on_every_nth_hardware_refresh() {
        let mut g = generator_with_ecc("trn1.32xlarge", &[], ALL, &[], Some(2));
        let mut seen = Vec::new();
        for t in [1000, 2000, 3000, 4000] {
            let value: serde_json::Value = serde_json::from_str(&line_at(&mut g, t)).unwrap();
            let devices = value["system_data"]["neuron_hw_counters"]["neuron_devices"].as_array().unwrap().clone();
            assert_eq!(devices[1]["mem_ecc_corrected"], 0);
            seen.push((
                devices[0]["mem_ecc_corrected"].as_u64().unwrap(),
                devices[0]["sram_ecc_uncorrected"].as_u64().unwrap(),
                devices[0]["mem_ecc_uncorrected"].as_u64().unwrap(),
            ));
        }
        assert_eq!(seen, vec![(0, 0, 0), (1, 1, 0), (0, 0, 0), (1, 1, 0)]);
    }

    #[test]
    fn values_are_the_same_every_tick() {
        let mut g = generator("inf2.24xlarge", &["tag=a,cores=0-3,util=33,rps=7"], ALL, &[]);
        let first = line_at(&mut g, 1000);
        let second = line_at(&mut g, 2000);
        assert_eq!(first, second);
        let value: serde_json::Value = serde_json::from_str(&first).unwrap();
        assert_eq!(
            value["neuron_runtime_data"][0]["report"]["neuroncore_counters"]["neuroncores_in_use"]["3"]
                ["neuroncore_utilization"],
            33.0
        );
    }
}
