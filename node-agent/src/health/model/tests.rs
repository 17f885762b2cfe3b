use super::*;
use crate::health::{
    kmsg::kernel_event,
    sysfs::{parse_components, CoreReading},
};

fn ready(index: u32) -> DeviceReading {
    DeviceReading {
        index,
        core_count: Some(2),
        state: Some(DeviceState::Ready),
        ecc: [Some(0); 5],
        ..DeviceReading::default()
    }
}

fn node(devices: Vec<DeviceReading>) -> NodeReading {
    NodeReading { driver_loaded: true, devices, ..NodeReading::default() }
}

fn model() -> HealthModel {
    HealthModel::new("boot-a".to_owned(), Duration::from_secs(60))
}

fn event(text: &str) -> (Option<u64>, Event) {
    (Some(1), kernel_event(text).unwrap())
}

#[test]
fn ready_devices_are_healthy_and_no_driver_is_unknown() {
    let mut m = model();
    assert_eq!(m.node_state(), State::Unknown, "nothing read yet");
    m.apply_reading(node(vec![ready(0), ready(1)]), 10, Instant::now());
    assert_eq!(m.devices[&0].state(), State::Healthy);
    assert_eq!(m.node_state(), State::Healthy);
    let mut empty = model();
    empty.apply_reading(NodeReading::default(), 10, Instant::now());
    assert_eq!(empty.node_state(), State::Unknown);
    // The tree goes away: known devices become unknown, never healthy.
    m.apply_reading(NodeReading::default(), 11, Instant::now());
    assert_eq!(m.devices[&0].state(), State::Unknown);
    assert_eq!(m.devices[&0].unknown, Some("no_driver"));
}

#[test]
fn unreadable_resetting_and_silent_devices_are_unknown() {
    let mut m = model();
    let mut broken = ready(0);
    broken.unreadable.push("reset".to_owned());
    let mut resetting = ready(1);
    resetting.state = Some(DeviceState::Resetting);
    let silent = DeviceReading { index: 2, ..DeviceReading::default() };
    m.apply_reading(node(vec![broken, resetting, silent]), 10, Instant::now());
    let why: Vec<_> = m.devices.values().map(|d| (d.state(), d.unknown)).collect();
    assert_eq!(
        why,
        [
            (State::Unknown, Some("unreadable")),
            (State::Unknown, Some("resetting")),
            (State::Unknown, Some("no_health_files"))
        ]
    );
    assert_eq!(m.node_state(), State::Unknown);
    // One unhealthy device makes the node unhealthy, whatever the others are.
    let mut invalid = ready(3);
    invalid.state = Some(DeviceState::Invalid);
    m.apply_reading(node(vec![invalid, DeviceReading { index: 2, ..DeviceReading::default() }]), 11, Instant::now());
    assert_eq!(m.node_state(), State::Unhealthy);
}

#[test]
fn a_stalled_heartbeat_is_unknown() {
    let mut m = HealthModel::new("b".to_owned(), Duration::from_secs(30));
    let t0 = Instant::now();
    let beat = |v: &str| DeviceReading { heartbeat: Some(v.to_owned()), ..ready(0) };
    m.apply_reading(node(vec![beat("1")]), 0, t0);
    m.apply_reading(node(vec![beat("2")]), 20, t0 + Duration::from_secs(20));
    m.apply_reading(node(vec![beat("2")]), 45, t0 + Duration::from_secs(45));
    assert_eq!(m.devices[&0].state(), State::Healthy, "25 s without a change");
    m.apply_reading(node(vec![beat("2")]), 60, t0 + Duration::from_secs(60));
    assert_eq!((m.devices[&0].state(), m.devices[&0].unknown), (State::Unknown, Some("heartbeat_stalled")));
    m.apply_reading(node(vec![beat("3")]), 61, t0 + Duration::from_secs(61));
    assert_eq!(m.devices[&0].state(), State::Healthy);
}

