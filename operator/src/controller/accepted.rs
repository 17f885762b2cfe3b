//! The last accepted version of each config, kept on the config itself so that it
//! survives an operator restart and a leader change: when an edit makes a config
//! invalid, its nodes keep running the version accepted before, whichever replica
//! renders them.
//!
//! The operator records the spec it accepted, with its generation, in the annotation
//! [`LAST_ACCEPTED_ANNOTATION`] of the NeuronMonitorConfig (server-side apply, its own
//! field), once per generation. An annotation rather than the node ConfigMaps' routes:
//! the routes hold what each node runs, not the selector and periods that decide which
//! nodes a config reaches, so a node that joins later could not be rendered from them;
//! and rather than the status, which tools and backups treat as re-derivable. What is
//! read back is validated again like any spec: the annotation grants nothing a user
//! could not write in the spec.

use api::{
    crd::{NeuronMonitorConfig, NeuronMonitorConfigSpec},
    validate::{self, ValidConfig},
};
use kube::{
    api::{Patch, PatchParams},
    Api, Resource, ResourceExt,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Controller, Error, MANAGER};

/// Annotation holding the last accepted spec and its generation (JSON).
pub const LAST_ACCEPTED_ANNOTATION: &str = "neuronmonitor.io/last-accepted";

/// Largest annotation read back. The API server keeps all of an object's annotations
/// under 256 KiB; an accepted spec renders to at most 16 KiB of route
/// (`api::limits::MAX_CONFIG_RENDERED_BYTES`), its selector and health add little.
const MAX_LAST_ACCEPTED_BYTES: usize = 128 * 1024;

#[derive(Serialize, Deserialize)]
struct LastAccepted {
    generation: i64,
    spec: NeuronMonitorConfigSpec,
}

/// Whether the config's current generation is the one recorded.
pub(super) fn is_recorded(config: &NeuronMonitorConfig) -> bool {
    #[derive(Deserialize)]
    struct Generation {
        generation: i64,
    }
    let recorded = config.annotations().get(LAST_ACCEPTED_ANNOTATION);
    let generation = recorded.and_then(|text| serde_json::from_str::<Generation>(text).ok());
    generation.is_some_and(|g| Some(g.generation) == config.metadata.generation)
}

/// The version recorded on `config`, validated again as the operator of `namespace`
/// would, with the object it is of: the same name, uid and creation time (the same
/// precedence), the accepted spec and its generation. `None` when there is none, or it
/// is unreadable or no longer valid.
pub(super) fn recorded(config: &NeuronMonitorConfig, namespace: &str) -> Option<(NeuronMonitorConfig, ValidConfig)> {
    let text = config.annotations().get(LAST_ACCEPTED_ANNOTATION)?;
    if text.len() > MAX_LAST_ACCEPTED_BYTES {
        return None;
    }
    let last: LastAccepted = serde_json::from_str(text).ok()?;
    let mut previous = NeuronMonitorConfig::new(&config.name_any(), last.spec);
    previous.metadata = config.metadata.clone();
    previous.metadata.generation = Some(last.generation);
    let valid = validate::validate(&previous, namespace).ok()?;
    Some((previous, valid))
}

impl Controller {
    /// Records the config's current spec as its last accepted version.
    pub(super) async fn record_accepted(&self, config: &NeuronMonitorConfig) -> Result<(), Error> {
        let last = LastAccepted { generation: config.metadata.generation.unwrap_or(0), spec: config.spec.clone() };
        let patch = json!({
            "apiVersion": NeuronMonitorConfig::api_version(&()),
            "kind": NeuronMonitorConfig::kind(&()),
            "metadata": { "annotations": { LAST_ACCEPTED_ANNOTATION: serde_json::to_string(&last)? } },
        });
        let api: Api<NeuronMonitorConfig> =
            Api::namespaced(self.client.clone(), &config.namespace().unwrap_or_default());
        api.patch(&config.name_any(), &PatchParams::apply(MANAGER).force(), &Patch::Apply(&patch)).await?;
        self.metrics.wrote("config", "annotate");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(generation: i64, annotation: Option<String>) -> NeuronMonitorConfig {
        let mut c = NeuronMonitorConfig::new("c", NeuronMonitorConfigSpec::default());
        c.metadata.namespace = Some("team".into());
        c.metadata.generation = Some(generation);
        c.metadata.uid = Some("uid-1".into());
        c.metadata.annotations = annotation.map(|a| [(LAST_ACCEPTED_ANNOTATION.to_owned(), a)].into());
        c
    }

    fn valid_spec() -> NeuronMonitorConfigSpec {
        serde_json::from_value(json!({ "runtimes": [{ "metrics": [{ "type": "memory_used" }] }] })).unwrap()
    }

    #[test]
    fn the_recorded_spec_is_validated_again() {
        let last = LastAccepted { generation: 3, spec: valid_spec() };
        let c = config(4, Some(serde_json::to_string(&last).unwrap()));
        assert!(!is_recorded(&c), "generation 4 is not the recorded 3");
        let (object, valid) = recorded(&c, "neuron-monitor").expect("the recorded spec");
        assert_eq!(object.metadata.generation, Some(3), "the recorded generation");
        assert_eq!(valid.key.to_string(), "team/c");
        assert_eq!(valid.route.runtimes.len(), 1);
        assert!(is_recorded(&config(3, Some(serde_json::to_string(&last).unwrap()))));

        // A recorded spec that is not valid (any more) is not used.
        let spec = serde_json::from_value(json!({ "runtimes": [{ "tagFilter": "((", "metrics": [] }] })).unwrap();
        let invalid = LastAccepted { generation: 3, spec };
        assert!(recorded(&config(4, Some(serde_json::to_string(&invalid).unwrap())), "neuron-monitor").is_none());
    }

    #[test]
    fn unreadable_or_oversized_annotations_are_ignored() {
        for text in ["", "{", "[]", r#"{"generation":"x"}"#] {
            let c = config(1, Some(text.to_owned()));
            assert!(!is_recorded(&c) && recorded(&c, "neuron-monitor").is_none(), "{text:?}");
        }
        assert!(recorded(&config(1, None), "neuron-monitor").is_none());
        let huge = format!(
            r#"{{"generation":1,"spec":{{"runtimes":[{{"tagFilter":"{}","metrics":[{{"type":"memory_used"}}]}}]}}}}"#,
            "a".repeat(MAX_LAST_ACCEPTED_BYTES)
        );
        assert!(recorded(&config(2, Some(huge)), "neuron-monitor").is_none());
    }
}
