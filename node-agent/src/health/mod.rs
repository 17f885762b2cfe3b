//! Neuron hardware health, off the report path. In the order the data flows:
//!
//! - [`sysfs`]: the driver's sysfs tree (ECC counters, unhealthy components, device
//!   state, heartbeat, power, per-core hardware error counters, driver version);
//! - [`kmsg`]: the kernel log (`NEURON_HW_ERR=<NAME>` records, the driver's `neuron:`
//!   error records), followed from `/dev/kmsg` or a regular file;
//! - [`model`]: the health of each device (healthy / unhealthy / unknown and why),
//!   persisted per boot in the state directory.

pub mod kmsg;
pub mod model;
pub mod sysfs;
