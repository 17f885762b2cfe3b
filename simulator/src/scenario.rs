//! What the simulated host runs: the Neuron applications (`--app SPEC`) and the injected
//! group errors, checked against the instance's hardware.

use std::fmt;

use anyhow::{anyhow, bail, Result};
use api::monitor_config::{RuntimeGroup, SystemGroup};

use crate::hardware::InstanceType;

/// The application simulated when no `--app` is given.
pub const DEFAULT_APP: &str = "tag=sim-app,cores=0,util=50,rps=100";

const MIB: u64 = 1 << 20;

/// One `--app` specification as written, before it is placed on a host.
#[derive(Clone, Debug, PartialEq)]
pub struct AppSpec {
    /// Empty means "no NEURON_PROCESS_TAG": the pid becomes the tag.
    pub tag: String,
    pub cores: Vec<u32>,
    /// Percent, on each of the app's cores.
    pub util: f64,
    /// Completed executions per second.
    pub rps: f64,
    pub pid: Option<u32>,
    /// Execution errors per second, of `error_type`.
    pub errors: f64,
    /// `error_summary`'s key for them: `generic` unless given (another name is written
    /// beside the six documented ones, as a newer neuron-monitor would).
    pub error_type: Option<String>,
    pub host_mem: Option<u64>,
    /// The pod running the app, for `neuron_k8s_info`.
    pub pod: Option<PodName>,
}

/// `NAMESPACE/POD/CONTAINER` of an app spec's `pod=`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodName {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

/// A simulated Neuron application on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct App {
    pub pid: u32,
    /// `neuron_runtime_tag` as reported: the spec's tag, or the pid when it had none.
    pub tag: String,
    /// Host core indices, in the order given; the position is the runtime-local index.
    pub cores: Vec<u32>,
    pub util: f64,
    pub rps: f64,
    pub errors: f64,
    pub error_type: String,
    pub host_mem: u64,
    pub pod: Option<PodName>,
}

/// A metric group named on the command line (`--group-error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupName {
    Runtime(RuntimeGroup),
    System(SystemGroup),
}

impl GroupName {
    pub fn parse(name: &str) -> Result<GroupName, String> {
        let runtime = RuntimeGroup::ALL
            .into_iter()
            .find(|g| g.as_str() == name || (name == "inference_stats" && *g == RuntimeGroup::ExecutionStats))
            .map(GroupName::Runtime);
        let system = SystemGroup::ALL
            .into_iter()
            .chain([SystemGroup::NeuronK8sInfo])
            .find(|g| g.as_str() == name)
            .map(GroupName::System);
        runtime.or(system).ok_or_else(|| {
            let known: Vec<&str> = RuntimeGroup::ALL
                .iter()
                .map(|g| g.as_str())
                .chain(SystemGroup::ALL.iter().map(|g| g.as_str()))
                .collect();
            format!("unknown metric group {name:?}; known groups: {}", known.join(", "))
        })
    }
}

impl fmt::Display for GroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GroupName::Runtime(g) => f.write_str(g.as_str()),
            GroupName::System(g) => f.write_str(g.as_str()),
        }
    }
}

/// Everything the generated documents are made of.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub instance: InstanceType,
    pub region: String,
    pub apps: Vec<App>,
    pub group_errors: Vec<GroupName>,
    /// Every Nth refresh of `neuron_hw_counters` reports ECC events on device 0.
    pub ecc_every: Option<u64>,
}

impl Scenario {
    /// Places the specs on the host: default pids, tags and host memory, and core
    /// indices checked against the hardware.
    pub fn new(
        instance: InstanceType,
        region: String,
        specs: Vec<AppSpec>,
        group_errors: Vec<GroupName>,
        ecc_every: Option<u64>,
    ) -> Result<Scenario> {
        let mut apps: Vec<App> = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let pid = 1000 + i as u32;
            let app = place(&instance, &apps, spec, pid).map_err(|e| anyhow!("app {}: {e}", i + 1))?;
            apps.push(app);
        }
        Ok(Scenario { instance, region, apps, group_errors, ecc_every })
    }

    pub fn group_fails(&self, group: GroupName) -> bool {
        self.group_errors.contains(&group)
    }
}

