//! What every sender shares, below the sinks and the health event stream that use it: the
//! bounded [`queue`] of what is waiting to be sent, the [`backoff`] of retries and the
//! [`aws`] client configuration with its sorting of failures.

/// Bytes of an answer's body read at most, by every sender of the agent (OTLP receivers,
/// the AWS clients): an OTLP answer is a few bytes, a partial success's message or an AWS
/// answer (an error included) a few hundred. Beyond it the answer is not read: an endpoint
/// answering without end must not grow the agent.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub mod aws;
pub mod backoff;
pub mod queue;
