use std::time::Duration;

use super::*;
use crate::{
    gpu::{Gpu, GpuIdentity},
    health::{
        kmsg::{parse_event, parse_record, Event},
        model::HealthModel,
    },
};

fn gpu(index: u32) -> Gpu {
    Gpu {
        identity: GpuIdentity {
            index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: format!("00000000:{:02X}:00.0", 0x53 + index),
            device: format!("nvidia{index}"),
            model: "NVIDIA H100 80GB HBM3".to_owned(),
        },
        ..Gpu::default()
    }
}

fn snapshot(collections: u64, gpus: Vec<Gpu>) -> GpuSnapshot {
    GpuSnapshot { driver_version: "550.54.15".to_owned(), gpus, collections, ..GpuSnapshot::default() }
}

fn model_with(n: u32) -> HealthModel {
    let mut model = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
    model.apply_gpu_snapshot(&snapshot(1, (0..n).map(gpu).collect()), 1);
    model
}

fn xid_event(raw: &str) -> (Option<u64>, Event) {
    let record = parse_record(raw).unwrap();
    (Some(record.seq), parse_event(record.text, Some(record.origin)).unwrap().unwrap())
}

#[test]
fn gpus_are_unknown_until_collected_then_healthy() {
    let mut model = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
    assert!(!model.gpus.present());
    assert_eq!(model.gpus.node_state(), State::Unknown);
    let changes = model.apply_gpu_snapshot(&snapshot(1, vec![gpu(0), gpu(1)]), 1);
    assert_eq!(model.gpus.state_of(0), State::Healthy);
    assert_eq!(model.gpus.node_state(), State::Healthy);
    assert_eq!(changes.gpu_state_changes.len(), 1, "the GPUs together went from unknown to healthy");
}

#[test]
fn a_stale_snapshot_makes_every_healthy_gpu_unknown_until_the_next_collection() {
    let mut model = model_with(2);
    let mut stale = snapshot(1, vec![gpu(0), gpu(1)]);
    stale.stale = true;
    let changes = model.apply_gpu_snapshot(&stale, 2);
    assert_eq!((model.gpus.state_of(0), model.gpus.state_of(1)), (State::Unknown, State::Unknown));
    assert_eq!(changes.gpu_state_changes.len(), 3, "two GPUs and the node");
    model.apply_gpu_snapshot(&snapshot(2, vec![gpu(0), gpu(1)]), 3);
    assert_eq!(model.gpus.state_of(0), State::Healthy);
    let off = GpuSnapshot { off: true, ..snapshot(2, Vec::new()) };
    model.apply_gpu_snapshot(&off, 4);
    assert_eq!(model.gpus.state_of(0), State::Unknown, "switched off by the configuration");
}

#[test]
fn a_kernel_xid_79_makes_its_gpu_unhealthy_with_the_reason_and_the_action() {
    let mut model = model_with(2);
    let event =
        xid_event("3,40,1000,-;NVRM: Xid (PCI:0000:54:00): 79, pid=1234, name=python, GPU has fallen off the bus.");
    let changes = model.apply_events(vec![event], Some(40), 7);
    assert_eq!(model.gpus.state_of(1), State::Unhealthy);
    assert_eq!(model.gpus.state_of(0), State::Healthy);
    let reason = model.gpus.gpus[&1].worst().unwrap();
    assert_eq!(
        (reason.error.as_str(), reason.action.as_str(), reason.source),
        ("XID_79", "REBOOT_NODE", Source::KernelLog)
    );
    assert_eq!(changes.gpu_faults.len(), 1);
    assert_eq!(model.gpus.gpus[&1].last_xid, Some(79));
    assert_eq!(model.gpus.gpus[&1].xids["79"], 1);
    assert!(model.dirty, "persisted with the next write");
    // Again: counted, not new.
    let again = xid_event("3,41,1001,-;NVRM: Xid (PCI:0000:54:00): 79, pid=1234, name=python, x");
    let changes = model.apply_events(vec![again], Some(41), 8);
    assert!(changes.gpu_faults.is_empty());
    assert_eq!(model.gpus.gpus[&1].reasons["XID_79"].count, 2);
}

#[test]
fn informational_xids_are_counted_only_and_sxids_name_no_gpu() {
    let mut model = model_with(1);
    let app = xid_event("3,40,1000,-;NVRM: Xid (PCI:0000:53:00): 13, pid=9, name=a, Graphics Exception");
    let big = xid_event("3,41,1000,-;NVRM: Xid (PCI:0000:53:00): 4000, pid=9, name=a, new");
    let switch = xid_event("3,42,1000,-;nvidia-nvswitch2: SXid (PCI:0000:05:00.0): 12028, Non-fatal");
    let changes = model.apply_events(vec![app, big, switch], Some(42), 7);
    assert_eq!(model.gpus.state_of(0), State::Healthy);
    assert!(changes.gpu_faults.is_empty() && changes.refused.is_empty());
    let gpu = &model.gpus.gpus[&0];
    assert_eq!((gpu.xids["13"], gpu.xids["other"], gpu.last_xid), (1, 1, Some(4000)));
    assert_eq!(model.gpus.nvswitch_xids["12028"], 1);
}

#[test]
fn an_xid_for_an_address_no_collected_gpu_has_is_refused() {
    let mut model = model_with(1);
    let event = xid_event("3,40,1000,-;NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=a, b");
    let changes = model.apply_events(vec![event], Some(40), 7);
    assert_eq!(changes.refused, [Refusal::UnknownDevice]);
    assert_eq!(model.gpus.state_of(0), State::Healthy);
}

