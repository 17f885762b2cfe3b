//! `nvidia-ml-fake-gpus FILE`: the GPUs a fake NVML configuration describes, as one JSON
//! line (index, uuid, minor, pci_bus_id, name), read the way the library reads it. The
//! tests' real node gives these to its device plugin, so that the ids it advertises are
//! the ones the agent's NVML sees, not a copied list.

use std::{path::PathBuf, process::ExitCode};

use nvidia_ml_fake::state;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(path), None) = (args.next(), args.next()) else {
        eprintln!("usage: nvidia-ml-fake-gpus FILE (a fake NVML configuration)");
        return ExitCode::from(2);
    };
    let path = PathBuf::from(path);
    let machine = match state::load(&path) {
        Ok(machine) => machine,
        Err(e) => {
            eprintln!("nvidia-ml-fake-gpus: {}: {e}", path.display());
            return ExitCode::FAILURE;
        }
    };
    // The minor number is the index (README, "The machines").
    let gpus: Vec<serde_json::Value> = machine
        .gpus
        .iter()
        .map(|g| {
            serde_json::json!({
                "index": g.index, "uuid": g.uuid, "minor": g.index, "pci_bus_id": g.bus_id(), "name": g.name,
            })
        })
        .collect();
    println!("{}", serde_json::json!({ "gpus": gpus }));
    ExitCode::SUCCESS
}
