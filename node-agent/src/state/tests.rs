use super::*;
use crate::testdata::{fixture, IDLE_INF1, TRN1N_32, TRN1_ERRORS};

fn apply(state: &mut NodeState, line: &str) {
    state.apply(&Report::parse(line).unwrap());
}

fn runtime<'s>(state: &'s NodeState, tag: &str) -> &'s RuntimeState {
    state.runtimes.iter().find(|r| r.labels.runtime_tag == tag).unwrap_or_else(|| panic!("no runtime {tag}"))
}

fn total(values: Option<&NamedValues>, name: &str) -> Option<f64> {
    values?.get(name)
}

fn completed(state: &NodeState, tag: &str) -> Option<f64> {
    total(runtime(state, tag).status_total.as_ref(), "completed")
}

/// A small report: runtimes given as (tag, pid, held core, utilization percent, completed).
fn report(runtimes: &[(&str, u32, u32, f64, u32)], instance_id: &str) -> String {
    let entries: Vec<String> = runtimes
        .iter()
        .map(|(tag, pid, core, util, completed)| {
            let counters: Vec<String> = (0..4)
                .map(|c| format!(r#""{c}":{{"neuroncore_utilization":{}}}"#, if c == *core { *util } else { 0.0 }))
                .collect();
            let memory: Vec<String> = (0..4)
                .map(|c| format!(r#""{c}":{{"constants":0,"model_code":{},"model_shared_scratchpad":0,"runtime_memory":0,"tensors":0}}"#, if c == *core { 100 } else { 0 }))
                .collect();
            format!(
                r#"{{"pid":{pid},"neuron_runtime_tag":"{tag}","error":"","report":{{
                  "neuroncore_counters":{{"period":1,"error":"","neuroncores_in_use":{{{}}}}},
                  "memory_used":{{"period":1,"error":"","neuron_runtime_used_bytes":{{"host":1,"neuron_device":2,
                     "usage_breakdown":{{"neuroncore_memory_usage":{{{}}}}}}}}},
                  "neuron_runtime_vcpu_usage":{{"period":1,"error":"","vcpu_usage":{{"user":10,"system":5}}}},
                  "execution_stats":{{"period":1,"error":"","error_summary":{{"generic":1}},
                     "execution_summary":{{"completed":{completed}}},"latency_stats":{{"total_latency":null}}}}}}}}"#,
                counters.join(","),
                memory.join(",")
            )
        })
        .collect();
    format!(
        r#"{{"neuron_runtime_data":[{}],"system_data":{{}},
            "instance_info":{{"instance_id":"{instance_id}","instance_type":"inf2.xlarge","error":""}},
            "neuron_hardware_info":{{"neuron_device_count":2,"neuroncore_per_device_count":2,"error":""}}}}"#,
        entries.join(",")
    )
}

#[test]
fn every_runtime_of_the_32_runtime_fixture_holds_exactly_its_core() {
    let mut state = NodeState::default();
    apply(&mut state, &fixture(TRN1N_32));
    assert_eq!(state.runtimes.len(), 32);
    let mut cores: Vec<u32> = state
        .runtimes
        .iter()
        .map(|rt| {
            assert_eq!(rt.cores.len(), 1, "runtime {} holds one core", rt.labels.runtime_tag);
            rt.cores[0].index
        })
        .collect();
    cores.sort_unstable();
    assert_eq!(cores, (0..32).collect::<Vec<_>>());
    assert!(state.idle_cores.is_empty());
    // The runtime on core 1 is busy at 1%, the one on core 0 is idle but holds it.
    let busy = runtime(&state, "538");
    assert_eq!(busy.cores[0].index, 1);
    assert_eq!(busy.cores[0].utilization, Some(1.0));
    let idle = runtime(&state, "535");
    assert_eq!(idle.cores[0].index, 0);
    assert_eq!(idle.cores[0].utilization, Some(0.0));
    assert!(idle.cores[0].memory.unwrap().is_held());
    assert_eq!(state.system.vcpu_count, Some(128));
}

