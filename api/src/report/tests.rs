use neuron_test_support::{fixture, IDLE_INF1, TRN1N_32, TRN1_ERRORS};

use super::*;

fn runtimes<'r, 'a>(report: &'r Report<'a>) -> Vec<&'r RuntimeEntry<'a>> {
    report
        .neuron_runtime_data
        .iter()
        .map(|item| match item {
            Item::Ok(rt) => rt,
            Item::Malformed(reason) => panic!("malformed runtime: {reason}"),
        })
        .collect()
}

#[test]
fn idle_inf1_fixture() {
    let text = fixture(IDLE_INF1);
    let report = Report::parse(&text).unwrap();
    let rts = runtimes(&report);
    assert_eq!(rts.len(), 1);
    let rt = rts[0];
    assert_eq!(rt.pid, Some(41298));
    assert_eq!(rt.neuron_runtime_tag.as_deref(), Some(""));
    let groups = rt.report.as_ref().unwrap();
    let stats = groups.execution_stats.as_ref().unwrap().ok().unwrap();
    assert_eq!(stats.latency_stats.as_ref().unwrap().total_latency, None, "null latency stays absent");
    let counters = groups.neuroncore_counters.as_ref().unwrap().ok().unwrap();
    let cores = counters.neuroncores_in_use.as_ref().unwrap();
    assert_eq!(cores.len(), 4);
    assert_eq!(cores.get(3).unwrap().neuroncore_utilization, Some(0.0));
    assert_eq!(cores.get(3).unwrap().flops, None);
    let memory = groups.memory_used.as_ref().unwrap().ok().unwrap();
    let per_core = memory
        .neuron_runtime_used_bytes
        .as_ref()
        .and_then(|b| b.usage_breakdown.as_ref())
        .and_then(|b| b.neuroncore_memory_usage.as_ref())
        .unwrap();
    assert!(per_core.iter().all(|(_, m)| !m.is_held()));
    let models = memory.loaded_models().unwrap();
    assert_eq!((models.len(), models.skipped), (1, 0));
    let Item::Ok(model) = &models[0] else { panic!("malformed model") };
    let subgraphs = model.subgraphs().unwrap();
    assert_eq!(subgraphs.0[0].0, "sg_00");
    assert_eq!(subgraphs.0[0].1.neuroncore_index, Some(3));

    let system = report.system_data.as_ref().unwrap();
    let vcpu = system.vcpu_usage.as_ref().unwrap().ok().unwrap();
    assert_eq!(vcpu.usage_data.as_ref().unwrap().len(), 4);
    assert_eq!(vcpu.average_usage.unwrap().idle, Some(100.0));
    let hw = system.neuron_hw_counters.as_ref().unwrap().ok().unwrap();
    assert_eq!(hw.neuron_devices.as_ref().unwrap().len(), 1);
    let info = report.instance_info.as_ref().unwrap().ok().unwrap();
    assert_eq!(info.instance_type.as_deref(), Some("inf1.xlarge"));
    assert_eq!(info.instance_region.as_deref(), Some("ap-northeast-1"));
    let hardware = report.neuron_hardware_info.as_ref().unwrap().ok().unwrap();
    assert_eq!(hardware.core_count(), Some(4));
    assert_eq!(hardware.neuron_device_type, None);
}

#[test]
fn trn1_fixture_with_errors_and_latency() {
    let text = fixture(TRN1_ERRORS);
    let report = Report::parse(&text).unwrap();
    let rt = runtimes(&report)[0];
    assert_eq!(rt.neuron_runtime_tag.as_deref(), Some("1337"));
    let stats = rt.report.as_ref().unwrap().execution_stats.as_ref().unwrap().ok().unwrap();
    let errors = stats.error_summary.as_ref().unwrap();
    assert_eq!(errors.get("generic"), Some(23654.0));
    // Every documented type the fixture carries, in its order, nothing else.
    let names: Vec<&str> = errors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ErrorTypes::NAMES);
    assert_eq!(stats.execution_summary.as_ref().unwrap().get("completed"), Some(260.0));
    let total = stats.latency_stats.as_ref().unwrap().total_latency.as_ref().unwrap();
    assert!(total.get("p50").unwrap() > 0.0 && total.get("p50") <= total.get("p100"));
    assert_eq!(total.entries.len(), 7);
    let counters = rt.report.as_ref().unwrap().neuroncore_counters.as_ref().unwrap().ok().unwrap();
    let busy = counters.neuroncores_in_use.as_ref().unwrap().get(0).unwrap();
    assert!((busy.neuroncore_utilization.unwrap() - 1.3631567613356375).abs() < 1e-12);
}

