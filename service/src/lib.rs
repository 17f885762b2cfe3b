//! What both long-running binaries (the node agent and the operator) share as services;
//! the `api` crate holds no I/O.
//!
//! - [`cli`]: the flags both binaries share (HTTP, TLS, token checks, logs) and the
//!   settings they build.
//! - [`tasks`]: the named set of a binary's critical tasks: one that ends unexpectedly
//!   makes the process unhealthy and exit, to be restarted.
//! - [`process`]: logs set up from the flags, and the signal that stops the service.
//! - [`http`]: the HTTP/1.1 server of `/metrics`, `/healthz` and `/readyz`, within limits,
//!   plain or HTTPS ([`tls`]: a certificate from files, reloaded when they change), with an
//!   optional plain-HTTP probe port.
//! - [`auth`]: who may read `/metrics`: TokenReview and SubjectAccessReview, cached.
//! - [`device_taints`]: whether the API server serves DeviceTaintRules, and at which version.
//! - [`labels`]: the label sets of those modules' metrics.
//! - [`ratelimit`]: logs that could repeat per request or per report, rate-limited.

pub mod auth;
pub mod cli;
pub mod device_taints;
pub mod http;
pub mod labels;
pub mod process;
pub mod ratelimit;
pub mod tasks;
pub mod tls;