#[test]
fn an_idle_node_reports_all_its_cores_as_idle() {
    let mut state = NodeState::default();
    apply(&mut state, &fixture(IDLE_INF1));
    assert_eq!(state.runtimes.len(), 1);
    // Tag empty: the PID stands in, as neuron-monitor itself does.
    assert_eq!(state.runtimes[0].labels.runtime_tag, "41298");
    assert!(state.runtimes[0].cores.is_empty());
    assert_eq!(state.idle_core_indices(), vec![0, 1, 2, 3]);
    assert_eq!(state.system.vcpu_count, Some(4));
    assert_eq!(state.system.ecc_totals, vec![(0, [0.0; 4])]);
    assert_eq!(state.instance.instance_type, "inf1.xlarge");
    assert_eq!(state.instance.region, "ap-northeast-1");
}

#[test]
fn counters_are_running_sums_and_latency_follows_the_report() {
    let mut state = NodeState::default();
    let line = fixture(TRN1_ERRORS);
    apply(&mut state, &line);
    apply(&mut state, &line);
    let rt = runtime(&state, "1337");
    assert_eq!(total(rt.errors_total.as_ref(), "generic"), Some(2.0 * 23654.0));
    assert_eq!(total(rt.status_total.as_ref(), "completed"), Some(2.0 * 260.0));
    assert!(rt.latency.as_ref().unwrap().get("p50").unwrap() > 0.0);
    assert_eq!(rt.device_latency.as_ref().unwrap().get("p50"), Some(9.5367431640625e-05));
    assert_eq!(rt.vcpu, Some([Some(19.26), Some(3.95)]));
    // Core 1 holds a little model code but is not busy; core 0 is busy.
    let cores: Vec<u32> = rt.cores.iter().map(|c| c.index).collect();
    assert_eq!(cores, vec![0, 1]);
    assert!((rt.cores[0].utilization.unwrap() - 1.3631567613356375).abs() < 1e-12);
    assert_eq!(rt.cores[1].utilization, Some(0.0));
}

#[test]
fn a_runtime_that_leaves_is_dropped_and_starts_afresh_when_back() {
    let mut state = NodeState::default();
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 10), ("b", 2, 1, 20.0, 5)], "i-1"));
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 10), ("b", 2, 1, 20.0, 5)], "i-1"));
    assert_eq!(completed(&state, "b"), Some(10.0));
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 10)], "i-1"));
    assert_eq!(state.runtimes.len(), 1);
    assert_eq!(state.idle_core_indices(), vec![1, 2, 3]);
    assert_eq!(completed(&state, "a"), Some(30.0));
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 10), ("b", 3, 1, 20.0, 5)], "i-1"));
    assert_eq!(completed(&state, "b"), Some(5.0));
}

#[test]
fn the_nodes_identity_fills_what_no_report_gives_and_a_report_wins() {
    let mut state = NodeState::default();
    let node = InstanceLabels {
        instance_id: "i-0node0000".into(),
        instance_type: "g5.12xlarge".into(),
        region: "us-west-2".into(),
        ..InstanceLabels::default()
    };
    state.set_node_instance(node.clone());
    assert_eq!(*state.instance, node, "no report: the Node's");
    // The report names the instance and its type, not the region: those win, the region stays.
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 1)], "i-report"));
    assert_eq!(
        (state.instance.instance_id.as_str(), state.instance.instance_type.as_str(), state.instance.region.as_str()),
        ("i-report", "inf2.xlarge", "us-west-2")
    );
    assert_eq!(runtime(&state, "a").labels.instance.instance_id, "i-report");
    // Read later, the Node's identity does not override the report's.
    state.set_node_instance(node);
    assert_eq!(state.instance.instance_id, "i-report");
}

#[test]
fn instance_labels_follow_the_latest_report() {
    let mut state = NodeState::default();
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 1)], "i-old"));
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 1)], "i-new"));
    assert_eq!(state.instance.instance_id, "i-new");
    assert_eq!(runtime(&state, "a").labels.instance.instance_id, "i-new");
}

