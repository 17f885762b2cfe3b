//! Whether the API server serves DeviceTaintRules (`api::device_taints`), and at which
//! version: what the operator checks before it accepts `spec.health.deviceTaints`, and the
//! agent before it publishes a rule. Discovery, two or three requests: the API groups,
//! then the group's versions the agent may use, the preferred first.

use api::device_taints::{accepts_inform, minor_version, GROUP, KIND, VERSIONS};
use kube::{
    core::{discovery::ApiResource, GroupVersion},
    discovery, Client,
};

/// DeviceTaintRules as this API server serves them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Served {
    pub resource: ApiResource,
    /// The taint effect `None` is accepted (Kubernetes 1.35 and later).
    pub accepts_inform: bool,
}

/// The served version the agent would use, `None` when no version serves the kind.
pub async fn served(client: &Client) -> Result<Option<Served>, kube::Error> {
    let groups = client.list_api_groups().await?;
    let Some(group) = groups.groups.into_iter().find(|g| g.name == GROUP) else { return Ok(None) };
    let listed: Vec<String> = group.versions.into_iter().map(|v| v.version).collect();
    for version in VERSIONS.into_iter().filter(|v| listed.iter().any(|l| l == v)) {
        let gv = GroupVersion::gv(GROUP, version);
        let Some((resource, _)) = discovery::pinned_group(client, &gv).await?.recommended_kind(KIND) else {
            continue;
        };
        let minor = if version == "v1alpha3" {
            client.apiserver_version().await.ok().and_then(|info| minor_version(&info.minor))
        } else {
            None
        };
        return Ok(Some(Served { resource, accepts_inform: accepts_inform(version, minor) }));
    }
    Ok(None)
}