#[test]
fn trn1n_fixture_with_32_runtimes() {
    let text = fixture(TRN1N_32);
    let report = Report::parse(&text).unwrap();
    let rts = runtimes(&report);
    assert_eq!(rts.len(), 32);
    for rt in &rts {
        let groups = rt.report.as_ref().unwrap();
        let cores = groups.neuroncore_counters.as_ref().unwrap().ok().unwrap().neuroncores_in_use.as_ref().unwrap();
        assert_eq!(cores.len(), 32, "every runtime lists every core of the host");
        let held: Vec<u32> = groups
            .memory_used
            .as_ref()
            .unwrap()
            .ok()
            .unwrap()
            .neuron_runtime_used_bytes
            .as_ref()
            .unwrap()
            .usage_breakdown
            .as_ref()
            .unwrap()
            .neuroncore_memory_usage
            .as_ref()
            .unwrap()
            .iter()
            .filter(|(_, m)| m.is_held())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(held.len(), 1, "each runtime holds exactly one core");
    }
    let hardware = report.neuron_hardware_info.as_ref().unwrap().ok().unwrap();
    assert_eq!(hardware.neuron_device_version.as_deref(), Some("v2"));
    assert_eq!(hardware.core_count(), Some(32));
    assert!(report.system_data.as_ref().unwrap().neuron_hw_counters.is_none());
}

#[test]
fn group_errors_are_kept_not_zeroed() {
    let line = r#"{"neuron_runtime_data":[{"pid":7,"neuron_runtime_tag":"x","error":"","report":{
        "neuron_runtime_vcpu_usage":{"period":1.0,"error":"open /proc/7/stat: no such file or directory"}}}],
        "system_data":{"neuron_hw_counters":{"period":1.0,"neuron_devices":null,"error":"driver not reachable"}},
        "instance_info":{"error":"metadata unavailable"},"neuron_hardware_info":{"neuron_device_count":1,"neuroncore_per_device_count":2,"error":""}}"#;
    let report = Report::parse(line).unwrap();
    let rt = runtimes(&report)[0];
    let vcpu = rt.report.as_ref().unwrap().neuron_runtime_vcpu_usage.as_ref().unwrap();
    assert_eq!(vcpu.problem(), Some("open /proc/7/stat: no such file or directory"));
    assert!(vcpu.ok().is_none());
    let hw = report.system_data.as_ref().unwrap().neuron_hw_counters.as_ref().unwrap();
    assert_eq!(*hw, Group::Error("driver not reachable".to_owned()));
    assert!(matches!(report.instance_info, Some(Group::Error(_))));
}

