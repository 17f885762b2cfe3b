//! What the cluster's API server serves that a config may ask for: the DeviceTaintRule API
//! of `spec.health.deviceTaints` (`service::device_taints`), found by discovery only
//! while a config asks for it, and cached for [`CACHE_FOR`] (a cluster upgrade or the
//! alpha API turned on is seen within it). A config asking for an API the cluster does
//! not serve is refused (`Unsupported`, the field named and why), never rendered.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

use api::{
    crd::{DeviceTaintEffect, NeuronMonitorConfig},
    validate::{Invalid, Refusal, ValidConfig},
};
use kube::Client;
use tracing::warn;

/// How long a discovery's answer is used.
const CACHE_FOR: Duration = Duration::from_secs(60);

/// The DeviceTaintRule API as the last discovery found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum DeviceTaintApi {
    /// Not asked (no config wants it) or discovery failed: nothing is refused for it.
    Unknown,
    Missing,
    Served {
        accepts_inform: bool,
    },
}

#[derive(Default)]
pub(super) struct ClusterApis {
    device_taints: Mutex<Option<(Instant, DeviceTaintApi)>>,
}

/// Whether a config asks for DeviceTaintRules.
fn wants_device_taints(config: &NeuronMonitorConfig) -> bool {
    let health = config.spec.health.as_ref();
    health.and_then(|h| h.device_taints.as_ref()).is_some_and(|d| d.enabled == Some(true))
}

impl ClusterApis {
    /// The DeviceTaintRule API, asked of the API server when one of `configs` wants it and
    /// the last answer is older than [`CACHE_FOR`].
    pub(super) async fn device_taints(
        &self,
        client: &Client,
        configs: &[std::sync::Arc<NeuronMonitorConfig>],
    ) -> DeviceTaintApi {
        if !configs.iter().any(|c| wants_device_taints(c)) {
            return DeviceTaintApi::Unknown;
        }
        let cached = *self.device_taints.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((at, api)) = cached.filter(|(at, _)| at.elapsed() < CACHE_FOR) {
            let _ = at;
            return api;
        }
        let api = match service::device_taints::served(client).await {
            Ok(Some(served)) => DeviceTaintApi::Served { accepts_inform: served.accepts_inform },
            Ok(None) => DeviceTaintApi::Missing,
            Err(e) => {
                warn!(error = %e, "cannot tell whether the API server serves DeviceTaintRules; asked again next pass");
                return cached.map_or(DeviceTaintApi::Unknown, |(_, api)| api);
            }
        };
        *self.device_taints.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), api));
        api
    }
}

/// Refuses a config whose `spec.health.deviceTaints` the cluster cannot carry out.
pub(super) fn check_device_taints(valid: &ValidConfig, api: DeviceTaintApi) -> Result<(), Invalid> {
    let Some(taints) = valid.health.as_ref().and_then(|h| h.device_taints) else { return Ok(()) };
    let field = "spec.health.deviceTaints";
    match api {
        DeviceTaintApi::Missing => Err(Invalid::of(
            Refusal::Unsupported,
            field,
            "the API server serves no DeviceTaintRule (resource.k8s.io): it is served from Kubernetes 1.36, and in \
             1.33 to 1.35 only with the feature gates DRADeviceTaints (and DRADeviceTaintRules from 1.35) and \
             --runtime-config=resource.k8s.io/v1alpha3=true",
        )),
        DeviceTaintApi::Served { accepts_inform: false } if taints.effect == DeviceTaintEffect::Inform => {
            Err(Invalid::of(
                Refusal::Unsupported,
                format!("{field}.effect"),
                "the API server refuses the taint effect None (Kubernetes 1.35 and later accept it): use NoSchedule or NoExecute",
            ))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api::validate::validate;

    fn config(device_taints: serde_json::Value) -> ValidConfig {
        let spec = serde_json::json!({ "health": { "deviceTaints": device_taints } });
        let mut config = NeuronMonitorConfig::new("c", serde_json::from_value(spec).unwrap());
        config.metadata.namespace = Some("ops".to_owned());
        validate(&config, "ops").unwrap()
    }

    #[test]
    fn device_taints_are_refused_where_the_api_is_not_served() {
        let on = config(serde_json::json!({ "enabled": true }));
        let refused = check_device_taints(&on, DeviceTaintApi::Missing).unwrap_err();
        assert_eq!((refused.field.as_str(), refused.kind), ("spec.health.deviceTaints", Refusal::Unsupported));
        assert!(refused.reason.contains("DeviceTaintRule"), "{refused}");
        assert_eq!(check_device_taints(&on, DeviceTaintApi::Served { accepts_inform: false }), Ok(()));
        assert_eq!(check_device_taints(&on, DeviceTaintApi::Unknown), Ok(()), "discovery failed: not refused for it");
        let off = config(serde_json::json!({ "enabled": false }));
        assert_eq!(check_device_taints(&off, DeviceTaintApi::Missing), Ok(()));
    }

    #[test]
    fn the_effect_none_is_refused_where_the_api_server_refuses_it() {
        let inform = config(serde_json::json!({ "enabled": true, "effect": "None" }));
        let refused = check_device_taints(&inform, DeviceTaintApi::Served { accepts_inform: false }).unwrap_err();
        assert_eq!(refused.field, "spec.health.deviceTaints.effect");
        assert_eq!(check_device_taints(&inform, DeviceTaintApi::Served { accepts_inform: true }), Ok(()));
    }
}
