//! The built fake library loaded the way the agent loads NVML: through nvml-wrapper with
//! `lib_path`. Cargo builds this package's cdylib before its integration tests, so the `.so`
//! is beside this test executable's `deps/` folder.
//!
//! The library's state and `FAKE_NVML_CONFIG` are process-wide, so the tests take turns.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use neuron_test_support::TempDir;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor};
use nvml_wrapper::enums::device::{SampleValue, UsedGpuMemory};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::structs::device::FieldId;
use nvml_wrapper::Nvml;

static SERIAL: Mutex<()> = Mutex::new(());
const MIB: u64 = 1024 * 1024;

fn library_path() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps folder");
    let beside_deps = deps.parent().expect("profile folder").join("libnvidia_ml_fake.so");
    let in_deps = deps.join("libnvidia_ml_fake.so");
    [beside_deps, in_deps].into_iter().find(|p| p.exists()).expect("cargo built libnvidia_ml_fake.so for the tests")
}

/// One test's fake machine: the file, the environment pointing at it, and NVML opened on it.
struct Fake {
    nvml: Nvml,
    dir: TempDir,
    _serial: MutexGuard<'static, ()>,
}

fn open(yaml: &str) -> Fake {
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("nvml-fake");
    let config = dir.write("fake-nvml.yaml", yaml);
    std::env::set_var("FAKE_NVML_CONFIG", &config);
    let nvml = Nvml::builder().lib_path(library_path().as_os_str()).init().expect("init on the fake library");
    Fake { nvml, dir, _serial: serial }
}

/// Init's result on a file (or none), with the turn held.
fn init_result(yaml: Option<&str>) -> Result<(), NvmlError> {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = TempDir::new("nvml-fake-bad");
    match yaml {
        Some(yaml) => std::env::set_var("FAKE_NVML_CONFIG", dir.write("fake-nvml.yaml", yaml)),
        None => std::env::remove_var("FAKE_NVML_CONFIG"),
    }
    Nvml::builder().lib_path(library_path().as_os_str()).init().map(drop)
}

impl Fake {
    /// Rewrites the file with a later modification time and waits past the re-read interval.
    fn rewrite(&self, yaml: &str) {
        let path = self.config();
        let before = std::fs::metadata(&path).and_then(|m| m.modified()).expect("mtime");
        std::fs::write(&path, yaml).expect("rewrite");
        let file = std::fs::File::options().write(true).open(&path).expect("open");
        file.set_modified(before + Duration::from_secs(1)).expect("set mtime");
        std::thread::sleep(Duration::from_millis(150));
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("fake-nvml.yaml")
    }
}

#[test]
fn each_instance_type_has_its_model_count_memory_and_distinct_identities() {
    let cases = [
        ("p5.48xlarge", 8, "NVIDIA H100 80GB HBM3", 81559),
        ("p4d.24xlarge", 8, "NVIDIA A100-SXM4-40GB", 40960),
        ("g5.xlarge", 1, "NVIDIA A10G", 23028),
        ("g5.12xlarge", 4, "NVIDIA A10G", 23028),
        ("g6.xlarge", 1, "NVIDIA L4", 23034),
    ];
    for (instance_type, count, model, memory_mib) in cases {
        let fake = open(&format!("instance_type: {instance_type}"));
        assert_eq!(fake.nvml.device_count().unwrap(), count, "{instance_type}");
        let mut uuids = Vec::new();
        let mut bus_ids = Vec::new();
        for i in 0..count {
            let d = fake.nvml.device_by_index(i).unwrap();
            assert_eq!(d.name().unwrap(), model, "{instance_type} {i}");
            assert_eq!(d.memory_info().unwrap().total, memory_mib * MIB, "{instance_type} {i}");
            assert_eq!((d.index().unwrap(), d.minor_number().unwrap()), (i, i));
            let uuid = d.uuid().unwrap();
            assert!(uuid.starts_with("GPU-") && uuid.len() == 40, "{uuid}");
            uuids.push(uuid);
            bus_ids.push(d.pci_info().unwrap().bus_id);
        }
        for list in [&mut uuids, &mut bus_ids] {
            list.sort();
            list.dedup();
            assert_eq!(list.len(), count as usize, "{instance_type}: {list:?}");
        }
    }
}