#[test]
fn newer_and_older_field_names() {
    let line = r#"{"neuron_runtime_data":[{"pid":1,"neuron_runtime_tag":"new","error":"","report":{
        "neuroncore_counters":{"period":1,"error":"","neuroncores_in_use":{"0":{"neuroncore_utilization":50,"effective_flops":12,
          "v3d":{"nc_v3":{"0":{"neuroncore_utilization":60},"1":{"neuroncore_utilization":40}}}}}},
        "inference_stats":{"period":1,"error":"","execution_summary":{"completed":3}}}}],
      "neuron_hardware_info":{"neuron_device_count":16,"neuroncore_per_device_count":8,"neuron_device_type":"trainium2",
        "neuron_device_version":"v4","neuroncore_version":"v4","neuron_device_memory_size":103079215104,
        "logical_neuroncore_config":2,"error":""}}"#;
    let report = Report::parse(line).unwrap();
    let groups = runtimes(&report)[0].report.as_ref().unwrap();
    let core =
        groups.neuroncore_counters.as_ref().unwrap().ok().unwrap().neuroncores_in_use.as_ref().unwrap().get(0).unwrap();
    assert_eq!(core.effective_flops, Some(12.0));
    assert_eq!(core.flops, None);
    // Trn2's logical core and its physical ones.
    let physical = core.v3d.as_ref().and_then(|v| v.nc_v3.as_ref()).unwrap();
    let utilization: Vec<(u32, Option<f64>)> = physical.iter().map(|(n, p)| (n, p.neuroncore_utilization)).collect();
    assert_eq!(utilization, [(0, Some(60.0)), (1, Some(40.0))]);
    let stats = groups.execution_stats.as_ref().unwrap().ok().unwrap();
    assert_eq!(stats.execution_summary.as_ref().unwrap().get("completed"), Some(3.0));
    assert_eq!(stats.execution_summary.as_ref().unwrap().get("timed_out"), None, "not carried: absent");
    assert_eq!(stats.error_summary, None);
    let hw = report.neuron_hardware_info.as_ref().unwrap().ok().unwrap();
    assert_eq!(hw.neuron_device_type.as_deref(), Some("trainium2"));
    assert_eq!(hw.logical_neuroncore_config, Some(NumberOrText::Number(2.0)));
    assert_eq!(hw.neuron_device_memory_size, Some(103079215104.0));
}

#[test]
fn unknown_fields_nulls_and_empty_lists() {
    let line = r#"{"neuron_runtime_data":null,"system_data":{"memory_info":{"memory_total_bytes":null,
        "memory_used_bytes":5,"brand_new_field":{"a":[1,2]},"error":""},"vcpu_usage":null},
        "instance_info":{"instance_id":"i-1","error":""},"neuron_hardware_info":{"error":""},"future":true}"#;
    let report = Report::parse(line).unwrap();
    assert!(report.neuron_runtime_data.is_empty());
    let system = report.system_data.as_ref().unwrap();
    assert!(system.vcpu_usage.is_none());
    let mem = system.memory_info.as_ref().unwrap().ok().unwrap();
    assert_eq!(mem.memory_total_bytes, None);
    assert_eq!(mem.memory_used_bytes, Some(5.0));
    assert_eq!(report.instance_info.as_ref().unwrap().ok().unwrap().instance_type, None);
    assert_eq!(report.neuron_hardware_info.as_ref().unwrap().ok().unwrap().core_count(), None);

    let empty = Report::parse(r#"{"neuron_runtime_data":[],"instance_info":{},"neuron_hardware_info":{}}"#).unwrap();
    assert!(empty.neuron_runtime_data.is_empty());
    assert!(empty.system_data.is_none());
}

#[test]
fn one_odd_group_does_not_fail_the_document() {
    // A release that changed a field's type: only that group is lost.
    let line = r#"{"neuron_runtime_data":[
        {"pid":1,"neuron_runtime_tag":"a","error":"","report":{
          "neuron_runtime_vcpu_usage":{"vcpu_usage":{"user":"high"},"error":""},
          "memory_used":{"neuron_runtime_used_bytes":{"host":10,"neuron_device":20},"error":""}}},
        {"pid":"not-a-pid","report":{}}],
      "system_data":{"memory_info":{"memory_used_bytes":1,"error":""},
                     "vcpu_usage":{"usage_data":{"zero":{}},"error":""}},
      "instance_info":{"instance_id":"i-1","error":""},"neuron_hardware_info":{"error":""}}"#;
    let report = Report::parse(line).unwrap();
    let Item::Ok(first) = &report.neuron_runtime_data[0] else { panic!("first runtime lost") };
    let groups = first.report.as_ref().unwrap();
    assert!(matches!(groups.neuron_runtime_vcpu_usage, Some(Group::Malformed(_))));
    let memory = groups.memory_used.as_ref().unwrap().ok().unwrap();
    assert_eq!(memory.neuron_runtime_used_bytes.as_ref().unwrap().neuron_device, Some(20.0));
    assert!(matches!(report.neuron_runtime_data[1], Item::Malformed(_)));
    let system = report.system_data.as_ref().unwrap();
    assert!(matches!(system.vcpu_usage, Some(Group::Malformed(_))));
    assert!(system.memory_info.as_ref().unwrap().ok().is_some());
}

