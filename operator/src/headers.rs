//! The OTLP headers of the configs' Secrets (`spec.sinks.otlp.headersSecret`), mirrored
//! into one Secret of the operator's namespace (`--otlp-headers-secret`), the only Secret
//! the agents may read.
//!
//! Least privilege both ways: the agents never read a team's Secret, and the operator
//! reads a team's Secret only where the team granted it (a Role in its namespace giving
//! the operator's ServiceAccount `get` on that Secret, by name: docs/configuration.md,
//! "OTLP headers").
//! The chart grants the operator no Secret of any other namespace, and in its own only
//! the mirror, by name. Each pass reads the Secrets of the accepted configs that name
//! one, checks their headers ([`api::otlp::check_headers`]) and applies the mirror
//! (server-side apply) when its content changed; a key whose Secret could not be read
//! for a passing reason (not a refusal or absence) keeps what was mirrored before.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Mutex,
};

use api::{
    node_config::Route,
    otlp::{check_headers, headers_key, mirror_value},
    validate::ConfigKey,
};
use k8s_openapi::{api::core::v1::Secret, ByteString};
use kube::{
    api::{Patch, PatchParams},
    Api, Client,
};
use serde_json::json;
use tracing::{info, warn};

use crate::MANAGER;

/// Bytes of the mirror's data at most: the API server refuses a Secret over 1 MiB. One
/// config's headers take at most ~16 KiB (8 KiB, JSON-escaped); realistic ones ~100 bytes.
pub const MAX_MIRROR_BYTES: usize = 768 * 1024;

/// What a config's `headersSecret` gave in a pass, for its `OtlpHeaders` condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeadersOutcome {
    /// The headers reach the agents.
    pub mirrored: bool,
    /// `Mirrored`, `Forbidden`, `NotFound`, `Invalid`, `MirrorFull` or `ReadFailed`.
    pub reason: &'static str,
    pub message: String,
}

impl HeadersOutcome {
    fn refused(reason: &'static str, message: String) -> Self {
        HeadersOutcome { mirrored: false, reason, message }
    }
}

/// The mirror and what it holds.
pub struct HeadersMirror {
    client: Client,
    namespace: String,
    name: String,
    /// What was last applied (key → value); `None` before the first apply of this process.
    written: Mutex<Option<BTreeMap<String, String>>>,
}

impl HeadersMirror {
    pub fn new(client: Client, namespace: &str, name: &str) -> Self {
        HeadersMirror { client, namespace: namespace.to_owned(), name: name.to_owned(), written: Mutex::new(None) }
    }

    /// Reads the Secrets the routes name and applies the mirror if it changed. Returns
    /// each config's outcome; `Err`: the mirror could not be written (retried next pass).
    pub async fn sync<'r>(
        &self,
        routes: impl Iterator<Item = (&'r ConfigKey, &'r Route)>,
    ) -> (HashMap<ConfigKey, HeadersOutcome>, Result<bool, kube::Error>) {
        let previous = self.written.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut data: BTreeMap<String, String> = BTreeMap::new();
        let mut outcomes = HashMap::new();
        let mut bytes = 0usize;
        for (key, route) in routes {
            let Some(secret) = route.otlp.as_ref().and_then(|o| o.headers_secret.as_ref()) else { continue };
            let mirror_key = headers_key(&route.config);
            let outcome = match self.read(&key.namespace, &secret.name).await {
                Ok(headers) => {
                    let value = mirror_value(&headers);
                    bytes += mirror_key.len() + value.len();
                    if bytes > MAX_MIRROR_BYTES {
                        HeadersOutcome::refused(
                            "MirrorFull",
                            format!("the mirrored headers of all configs exceed {MAX_MIRROR_BYTES} bytes"),
                        )
                    } else {
                        data.insert(mirror_key, value);
                        let message = format!(
                            "the {} header(s) of Secret {}/{} reach the agents",
                            headers.len(),
                            key.namespace,
                            secret.name
                        );
                        HeadersOutcome { mirrored: true, reason: "Mirrored", message }
                    }
                }
                Err(outcome) if outcome.reason == "ReadFailed" => {
                    // A passing failure: what reached the agents stays.
                    if let Some(kept) = previous.as_ref().and_then(|p| p.get(&mirror_key)) {
                        data.insert(mirror_key, kept.clone());
                    }
                    outcome
                }
                Err(outcome) => outcome,
            };
            outcomes.insert(key.clone(), outcome);
        }
        if previous.as_ref() == Some(&data) {
            return (outcomes, Ok(false));
        }
        let secret = json!({
            "apiVersion": "v1",
            "kind": "Secret",
            // Only the data: the chart creates the Secret with its labels.
            "metadata": { "name": self.name, "namespace": self.namespace },
            "type": "Opaque",
            "data": data.iter().map(|(k, v)| (k.clone(), ByteString(v.as_bytes().to_vec()))).collect::<BTreeMap<_, _>>(),
        });
        let api: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        let applied = api.patch(&self.name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&secret)).await;
        match applied {
            Ok(_) => {
                info!(secret = %self.name, configs = data.len(), "mirrored the OTLP headers");
                *self.written.lock().unwrap_or_else(|p| p.into_inner()) = Some(data);
                (outcomes, Ok(true))
            }
            Err(e) => (outcomes, Err(e)),
        }
    }

    /// The checked headers of one Secret, or why not.
    async fn read(&self, namespace: &str, name: &str) -> Result<Vec<(String, String)>, HeadersOutcome> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let field = "spec.sinks.otlp.headersSecret";
        match api.get_opt(name).await {
            Ok(Some(secret)) => {
                let data = secret.data.unwrap_or_default();
                check_headers(data.iter().map(|(k, v)| (k.as_str(), v.0.as_slice())))
                    .map_err(|e| HeadersOutcome::refused("Invalid", format!("{field}: Secret {namespace}/{name}: {e}")))
            }
            Ok(None) => {
                Err(HeadersOutcome::refused("NotFound", format!("{field}: Secret {namespace}/{name} does not exist")))
            }
            Err(kube::Error::Api(e)) if e.code == 403 => Err(HeadersOutcome::refused(
                "Forbidden",
                format!(
                    "{field}: the operator may not read Secret {namespace}/{name}: grant its ServiceAccount `get` on \
                     that Secret with a Role and RoleBinding in {namespace} (docs/configuration.md, \"OTLP headers\")"
                ),
            )),
            Err(e) => {
                warn!(secret = %name, %namespace, error = %e, "could not read an OTLP headers Secret; keeping what was mirrored");
                Err(HeadersOutcome::refused("ReadFailed", format!("{field}: reading Secret {namespace}/{name}: {e}")))
            }
        }
    }
}
