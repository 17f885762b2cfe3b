//! The agent's own health-reader metrics (`neuron_agent_health_*`): what the sysfs and
//! kernel-log readers read, refused and could not write.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use super::kmsg::Refusal;
use crate::telemetry::{ReasonLabel, SourceLabel, WhatLabel};

pub const SOURCE_SYSFS: &str = "sysfs";
pub const SOURCE_KMSG: &str = "kmsg";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabel {
    /// `start`, `event` (a `hw_error_event` notification) or `interval`.
    pub trigger: &'static str,
}

/// The agent's own health-reader metrics; cloning shares them.
#[derive(Clone, Default)]
pub struct HealthMetrics {
    pub sysfs_reads: Family<TriggerLabel, Counter>,
    pub sysfs_read_timeouts: Counter,
    pub sysfs_stuck_reads: Gauge,
    pub sysfs_held_files: Gauge,
    pub kmsg_records: Counter,
    pub kmsg_overruns: Counter,
    /// Records naming a hardware fault or a driver error, not taken, by reason.
    pub kmsg_refused: Family<ReasonLabel, Counter>,
    pub refused: Family<WhatLabel, Counter>,
    pub state_write_errors: Counter,
    pub up: Family<SourceLabel, Gauge>,
    /// Node Events of faults given up for the cap on those waiting.
    pub events_dropped: Counter,
}

impl HealthMetrics {
    pub fn register(registry: &mut Registry) -> Self {
        let m = HealthMetrics::default();
        // Every reason from the start, at 0: a refusal shows as an increase.
        for refusal in Refusal::ALL {
            let _ = m.kmsg_refused.get_or_create(&ReasonLabel { reason: refusal.as_str() });
        }
        let r = registry.sub_registry_with_prefix("neuron_agent_health");
        r.register(
            "sysfs_reads",
            "Reads of the Neuron driver's sysfs tree, by trigger (start, event: a hw_error_event notification, interval)",
            m.sysfs_reads.clone(),
        );
        r.register(
            "sysfs_read_timeouts",
            "Reads of the Neuron driver's sysfs tree that missed their deadline (a file whose read never returned: it is \
             skipped until it does, and its device is unknown)",
            m.sysfs_read_timeouts.clone(),
        );
        r.register(
            "sysfs_stuck_reads",
            "Sysfs files whose read has not returned (one thread each); source_up{source=\"sysfs\"} is 0 while any is",
            m.sysfs_stuck_reads.clone(),
        );
        r.register(
            "sysfs_held_files",
            "Descriptors of the Neuron driver's sysfs tree held open from one read to the next (files and directories)",
            m.sysfs_held_files.clone(),
        );
        r.register("kmsg_records", "Kernel-log records read", m.kmsg_records.clone());
        r.register(
            "kmsg_overruns",
            "Kernel-log overruns (EPIPE: records the kernel dropped before the agent read them); reading continues",
            m.kmsg_overruns.clone(),
        );
        r.register(
            "kmsg_refused",
            "Kernel-log records naming a Neuron hardware fault, driver error or NVIDIA Xid that the driver did not write as it \
             writes them, not taken, by reason (no_header, facility, level, position, name, device, unknown_device, \
             serial_mismatch, xid_format)",
            m.kmsg_refused.clone(),
        );
        r.register(
            "refused",
            "Health inputs beyond the limits, left out (sysfs_device, sysfs_core, kmsg_record_too_long, kmsg_field, \
             error_name, state_file)",
            m.refused.clone(),
        );
        r.register(
            "state_write_errors",
            "Failed writes of the persisted device health (the state directory)",
            m.state_write_errors.clone(),
        );
        r.register(
            "events_dropped",
            "Node Events of hardware faults given up: more were waiting for the API server than the cap \
             (api::limits::MAX_PENDING_HEALTH_EVENTS per kind of device); the Node condition still names the faults",
            m.events_dropped.clone(),
        );
        r.register(
            "source_up",
            "1 while a health source is readable (sysfs: the driver's device tree; kmsg: the kernel log, once its history is read)",
            m.up.clone(),
        );
        m
    }

    pub fn refused(&self, what: &'static str) {
        self.refused_by(what, 1);
    }

    pub fn refused_by(&self, what: &'static str, n: u64) {
        self.refused.get_or_create(&WhatLabel { what }).inc_by(n);
    }

    pub fn kmsg_refused(&self, refusal: Refusal) {
        self.kmsg_refused.get_or_create(&ReasonLabel { reason: refusal.as_str() }).inc();
    }

    pub fn source_up(&self, source: &'static str, up: bool) {
        self.up.get_or_create(&SourceLabel { source }).set(i64::from(up));
    }
}