#[test]
fn lenient_mode_does_not_leak_into_the_next_parse() {
    let odd = r#"{"system_data":{"memory_info":{"memory_used_bytes":"x","error":""}}}"#;
    assert!(Report::parse(odd).is_ok());
    assert!(!lenient());
}

#[test]
fn not_a_report() {
    for line in ["", "not json", "[1,2]", r#"{"neuron_runtime_data": 5}"#, r#"{"neuron_runtime_data":[{"pid":1}"#] {
        assert!(Report::parse(line).is_err(), "{line:?} should be refused");
    }
}

#[test]
fn runtime_entries_beyond_the_cap_are_skipped_and_counted() {
    use crate::limits::MAX_RUNTIMES_PER_REPORT;
    let entry = |i: usize| format!(r#"{{"pid":{i},"neuron_runtime_tag":"t{i}","error":""}}"#);
    let entries: Vec<String> = (0..MAX_RUNTIMES_PER_REPORT + 7).map(entry).collect();
    let line = format!(r#"{{"neuron_runtime_data":[{}]}}"#, entries.join(","));
    let report = Report::parse(&line).unwrap();
    assert_eq!(report.neuron_runtime_data.len(), MAX_RUNTIMES_PER_REPORT);
    assert_eq!(report.neuron_runtime_data.skipped, 7);
    // The first ones, in document order.
    let Item::Ok(last) = &report.neuron_runtime_data[MAX_RUNTIMES_PER_REPORT - 1] else { panic!("malformed") };
    assert_eq!(last.pid, Some(MAX_RUNTIMES_PER_REPORT as u32 - 1));

    // The lenient pass (an odd group elsewhere) keeps the cap; skipped entries need only
    // be valid JSON.
    let odd = format!(
        r#"{{"neuron_runtime_data":[{},{{"pid":"odd"}},[1,2]],"system_data":{{"memory_info":{{"memory_used_bytes":"x","error":""}}}}}}"#,
        entries.join(",")
    );
    let report = Report::parse(&odd).unwrap();
    assert_eq!(report.neuron_runtime_data.len(), MAX_RUNTIMES_PER_REPORT);
    assert_eq!(report.neuron_runtime_data.skipped, 9);

    let report = Report::parse(r#"{"neuron_runtime_data":null}"#).unwrap();
    assert!(report.neuron_runtime_data.is_empty());
    assert_eq!(report.neuron_runtime_data.skipped, 0);
}

/// An `execution_stats` group with these objects, parsed.
fn execution_stats(body: &str) -> ExecutionStats<'static> {
    let line =
        format!(r#"{{"neuron_runtime_data":[{{"pid":1,"report":{{"execution_stats":{{{body},"error":""}}}}}}]}}"#);
    let line: &'static str = Box::leak(line.into_boxed_str());
    let report = Report::parse(line).unwrap();
    let rt = runtimes(&report)[0];
    let stats = rt.report.as_ref().unwrap().execution_stats.as_ref().unwrap();
    stats.ok().unwrap_or_else(|| panic!("{stats:?}")).clone()
}

#[test]
fn types_a_newer_release_adds_are_kept_under_their_own_names() {
    let stats = execution_stats(
        r#""error_summary":{"generic":1,"oom":3,"numerical":null},
           "execution_summary":{"completed":5,"preempted":2},
           "latency_stats":{"total_latency":{"p50":0.01,"p90":0.02,"p99":0.03},"device_latency":null}"#,
    );
    let errors = stats.error_summary.as_ref().unwrap();
    let names: Vec<(&str, f64)> = errors.iter().map(|(n, v)| (n.as_str(), v)).collect();
    assert_eq!(names, [("generic", 1.0), ("oom", 3.0)], "a null value is absent, an absent type too");
    assert_eq!(errors.entries[0].0, Name::Documented("generic"));
    assert!(matches!(errors.entries[1].0, Name::Other(Cow::Borrowed("oom"))), "borrowed from the line");
    assert_eq!(stats.execution_summary.as_ref().unwrap().get("preempted"), Some(2.0));
    let latency = stats.latency_stats.as_ref().unwrap();
    assert_eq!(latency.total_latency.as_ref().unwrap().get("p90"), Some(0.02));
    assert_eq!(latency.device_latency, None);
    assert_eq!(errors.refused, 0);
}

#[test]
fn odd_names_and_values_are_refused_and_counted_not_fatal() {
    let long = "x".repeat(crate::limits::MAX_VALUE_NAME_BYTES + 1);
    let stats = execution_stats(&format!(
        r#""error_summary":{{"generic":1,"bad name":1,"{long}":1,"":1,"model":"many","runtime":{{"a":1}},
           "generic":7,"ok-1.5":2}}"#
    ));
    let errors = stats.error_summary.as_ref().unwrap();
    let names: Vec<(&str, f64)> = errors.iter().map(|(n, v)| (n.as_str(), v)).collect();
    assert_eq!(names, [("generic", 1.0), ("ok-1.5", 2.0)], "the first of a name given twice");
    // A space, too long, empty, a string, an object, a second `generic`.
    assert_eq!(errors.refused, 6);
}

#[test]
fn undocumented_names_are_bounded_per_object() {
    use crate::limits::MAX_UNDOCUMENTED_NAMES;
    let extra: Vec<String> = (0..MAX_UNDOCUMENTED_NAMES + 5).map(|i| format!(r#""type{i}":1"#)).collect();
    let stats = execution_stats(&format!(r#""error_summary":{{{},"hardware":4}}"#, extra.join(",")));
    let errors = stats.error_summary.as_ref().unwrap();
    assert_eq!(errors.entries.len(), MAX_UNDOCUMENTED_NAMES + 1, "the documented ones always fit");
    assert_eq!(errors.get("hardware"), Some(4.0));
    assert_eq!(errors.get("type0"), Some(1.0));
    assert_eq!(errors.get(&format!("type{MAX_UNDOCUMENTED_NAMES}")), None);
    assert_eq!(errors.refused, 5);
}

#[test]
fn physical_cores_numbered_across_the_host_as_in_the_user_guide() {
    let line = r#"{"neuron_runtime_data":[{"pid":1,"report":{"neuroncore_counters":{"error":"","neuroncores_in_use":{
        "0":{"neuroncore_utilization":42.01,"flops":1234567891011,
             "v3d":{"nc_v3.0":{"neuroncore_utilization":21.01},"nc_v3.1":{"neuroncore_utilization":63.01}}},
        "1":{"neuroncore_utilization":42.02,
             "v3d":{"nc_v3.3":{"neuroncore_utilization":63.02},"nc_v3.2":{"neuroncore_utilization":21.02},"other":1}}}}}}]}"#;
    let report = Report::parse(line).unwrap();
    let groups = runtimes(&report)[0].report.as_ref().unwrap();
    let cores = groups.neuroncore_counters.as_ref().unwrap().ok().unwrap().neuroncores_in_use.as_ref().unwrap();
    let physical = |core: u32| -> Vec<(u32, Option<f64>)> {
        let v3d = cores.get(core).unwrap().v3d.as_ref().unwrap();
        v3d.nc_v3.as_ref().unwrap().iter().map(|(n, p)| (n, p.neuroncore_utilization)).collect()
    };
    assert_eq!(physical(0), [(0, Some(21.01)), (1, Some(63.01))]);
    // In the order of their host numbers, whatever the document's order.
    assert_eq!(physical(1), [(0, Some(21.02)), (1, Some(63.02))]);
}