#[test]
fn shared_tags_are_made_unique_by_pid() {
    let mut state = NodeState::default();
    apply(&mut state, &report(&[("serve", 20, 0, 1.0, 1), ("serve", 10, 1, 1.0, 1), ("", 30, 2, 1.0, 1)], "i"));
    let tags: Vec<&str> = state.runtimes.iter().map(|r| r.labels.runtime_tag.as_str()).collect();
    assert_eq!(tags, vec!["30", "serve", "serve@20"]);
    assert_eq!(runtime(&state, "serve").pid, Some(10));
}

#[test]
fn a_group_in_error_exports_no_values_and_is_recorded() {
    let mut state = NodeState::default();
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 4)], "i"));
    let broken = r#"{"neuron_runtime_data":[{"pid":1,"neuron_runtime_tag":"a","error":"","report":{
        "neuron_runtime_vcpu_usage":{"period":1,"error":"open /proc/1/stat: no such file or directory"},
        "execution_stats":{"period":1,"error":"runtime unreachable"}}}],
        "instance_info":{"instance_id":"i","error":""},
        "neuron_hardware_info":{"neuron_device_count":2,"neuroncore_per_device_count":2,"error":""}}"#;
    apply(&mut state, broken);
    let rt = runtime(&state, "a");
    assert_eq!(rt.vcpu, None, "no zeros for a group in error");
    assert_eq!(rt.latency, None);
    assert_eq!(completed(&state, "a"), Some(4.0), "a counter keeps its sum");
    // Groups not refreshed in this report keep their last values.
    assert_eq!(rt.memory_used, Some([Some(1.0), Some(2.0)]));
    assert_eq!(rt.cores[0].utilization, Some(50.0));
    let groups: Vec<(&str, ProblemKind)> = state.problems.iter().map(|p| (p.group, p.kind)).collect();
    assert_eq!(
        groups,
        vec![("neuron_runtime_vcpu_usage", ProblemKind::Monitor), ("execution_stats", ProblemKind::Monitor)]
    );
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 4)], "i"));
    assert!(state.problems.is_empty(), "problems describe the latest report only");
    assert!(runtime(&state, "a").vcpu.is_some());
}

#[test]
fn ecc_events_accumulate_per_device() {
    let mut state = NodeState::default();
    let line = r#"{"system_data":{"neuron_hw_counters":{"period":1,"error":"","neuron_devices":[
        {"neuron_device_index":1,"mem_ecc_corrected":2,"mem_ecc_uncorrected":0,"sram_ecc_corrected":0,"sram_ecc_uncorrected":1},
        {"neuron_device_index":0,"mem_ecc_corrected":0,"mem_ecc_uncorrected":0,"sram_ecc_corrected":0,"sram_ecc_uncorrected":0}]}}}"#;
    apply(&mut state, line);
    apply(&mut state, line);
    assert_eq!(state.system.ecc_totals, vec![(0, [0.0; 4]), (1, [4.0, 0.0, 0.0, 2.0])]);
}

fn hardware_report(devices: u32, cores: u32) -> String {
    format!(
        r#"{{"neuron_runtime_data":[],"neuron_hardware_info":{{"neuron_device_count":{devices},
            "neuroncore_per_device_count":{cores},"error":""}}}}"#
    )
}

#[test]
fn hardware_counts_beyond_any_node_refuse_the_group() {
    use api::limits::{MAX_NEURONCORES, MAX_NEURONCORES_PER_DEVICE, MAX_NEURON_DEVICES};
    // trn2 with LNC=1, and the largest shape the limits allow, are taken.
    for (devices, cores) in [(16, 8), (MAX_NEURONCORES / MAX_NEURONCORES_PER_DEVICE, MAX_NEURONCORES_PER_DEVICE)] {
        let mut state = NodeState::default();
        apply(&mut state, &hardware_report(devices, cores));
        assert_eq!(state.idle_cores.len(), (devices * cores) as usize);
        assert!(state.problems.is_empty() && state.refusals.is_empty());
    }
    for (devices, cores) in [(65535, 65535), (1000, 1000), (MAX_NEURON_DEVICES + 1, 1), (1, 17), (64, 16)] {
        let mut state = NodeState::default();
        apply(&mut state, &hardware_report(16, 2));
        apply(&mut state, &hardware_report(devices, cores));
        assert!(state.idle_cores.is_empty(), "{devices}×{cores}: no idle cores from refused counts");
        assert_eq!(state.hardware, None);
        assert_eq!(state.refusals.hardware_counts, 1);
        let problem = &state.problems[0];
        assert_eq!((problem.group, problem.kind), ("neuron_hardware_info", ProblemKind::OutOfBounds));
    }
}