#[test]
fn lost_gpus_uncorrectable_ecc_and_remap_failures_are_faults_of_their_own() {
    let mut model = model_with(3);
    // Lost before NVML gave its handle: no identity but its index.
    let mut gpus =
        vec![Gpu { identity: GpuIdentity { index: 0, ..GpuIdentity::default() }, lost: true, ..Gpu::default() }];
    gpus.extend([gpu(1), gpu(2)]);
    gpus[1].values.ecc.uncorrected_volatile = Some(2);
    gpus[2].values.remapped_rows.failure = Some(1);
    let changes = model.apply_gpu_snapshot(&snapshot(2, gpus), 5);
    let names: Vec<&str> = changes.gpu_faults.iter().map(|(_, r)| r.error.as_str()).collect();
    assert_eq!(names, [GPU_LOST, ECC_UNCORRECTABLE, ROW_REMAP_FAILURE]);
    assert_eq!(model.gpus.node_state(), State::Unhealthy);
    assert_eq!(model.gpus.gpus[&1].reasons[ECC_UNCORRECTABLE].count, 2);
    assert_eq!(model.gpus.gpus[&0].identity.uuid, "GPU-0", "the lost GPU keeps the identity known");
}

#[test]
fn a_driver_reload_clears_the_faults() {
    let mut model = model_with(1);
    let mut first = gpu(0);
    first.values.energy_millijoules = Some(1_000_000);
    first.values.ecc.uncorrected_volatile = Some(1);
    model.apply_gpu_snapshot(&snapshot(2, vec![first]), 5);
    assert_eq!(model.gpus.state_of(0), State::Unhealthy);
    let mut reloaded = gpu(0);
    reloaded.values.energy_millijoules = Some(10);
    reloaded.values.ecc.uncorrected_volatile = Some(0);
    let changes = model.apply_gpu_snapshot(&snapshot(3, vec![reloaded]), 6);
    assert!(changes.gpu_reasons_cleared);
    assert_eq!((model.gpus.state_of(0), model.gpus.reloads), (State::Healthy, 1));
}

#[test]
fn faults_are_persisted_per_boot_and_restored_only_for_the_same_boot() {
    let mut model = model_with(2);
    let event = xid_event("3,40,1000,-;NVRM: Xid (PCI:0000:53:00): 48, pid=1, name=a, DBE");
    model.apply_events(vec![event], Some(40), 7);
    let saved = model.persisted();
    let text = serde_json::to_string(&saved).unwrap();
    let saved: crate::health::model::Persisted = serde_json::from_str(&text).unwrap();

    let mut same_boot = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
    assert!(same_boot.restore(saved.clone()));
    assert_eq!(same_boot.gpus.state_of(0), State::Unhealthy, "before the first collection too");
    assert_eq!(
        same_boot.unannounced_gpus().1.into_iter().map(|(k, _)| k).collect::<Vec<_>>(),
        [(0, "XID_48".to_owned())]
    );
    same_boot.apply_gpu_snapshot(&snapshot(1, vec![gpu(0), gpu(1)]), 8);
    assert_eq!((same_boot.gpus.state_of(0), same_boot.gpus.state_of(1)), (State::Unhealthy, State::Healthy));

    let mut next_boot = HealthModel::new("other".to_owned(), Duration::from_secs(60));
    assert!(!next_boot.restore(saved));
    assert!(!next_boot.gpus.present());
}

#[test]
fn a_state_file_of_an_agent_without_gpus_still_loads() {
    let old = r#"{"boot_id":"b","kmsg_seq":3,"devices":[],"node_reasons":[],"kernel_errors":[]}"#;
    let saved: crate::health::model::Persisted = serde_json::from_str(old).unwrap();
    assert!(saved.gpus.is_empty());
}

/// Issue 41, item 4: a GPU fault's Event not written before a restart is written after
/// it; one written is not written again.
#[test]
fn gpu_events_not_written_before_a_restart_are_written_after_it_and_only_those() {
    let mut model = model_with(2);
    model.apply_events(vec![xid_event("3,40,1000,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=a, off")], Some(40), 7);
    model.apply_events(vec![xid_event("3,41,1000,-;NVRM: Xid (PCI:0000:54:00): 48, pid=1, name=a, DBE")], Some(41), 8);
    let (reloads, pending) = model.unannounced_gpus();
    let keys: Vec<GpuFaultKey> = pending.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys, [(0, "XID_79".to_owned()), (1, "XID_48".to_owned())], "earliest first");
    model.announce_gpu(keys[1].clone(), reloads);
    let text = serde_json::to_string(&model.persisted()).unwrap();
    let saved: crate::health::model::Persisted = serde_json::from_str(&text).unwrap();
    let mut restarted = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
    assert!(restarted.restore(saved.clone()));
    let pending: Vec<GpuFaultKey> = restarted.unannounced_gpus().1.into_iter().map(|(k, _)| k).collect();
    assert_eq!(pending, [keys[0].clone()]);
    // A file without the lists: every fault was announced.
    let mut gpus = saved.gpus.clone();
    for g in &mut gpus {
        g.announced = None;
    }
    let mut old = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
    assert!(old.restore(crate::health::model::Persisted { gpus, ..saved }));
    assert!(old.unannounced_gpus().1.is_empty());
}
