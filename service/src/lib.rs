//! What both long-running binaries (the node agent and the operator) share as services;
//! the `api` crate holds no I/O.
//!
//! - [`process`]: logs set up from the flags, and the signal that stops the service.
//! - [`http`]: the HTTP/1.1 server of `/metrics`, `/healthz` and `/readyz`, within limits,
//!   plain or HTTPS ([`tls`]: a certificate from files, reloaded when they change), with an
//!   optional plain-HTTP probe port.
//! - [`auth`]: who may read `/metrics`: TokenReview and SubjectAccessReview, cached.
//! - [`ratelimit`]: logs that could repeat per request or per report, rate-limited.

pub mod auth;
pub mod http;
pub mod process;
pub mod ratelimit;
pub mod tls;