#[test]
fn core_and_device_indices_beyond_any_node_are_ignored_and_counted() {
    let line = r#"{"neuron_runtime_data":[{"pid":1,"neuron_runtime_tag":"a","error":"","report":{
        "neuroncore_counters":{"error":"","neuroncores_in_use":{"4000000000":{"neuroncore_utilization":50},
            "512":{"neuroncore_utilization":1},"3":{"neuroncore_utilization":20},"3":{"neuroncore_utilization":99}}},
        "memory_used":{"error":"","neuron_runtime_used_bytes":{"usage_breakdown":{"neuroncore_memory_usage":{
            "4294967295":{"tensors":1},"5":{"tensors":1}}}}}}}],
        "system_data":{"neuron_hw_counters":{"error":"","neuron_devices":[
            {"neuron_device_index":4000000000,"mem_ecc_corrected":1},{"neuron_device_index":64,"mem_ecc_corrected":1},
            {"neuron_device_index":63,"mem_ecc_corrected":1}]}},
        "neuron_hardware_info":{"neuron_device_count":4,"neuroncore_per_device_count":2,"error":""}}"#;
    let mut state = NodeState::default();
    apply(&mut state, line);
    let rt = runtime(&state, "a");
    let cores: Vec<(u32, Option<f64>)> = rt.cores.iter().map(|c| (c.index, c.utilization)).collect();
    // The first entry of a repeated core wins, as before.
    assert_eq!(cores, vec![(3, Some(20.0)), (5, Some(0.0))]);
    assert_eq!(state.refusals.core_indices, 3);
    assert_eq!(state.refusals.device_indices, 2);
    assert_eq!(state.system.ecc_totals, vec![(63, [1.0, 0.0, 0.0, 0.0])]);
    assert_eq!(state.idle_core_indices(), vec![0, 1, 2, 4, 6, 7]);
}

#[test]
fn label_values_from_a_report_are_bounded() {
    use api::limits::MAX_REPORT_LABEL_VALUE_BYTES;
    let region = "r".repeat(1_000_000);
    let tag = format!("{}é", "t".repeat(MAX_REPORT_LABEL_VALUE_BYTES - 1)); // é straddles the limit
    let line = format!(
        r#"{{"neuron_runtime_data":[{{"pid":1,"neuron_runtime_tag":"{tag}","error":""}},
            {{"pid":2,"neuron_runtime_tag":"bell\u0007tag","error":""}}],
            "instance_info":{{"instance_region":"{region}","instance_id":"i-1","error":""}}}}"#
    );
    let mut state = NodeState::default();
    apply(&mut state, &line);
    assert_eq!(state.instance.region.len(), MAX_REPORT_LABEL_VALUE_BYTES);
    assert_eq!(state.instance.instance_id, "i-1");
    let tags: Vec<&str> = state.runtimes.iter().map(|r| r.labels.runtime_tag.as_str()).collect();
    assert_eq!(tags, vec!["bell\u{FFFD}tag", &"t".repeat(MAX_REPORT_LABEL_VALUE_BYTES - 1)]);
    assert_eq!(state.refusals.label_values, 3);
}

#[test]
fn runtimes_beyond_the_cap_are_counted_and_the_first_kept() {
    use api::limits::MAX_RUNTIMES_PER_REPORT;
    let runtimes: Vec<(String, u32)> =
        (0..MAX_RUNTIMES_PER_REPORT as u32 + 100).map(|i| (format!("r{i:05}"), i)).collect();
    let entries: Vec<(&str, u32, u32, f64, u32)> =
        runtimes.iter().map(|(t, p)| (t.as_str(), *p, p % 4, 1.0, 1)).collect();
    let mut state = NodeState::default();
    apply(&mut state, &report(&entries, "i"));
    assert_eq!(state.runtimes.len(), MAX_RUNTIMES_PER_REPORT);
    assert_eq!(state.refusals.runtimes, 100);
    assert_eq!(state.runtimes.last().unwrap().labels.runtime_tag, format!("r{:05}", MAX_RUNTIMES_PER_REPORT - 1));
}