#[test]
fn each_sysfs_fault_makes_its_device_unhealthy_with_its_reason() {
    let mut m = model();
    let mut hbm = ready(0);
    hbm.ecc[0] = Some(2);
    let mut repairable = ready(1);
    repairable.ecc[1] = Some(1);
    let mut component = ready(2);
    component.components = Some(parse_components("link_efa\n"));
    let mut invalid = ready(3);
    invalid.state = Some(DeviceState::Invalid);
    let mut dma = ready(4);
    dma.cores = vec![CoreReading { index: 1, errors: [None, None, Some(1), None, None] }];
    let changes = m.apply_reading(node(vec![hbm, repairable, component, invalid, dma]), 100, Instant::now());
    let faults: Vec<_> = changes.new_faults.iter().map(|(d, r)| (d.unwrap(), r.error.as_str())).collect();
    assert_eq!(
        faults,
        [
            (0, "HBM_UNCORRECTABLE_ERROR"),
            (1, REPAIRABLE_HBM_ERROR),
            (2, UNHEALTHY_COMPONENT),
            (3, DEVICE_STATE_INVALID),
            (4, "DMA_ERROR")
        ]
    );
    assert!(m.devices.values().all(|d| d.state() == State::Unhealthy));
    let repair = m.devices[&1].worst().unwrap();
    assert_eq!(repair.action, ACTION_RELOAD, "repairable: reload the driver, not replace the instance");
    assert_eq!(m.devices[&0].worst().unwrap().action, ACTION_TERMINATE);
    assert_eq!(m.devices[&2].worst().unwrap().component, "link_efa");
    assert_eq!(m.devices[&4].worst().unwrap().core, Some(1));
    assert_eq!(m.devices[&0].worst().unwrap().count, 2);
    // Unchanged counters: nothing new, the first-seen time stays.
    let mut again = ready(0);
    again.ecc[0] = Some(3);
    let changes = m.apply_reading(node(vec![again]), 200, Instant::now());
    assert!(changes.new_faults.is_empty());
    let r = m.devices[&0].worst().unwrap();
    assert_eq!((r.first_seen, r.last_seen, r.count), (100, 200, 3));
}

#[test]
fn kernel_records_are_counted_and_sticky() {
    let mut m = model();
    m.apply_reading(node(vec![ready(0), ready(1)]), 10, Instant::now());
    let line = "NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=1 nc-id=0 serial-num=abc action=TERMINATE_INSTANCE";
    let changes = m.apply_events(vec![event(line), event(line)], Some(7), 20);
    assert_eq!(changes.new_faults.len(), 1, "one new fault, counted twice");
    assert_eq!(m.kernel_errors[&(Some(1), "NC_UNCORRECTABLE_ERROR".to_owned())], 2);
    assert_eq!(m.devices[&1].state(), State::Unhealthy);
    assert_eq!(m.devices[&1].worst().unwrap().count, 2);
    assert_eq!(m.devices[&1].worst().unwrap().serial.as_deref(), Some("abc"));
    // A later healthy-looking reading does not clear it.
    m.apply_reading(node(vec![ready(0), ready(1)]), 30, Instant::now());
    assert_eq!(m.devices[&1].state(), State::Unhealthy);
    assert_eq!(m.node_state(), State::Unhealthy);
}

#[test]
fn kernel_records_name_a_device_of_the_tree_with_its_serial_number() {
    let mut m = model();
    let mut with_serial = ready(1);
    with_serial.serial = Some("19fcda00f5ff6e01".to_owned());
    m.apply_reading(node(vec![ready(0), with_serial]), 10, Instant::now());
    let changes = m.apply_events(
        vec![
            event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=2"),
            event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1 serial-num=deadbeefdeadbeef"),
        ],
        Some(3),
        11,
    );
    assert_eq!(changes.refused, [Refusal::UnknownDevice, Refusal::SerialMismatch]);
    assert!(changes.new_faults.is_empty() && m.kernel_errors.is_empty());
    assert_eq!(m.node_state(), State::Healthy);
    // The tree's serial number (any case in the record), or none in the record.
    let changes = m.apply_events(
        vec![
            event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1 serial-num=19FCDA00F5FF6E01"),
            event("NEURON_HW_ERR=DMA_ERROR nd-id=0 serial-num=0123456789abcdef"),
        ],
        Some(4),
        12,
    );
    assert!(changes.refused.is_empty(), "{changes:?}");
    assert_eq!(changes.new_faults.len(), 2);
    // Before any reading of the tree, no device is known.
    let mut fresh = model();
    let changes = fresh.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], None, 1);
    assert_eq!(changes.refused, [Refusal::UnknownDevice]);
}