#[test]
fn devices_are_found_by_uuid_and_by_either_bus_id_form() {
    let fake = open("instance_type: p5.48xlarge");
    let third = fake.nvml.device_by_index(2).unwrap();
    let pci = third.pci_info().unwrap();
    assert_eq!(pci.bus_id, "00000000:75:00.0");
    assert_eq!((pci.domain, pci.bus, pci.device), (0, 0x75, 0));
    assert_eq!(pci.pci_device_id, 0x2330_10DE);
    assert_eq!(fake.nvml.device_by_uuid(third.uuid().unwrap()).unwrap().index().unwrap(), 2);
    assert_eq!(fake.nvml.device_by_pci_bus_id("0000:75:00.0").unwrap().index().unwrap(), 2);
    assert!(matches!(fake.nvml.device_by_pci_bus_id("00000000:99:00.0"), Err(NvmlError::NotFound)));
    assert!(matches!(fake.nvml.device_by_uuid("GPU-nope"), Err(NvmlError::NotFound)));
    assert!(matches!(fake.nvml.device_by_index(8), Err(NvmlError::InvalidArg)));
}

#[test]
fn an_override_changes_only_its_gpu_and_processes_are_listed() {
    let fake = open(
        "instance_type: p5.48xlarge
gpus:
- {index: 3, utilization_gpu: 87, utilization_memory: 41, memory_used_mib: 30000, temperature_c: 66, power_w: 512}
processes:
- {gpu: 3, pid: 4242, used_memory_mib: 20000, sm_util: 70, mem_util: 20}
- {gpu: 3, pid: 4343, used_memory_mib: 9000}
- {gpu: 5, pid: 99, used_memory_mib: 100}
",
    );
    let d3 = fake.nvml.device_by_index(3).unwrap();
    let u = d3.utilization_rates().unwrap();
    assert_eq!((u.gpu, u.memory), (87, 41));
    let m = d3.memory_info().unwrap();
    assert_eq!((m.used, m.free), (30000 * MIB, (81559 - 30000) * MIB));
    assert_eq!(d3.temperature(TemperatureSensor::Gpu).unwrap(), 66);
    assert_eq!(d3.power_usage().unwrap(), 512_000);
    let processes = d3.running_compute_processes().unwrap();
    let listed: Vec<_> = processes.iter().map(|p| (p.pid, p.used_gpu_memory.clone(), p.gpu_instance_id)).collect();
    assert_eq!(
        listed,
        vec![(4242, UsedGpuMemory::Used(20000 * MIB), None), (4343, UsedGpuMemory::Used(9000 * MIB), None)]
    );
    let d0 = fake.nvml.device_by_index(0).unwrap();
    assert_eq!(d0.utilization_rates().unwrap().gpu, 0);
    assert_eq!(d0.memory_info().unwrap().used, 0);
    assert!(d0.running_compute_processes().unwrap().is_empty());
    assert_eq!(fake.nvml.device_by_index(5).unwrap().running_compute_processes_count().unwrap(), 1);
    // Per-process utilization: a sample for the process given one; none elsewhere, as
    // NVML answers (not found).
    let samples = d3.process_utilization_stats(None).unwrap();
    let got: Vec<_> = samples.iter().map(|s| (s.pid, s.sm_util, s.mem_util)).collect();
    assert_eq!(got, vec![(4242, 70, 20)]);
    assert!(matches!(d0.process_utilization_stats(None), Err(nvml_wrapper::error::NvmlError::NotFound)));
}

#[test]
fn more_processes_than_the_callers_first_guess_are_all_returned() {
    let mut yaml = String::from("instance_type: g6.xlarge\nprocesses:\n");
    for pid in 1..=40 {
        yaml.push_str(&format!("- {{gpu: 0, pid: {pid}, used_memory_mib: 10}}\n"));
    }
    let fake = open(&yaml);
    let d = fake.nvml.device_by_index(0).unwrap();
    let pids: Vec<u32> = d.running_compute_processes().unwrap().iter().map(|p| p.pid).collect();
    assert_eq!(pids, (1..=40).collect::<Vec<u32>>());
    assert_eq!(d.memory_info().unwrap().used, 400 * MIB, "used covers the processes' memory");
}