/// The app a spec describes on the host beside `others`: its pid (`default_pid` when
/// the spec has none), tag and host memory, its cores checked against the hardware and
/// the other apps.
pub fn place(instance: &InstanceType, others: &[App], spec: AppSpec, default_pid: u32) -> Result<App> {
    let pid = spec.pid.unwrap_or(default_pid);
    if let Some(other) = others.iter().position(|a| a.pid == pid) {
        bail!("pid {pid} is already used by app {}", other + 1);
    }
    let host_cores = instance.cores();
    for &core in &spec.cores {
        if core >= host_cores {
            bail!("core {core} does not exist on {} (cores 0-{})", instance.name, host_cores - 1);
        }
        if let Some(other) = others.iter().position(|a| a.cores.contains(&core)) {
            bail!("core {core} is already held by app {}", other + 1);
        }
    }
    let tag = if spec.tag.is_empty() { pid.to_string() } else { spec.tag };
    let host_mem = spec.host_mem.unwrap_or(512 * MIB + 64 * MIB * spec.cores.len() as u64);
    Ok(App {
        pid,
        tag,
        cores: spec.cores,
        util: spec.util,
        rps: spec.rps,
        errors: spec.errors,
        error_type: spec.error_type.unwrap_or_else(|| "generic".to_owned()),
        host_mem,
        pod: spec.pod,
    })
}

/// Parses `tag=NAME,cores=0-3|0,2,5,util=NN[,rps=NN][,pid=NN][,errors=NN][,error_type=NAME]
/// [,host_mem=BYTES][,pod=NAMESPACE/POD/CONTAINER]`.
///
/// The core list may itself contain commas (`cores=0,2,5`): a bare item after `cores=`
/// continues the list.
pub fn parse_app_spec(spec: &str) -> Result<AppSpec> {
    let mut tag = None;
    let mut cores: Option<Vec<u32>> = None;
    let mut util = None;
    let mut rps = None;
    let mut pid = None;
    let mut errors = None;
    let mut error_type = None;
    let mut host_mem = None;
    let mut pod = None;
    // Whether the previous item was part of the core list.
    let mut in_cores = false;

    for item in spec.split(',').map(str::trim) {
        let Some((key, value)) = item.split_once('=') else {
            match (&mut cores, in_cores) {
                (Some(list), true) if !item.is_empty() => {
                    list.extend(parse_cores(item)?);
                    continue;
                }
                _ => bail!("app spec {spec:?}: {item:?} is not key=value"),
            }
        };
        let (key, value) = (key.trim(), value.trim());
        in_cores = key == "cores";
        let duplicate = match key {
            "tag" => tag.replace(value.to_owned()).is_some(),
            "cores" => cores.replace(parse_cores(value)?).is_some(),
            "util" => {
                let v = parse_number(key, value)?;
                if v > 100.0 {
                    bail!("util={value}: utilization is a percentage, at most 100");
                }
                util.replace(v).is_some()
            }
            "rps" => rps.replace(parse_number(key, value)?).is_some(),
            "errors" => errors.replace(parse_number(key, value)?).is_some(),
            "pid" => match value.parse::<u32>() {
                Ok(p) if p > 0 => pid.replace(p).is_some(),
                _ => bail!("pid={value}: not a positive process id"),
            },
            "host_mem" => match value.parse::<u64>() {
                Ok(b) => host_mem.replace(b).is_some(),
                _ => bail!("host_mem={value}: not a number of bytes"),
            },
            "error_type" => match value {
                "" => bail!("error_type=: an error type name is needed"),
                name => error_type.replace(name.to_owned()).is_some(),
            },
            "pod" => match value.split('/').collect::<Vec<_>>()[..] {
                [namespace, name, container] if !namespace.is_empty() && !name.is_empty() => {
                    let name = PodName {
                        namespace: namespace.to_owned(),
                        pod: name.to_owned(),
                        container: container.to_owned(),
                    };
                    pod.replace(name).is_some()
                }
                _ => bail!("pod={value}: not NAMESPACE/POD/CONTAINER"),
            },
            _ => bail!(
                "app spec {spec:?}: unknown key {key:?} \
                 (known: tag, cores, util, rps, pid, errors, error_type, host_mem, pod)"
            ),
        };
        if duplicate {
            bail!("app spec {spec:?}: {key} is given twice");
        }
    }

    let Some(cores) = cores else {
        bail!("app spec {spec:?}: cores= is missing");
    };
    for (i, core) in cores.iter().enumerate() {
        if cores[..i].contains(core) {
            bail!("app spec {spec:?}: core {core} is listed twice");
        }
    }
    let Some(util) = util else {
        bail!("app spec {spec:?}: util= is missing");
    };
    let tag = tag.unwrap_or_default();
    if tag.len() > 255 {
        bail!("app spec {spec:?}: tag is longer than 255 characters");
    }
    Ok(AppSpec {
        tag,
        cores,
        util,
        rps: rps.unwrap_or(0.0),
        pid,
        errors: errors.unwrap_or(0.0),
        error_type,
        host_mem,
        pod,
    })
}

