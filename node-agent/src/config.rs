//! The node's configuration: where it comes from and how it is put in force.
//!
//! - [`crate::state_dir`] (its own module: health writes there too): neuron-monitor's
//!   configuration files, in a directory only the agent writes, and the launch spec that
//!   runs neuron-monitor on one ([`Launcher`]).
//! - [`activate`]: one path puts the built-in configuration, a file's or the ConfigMap's in
//!   force ([`Activator`]), with typed errors; a configuration that fails changes nothing.
//! - [`configmap`]: the node's ConfigMap, followed through the API and acknowledged.
//! - [`standalone`]: NeuronMonitorConfig documents from a YAML file, validated and
//!   rendered for this host without Kubernetes, and followed as the file changes.

pub mod activate;
pub mod configmap;
pub mod standalone;

pub use crate::state_dir::{check_state_dir, open_state_dir, Launcher, StateDirError};
pub use activate::{
    read_config_file, ActivationError, Activator, Candidate, ConfigFileError, Origin, MAX_CONFIG_FILE_BYTES,
};
pub use configmap::Reloader;