#[test]
fn identity_power_clocks_pcie_and_versions_answer_from_the_catalogue() {
    let fake = open("instance_type: g5.xlarge\ndriver_version: 535.183.01\ncuda_driver_version: 12020");
    assert_eq!(fake.nvml.sys_driver_version().unwrap(), "535.183.01");
    assert_eq!(fake.nvml.sys_nvml_version().unwrap(), "12.535.183.01");
    assert_eq!(fake.nvml.sys_cuda_driver_version().unwrap(), 12020);
    let d = fake.nvml.device_by_index(0).unwrap();
    assert_eq!(d.pci_info().unwrap().bus_id, "00000000:00:1E.0");
    assert_eq!(d.enforced_power_limit().unwrap(), 300_000);
    assert_eq!(d.clock_info(Clock::SM).unwrap(), 1710);
    assert_eq!(d.clock_info(Clock::Memory).unwrap(), 6251);
    assert_eq!((d.current_pcie_link_gen().unwrap(), d.current_pcie_link_width().unwrap()), (4, 16));
    assert_eq!(d.pcie_throughput(PcieUtilCounter::Send).unwrap(), 0);
    assert_eq!(d.pcie_replay_counter().unwrap(), 0);
    assert_eq!(d.current_throttle_reasons().unwrap().bits(), 0x1, "an idle GPU says GpuIdle");
    assert!(d.supported_event_types().unwrap().contains(EventTypes::CRITICAL_XID_ERROR));
    assert!(
        matches!(d.power_management_limit(), Err(NvmlError::FailedToLoadSymbol(_))),
        "a call the fake does not export fails alone"
    );
    let first = d.total_energy_consumption().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(d.total_energy_consumption().unwrap() > first, "energy grows with time");
}

#[test]
fn ecc_counts_and_field_values_come_from_the_file() {
    let fake = open(
        "instance_type: p5.48xlarge
gpus:
- index: 1
  memory_temperature_c: 71
  ecc: {corrected_volatile: 12, uncorrected_volatile: 2, corrected_aggregate: 140}
  remapped_rows: {correctable: 3, uncorrectable: 1, pending: true}
",
    );
    let d = fake.nvml.device_by_index(1).unwrap();
    let ecc = |e, c| d.total_ecc_errors(e, c).unwrap();
    assert_eq!(ecc(MemoryError::Corrected, EccCounter::Volatile), 12);
    assert_eq!(ecc(MemoryError::Uncorrected, EccCounter::Volatile), 2);
    assert_eq!(ecc(MemoryError::Corrected, EccCounter::Aggregate), 140);
    assert_eq!(ecc(MemoryError::Uncorrected, EccCounter::Aggregate), 2, "aggregate defaults to volatile");
    let ids = [82, 142, 143, 144, 145, 9999].map(FieldId);
    let values: Vec<_> = d.field_values_for(&ids).unwrap().into_iter().map(|s| s.map(|s| s.value)).collect();
    for (got, want) in values.iter().zip([71, 3, 1, 1, 0]) {
        assert!(matches!(got, Ok(Ok(SampleValue::U32(v))) if *v == want), "{got:?} != {want}");
    }
    assert!(matches!(values[5], Ok(Err(NvmlError::NotSupported))), "{:?}", values[5]);
    let healthy = fake.nvml.device_by_index(0).unwrap();
    assert_eq!(healthy.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile).unwrap(), 0);
}

#[test]
fn gddr_models_have_no_memory_temperature() {
    let fake = open("instance_type: g6.xlarge");
    let d = fake.nvml.device_by_index(0).unwrap();
    let sample = d.field_values_for(&[FieldId(82)]).unwrap().remove(0).unwrap();
    assert!(matches!(sample.value, Err(NvmlError::NotSupported)), "{:?}", sample.value);
}

#[test]
fn a_lost_gpu_answers_gpu_lost_and_the_others_still_answer() {
    let fake = open("instance_type: g5.12xlarge\ngpus: [{index: 2, lost: true}]");
    assert_eq!(fake.nvml.device_count().unwrap(), 4);
    assert!(matches!(fake.nvml.device_by_index(2), Err(NvmlError::GpuLost)));
    assert_eq!(fake.nvml.device_by_index(1).unwrap().utilization_rates().unwrap().gpu, 0);
}

#[test]
fn an_edit_of_the_file_is_picked_up_while_the_library_is_open() {
    let fake = open("instance_type: g5.12xlarge");
    let d2 = fake.nvml.device_by_index(2).unwrap();
    assert_eq!(d2.temperature(TemperatureSensor::Gpu).unwrap(), 30);
    fake.rewrite("instance_type: g5.12xlarge\ngpus: [{index: 2, lost: true}, {index: 0, temperature_c: 81}]");
    assert!(matches!(d2.temperature(TemperatureSensor::Gpu), Err(NvmlError::GpuLost)));
    assert!(matches!(d2.uuid(), Err(NvmlError::GpuLost)));
    assert_eq!(fake.nvml.device_by_index(0).unwrap().temperature(TemperatureSensor::Gpu).unwrap(), 81);
}

