//! The label sets of the service's metrics, apart from the modules that count them, so
//! that [`crate::http`], [`crate::auth`] and [`crate::tls`] import them one way.

use prometheus_client::encoding::EncodeLabelSet;

/// TLS handshake failures: `timeout` (no complete handshake within the header timeout),
/// `error` (a plain-HTTP request, no common version or ALPN protocol, a client that
/// closed or refused the certificate); token checks refused before a review.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

/// Certificate reloads, token reviews and cache hits, by result.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}
