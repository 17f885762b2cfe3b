//! What every sender shares, below the sinks and the health event stream that use it: the
//! bounded [`queue`] of what is waiting to be sent, the [`backoff`] of retries and the
//! [`aws`] client configuration with its sorting of failures.

pub mod aws;
pub mod backoff;
pub mod queue;
