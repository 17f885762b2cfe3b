//! The headers of the configs' Secrets, as the operator mirrors them into one Secret of
//! its namespace (`--otlp-headers-secret`): the only Secret the agent reads, by name
//! (the chart grants `get`, `list` and `watch` on that name alone). Each key is a
//! config's ([`api::otlp::headers_key`]), each value its headers ([`api::otlp::mirror_value`]),
//! checked again here.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kube::{runtime::watcher::Event, Api, Client};
use service::tasks::CriticalTasks;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::telemetry::OtlpMetrics;
use crate::{kubernetes::Watch, routing::SharedRouting};

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

/// How often the agent checks whether a config in force names a `headersSecret`.
const NEED_CHECK: Duration = Duration::from_secs(1);

/// Follows the mirror Secret `namespace/name` until `shutdown`, while a config in force
/// (`routing`) names a `headersSecret`: most nodes never need it, and a watch per agent
/// is load on the API server at fleet scale. No Secret, no headers. The follower is one
/// of `tasks`.
#[allow(clippy::too_many_arguments)] // the follower's inputs, each used once
pub fn follow(
    tasks: &mut CriticalTasks,
    client: Client,
    namespace: &str,
    name: &str,
    routing: SharedRouting,
    watch_timeout: Duration,
    metrics: OtlpMetrics,
    shutdown: CancellationToken,
) -> watch::Receiver<MirroredHeaders> {
    let (tx, rx) = watch::channel(MirroredHeaders::default());
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    let needed = move || routing.current().names_otlp_headers();
    tasks.spawn("OTLP headers follower", async move {
        loop {
            while !needed() {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(NEED_CHECK) => {}
                }
            }
            info!(secret = %name, %namespace, "following the OTLP headers");
            metrics.headers_followed.set(1);
            let watch = Watch {
                fields: format!("metadata.name={name}"),
                timeout: watch_timeout,
                errors: metrics.headers_watch_errors.clone(),
                what: "the OTLP headers Secret",
                meanwhile: "the headers last read stay in use",
            };
            let stop = shutdown.child_token();
            let mut events = std::pin::pin!(watch.events(api.clone(), stop.clone()));
            let mut check = tokio::time::interval(NEED_CHECK);
            let mut seen_in_listing = false;
            loop {
                let event = tokio::select! {
                    event = events.next() => match event {
                        Some(event) => event,
                        None => break,
                    },
                    _ = check.tick() => {
                        if needed() { continue }
                        stop.cancel();
                        break;
                    }
                };
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
            if shutdown.is_cancelled() {
                return;
            }
            info!(secret = %name, "no config names OTLP headers: the Secret is no longer followed");
            metrics.headers_followed.set(0);
            tx.send_replace(MirroredHeaders::default());
        }
    });
    rx
}