#[test]
fn a_bad_edit_keeps_the_last_good_configuration() {
    let fake = open("instance_type: g6.xlarge\ngpus: [{index: 0, temperature_c: 55}]");
    fake.rewrite("instance_type: [broken");
    let d = fake.nvml.device_by_index(0).unwrap();
    assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), 55);
    fake.rewrite("instance_type: g6.xlarge\ngpus: [{index: 0, temperature_c: 56}]");
    assert_eq!(d.temperature(TemperatureSensor::Gpu).unwrap(), 56, "a good edit after a bad one is read");
}

#[test]
fn a_bad_or_missing_configuration_refuses_init() {
    assert!(matches!(init_result(Some("instance_type: [")), Err(NvmlError::Unknown)));
    assert!(matches!(init_result(Some("instance_type: p9.enormous")), Err(NvmlError::Unknown)));
    assert!(matches!(
        init_result(Some("instance_type: g5.xlarge\ngpus: [{index: 0, utilization_gpu: 300}]")),
        Err(NvmlError::Unknown)
    ));
    assert!(matches!(init_result(None), Err(NvmlError::DriverNotLoaded)));
    {
        let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        std::env::set_var("FAKE_NVML_CONFIG", "/nonexistent/fake-nvml.yaml");
        let missing = Nvml::builder().lib_path(library_path().as_os_str()).init();
        assert!(matches!(missing, Err(NvmlError::Unknown)), "{missing:?}");
    }
    assert!(init_result(Some("instance_type: g5.xlarge")).is_ok());
}

#[test]
fn xid_codes_arrive_once_each_then_the_wait_times_out_quickly() {
    let fake = open("instance_type: p5.48xlarge\ngpus: [{index: 4, xid: [79, 48]}]");
    let set = fake.nvml.create_event_set().unwrap();
    let set = fake.nvml.device_by_index(0).unwrap().register_events(EventTypes::CRITICAL_XID_ERROR, set).unwrap();
    let set = fake.nvml.device_by_index(4).unwrap().register_events(EventTypes::CRITICAL_XID_ERROR, set).unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let event = set.wait(1000).unwrap();
        assert!(event.event_type.contains(EventTypes::CRITICAL_XID_ERROR));
        seen.push((event.device.index().unwrap(), format!("{:?}", event.event_data)));
    }
    assert_eq!(seen, [(4, "Some(Value(79))".to_string()), (4, "Some(Value(48))".to_string())]);
    let started = Instant::now();
    assert!(matches!(set.wait(60_000), Err(NvmlError::Timeout)));
    assert!(started.elapsed() < Duration::from_secs(1), "the wait is capped: {:?}", started.elapsed());
    fake.rewrite("instance_type: p5.48xlarge\ngpus: [{index: 4, xid: [79, 48, 13]}]");
    assert_eq!(format!("{:?}", set.wait(1000).unwrap().event_data), "Some(Value(13))", "a code added later arrives");
}

#[test]
fn every_registered_set_gets_each_code() {
    let fake = open("instance_type: g6.xlarge\ngpus: [{index: 0, xid: [94]}]");
    let d = fake.nvml.device_by_index(0).unwrap();
    let first = d.register_events(EventTypes::CRITICAL_XID_ERROR, fake.nvml.create_event_set().unwrap()).unwrap();
    let second = d.register_events(EventTypes::CRITICAL_XID_ERROR, fake.nvml.create_event_set().unwrap()).unwrap();
    for set in [&first, &second] {
        assert_eq!(format!("{:?}", set.wait(1000).unwrap().event_data), "Some(Value(94))");
        assert!(matches!(set.wait(10), Err(NvmlError::Timeout)));
    }
}

#[test]
fn an_unregistered_gpus_xid_is_not_delivered() {
    let fake = open("instance_type: g5.12xlarge\ngpus: [{index: 3, xid: [79]}]");
    let set = fake.nvml.create_event_set().unwrap();
    let set = fake.nvml.device_by_index(0).unwrap().register_events(EventTypes::CRITICAL_XID_ERROR, set).unwrap();
    assert!(matches!(set.wait(50), Err(NvmlError::Timeout)));
}