#[test]
fn per_core_values_beyond_the_reports_budget_are_counted_and_the_first_kept() {
    use api::limits::MAX_CORE_ENTRIES_PER_REPORT;
    // 100 runtimes each claiming 64 busy cores: 6,400 per-core values in one report.
    let runtimes: Vec<String> = (0..100)
        .map(|r| {
            let cores: Vec<String> = (0..64).map(|c| format!(r#""{c}":{{"neuroncore_utilization":5}}"#)).collect();
            format!(
                r#"{{"pid":{},"neuron_runtime_tag":"r{r:03}","error":"","report":{{"neuroncore_counters":
                   {{"period":1,"error":"","neuroncores_in_use":{{{}}}}}}}}}"#,
                r + 1,
                cores.join(",")
            )
        })
        .collect();
    let line = format!(
        r#"{{"neuron_runtime_data":[{}],"system_data":{{}},
            "instance_info":{{"instance_id":"i","instance_type":"trn1.32xlarge","error":""}},
            "neuron_hardware_info":{{"neuron_device_count":16,"neuroncore_per_device_count":4,"error":""}}}}"#,
        runtimes.join(",")
    );
    let mut state = NodeState::default();
    apply(&mut state, &line);
    let kept: Vec<usize> = state.runtimes.iter().map(|r| r.utilization.as_ref().map_or(0, Vec::len)).collect();
    assert_eq!(kept.iter().sum::<usize>(), MAX_CORE_ENTRIES_PER_REPORT);
    assert_eq!(state.refusals.core_entries, (6400 - MAX_CORE_ENTRIES_PER_REPORT) as u64);
    // Document order: the first 64 runtimes whole, the 65th none.
    assert_eq!((kept[0], kept[63], kept[64], kept[99]), (64, 64, 0, 0));
    // The next report has a budget of its own.
    apply(&mut state, &report(&[("a", 1, 0, 50.0, 1)], "i"));
    assert_eq!(state.refusals.core_entries, 0);
}

#[test]
fn many_runtimes_sharing_tags_keep_their_state_across_reports() {
    // Linear bookkeeping gives what the pairwise scans gave: the lowest PID keeps the bare
    // tag, the others get `@pid`, and each keeps its running sums from report to report.
    let entries: Vec<(&str, u32, u32, f64, u32)> =
        (0..600u32).map(|i| (["a", "b", "c"][(i % 3) as usize], 1000 - i, i % 4, 1.0, 1)).collect();
    let mut state = NodeState::default();
    apply(&mut state, &report(&entries, "i"));
    apply(&mut state, &report(&entries, "i"));
    assert_eq!(state.runtimes.len(), 600);
    assert_eq!(runtime(&state, "a").pid, Some(1000 - 597));
    assert_eq!(runtime(&state, "a@1000").pid, Some(1000));
    assert_eq!(runtime(&state, "b@999").pid, Some(999));
    assert!(state.runtimes.iter().all(|rt| total(rt.status_total.as_ref(), "completed") == Some(2.0)));
}

/// One runtime `a` whose `execution_stats` group has this body.
fn stats_report(body: &str) -> String {
    format!(
        r#"{{"neuron_runtime_data":[{{"pid":1,"neuron_runtime_tag":"a","error":"","report":{{
            "execution_stats":{{"period":1,"error":"",{body}}}}}}}]}}"#
    )
}

fn names(values: Option<&NamedValues>) -> Vec<(&str, f64)> {
    values.map(|v| v.iter().collect()).unwrap_or_default()
}