/// `3` or `0-3`.
/// Core indices at most: above any instance type's count (128 on trn2 with LNC=1), and
/// the bound of a range before it is expanded.
const MAX_CORE_INDEX: u32 = 1023;

fn parse_cores(item: &str) -> Result<Vec<u32>> {
    let index = |s: &str| match s.trim().parse::<u32>() {
        Ok(i) if i <= MAX_CORE_INDEX => Ok(i),
        Ok(_) => bail!("cores: {item:?} names a core above {MAX_CORE_INDEX}"),
        Err(_) => bail!("cores: {item:?} is not a core index or range like 0-3"),
    };
    match item.split_once('-') {
        None => Ok(vec![index(item)?]),
        Some((first, last)) => {
            let (first, last) = (index(first)?, index(last)?);
            if first > last {
                bail!("cores: range {item:?} runs backwards");
            }
            Ok((first..=last).collect())
        }
    }
}

/// A list of core indices and ranges, like `0-3,8` (`NEURON_RT_VISIBLE_CORES`'s form),
/// each core once.
pub fn parse_core_list(list: &str) -> Result<Vec<u32>> {
    let mut cores: Vec<u32> = Vec::new();
    for item in list.split(',') {
        for core in parse_cores(item)? {
            if cores.contains(&core) {
                bail!("cores: core {core} is listed twice in {list:?}");
            }
            cores.push(core);
        }
    }
    Ok(cores)
}

