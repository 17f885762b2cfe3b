//! CloudWatch, without I/O: what a sink publishes ([`catalogue`]), the rules a sink's
//! settings obey, checked once for the operator and the agent ([`sink`]), and what a
//! config costs ([`cost`]); the log group rule of the health event stream ([`logs`]).

pub mod catalogue;
pub mod cost;
pub mod logs;
pub mod sink;
