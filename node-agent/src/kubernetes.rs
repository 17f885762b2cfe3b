//! The agent's side of the API server: a client whose requests cannot hang, and the one
//! watch loop both of its watches (its ConfigMap, its pods) run.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::{
    runtime::{watcher, WatchStreamExt},
    Api, Resource,
};
use prometheus_client::metrics::counter::Counter;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// Server-side duration of each call of the agent's watches (its ConfigMap, its pods),
/// by default. A quiet call ends normally and is resumed from its resource version (no
/// new listing); a call that stays silent 5 s longer is taken for a dead connection and
/// renewed. Each node then makes 2 watch requests per period: 100 per second per 1,000
/// nodes at 20 s, served from the API server's watch cache.
pub const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(20);
/// [`DEFAULT_WATCH_TIMEOUT`] as `--api-watch-timeout` takes it (a test checks they agree).
pub const DEFAULT_WATCH_TIMEOUT_FLAG: &str = "20s";

/// A Kubernetes client whose requests cannot hang on a dead connection (kube sets no
/// read timeout): a response, or the next bytes of a watch, must come within the watch
/// duration plus 10 s, counted from when the request was written (not from when its
/// pooled connection went idle). The watches themselves are renewed every
/// `watch_timeout` (see [`DEFAULT_WATCH_TIMEOUT`]).
pub async fn client(watch_timeout: Duration) -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer().await.map_err(kube::Error::InferConfig)?;
    client_from(config, watch_timeout)
}

/// [`client`] from a given configuration (the fleet benchmark's simulated agents share
/// one).
pub fn client_from(mut config: kube::Config, watch_timeout: Duration) -> Result<kube::Client, kube::Error> {
    config.read_timeout = Some(watch_timeout + Duration::from_secs(10));
    config.reset_reader_on_write = true;
    kube::Client::try_from(config)
}

/// One of the agent's watches: what it selects and how its failures are told.
pub struct Watch {
    /// Field selector (`metadata.name=…`, `spec.nodeName=…`).
    pub fields: String,
    /// Server-side duration of each call (see [`DEFAULT_WATCH_TIMEOUT`]).
    pub timeout: Duration,
    /// Counts failed requests (each is retried with backoff).
    pub errors: Counter,
    /// What is watched and what stays while it fails, for the log.
    pub what: &'static str,
    pub meanwhile: &'static str,
}

impl Watch {
    /// The watch's events until `shutdown`: failed requests are counted, logged and
    /// retried with backoff, never yielded, so the caller handles events only.
    pub fn events<K>(self, api: Api<K>, shutdown: CancellationToken) -> impl Stream<Item = watcher::Event<K>> + Send
    where
        K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    {
        let config = watcher::Config::default()
            .fields(&self.fields)
            .timeout(self.timeout.as_secs().try_into().unwrap_or(u32::MAX));
        let Watch { errors, what, meanwhile, .. } = self;
        watcher(api, config)
            .default_backoff()
            .filter_map(move |event| {
                let event = event
                    .inspect_err(|e| {
                        errors.inc();
                        warn!(error = %e, watch = what, "the watch failed; retrying ({meanwhile})");
                    })
                    .ok();
                std::future::ready(event)
            })
            .take_until(shutdown.cancelled_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_default_is_the_default_watch_timeout() {
        let period: api::duration::Period = DEFAULT_WATCH_TIMEOUT_FLAG.parse().unwrap();
        assert_eq!(period.as_duration(), DEFAULT_WATCH_TIMEOUT);
    }
}