#[test]
fn only_the_types_a_report_carries_are_counted_and_new_ones_under_their_names() {
    let mut state = NodeState::default();
    apply(&mut state, &stats_report(r#""error_summary":{"numerical":2,"oom":1},"execution_summary":{}"#));
    let rt = runtime(&state, "a");
    assert_eq!(names(rt.errors_total.as_ref()), [("numerical", 2.0), ("oom", 1.0)], "no made-up generic 0");
    assert!(rt.status_total.as_ref().unwrap().is_empty());
    // A type that comes and goes keeps its sum; one first seen starts from its count.
    apply(&mut state, &stats_report(r#""error_summary":{"generic":5}"#));
    apply(&mut state, &stats_report(r#""error_summary":{"oom":3,"numerical":-4}"#));
    let rt = runtime(&state, "a");
    assert_eq!(names(rt.errors_total.as_ref()), [("numerical", 2.0), ("oom", 4.0), ("generic", 5.0)]);
    assert!(state.refusals.is_empty());
}

#[test]
fn percentiles_follow_the_report_a_new_one_included() {
    let mut state = NodeState::default();
    apply(
        &mut state,
        &stats_report(r#""latency_stats":{"total_latency":{"p50":0.5,"p90":0.7},"device_latency":{"p999":0.9}}"#),
    );
    let rt = runtime(&state, "a");
    assert_eq!(names(rt.latency.as_ref()), [("p50", 0.5), ("p90", 0.7)]);
    assert_eq!(names(rt.device_latency.as_ref()), [("p999", 0.9)]);
    apply(&mut state, &stats_report(r#""latency_stats":{"total_latency":{"p99":0.1},"device_latency":null}"#));
    let rt = runtime(&state, "a");
    assert_eq!(names(rt.latency.as_ref()), [("p99", 0.1)], "gauges: the latest report's only");
    assert_eq!(rt.device_latency, None);
}

#[test]
fn undocumented_names_are_bounded_per_runtime_and_counted() {
    use api::limits::MAX_UNDOCUMENTED_NAMES;
    let mut state = NodeState::default();
    // Each report brings new names: the runtime's sums keep the first ones only.
    for round in 0..3 {
        let extra: Vec<String> = (0..MAX_UNDOCUMENTED_NAMES / 2 + 1).map(|i| format!(r#""t{round}_{i}":1"#)).collect();
        apply(&mut state, &stats_report(&format!(r#""error_summary":{{"hardware":1,{}}}"#, extra.join(","))));
    }
    let errors = runtime(&state, "a").errors_total.clone().unwrap();
    assert_eq!(errors.iter().count(), MAX_UNDOCUMENTED_NAMES + 1);
    assert_eq!(errors.get("hardware"), Some(3.0), "documented names always fit");
    // The third report's names found no room: all counted.
    assert_eq!(state.refusals.value_names, (MAX_UNDOCUMENTED_NAMES / 2 + 1) as u64);
    apply(&mut state, &stats_report(r#""error_summary":{"bad name":1,"generic":"x"}"#));
    assert_eq!(state.refusals.value_names, 2, "refused by the parser, counted per report");
}

fn models_report(models: &str) -> String {
    format!(
        r#"{{"neuron_runtime_data":[{{"pid":1,"neuron_runtime_tag":"a","error":"","report":{{
            "memory_used":{{"period":1,"error":"","loaded_models":[{models}]}}}}}}]}}"#
    )
}

#[test]
fn loaded_models_are_counted_by_state_and_listed_up_to_the_bound() {
    use api::limits::MAX_MODEL_INFO_PER_RUNTIME;
    let mut state = NodeState::default();
    let model = |i: usize, running: &str| format!(r#"{{"name":"m{i}","model_id":{i},"is_running":{running}}}"#);
    let mut models: Vec<String> = (0..MAX_MODEL_INFO_PER_RUNTIME + 2).map(|i| model(i, "false")).collect();
    models[1] = model(1, "true");
    models.push(r#"{"name":"bell\u0007"}"#.to_owned());
    apply(&mut state, &models_report(&models.join(",")));
    let loaded = runtime(&state, "a").models.clone().unwrap();
    assert_eq!((loaded.running, loaded.idle, loaded.unknown), (1, MAX_MODEL_INFO_PER_RUNTIME as u32 + 1, 1));
    assert_eq!(loaded.info.len(), MAX_MODEL_INFO_PER_RUNTIME);
    assert_eq!(loaded.info[1], ModelInfo { name: "m1".into(), model_id: Some(1), is_running: Some(true) });
    assert_eq!(state.refusals.loaded_models, 3, "three models without an info series");
    // The same models again (not read again): the same state, the same refusals.
    apply(&mut state, &models_report(&models.join(",")));
    assert_eq!(runtime(&state, "a").models.as_ref(), Some(&loaded));
    assert_eq!(state.refusals.loaded_models, 3);
    // Fewer: the list shrinks; none: zero counts; not a list: nothing exported.
    apply(&mut state, &models_report(&models[..2].join(",")));
    let loaded = runtime(&state, "a").models.clone().unwrap();
    assert_eq!((loaded.running, loaded.idle, loaded.info.len()), (1, 1, 2));
    apply(&mut state, &models_report(""));
    let loaded = runtime(&state, "a").models.clone().unwrap();
    assert_eq!((loaded.readable, loaded.running, loaded.idle, loaded.unknown, loaded.info.len()), (true, 0, 0, 0, 0));
    let odd = models_report("").replace(r#""loaded_models":[]"#, r#""loaded_models":{"a":1}"#);
    apply(&mut state, &odd);
    assert!(!runtime(&state, "a").models.as_ref().unwrap().readable);
    assert_eq!(state.refusals.loaded_models, 1);
}

#[test]
fn the_newer_hardware_fields_become_labels() {
    let mut state = NodeState::default();
    apply(
        &mut state,
        r#"{"neuron_hardware_info":{"neuron_device_type":"trainium2","neuron_device_version":"v4",
            "neuroncore_version":"v3d","neuron_device_count":16,"neuron_device_memory_size":103079215104,
            "neuroncore_per_device_count":4,"logical_neuroncore_config":2,"error":""}}"#,
    );
    let hw = state.hardware.clone().unwrap();
    let labels: Vec<(&str, &str)> = hw.labels.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(
        labels,
        [
            ("neuron_device_type", "trainium2"),
            ("neuron_device_version", "v4"),
            ("neuroncore_version", "v3d"),
            ("neuron_device_memory_size", "103079215104"),
            ("logical_neuroncore_config", "2"),
        ]
    );
    assert_eq!(hw.logical_neuroncore_config, Some(2));
    apply(&mut state, &hardware_report(16, 2));
    assert!(state.hardware.clone().unwrap().labels.is_empty(), "older reports: the two counts only");
}

#[test]
fn k8s_info_gives_bounded_owners_and_a_new_generation_on_change() {
    let mut state = NodeState::default();
    let line = r#"{"neuron_k8s_info":{"error":"","neuroncores_k8s_info":{
        "2":{"pod_name":"p","namespace":"n","container_name":["c"]},"600":{"pod_name":"p","namespace":"n"},
        "1":{"pod_name":"q","namespace":"n","container_name":[]},"3":{"namespace":"n"}},
        "neurondevices_k8s_info":{"0":{"pod_name":"p","namespace":"n","container_name":"c"},"99":{"pod_name":"p","namespace":"n"}}}}"#;
    apply(&mut state, line);
    let owner = |pod: &str, containers: &[&str]| K8sOwner {
        namespace: "n".into(),
        pod: pod.into(),
        containers: containers.iter().map(|c| c.to_string()).collect(),
    };
    let expected = K8sOwners {
        cores: vec![(1, owner("q", &[])), (2, owner("p", &["c"]))],
        devices: vec![(0, owner("p", &["c"]))],
    };
    assert_eq!(state.k8s, Some(expected.clone()));
    assert_eq!((state.refusals.core_indices, state.refusals.device_indices), (1, 1));
    let generation = state.k8s_generation;
    apply(&mut state, line);
    apply(&mut state, "{}");
    assert_eq!(
        (state.k8s.as_ref(), state.k8s_generation),
        (Some(&expected), generation),
        "unchanged, or not refreshed"
    );
    apply(&mut state, r#"{"neuron_k8s_info":{"error":"kubelet not reachable"}}"#);
    assert_eq!(state.k8s, None);
    assert!(state.k8s_generation > generation);
    assert_eq!(state.problems[0].group, "neuron_k8s_info");
}
