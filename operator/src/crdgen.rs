//! The CRD as YAML: what `neuron-operator crd` prints and `crds/` holds.

use api::crd::NeuronMonitorConfig;
use kube::CustomResourceExt;

/// The file in `crds/` that must equal [`crd_yaml`].
pub const CRD_FILE: &str = "neuronmonitorconfigs.neuronmonitor.io.yaml";

pub fn crd_yaml() -> Result<String, serde_norway::Error> {
    serde_norway::to_string(&NeuronMonitorConfig::crd())
}

#[cfg(test)]
mod tests {
    #[test]
    fn committed_crd_matches_the_types() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/neuronmonitorconfigs.neuronmonitor.io.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        let generated = super::crd_yaml().unwrap();
        assert!(
            committed == generated,
            "crds/{} is out of date: run `cargo run -p neuron-operator -- crd > crds/{}`",
            super::CRD_FILE,
            super::CRD_FILE
        );
    }
}