#[test]
fn mig_instances_have_handles_uuids_and_their_own_processes() {
    let fake = open(
        "instance_type: p4d.24xlarge
gpus:
- index: 0
  mig: {enabled: true, instances: [{profile: 3g.20gb, gpu_instance_id: 1}, {profile: 1g.5gb, gpu_instance_id: 13}]}
processes:
- {gpu: 0, pid: 700, used_memory_mib: 1000, gpu_instance_id: 13}
- {gpu: 0, pid: 701, used_memory_mib: 2000, gpu_instance_id: 1}
",
    );
    let gpu = fake.nvml.device_by_index(0).unwrap();
    let mode = gpu.mig_mode().unwrap();
    assert_eq!((mode.current, mode.pending), (1, 1));
    assert_eq!(gpu.mig_device_count().unwrap(), 7);
    assert!(matches!(gpu.utilization_rates(), Err(NvmlError::NotSupported)));
    let mig = gpu.mig_device_by_index(1).unwrap();
    let uuid = mig.uuid().unwrap();
    assert!(uuid.starts_with("MIG-") && uuid.len() == 40, "{uuid}");
    assert_eq!(mig.name().unwrap(), "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
    assert_eq!(mig.memory_info().unwrap().total, 5 * 1024 * MIB);
    let pids: Vec<_> = mig.running_compute_processes().unwrap().iter().map(|p| (p.pid, p.gpu_instance_id)).collect();
    assert_eq!(pids, [(700, Some(13))]);
    assert_eq!(fake.nvml.device_by_uuid(uuid).unwrap().name().unwrap(), "NVIDIA A100-SXM4-40GB MIG 1g.5gb");
    assert!(matches!(gpu.mig_device_by_index(2), Err(NvmlError::NotFound)));
    // SAFETY: the handle comes from a live Device of this Nvml and the symbol's signature is NVML's.
    let instance_id = unsafe {
        let mut id = 0u32;
        let rc = fake.nvml.lib().nvmlDeviceGetGpuInstanceId(mig.handle(), &mut id);
        (rc, id)
    };
    assert_eq!(instance_id, (0, 13));
    let other = fake.nvml.device_by_index(1).unwrap();
    assert_eq!(other.mig_mode().unwrap().current, 0);
}

#[test]
fn models_without_mig_say_not_supported() {
    let fake = open("instance_type: g5.xlarge");
    let d = fake.nvml.device_by_index(0).unwrap();
    assert!(matches!(d.mig_mode(), Err(NvmlError::NotSupported)));
    assert!(matches!(d.mig_device_count(), Err(NvmlError::NotSupported)));
}

#[test]
fn calls_before_init_are_refused() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: loads the fake's symbols with NVML's signatures; nothing else runs on load.
    let lib = unsafe { nvml_wrapper_sys::bindings::NvmlLib::new(library_path()) }.unwrap();
    let mut count = 7u32;
    // SAFETY: a valid out pointer; no Nvml is open while the turn is held, so none is initialized.
    let rc = unsafe { lib.nvmlDeviceGetCount_v2(&mut count) };
    assert_eq!((rc, count), (1, 7), "NVML_ERROR_UNINITIALIZED, nothing written");
}

#[test]
fn calls_from_many_threads_at_once_all_answer() {
    let fake = open("instance_type: p5.48xlarge\ngpus: [{index: 6, utilization_gpu: 33}]");
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    let d = fake.nvml.device_by_index(6).unwrap();
                    (0..200).filter(|_| d.utilization_rates().is_ok_and(|u| u.gpu == 33)).count()
                })
            })
            .collect();
        for worker in workers {
            assert_eq!(worker.join().unwrap(), 200);
        }
    });
}

#[test]
fn wrong_arguments_get_nvml_errors() {
    let fake = open("instance_type: g5.xlarge");
    let lib = fake.nvml.lib();
    // SAFETY: these call the fake's exports with arguments NVML's contract allows (null
    // pointers, a handle that is not one), which must answer errors, not crash.
    let (null_out, bogus_handle, bad_sensor) = unsafe {
        let null_out = lib.nvmlDeviceGetCount_v2(std::ptr::null_mut());
        let mut temp = 0u32;
        let bogus = 8usize as nvml_wrapper_sys::bindings::nvmlDevice_t;
        let bogus_handle = lib.nvmlDeviceGetTemperature(bogus, 0, &mut temp);
        let d = fake.nvml.device_by_index(0).unwrap().handle();
        let bad_sensor = lib.nvmlDeviceGetTemperature(d, 7, &mut temp);
        (null_out, bogus_handle, bad_sensor)
    };
    assert_eq!((null_out, bogus_handle, bad_sensor), (2, 2, 2));
}