#[test]
fn a_driver_reload_clears_the_reasons() {
    let mut m = model();
    let mut faulty = ready(0);
    faulty.ecc[0] = Some(1);
    faulty.hw_error_event = Some(5);
    m.apply_reading(node(vec![faulty]), 10, Instant::now());
    m.apply_events(vec![event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=0")], None, 11);
    assert_eq!(m.devices[&0].state(), State::Unhealthy);
    // Counters back to zero: the driver was reloaded.
    let changes = m.apply_reading(node(vec![ready(0)]), 20, Instant::now());
    assert!(changes.reasons_cleared);
    assert_eq!(m.devices[&0].state(), State::Healthy);
    // The tree going away and coming back is a reload too.
    m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], None, 21);
    m.apply_reading(NodeReading::default(), 22, Instant::now());
    assert_eq!(m.devices[&0].state(), State::Unhealthy);
    m.apply_reading(node(vec![ready(0)]), 23, Instant::now());
    assert_eq!(m.devices[&0].state(), State::Healthy);
}

#[test]
fn persisted_state_survives_a_restart_of_the_same_boot_only() {
    let mut m = model();
    m.apply_reading(node(vec![ready(0)]), 10, Instant::now());
    m.apply_events(vec![event("NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=0")], Some(42), 11);
    let saved = m.persisted();
    let text = serde_json::to_string(&saved).unwrap();
    let back: Persisted = serde_json::from_str(&text).unwrap();
    let mut restarted = model();
    assert!(restarted.restore(back.clone()));
    assert_eq!(restarted.kmsg_seq, Some(42));
    let sram = (Some(0), "SRAM_UNCORRECTABLE_ERROR".to_owned(), String::new(), String::new());
    assert_eq!(restarted.unannounced().1.into_iter().map(|(k, _)| k).collect::<Vec<_>>(), [sram], "no Event yet");
    restarted.apply_reading(node(vec![ready(0)]), 20, Instant::now());
    assert_eq!(restarted.devices[&0].state(), State::Unhealthy);
    assert_eq!(restarted.kernel_errors[&(Some(0), "SRAM_UNCORRECTABLE_ERROR".to_owned())], 1);
    let mut rebooted = HealthModel::new("boot-b".to_owned(), Duration::from_secs(60));
    assert!(!rebooted.restore(back));
    assert!(rebooted.devices.is_empty());
}

#[test]
fn error_names_are_bounded_with_the_documented_names_kept() {
    let mut m = model();
    m.apply_reading(node(vec![ready(0)]), 1, Instant::now());
    let events: Vec<_> =
        (0..MAX_HEALTH_ERROR_NAMES + 3).map(|i| event(&format!("NEURON_HW_ERR=E{i} nd-id=0"))).collect();
    let changes = m.apply_events(events, None, 1);
    let kept = MAX_UNDOCUMENTED_ERROR_NAMES;
    assert_eq!(changes.names_over_limit, (MAX_HEALTH_ERROR_NAMES + 3 - kept) as u64);
    assert_eq!(m.kernel_errors[&(Some(0), OTHER_ERROR.to_owned())], (MAX_HEALTH_ERROR_NAMES + 3 - kept) as u64);
    // Every documented name still has its slot, and the table stays within the limit.
    let documented: Vec<String> =
        DEFAULT_TAINT_ERRORS.iter().map(|n| n.to_string()).chain([REPAIRABLE_HBM_ERROR.to_owned()]).collect();
    let events = documented.iter().map(|n| event(&format!("NEURON_HW_ERR={n} nd-id=0"))).collect();
    let changes = m.apply_events(events, None, 2);
    assert_eq!(changes.names_over_limit, 0);
    for name in &documented {
        assert!(documented_error(name));
        assert_eq!(m.kernel_errors[&(Some(0), name.clone())], 1, "{name}");
    }
    let names: std::collections::BTreeSet<&String> = m.kernel_errors.keys().map(|(_, n)| n).collect();
    assert_eq!(names.len(), MAX_HEALTH_ERROR_NAMES);
}

