//! `spec.gpu`: the GPU collector's settings a config of the operator's namespace gives
//! its nodes, checked and resolved into the rendered [`NodeGpu`].

use crate::crd::GpuSpec;
use crate::duration::Period;
use crate::gpu_groups::{GpuGroup, GpuGroups};
use crate::node_config::NodeGpu;

use super::{parse_period, Invalid};

/// Checks `spec.gpu` and resolves it: on unless `enabled: false`, at its own period, else
/// the config's (`period`). `cluster_wide`: the config is in the operator's namespace,
/// the only one whose configs may set it (the collector reads every GPU of the node, for
/// every namespace).
pub(super) fn node_gpu(
    spec: Option<&GpuSpec>,
    period: Period,
    cluster_wide: bool,
    operator_namespace: &str,
) -> Result<Option<NodeGpu>, Invalid> {
    let Some(spec) = spec else { return Ok(None) };
    if !cluster_wide {
        return Err(Invalid::new(
            "spec.gpu",
            format!(
                "only configs in the operator's namespace ({operator_namespace}) may set the nodes' GPU collection"
            ),
        ));
    }
    // Checked even while off, so that turning it on cannot fail later.
    let period = parse_period(spec.period.as_deref(), "spec.gpu.period")?.unwrap_or(period);
    Ok(Some(NodeGpu { enabled: spec.enabled.unwrap_or(true), period, groups: groups(spec.groups.as_deref())? }))
}

/// The groups named (every group when none are); an empty list would collect nothing
/// while saying it is on, so it is refused.
fn groups(named: Option<&[GpuGroup]>) -> Result<GpuGroups, Invalid> {
    match named {
        None => Ok(GpuGroups::ALL),
        Some([]) => Err(Invalid::new(
            "spec.gpu.groups",
            "names no group: name at least one, or set spec.gpu.enabled to false".to_owned(),
        )),
        Some(named) => Ok(named.iter().copied().collect()),
    }
}
