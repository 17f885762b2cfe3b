use std::{collections::VecDeque, time::Instant};

use super::*;
use crate::health::{
    kmsg::kernel_event,
    model::{HealthModel, ACTION_RELOAD},
    sysfs::{DeviceReading, DeviceState, NodeReading},
};

fn record(timestamp_ms: i64, pad: usize) -> Record {
    Record {
        time: String::new(),
        event: "fault",
        instance_id: None,
        node: None,
        device: Some(0),
        core: None,
        error: Some("E".repeat(pad)),
        component: None,
        counter: None,
        count: None,
        source: None,
        serial_number: None,
        action: None,
        state_before: None,
        state_after: "unhealthy",
        unknown_reason: None,
        pods: Vec::new(),
        driver_version: None,
        accelerator: "neuron",
        gpu: None,
        gpu_uuid: None,
        pci_bus_id: None,
        xid: None,
        timestamp_ms,
    }
}

fn size(r: &Record) -> usize {
    serde_json::to_string(r).unwrap().len() + EVENT_OVERHEAD_BYTES
}

#[test]
fn requests_hold_at_most_10000_events_and_1_mib_and_take_the_queue_in_order() {
    // A record is at least ~350 bytes of JSON (every key present, the GPU keys too), so
    // 1 MiB binds first.
    let mut queue: VecDeque<Record> = (0..25_000).map(|i| record(i, 1)).collect();
    let mut next = 0;
    while !queue.is_empty() {
        let batch = take_batch(&mut queue, &Identity::default());
        let bytes: usize = batch.events.iter().map(|e| e.message().len() + EVENT_OVERHEAD_BYTES).sum();
        assert!(batch.events.len() <= MAX_EVENTS_PER_REQUEST && bytes <= MAX_REQUEST_BYTES);
        assert!(batch.events.len() > 2500 || queue.is_empty(), "{} events", batch.events.len());
        for e in &batch.events {
            assert_eq!(e.timestamp(), next);
            next += 1;
        }
    }
    assert_eq!(next, 25_000);
}

#[test]
fn a_request_stays_within_1_mib_counting_26_bytes_an_event() {
    // Events of about 10 KiB: 1 MiB holds 102 of them with their overhead, not 103.
    let one = record(0, 10_200);
    let per_request = MAX_REQUEST_BYTES / size(&one);
    let mut queue: VecDeque<Record> = (0..300).map(|i| record(i, 10_200)).collect();
    let batch = take_batch(&mut queue, &Identity::default());
    assert_eq!(batch.events.len(), per_request);
    let bytes: usize = batch.events.iter().map(|e| e.message().len() + EVENT_OVERHEAD_BYTES).sum();
    assert!(bytes <= MAX_REQUEST_BYTES, "{bytes}");
    assert!(bytes + size(&one) > MAX_REQUEST_BYTES, "one more would not fit");
    // Exactly at the limit is allowed: the message bytes chosen so that n events fill it.
    let fill = record(0, 0);
    let n = 10;
    let pad = MAX_REQUEST_BYTES / n - size(&fill);
    let mut exact: VecDeque<Record> = (0..n as i64 + 1).map(|i| record(i, pad)).collect();
    let used: usize = (0..n).map(|_| size(&record(0, pad))).sum();
    assert!(used <= MAX_REQUEST_BYTES);
    assert_eq!(take_batch(&mut exact, &Identity::default()).events.len(), n);
    // One record over the limit alone (cannot be built from bounded fields) is left
    // out and counted, never retried in a loop.
    let mut huge: VecDeque<Record> = [record(0, MAX_REQUEST_BYTES), record(1, 1)].into();
    let batch = take_batch(&mut huge, &Identity::default());
    assert_eq!((batch.oversized, batch.events.len()), (1, 1));
}

#[test]
fn a_request_spans_at_most_24_hours_and_is_in_time_order() {
    let day = MAX_SPAN_MS;
    // Handed over out of order by the two readers: sorted within the request.
    let mut queue: VecDeque<Record> =
        [5_000, 4_000, 6_000, 4_000 + day, 4_001 + day, 10].into_iter().map(|t| record(t, 1)).collect();
    let first = take_batch(&mut queue, &Identity::default());
    let times: Vec<i64> = first.events.iter().map(|e| e.timestamp()).collect();
    assert_eq!(times, [4_000, 5_000, 6_000, 4_000 + day], "exactly 24 h apart is allowed");
    // 4_001 + day would stretch it past 24 h; then 10 would.
    for expected in [4_001 + day, 10] {
        let batch = take_batch(&mut queue, &Identity::default());
        let times: Vec<i64> = batch.events.iter().map(|e| e.timestamp()).collect();
        assert_eq!(times, [expected]);
        assert_eq!(batch.records[0].timestamp_ms, expected);
    }
    assert!(queue.is_empty());
}