#[test]
fn neuron_monitor_fills_in_what_sysfs_and_the_kernel_log_did_not_say() {
    let mut m = model();
    // Device 0 has a sysfs reading, device 1 none (an older driver, or no tree mounted).
    m.apply_reading(node(vec![ready(0)]), 100, Instant::now());
    let signals = MonitorSignals { uncorrected_ecc: vec![(0, "hbm", 2), (1, "sram", 1)], hardware_errors: vec![] };
    let changes = m.apply_monitor(&signals, 110);
    // Device 0's own counters say nothing: the driver's tree wins over neuron-monitor.
    assert_eq!(m.devices[&0].state(), State::Healthy);
    assert_eq!(m.devices[&1].state(), State::Unhealthy);
    assert_eq!(changes.new_faults.len(), 1, "{changes:?}");
    let (device, reason) = &changes.new_faults[0];
    assert_eq!(
        (*device, reason.error.as_str(), reason.source),
        (Some(1), "SRAM_UNCORRECTABLE_ERROR", Source::NeuronMonitor)
    );
    // The same count again is no new fault.
    assert!(m.apply_monitor(&signals, 120).new_faults.is_empty());

    // Executions failed by a hardware error on device 0, which has no reason yet.
    let errors = MonitorSignals { uncorrected_ecc: vec![], hardware_errors: vec![(0, 3)] };
    let changes = m.apply_monitor(&errors, 130);
    assert_eq!(m.devices[&0].state(), State::Unhealthy);
    assert_eq!(changes.new_faults.len(), 1);
    assert_eq!(m.devices[&0].worst().map(|r| (r.error.as_str(), r.count)), Some((EXECUTION_HW_ERROR, 3)));
    // Nothing counted: nothing changes.
    let none = MonitorSignals { uncorrected_ecc: vec![(2, "hbm", 0)], hardware_errors: vec![(3, 0)] };
    assert!(m.apply_monitor(&none, 140).new_faults.is_empty());
    assert!(!m.devices.contains_key(&2) && !m.devices.contains_key(&3));
}

/// The outputs that follow the model wake at each fold that may change what it shows,
/// and only then: a report that counts nothing, a batch of the kernel log without an
/// event, leave them asleep.
#[test]
fn folds_that_may_change_the_model_wake_its_followers() {
    let mut m = model();
    let mut changed = m.subscribe();
    let mut woke = || {
        let woke = changed.has_changed().unwrap_or(false);
        changed.mark_unchanged();
        woke
    };
    m.apply_reading(node(vec![ready(0)]), 100, Instant::now());
    assert!(woke(), "a reading");
    let nothing = MonitorSignals { uncorrected_ecc: vec![(0, "hbm", 0)], hardware_errors: vec![(0, 0)] };
    m.apply_monitor(&nothing, 101);
    m.apply_events(vec![], Some(7), 101);
    assert!(!woke(), "nothing counted, no event");
    m.apply_monitor(&MonitorSignals { uncorrected_ecc: vec![], hardware_errors: vec![(1, 2)] }, 102);
    assert!(woke(), "a report that counts");
    m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], Some(8), 103);
    assert!(woke(), "a kernel record");
}

#[test]
fn a_device_the_kernel_log_named_takes_no_execution_error_reason() {
    let mut m = model();
    m.apply_reading(node(vec![ready(4)]), 99, Instant::now());
    m.apply_events(vec![event("NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=4 nc-id=1")], Some(1), 100);
    let changes = m.apply_monitor(&MonitorSignals { uncorrected_ecc: vec![], hardware_errors: vec![(4, 1)] }, 101);
    assert!(changes.new_faults.is_empty(), "{changes:?}");
    assert_eq!(m.devices[&4].reasons.len(), 1);
}