fn parse_number(key: &str, value: &str) -> Result<f64> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => bail!("{key}={value}: not a non-negative number"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware;

    fn trn1_32() -> InstanceType {
        hardware::lookup("trn1.32xlarge").unwrap()
    }

    fn error_of(spec: &str) -> String {
        format!("{:#}", parse_app_spec(spec).unwrap_err())
    }

    #[test]
    fn parses_the_documented_forms() {
        let a = parse_app_spec("tag=bert,cores=0-3,util=75").unwrap();
        assert_eq!(a.tag, "bert");
        assert_eq!(a.cores, vec![0, 1, 2, 3]);
        assert_eq!(a.util, 75.0);
        assert_eq!((a.rps, a.errors, a.pid, a.host_mem), (0.0, 0.0, None, None));

        let b = parse_app_spec("tag=x,cores=0,2,5,util=12.5,rps=30,pid=4242,errors=2,host_mem=1048576").unwrap();
        assert_eq!(b.cores, vec![0, 2, 5]);
        assert_eq!((b.util, b.rps, b.errors), (12.5, 30.0, 2.0));
        assert_eq!((b.pid, b.host_mem), (Some(4242), Some(1_048_576)));

        let c = parse_app_spec("util=1, cores=4-5,8 ,tag=").unwrap();
        assert_eq!(c.cores, vec![4, 5, 8]);
        assert_eq!(c.tag, "");

        assert_eq!(parse_app_spec(DEFAULT_APP).unwrap().rps, 100.0);

        let d =
            parse_app_spec("tag=d,cores=1,util=5,errors=3,error_type=memory_pressure,pod=team/train-0/main").unwrap();
        assert_eq!(d.error_type.as_deref(), Some("memory_pressure"));
        let pod = PodName { namespace: "team".into(), pod: "train-0".into(), container: "main".into() };
        assert_eq!(d.pod, Some(pod));
        assert!(error_of("tag=a,cores=1,util=5,pod=team/train").contains("pod=team/train"));
    }

    #[test]
    fn refuses_bad_specs_naming_the_bad_part() {
        assert!(error_of("tag=a,cores=0,util=50,speed=3").contains("\"speed\""));
        assert!(error_of("tag=a,cores=0,util=lots").contains("util=lots"));
        assert!(error_of("tag=a,cores=0,util=150").contains("util=150"));
        assert!(error_of("tag=a,cores=3-1,util=5").contains("3-1"));
        assert!(error_of("tag=a,cores=x,util=5").contains("\"x\""));
        assert!(error_of("tag=a,cores=,util=5").contains("cores"));
        assert!(error_of("tag=a,util=5").contains("cores= is missing"));
        assert!(error_of("tag=a,cores=1").contains("util= is missing"));
        assert!(error_of("tag=a,cores=1,util=5,pid=0").contains("pid=0"));
        assert!(error_of("tag=a,cores=1,util=5,rps=-1").contains("rps=-1"));
        assert!(error_of("tag=a,cores=1,util=5,util=6").contains("util is given twice"));
        assert!(error_of("tag=a,cores=1,1,util=5").contains("core 1 is listed twice"));
        assert!(error_of("oops,tag=a,cores=1,util=5").contains("\"oops\""));
        assert!(error_of("tag=a,util=5,7,cores=1").contains("\"7\""));
    }

    #[test]
    fn places_apps_with_defaults() {
        let specs = vec![
            parse_app_spec("tag=,cores=0,util=10").unwrap(),
            parse_app_spec("tag=b,cores=1-2,util=20,pid=77").unwrap(),
        ];
        let s = Scenario::new(trn1_32(), "us-west-2".into(), specs, vec![], None).unwrap();
        assert_eq!((s.apps[0].pid, s.apps[0].tag.as_str()), (1000, "1000"));
        assert_eq!((s.apps[1].pid, s.apps[1].tag.as_str()), (77, "b"));
        assert_eq!(s.apps[1].host_mem, 640 * MIB);
    }

    #[test]
    fn refuses_cores_the_host_does_not_have_or_shares() {
        let on = |specs: &[&str], t: &str| {
            let specs = specs.iter().map(|s| parse_app_spec(s).unwrap()).collect();
            let instance = hardware::lookup(t).unwrap();
            Scenario::new(instance, "us-west-2".into(), specs, vec![], None).map(|_| ()).map_err(|e| e.to_string())
        };
        let err = on(&["tag=a,cores=2,util=5"], "trn1.2xlarge").unwrap_err();
        assert!(err.contains("core 2") && err.contains("trn1.2xlarge"), "{err}");
        assert!(on(&["tag=a,cores=31,util=5"], "trn1.32xlarge").is_ok());
        let err = on(&["tag=a,cores=0-1,util=5", "tag=b,cores=1,util=5"], "trn1.32xlarge");
        assert!(err.unwrap_err().contains("core 1 is already held by app 1"));
        let err = on(&["tag=a,cores=0,util=5,pid=9", "tag=b,cores=1,util=5,pid=9"], "trn1.32xlarge");
        assert!(err.unwrap_err().contains("pid 9"));
    }

    #[test]
    fn group_names_parse_including_the_old_alias() {
        assert_eq!(GroupName::parse("inference_stats"), Ok(GroupName::Runtime(RuntimeGroup::ExecutionStats)));
        assert_eq!(GroupName::parse("neuron_hw_counters"), Ok(GroupName::System(SystemGroup::NeuronHwCounters)));
        assert_eq!(GroupName::parse("neuron_k8s_info"), Ok(GroupName::System(SystemGroup::NeuronK8sInfo)));
        let err = GroupName::parse("gpu").unwrap_err();
        assert!(err.contains("\"gpu\"") && err.contains("memory_used"));
    }
}
