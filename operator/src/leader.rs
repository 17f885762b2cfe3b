//! Leader election on a `coordination.k8s.io/v1` Lease, so that two replicas never
//! write at the same time. The holder renews the lease every `renew`; others take it
//! over once it has not been renewed for `duration`. Writes use the lease's
//! resourceVersion, so two candidates cannot both win.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::MicroTime,
    jiff::Timestamp,
};
use kube::{
    api::{ObjectMeta, PostParams},
    Api, Client,
};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub struct LeaderElection {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
    pub renew: Duration,
}

impl LeaderElection {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str) -> Self {
        LeaderElection {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(15),
            renew: Duration::from_secs(5),
        }
    }

    /// Keeps trying to hold the lease until `shutdown`; publishes whether this replica
    /// leads. Releases the lease on shutdown so a successor takes over at once.
    pub async fn run(self, leading: watch::Sender<bool>, shutdown: CancellationToken) {
        loop {
            let is_leader = match self.try_acquire_or_renew().await {
                Ok(held) => held,
                Err(e) => {
                    warn!(error = %e, lease = %self.name, "leader election: could not read or write the lease");
                    // Without a renewal we cannot know we still lead: step down.
                    false
                }
            };
            if *leading.borrow() != is_leader {
                info!(identity = %self.identity, leading = is_leader, "leadership changed");
                leading.send_replace(is_leader);
            }
            tokio::select! {
                _ = tokio::time::sleep(self.renew) => {}
                _ = shutdown.cancelled() => break,
            }
        }
        if *leading.borrow() {
            if let Err(e) = self.release().await {
                warn!(error = %e, "could not release the lease");
            }
            leading.send_replace(false);
        }
    }

    async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta { name: Some(self.name.clone()), ..Default::default() },
                spec: Some(self.spec(now, 0)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            };
        };
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let renewed = spec.renew_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
        let lease_for = Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64);
        let expired = now.duration_since(renewed).unsigned_abs() > lease_for;
        if holder != self.identity && !holder.is_empty() && !expired {
            return Ok(false);
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(holder != self.identity);
        let mut new_spec = self.spec(now, transitions);
        if holder == self.identity {
            new_spec.acquire_time = spec.acquire_time;
        }
        lease.spec = Some(new_spec);
        // The resourceVersion in `lease` makes this a compare-and-swap.
        match self.api.replace(&self.name, &PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e),
        }
    }

    fn spec(&self, now: Timestamp, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration.as_secs() as i32),
            acquire_time: Some(MicroTime(now)),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    async fn release(&self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else { return Ok(()) };
        let Some(spec) = lease.spec.as_mut() else { return Ok(()) };
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        self.api.replace(&self.name, &PostParams::default(), &lease).await.map(|_| ())
    }
}