#[test]
fn updates_report_the_state_changes_they_make() {
    let change = |device, before, after| StateChange { device, before, after };
    let mut m = model();
    // The first reading: healthy devices are no change, the node's state is (unknown before).
    let mut silent = ready(1);
    silent.state = Some(DeviceState::Resetting);
    let changes = m.apply_reading(node(vec![ready(0), silent]), 10, Instant::now());
    assert_eq!(changes.state_changes, [change(Some(1), None, State::Unknown)]);
    let changes = m.apply_reading(node(vec![ready(0), ready(1)]), 11, Instant::now());
    assert_eq!(
        changes.state_changes,
        [change(Some(1), Some(State::Unknown), State::Healthy), change(None, Some(State::Unknown), State::Healthy)]
    );
    assert!(m.apply_reading(node(vec![ready(0), ready(1)]), 12, Instant::now()).state_changes.is_empty());
    // A kernel record: the device and the node turn unhealthy, and the fault knows both states.
    let changes = m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=1")], Some(2), 13);
    assert_eq!(
        changes.state_changes,
        [change(Some(1), Some(State::Healthy), State::Unhealthy), change(None, Some(State::Healthy), State::Unhealthy)]
    );
    assert_eq!(changes.states_of(Some(1), State::Unhealthy), (Some(State::Healthy), State::Unhealthy));
    assert_eq!(changes.states_of(Some(0), State::Healthy), (Some(State::Healthy), State::Healthy));
    // A second fault of an unhealthy device changes no state.
    let changes = m.apply_events(vec![event("NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1")], Some(3), 14);
    assert_eq!((changes.new_faults.len(), changes.state_changes.len()), (1, 0));
}

fn with_thresholds(m: &mut HealthModel, thresholds: &[(&str, u32, u64)]) {
    let map = thresholds
        .iter()
        .map(|(e, count, window_secs)| {
            ((*e).to_owned(), thresholds::Threshold { count: *count, window_secs: *window_secs })
        })
        .collect();
    m.set_thresholds(&std::sync::Arc::new(map));
}

#[test]
fn a_thresholded_error_turns_its_device_unhealthy_only_at_the_count_within_the_window() {
    let mut m = model();
    with_thresholds(&mut m, &[("DMA_ERROR", 3, 600)]);
    m.apply_reading(node(vec![ready(0), ready(1)]), 10, Instant::now());
    let dma = |m: &mut HealthModel, at| m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], None, at);
    assert!(dma(&mut m, 100).new_faults.is_empty());
    assert!(dma(&mut m, 200).new_faults.is_empty());
    assert_eq!(m.devices[&0].state(), State::Healthy, "two of three");
    assert_eq!(m.kernel_errors[&(Some(0), "DMA_ERROR".to_owned())], 2, "every record counted");
    // Outside the window: the first is forgotten.
    assert!(dma(&mut m, 701).new_faults.is_empty());
    assert_eq!(m.devices[&0].state(), State::Healthy);
    let changes = dma(&mut m, 702);
    assert_eq!(changes.new_faults.len(), 1, "200, 701 and 702 within 10 minutes");
    assert_eq!(m.devices[&0].state(), State::Unhealthy);
    assert_eq!(m.devices[&0].worst().unwrap().first_seen, 702);
    // Another error name keeps its first occurrence.
    m.apply_events(vec![event("NEURON_HW_ERR=NC_UNCORRECTABLE_ERROR nd-id=1")], None, 703);
    assert_eq!(m.devices[&1].state(), State::Unhealthy);
}

#[test]
fn a_thresholded_counter_counts_its_increases() {
    let mut m = model();
    with_thresholds(&mut m, &[("HBM_UNCORRECTABLE_ERROR", 3, 60)]);
    let ecc = |n| {
        let mut d = ready(0);
        d.ecc[0] = Some(n);
        node(vec![d])
    };
    m.apply_reading(ecc(1), 10, Instant::now());
    m.apply_reading(ecc(2), 20, Instant::now());
    m.apply_reading(ecc(2), 30, Instant::now());
    assert_eq!(m.devices[&0].state(), State::Healthy, "two increases in a minute");
    let changes = m.apply_reading(ecc(3), 40, Instant::now());
    assert_eq!(changes.new_faults.len(), 1);
    assert_eq!(m.devices[&0].worst().unwrap().count, 3);
}

