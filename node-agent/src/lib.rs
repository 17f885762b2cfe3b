//! The node agent: runs neuron-monitor, turns its reports into the node's telemetry and
//! exports it. In the order the data flows:
//!
//! - [`config`]: where the node configuration comes from (built-in, a file, the node's
//!   ConfigMap followed through the API) and the one path that puts it in force.
//! - [`state_dir`]: the directory only the agent writes (neuron-monitor's configuration
//!   files, the health state), checked before each write.
//! - [`kubernetes`]: the API client and the watch loop the agent's watches share.
//! - [`monitor`]: neuron-monitor as a supervised child (its own process group, restarts
//!   with backoff, silence detection) and the bounded framing of its output lines.
//! - [`pipeline`]: one line → one parsed report, counted and bounded.
//! - [`state`]: what the node looks like now, folded from the reports.
//! - [`identity`]: the instance identity of a node from its Node object, where no report
//!   gives it (GPUs and no Neuron device).
//! - [`attribution`]: processes and cores → pods (cgroups, the kubelet's pod-resources
//!   API, the pod watch).
//! - [`efa`]: the EFA devices' counters from sysfs, with the pods holding the devices,
//!   read off the report path.
//! - [`gpu`]: NVIDIA GPUs through NVML, read off the report path, under dcgm-exporter's
//!   names.
//! - [`processes`]: the applications' own processes (CPU, memory, threads, descriptors,
//!   I/O) from `/proc`, read after each report off the report path.
//! - [`routing`]: which config gets which applications, groups and sinks.
//! - [`series`]: the series encoder the sources and sinks share (families, labels, the
//!   scope of an encoding).
//! - [`health`]: Neuron hardware health from the driver's sysfs tree and the kernel log,
//!   read off the report path (a model per device, its series on `/metrics`).
//! - [`delivery`]: what every sender shares (queue, backoff, the AWS clients).
//! - [`sinks`]: Prometheus (`/metrics`), CloudWatch (`PutMetricData`) and OTLP.
//! - [`http`]: `/metrics`, `/healthz`, `/readyz`; [`telemetry`]: the agent's own metrics;
//!   [`ratelimit`]: logs that could repeat per report; [`timed_read`]: reads of files that
//!   may never return (sysfs attributes), with a deadline.

pub mod attribution;
pub mod config;
pub mod delivery;
pub mod efa;
pub mod gpu;
pub mod health;
pub mod http;
pub mod identity;
pub mod kubernetes;
pub mod monitor;
pub mod pipeline;
pub mod processes;
pub use service::ratelimit;
pub mod routing;
pub mod series;
pub mod sinks;
pub mod state;
pub mod state_dir;
pub mod telemetry;
pub mod timed_read;

#[cfg(test)]
pub(crate) mod testdata {
    pub use neuron_test_support::{fixture, TempDir, IDLE_INF1, TRN1N_32, TRN1_ERRORS};

    /// Attributes each runtime of `state` to a pod of its own, `serve-<i>` (container
    /// `main`), in the namespace `namespace(i)`.
    pub fn a_pod_per_runtime(state: &mut crate::state::NodeState, namespace: impl Fn(usize) -> &'static str) {
        for (i, rt) in state.runtimes.iter_mut().enumerate() {
            let pod = crate::state::PodRef {
                namespace: namespace(i).into(),
                pod: format!("serve-{i:02}"),
                owner: format!("serve-{i:02}"),
                container: "main".into(),
                labels: vec![],
            };
            std::sync::Arc::make_mut(&mut rt.labels).pod = Some(std::sync::Arc::new(pod));
        }
    }
}