#[test]
fn k8s_info_at_the_top_level_or_among_the_system_groups() {
    let body = r#"{"period":15.0,"error":"","neuroncores_k8s_info":{"0":{"pod_name":"p0","namespace":"n0",
        "container_name":["c0"]},"1":{"pod_name":"p0","namespace":"n0","container_name":"c1"}},
        "neurondevices_k8s_info":{"0":{"pod_name":"p0","namespace":"n0","container_name":["c0","c1"]}}}"#;
    for line in
        [format!(r#"{{"neuron_k8s_info":{body}}}"#), format!(r#"{{"system_data":{{"neuron_k8s_info":{body}}}}}"#)]
    {
        let report = Report::parse(&line).unwrap();
        let info = report.k8s_info().unwrap().ok().unwrap();
        let cores = info.neuroncores_k8s_info.as_ref().unwrap();
        let core0 = cores.get(0).unwrap();
        assert_eq!((core0.pod_name.as_deref(), core0.namespace.as_deref()), (Some("p0"), Some("n0")));
        assert_eq!(core0.container_name.as_ref().unwrap().names, ["c0"]);
        assert_eq!(cores.get(1).unwrap().container_name.as_ref().unwrap().names, ["c1"], "one name: a list of one");
        let device = info.neurondevices_k8s_info.as_ref().unwrap().get(0).unwrap();
        assert_eq!(device.container_name.as_ref().unwrap().names, ["c0", "c1"]);
    }
    let report = Report::parse(r#"{"neuron_k8s_info":{"error":"kubelet not reachable"}}"#).unwrap();
    assert_eq!(report.k8s_info(), Some(&Group::Error("kubelet not reachable".to_owned())));
    assert!(Report::parse("{}").unwrap().k8s_info().is_none());

    let many: Vec<String> =
        (0..crate::limits::MAX_K8S_CONTAINERS_PER_ENTRY + 3).map(|i| format!(r#""c{i}""#)).collect();
    let line = format!(
        r#"{{"neuron_k8s_info":{{"error":"","neuroncores_k8s_info":{{"0":{{"container_name":[{}]}}}}}}}}"#,
        many.join(",")
    );
    let report = Report::parse(&line).unwrap();
    let info = report.k8s_info().unwrap().ok().unwrap();
    let containers = info.neuroncores_k8s_info.as_ref().unwrap().get(0).unwrap().container_name.clone().unwrap();
    assert_eq!((containers.names.len(), containers.skipped), (crate::limits::MAX_K8S_CONTAINERS_PER_ENTRY, 3));
}

#[test]
fn loaded_models_are_read_up_to_the_cap_their_subgraphs_on_demand() {
    use crate::limits::MAX_LOADED_MODELS_PER_RUNTIME;
    let model = |i: usize| {
        format!(
            r#"{{"name":"m{i}","uuid":"u{i}","model_id":{i},"is_running":{},"subgraphs":{{"sg_00":{{"neuroncore_index":0}}}}}}"#,
            i.is_multiple_of(2)
        )
    };
    let models: Vec<String> = (0..MAX_LOADED_MODELS_PER_RUNTIME + 2).map(model).collect();
    let line = format!(
        r#"{{"neuron_runtime_data":[{{"pid":1,"report":{{"memory_used":{{"error":"","loaded_models":[{}]}}}}}}]}}"#,
        models.join(",")
    );
    let report = Report::parse(&line).unwrap();
    let memory = runtimes(&report)[0].report.as_ref().unwrap().memory_used.as_ref().unwrap().ok().unwrap();
    let loaded = memory.loaded_models().unwrap();
    assert_eq!((loaded.len(), loaded.skipped), (MAX_LOADED_MODELS_PER_RUNTIME, 2));
    let Item::Ok(first) = &loaded[0] else { panic!("malformed") };
    assert_eq!((first.name.as_deref(), first.model_id, first.is_running), (Some("m0"), Some(0), Some(true)));
    assert_eq!(first.subgraphs().unwrap().0[0].1.neuroncore_index, Some(0));
}

#[test]
fn parse_reusing_reads_every_fixture_as_parse_does() {
    let mut buffer = String::new();
    for rel in [IDLE_INF1, TRN1_ERRORS, TRN1N_32] {
        let pretty = fixture(rel);
        let compact = serde_json::to_string(&serde_json::from_str::<serde_json::Value>(&pretty).unwrap()).unwrap();
        for text in [&pretty, &compact] {
            let plain = format!("{:?}", Report::parse(text).unwrap());
            assert_eq!(format!("{:?}", Report::parse_reusing(text, &mut buffer).unwrap()), plain, "{rel}");
        }
    }
    let models = |report: &Report| {
        runtimes(report)
            .iter()
            .map(|rt| {
                rt.report.as_ref().unwrap().memory_used.as_ref().unwrap().ok().unwrap().loaded_models().unwrap().len()
            })
            .sum::<usize>()
    };
    let text = fixture(TRN1N_32);
    assert_eq!(models(&Report::parse_reusing(&text, &mut buffer).unwrap()), 640);
}

#[test]
fn parse_reusing_keeps_the_report_when_loaded_models_are_malformed() {
    let line = |models: &str| {
        format!(
            r#"{{"neuron_runtime_data":[{{"pid":1,"report":{{"memory_used":{{"error":"","loaded_models":{models},
            "neuron_runtime_used_bytes":{{"host":10}}}}}}}},{{"pid":2,"report":{{"memory_used":{{"error":"","loaded_models":[]}}}}}}]}}"#
        )
    };
    let mut buffer = String::new();
    let bad = line(r#"[{"name":"m","model_id":1}}"#);
    assert!(Report::parse(&bad).is_err(), "serde reads the whole line");
    let report = Report::parse_reusing(&bad, &mut buffer).unwrap();
    let memory = |i: usize| runtimes(&report)[i].report.as_ref().unwrap().memory_used.as_ref().unwrap().ok().unwrap();
    assert_eq!(memory(0).loaded_models, Some(r#"[{"name":"m","model_id":1}}"#));
    assert!(memory(0).loaded_models().is_err());
    assert_eq!(memory(0).neuron_runtime_used_bytes.as_ref().unwrap().host, Some(10.0));
    assert_eq!(memory(1).loaded_models, Some("[]"));
}

#[test]
fn parse_reusing_fails_as_parse_does_on_a_line_cut_short_or_odd_in_another_group() {
    let mut buffer = String::new();
    let text = fixture(TRN1N_32);
    for cut in [text.len() / 2, text.len() - 3] {
        assert!(Report::parse_reusing(&text[..cut], &mut buffer).unwrap_err().is_truncated());
    }
    let odd = r#"{"neuron_runtime_data":[{"pid":1,"report":{
        "neuron_runtime_vcpu_usage":{"vcpu_usage":{"user":"high"},"error":""},
        "memory_used":{"error":"","loaded_models":[{"name":"m","model_id":3}]}}}]}"#;
    let report = Report::parse_reusing(odd, &mut buffer).unwrap();
    let groups = runtimes(&report)[0].report.as_ref().unwrap();
    assert!(matches!(groups.neuron_runtime_vcpu_usage, Some(Group::Malformed(_))));
    let models = groups.memory_used.as_ref().unwrap().ok().unwrap().loaded_models().unwrap();
    let Item::Ok(model) = &models[0] else { panic!("malformed") };
    assert_eq!(model.model_id, Some(3));
}

#[test]
fn parse_reusing_puts_back_only_its_own_placeholders() {
    // The second runtime's key, spaced, is not cut: serde reads its value, `0`, which must
    // stay `0` (malformed when read) rather than become the first runtime's models.
    let line = r#"{"neuron_runtime_data":[
        {"pid":1,"report":{"memory_used":{"error":"","loaded_models":[{"name":"m","model_id":7}]}}},
        {"pid":2,"report":{"memory_used":{"error":"","loaded_models" : 0}}}]}"#;
    let mut buffer = String::new();
    let report = Report::parse_reusing(line, &mut buffer).unwrap();
    let memory = |i: usize| runtimes(&report)[i].report.as_ref().unwrap().memory_used.as_ref().unwrap().ok().unwrap();
    assert_eq!(memory(0).loaded_models, Some(r#"[{"name":"m","model_id":7}]"#));
    assert_eq!(memory(1).loaded_models, Some("0"));
    assert!(memory(1).loaded_models().is_err());
    assert_eq!(format!("{:?}", Report::parse(line).unwrap()), format!("{report:?}"));
}