#[test]
fn pending_occurrences_survive_a_restart_and_a_driver_reload_forgets_them() {
    let mut m = model();
    with_thresholds(&mut m, &[("DMA_ERROR", 2, 600)]);
    m.apply_reading(node(vec![ready(0)]), 10, Instant::now());
    m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], Some(7), 100);
    assert_eq!(m.devices[&0].state(), State::Healthy);
    let text = serde_json::to_string(&m.persisted()).unwrap();
    let mut restarted = model();
    assert!(restarted.restore(serde_json::from_str(&text).unwrap()));
    with_thresholds(&mut restarted, &[("DMA_ERROR", 2, 600)]);
    restarted.apply_reading(node(vec![ready(0)]), 110, Instant::now());
    restarted.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], Some(8), 120);
    assert_eq!(restarted.devices[&0].state(), State::Unhealthy, "the first occurrence was kept");

    // A reload in between: the count starts again.
    let mut m = model();
    with_thresholds(&mut m, &[("DMA_ERROR", 2, 600)]);
    m.apply_reading(node(vec![ready(0)]), 10, Instant::now());
    m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], None, 100);
    m.apply_reading(NodeReading::default(), 101, Instant::now());
    m.apply_reading(node(vec![ready(0)]), 102, Instant::now());
    assert!(m.gate.pending.is_empty(), "{:?}", m.gate.pending);
    m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=0")], None, 103);
    assert_eq!(m.devices[&0].state(), State::Healthy, "one occurrence since the reload");
    // A file without pending faults has no key for them (older agents read it).
    assert!(!serde_json::to_string(&model().persisted()).unwrap().contains("pending"));
}

/// Issue 41, item 4: which faults have their Event is persisted with them: an Event not
/// written before a restart is written after it, one written is not written again.
#[test]
fn events_not_written_before_a_restart_are_written_after_it_and_only_those() {
    let mut m = model();
    m.apply_reading(node(vec![ready(0), ready(1)]), 10, Instant::now());
    m.apply_events(
        vec![event("NEURON_HW_ERR=SRAM_UNCORRECTABLE_ERROR nd-id=0"), event("NEURON_HW_ERR=DMA_ERROR nd-id=1")],
        Some(42),
        11,
    );
    let (reloads, pending) = m.unannounced();
    let keys: Vec<FaultKey> = pending.into_iter().map(|(k, _)| k).collect();
    assert_eq!(keys.len(), 2);
    let saves = m.subscribe_saves();
    m.dirty = false;
    m.announce(keys[0].clone(), reloads);
    assert!(m.dirty && saves.has_changed().unwrap(), "an Event written is persisted at once");
    let saved: Persisted = serde_json::from_str(&serde_json::to_string(&m.persisted()).unwrap()).unwrap();

    let mut restarted = model();
    assert!(restarted.restore(saved.clone()));
    let (_, pending) = restarted.unannounced();
    assert_eq!(pending.into_iter().map(|(k, _)| k).collect::<Vec<_>>(), [keys[1].clone()]);
    // A file of an agent before the list: every fault restored was announced by it.
    let mut old = model();
    assert!(old.restore(Persisted { announced: None, ..saved }));
    assert!(old.unannounced().1.is_empty());

    // A driver reload clears the faults: one that comes back is news again, and an
    // Event written for it before the reload does not count.
    m.apply_reading(node(vec![ready(0), ready(1)]), 12, Instant::now());
    let (before, _) = m.unannounced();
    m.apply_reading(NodeReading::default(), 13, Instant::now());
    m.apply_reading(node(vec![ready(0), ready(1)]), 14, Instant::now());
    assert!(m.reloads > before);
    m.announce(keys[1].clone(), before);
    m.apply_events(vec![event("NEURON_HW_ERR=DMA_ERROR nd-id=1")], Some(43), 15);
    assert_eq!(m.unannounced().1.into_iter().map(|(k, _)| k).collect::<Vec<_>>(), [keys[1].clone()]);
}
