//! The headers of the configs' Secrets, as the operator mirrors them into one Secret of
//! its namespace (`--otlp-headers-secret`): the only Secret the agent reads, by name
//! (the chart grants `get`, `list` and `watch` on that name alone). Each key is a
//! config's ([`api::otlp::headers_key`]), each value its headers ([`api::otlp::mirror_value`]),
//! checked again here.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{runtime::watcher::Event, Api, Client};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::kubernetes::Watch;

/// Each config's headers (by [`api::otlp::headers_key`]), or why they are unusable.
pub type MirroredHeaders = Arc<BTreeMap<String, Result<Vec<(String, String)>, String>>>;

/// The headers of a mirror Secret.
pub fn parse(secret: &Secret) -> BTreeMap<String, Result<Vec<(String, String)>, String>> {
    secret
        .data
        .iter()
        .flatten()
        .map(|(key, value)| {
            let headers = api::otlp::parse_mirror_value(&value.0).map_err(|e| format!("mirror key {key}: {e}"));
            (key.clone(), headers)
        })
        .collect()
}

/// Follows the mirror Secret `namespace/name` until `shutdown`; no Secret, no headers.
pub fn follow(
    client: Client,
    namespace: &str,
    name: &str,
    watch_timeout: Duration,
    errors: Counter,
    shutdown: CancellationToken,
) -> watch::Receiver<MirroredHeaders> {
    let (tx, rx) = watch::channel(MirroredHeaders::default());
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let watch = Watch {
        fields: format!("metadata.name={name}"),
        timeout: watch_timeout,
        errors,
        what: "the OTLP headers Secret",
        meanwhile: "the headers last read stay in use",
    };
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watch.events(api, shutdown));
        let mut seen_in_listing = false;
        info!(secret = %name, %namespace, "following the OTLP headers");
        while let Some(event) = events.next().await {
            let headers = match event {
                Event::Init => {
                    seen_in_listing = false;
                    continue;
                }
                Event::InitApply(secret) => {
                    seen_in_listing = true;
                    parse(&secret)
                }
                Event::Apply(secret) => parse(&secret),
                Event::InitDone if seen_in_listing => continue,
                Event::InitDone | Event::Delete(_) => BTreeMap::new(),
            };
            for (key, why) in headers.iter().filter_map(|(k, h)| Some((k, h.as_ref().err()?))) {
                warn!(secret = %name, key = %key, error = %why, "OTLP headers left unused");
            }
            tx.send_replace(Arc::new(headers));
        }
    });
    rx
}