#[test]
fn structs_match_nvml_wrapper_sys_layouts() {
    use nvidia_ml_fake::types as fake;
    use nvml_wrapper_sys::bindings as sys;
    use std::mem::{offset_of, size_of};
    assert_eq!(size_of::<fake::Utilization>(), size_of::<sys::nvmlUtilization_t>());
    assert_eq!(size_of::<fake::MemoryV2>(), size_of::<sys::nvmlMemory_v2_t>());
    assert_eq!(offset_of!(fake::MemoryV2, used), offset_of!(sys::nvmlMemory_v2_t, used));
    assert_eq!(size_of::<fake::PciInfo>(), size_of::<sys::nvmlPciInfo_t>());
    assert_eq!(offset_of!(fake::PciInfo, bus_id), offset_of!(sys::nvmlPciInfo_t, busId));
    assert_eq!(offset_of!(fake::PciInfo, pci_sub_system_id), offset_of!(sys::nvmlPciInfo_t, pciSubSystemId));
    assert_eq!(size_of::<fake::ProcessInfo>(), size_of::<sys::nvmlProcessInfo_t>());
    assert_eq!(
        offset_of!(fake::ProcessInfo, compute_instance_id),
        offset_of!(sys::nvmlProcessInfo_t, computeInstanceId)
    );
    assert_eq!(size_of::<fake::EventData>(), size_of::<sys::nvmlEventData_t>());
    assert_eq!(offset_of!(fake::EventData, gpu_instance_id), offset_of!(sys::nvmlEventData_t, gpuInstanceId));
    assert_eq!(size_of::<fake::FieldValue>(), size_of::<sys::nvmlFieldValue_t>());
    assert_eq!(offset_of!(fake::FieldValue, nvml_return), offset_of!(sys::nvmlFieldValue_t, nvmlReturn));
    assert_eq!(offset_of!(fake::FieldValue, value), offset_of!(sys::nvmlFieldValue_t, value));
    assert_eq!(fake::MEMORY_V2_VERSION as usize, size_of::<sys::nvmlMemory_v2_t>() | (2 << 24));
    let ids = nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_REMAPPED_FAILURE;
    assert_eq!(ids, fake::FI_DEV_REMAPPED_FAILURE);
    assert_eq!(nvml_wrapper::sys_exports::field_id::NVML_FI_DEV_MEMORY_TEMP, fake::FI_DEV_MEMORY_TEMP);
    assert_eq!(size_of::<fake::ProcessUtilizationSample>(), size_of::<sys::nvmlProcessUtilizationSample_t>());
    assert_eq!(
        offset_of!(fake::ProcessUtilizationSample, sm_util),
        offset_of!(sys::nvmlProcessUtilizationSample_t, smUtil)
    );
    use nvml_wrapper::sys_exports::field_id as id;
    let nvlink = [
        (id::NVML_FI_DEV_NVLINK_LINK_COUNT, fake::FI_DEV_NVLINK_LINK_COUNT),
        (id::NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL, fake::FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
        (id::NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL, fake::FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL),
        (id::NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL, fake::FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL),
        (id::NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL, fake::FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL),
        (id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, fake::FI_DEV_NVLINK_THROUGHPUT_DATA_TX),
        (id::NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, fake::FI_DEV_NVLINK_THROUGHPUT_DATA_RX),
    ];
    for (wrapper, ours) in nvlink {
        assert_eq!(wrapper, ours);
    }
}

/// Every symbol the README lists is exported by the built library.
#[test]
fn the_library_exports_every_documented_symbol() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md")).unwrap();
    let symbols: Vec<&str> = readme
        .split('`')
        .filter(|w| w.starts_with("nvml") && w.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    assert!(symbols.len() >= 40, "{symbols:?}");
    // SAFETY: loading the fake runs no initialisers beyond Rust's; only symbols are looked up.
    let lib = unsafe { libloading::Library::new(library_path()) }.unwrap();
    for symbol in symbols {
        // SAFETY: only the address is taken; nothing is called.
        let found = unsafe { lib.get::<*const ()>(symbol.as_bytes()) };
        assert!(found.is_ok(), "{symbol} is not exported");
    }
}
