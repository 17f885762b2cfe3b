//! What each NVML call of a GPU collection costs on this machine's driver: the CPU time
//! of the calling thread and the wall time, averaged over `ROUNDS` calls per GPU, and the
//! whole collection the agent does, for comparison. Run where a GPU is (see
//! docs/gpu.md): `cargo run --release -p neuron-node-agent --example nvml_call_costs [LIBRARY]`.

use std::{
    path::Path,
    time::{Duration, Instant},
};

use api::gpu_groups::{GpuGroup, GpuGroups};
use neuron_node_agent::gpu::{nvml::NvmlReader, GpuMetrics};
use nvml_wrapper::enum_wrappers::device::{Clock, EccCounter, MemoryError, PcieUtilCounter, TemperatureSensor};

const ROUNDS: u32 = 20;

/// CPU time the calling thread has used.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid place for the one timespec the call writes.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `call` ROUNDS times; prints its mean CPU and wall time.
fn measure(name: &str, mut call: impl FnMut() -> bool) {
    let (cpu0, wall0) = (thread_cpu(), Instant::now());
    let mut ok = 0;
    for _ in 0..ROUNDS {
        ok += u32::from(call());
    }
    let (cpu, wall) = ((thread_cpu() - cpu0) / ROUNDS, wall0.elapsed() / ROUNDS);
    println!("{name:<32} cpu {:>9.1} µs  wall {:>9.1} µs  ok {ok}/{ROUNDS}", micros(cpu), micros(wall));
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let library = std::env::args().nth(1);
    let reader = match NvmlReader::open(library.as_deref().map(Path::new), GpuMetrics::default()) {
        Ok(reader) => reader,
        Err(e) => {
            eprintln!("NVML: {e}");
            std::process::exit(1);
        }
    };
    let nvml = reader.nvml();
    println!("driver {}, {} GPU(s), {ROUNDS} rounds each", reader.driver_version(), reader.gpu_count());
    measure("collection (every GPU)", || !reader.read(GpuGroups::ALL).gpus.is_empty());
    let ecc_only: GpuGroups = [GpuGroup::Ecc].into_iter().collect();
    measure("collection (ecc group only)", || !reader.read(ecc_only).gpus.is_empty());
    let no_nvlink: GpuGroups = GpuGroup::ALL.into_iter().filter(|g| *g != GpuGroup::Nvlink).collect();
    measure("collection (without nvlink)", || !reader.read(no_nvlink).gpus.is_empty());
    let Ok(device) = nvml.device_by_index(0) else {
        eprintln!("no GPU 0");
        std::process::exit(1);
    };
    measure("device_by_index", || nvml.device_by_index(0).is_ok());
    measure("uuid", || device.uuid().is_ok());
    measure("pci_info", || device.pci_info().is_ok());
    measure("name", || device.name().is_ok());
    measure("utilization_rates", || device.utilization_rates().is_ok());
    measure("memory_info", || device.memory_info().is_ok());
    measure("temperature", || device.temperature(TemperatureSensor::Gpu).is_ok());
    measure("power_usage", || device.power_usage().is_ok());
    measure("enforced_power_limit", || device.enforced_power_limit().is_ok());
    measure("total_energy_consumption", || device.total_energy_consumption().is_ok());
    measure("clock_info(SM)", || device.clock_info(Clock::SM).is_ok());
    measure("current_pcie_link_gen", || device.current_pcie_link_gen().is_ok());
    measure("current_pcie_link_width", || device.current_pcie_link_width().is_ok());
    measure("pcie_throughput(Send)", || device.pcie_throughput(PcieUtilCounter::Send).is_ok());
    measure("pcie_replay_counter", || device.pcie_replay_counter().is_ok());
    measure("total_ecc_errors", || device.total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile).is_ok());
    measure("current_throttle_reasons", || device.current_throttle_reasons().is_ok());
    measure("running_compute_processes", || device.running_compute_processes().is_ok());
    measure("mig_mode", || device.mig_mode().is_ok());
    let fields: Vec<_> = [82, 142, 143, 144, 145].map(nvml_wrapper::structs::device::FieldId).into();
    measure("field_values_for(5)", || device.field_values_for(&fields).is_ok());
    // NVLink: link count, the four error totals, data TX/RX (KiB).
    let nvlink: Vec<_> = [91, 38, 45, 52, 59, 138, 139].map(nvml_wrapper::structs::device::FieldId).into();
    measure("field_values_for(nvlink 7)", || device.field_values_for(&nvlink).is_ok());
    if let Ok(samples) = device.field_values_for(&nvlink) {
        for (id, sample) in nvlink.iter().zip(samples) {
            println!("field {:>3}: {:?}", id.0, sample.map(|s| s.value));
        }
    }
}