#[test]
fn the_instance_id_names_the_events_and_the_stream() {
    let mut queue: VecDeque<Record> = [record(1, 1)].into();
    let identity = Identity { instance_id: Some("i-0abc".to_owned()), node: Some("node-a".to_owned()) };
    let batch = take_batch(&mut queue, &identity);
    let json: serde_json::Value = serde_json::from_str(batch.events[0].message()).unwrap();
    assert_eq!(json["instance_id"], "i-0abc");
    assert_eq!(identity.stream(), "i-0abc");
    assert_eq!(Identity { instance_id: None, node: Some("node-a".to_owned()) }.stream(), "node-a");
    assert!(!Identity::default().stream().is_empty(), "the host name, at worst `unknown`");
    assert_eq!(stream_name("a:b*c\n"), "a_b_c_");
    assert_eq!(stream_name(&"x".repeat(600)).len(), 512);
}

#[test]
fn log_group_names_and_destinations_are_checked() {
    let valid = |g: &str| api::validate::check_log_group(g).is_ok();
    assert!(valid(DEFAULT_LOG_GROUP));
    assert!(valid("team.a-b_c/#1") && valid(&"g".repeat(512)));
    assert!(!valid("") && !valid(&"g".repeat(513)));
    assert!(!valid("a b") && !valid("a:b") && !valid("é") && !valid("aws/reserved"));
    let dest = |group: &str, region: Option<&str>| LogDestination {
        group: group.to_owned(),
        region: region.map(str::to_owned),
    };
    assert_eq!(dest("/g", None).check(), Ok(()));
    assert_eq!(dest("/g", Some("us-west-2")).check(), Ok(()));
    assert_eq!(dest("/g", Some("mars")).check(), Err("region"));
    assert_eq!(dest("bad group", None).check(), Err("group"));
}

#[test]
fn refused_events_are_counted_from_the_indexes() {
    assert_eq!(rejected_count(10, None, None, None), 0);
    assert_eq!(rejected_count(10, Some(2), None, None), 3);
    assert_eq!(rejected_count(10, Some(2), Some(4), None), 5);
    assert_eq!(rejected_count(10, None, None, Some(7)), 3);
    assert_eq!(rejected_count(10, Some(9), None, Some(0)), 10, "never more than sent");
    assert_eq!(rejected_count(10, Some(-1), None, None), 0);
}

#[test]
fn a_full_queue_drops_its_oldest_events_and_counts_them() {
    let metrics = LogMetrics::default();
    let queue = Queue::new(3, metrics.clone());
    for t in 0..5 {
        queue.push([record(t, 1)]);
    }
    assert_eq!(queue.len(), 3);
    assert_eq!(send::oldest_ms(&queue), Some(2));
    assert_eq!(metrics.events.get_or_create(&ResultLabel { result: "dropped" }).get(), 2);
    assert_eq!(metrics.queue.get(), 3);
    // A failed request's events go back in front, in their order.
    let batch = send::take(&queue, &Identity::default());
    assert_eq!(batch.records.len(), 3);
    queue.put_back(batch.records);
    assert_eq!(send::oldest_ms(&queue), Some(2));
    assert_eq!(queue.len(), 3);
}

#[test]
fn records_name_the_fault_and_the_states_before_and_after() {
    let mut model = HealthModel::new("boot".to_owned(), Duration::from_secs(60));
    let ready = |index| DeviceReading {
        index,
        state: Some(DeviceState::Ready),
        ecc: [Some(0); 5],
        serial: Some("19fcda00f5ff6eb9".to_owned()),
        ..DeviceReading::default()
    };
    let node = NodeReading {
        driver_loaded: true,
        driver_version: Some("2.30.2.0".to_owned()),
        devices: vec![ready(0), ready(1)],
        ..NodeReading::default()
    };
    let changes = model.apply_reading(node, 1, Instant::now());
    let first = records(&changes, &model, 1_700_000_000_123);
    assert_eq!(first.len(), 1, "healthy devices at the first reading are no change; the node is");
    assert_eq!((first[0].event, first[0].device, first[0].state_before), ("state_change", None, Some("unknown")));
    assert_eq!(first[0].time, "2023-11-14T22:13:20.123Z");

    let line =
        "NEURON_HW_ERR=HBM_UNCORRECTABLE_ERROR nd-id=1 nc-id=3 serial-num=19FCDA00F5FF6EB9 action=TERMINATE_INSTANCE";
    let changes = model.apply_events(vec![(Some(1), kernel_event(line).unwrap())], Some(1), 2);
    let out = records(&changes, &model, 2_000);
    let kinds: Vec<(&str, Option<u32>)> = out.iter().map(|r| (r.event, r.device)).collect();
    assert_eq!(kinds, [("fault", Some(1)), ("state_change", Some(1)), ("state_change", None)]);
    let fault = &out[0];
    assert_eq!(fault.error.as_deref(), Some("HBM_UNCORRECTABLE_ERROR"));
    assert_eq!((fault.core, fault.serial_number.as_deref()), (Some(3), Some("19fcda00f5ff6eb9")));
    assert_eq!(fault.action.as_deref(), Some("TERMINATE_INSTANCE"));
    assert_eq!((fault.state_before, fault.state_after), (Some("healthy"), "unhealthy"));
    assert_eq!(fault.driver_version.as_deref(), Some("2.30.2.0"));
    assert_eq!(fault.source, Some(Source::KernelLog));
    assert_eq!(out[1].error.as_deref(), Some("HBM_UNCORRECTABLE_ERROR"));
    assert_eq!(out[1].serial_number.as_deref(), Some("19fcda00f5ff6eb9"), "the device's serial number");

    // A repairable error on an unhealthy device: a fault, no state change.
    let line = "NEURON_HW_ERR=REPAIRABLE_HBM_UNCORRECTABLE_ERROR nd-id=1";
    let changes = model.apply_events(vec![(Some(2), kernel_event(line).unwrap())], Some(2), 3);
    let out = records(&changes, &model, 3_000);
    assert_eq!(out.len(), 1);
    assert_eq!((out[0].state_before, out[0].state_after), (Some("unhealthy"), "unhealthy"));
    assert_eq!(out[0].action.as_deref(), Some(ACTION_RELOAD));

    // Every key present, null when it does not apply.
    let json: serde_json::Value = serde_json::to_value(&out[0]).unwrap();
    let keys: Vec<&str> = json.as_object().unwrap().keys().map(String::as_str).collect();
    for key in [
        "time",
        "event",
        "instance_id",
        "node",
        "device",
        "core",
        "error",
        "serial_number",
        "action",
        "state_before",
        "state_after",
        "pods",
        "driver_version",
    ] {
        assert!(keys.contains(&key), "{key} in {keys:?}");
    }
    assert!(!keys.contains(&"timestamp_ms"));
}

#[test]
fn the_feed_never_waits_and_counts_what_it_drops() {
    let metrics = LogMetrics::default();
    let (tx, destination) = watch::channel(None);
    let (feed, mut rx) = channel(destination, &metrics);
    let mut model = HealthModel::with_ready_devices(2);
    let e = kernel_event("NEURON_HW_ERR=DMA_ERROR nd-id=1").unwrap();
    let changes = model.apply_events(vec![(Some(1), e)], Some(1), 1);
    let per_update = records(&changes, &model, 0).len();
    assert_eq!(per_update, 3, "a fault, the device's state, the node's");
    // Off: nothing handed over.
    feed.send(&changes, &model);
    assert!(rx.try_recv().is_err());
    tx.send_replace(Some(LogDestination { group: "/g".to_owned(), region: None }));
    let updates = 1000;
    for _ in 0..updates {
        feed.send(&changes, &model);
    }
    let handed = updates * per_update;
    let mut received = 0;
    while rx.try_recv().is_ok() {
        received += 1;
    }
    assert_eq!(received, FEED_CAPACITY);
    let dropped = metrics.events.get_or_create(&ResultLabel { result: "dropped" }).get() as usize;
    assert_eq!(received + dropped, handed);
}

/// Yields until `done` holds (no clock involved: the runtime's time is paused).
async fn until(done: impl Fn() -> bool) {
    while !done() {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_destination_follows_its_watch_and_an_invalid_one_sends_nothing() {
    let metrics = LogMetrics::default();
    let (tx, destination) = watch::channel(None);
    let (feed, records_rx) = channel(destination.clone(), &metrics);
    let health: SharedHealth = Arc::new(Mutex::new(HealthModel::with_ready_devices(8)));
    let sink = LogSink {
        destination,
        records: records_rx,
        state: Arc::default(),
        health: health.clone(),
        devices: None,
        node_name: Some("node-a".to_owned()),
        options: LogOptions {
            queue_events: 100,
            flush_interval: Duration::ZERO,
            backoff: Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) },
            request_timeout: Duration::from_secs(1),
            shutdown_timeout: Duration::from_secs(1),
        },
        metrics: metrics.clone(),
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(sink.run(shutdown.clone()));
    let fault = |seq: u64| {
        let mut model = health.lock().unwrap();
        let e = kernel_event(&format!("NEURON_HW_ERR=DMA_ERROR nd-id={seq}")).unwrap();
        let changes = model.apply_events(vec![(Some(seq), e)], Some(seq), seq);
        feed.send(&changes, &model);
    };
    let dropped = || metrics.events.get_or_create(&ResultLabel { result: "dropped" }).get();
    // Off: nothing is handed over or queued.
    fault(1);
    tokio::task::yield_now().await;
    assert_eq!((metrics.queue.get(), dropped()), (0, 0));
    // Turned on with a group CloudWatch Logs would refuse: flagged, its events dropped
    // and counted, no request made.
    tx.send_replace(Some(LogDestination { group: "not a group".to_owned(), region: Some("us-west-2".to_owned()) }));
    fault(2);
    until(|| metrics.invalid.get() == 1 && dropped() == 2).await;
    assert_eq!(metrics.queue.get(), 0);
    assert_eq!(metrics.failures.get_or_create(&ReasonLabel { reason: "auth" }).get(), 0, "no request made");
    shutdown.cancel();
    task.await.unwrap();
    assert_eq!(metrics.events.get_or_create(&ResultLabel { result: "sent" }).get(), 0);
}

#[test]
fn gpu_records_name_the_gpu_the_xid_and_the_states() {
    use crate::gpu::{Gpu, GpuIdentity, GpuSnapshot};
    let mut model = HealthModel::new("b".to_owned(), std::time::Duration::from_secs(60));
    let gpu = Gpu {
        identity: GpuIdentity {
            index: 0,
            uuid: "GPU-0".into(),
            pci_bus_id: "00000000:53:00.0".into(),
            ..GpuIdentity::default()
        },
        ..Gpu::default()
    };
    let snapshot =
        GpuSnapshot { driver_version: "550.1".into(), gpus: vec![gpu], collections: 1, ..GpuSnapshot::default() };
    let first = records(&model.apply_gpu_snapshot(&snapshot, 1), &model, 1_000);
    assert_eq!(first.len(), 1, "the GPUs together: unknown → healthy");
    assert_eq!((first[0].accelerator, first[0].gpu, first[0].state_after), ("nvidia_gpu", None, "healthy"));
    let raw = "3,5,100,-;NVRM: Xid (PCI:0000:53:00): 79, pid=1, name=a, GPU has fallen off the bus.";
    let r = crate::health::kmsg::parse_record(raw).unwrap();
    let event = crate::health::kmsg::parse_event(r.text, Some(r.origin)).unwrap().unwrap();
    let changes = model.apply_events(vec![(Some(5), event)], Some(5), 2);
    let out = records(&changes, &model, 2_000);
    let fault = out.iter().find(|r| r.event == "fault").expect("a fault record");
    assert_eq!((fault.gpu, fault.xid, fault.device), (Some(0), Some(79), None));
    assert_eq!((fault.error.as_deref(), fault.action.as_deref()), (Some("XID_79"), Some("REBOOT_NODE")));
    assert_eq!((fault.gpu_uuid.as_deref(), fault.pci_bus_id.as_deref()), (Some("GPU-0"), Some("00000000:53:00.0")));
    assert_eq!((fault.state_before, fault.state_after), (Some("healthy"), "unhealthy"));
    assert_eq!(fault.driver_version.as_deref(), Some("550.1"));
    let changes: Vec<(&str, Option<u32>)> =
        out.iter().filter(|r| r.event == "state_change").map(|r| (r.state_after, r.gpu)).collect();
    assert_eq!(changes, [("unhealthy", Some(0)), ("unhealthy", None)]);
    // A Neuron record keeps its schema, with the GPU keys null.
    let json = serde_json::to_value(record(0, 1)).unwrap();
    assert_eq!((json["accelerator"].as_str(), json["gpu"].is_null()), (Some("neuron"), true));
}
