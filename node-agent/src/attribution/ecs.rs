//! Which ECS task and container each Docker container of this host belongs to, from the
//! ECS container agent's introspection API (`GET /v1/tasks`, on `127.0.0.1:51678` of the
//! container instance; the agent's task needs the host network to reach it).
//!
//! The poller lists every task at once and replaces the index, so the report path only
//! looks up a container ID ([`EcsIndex::container`]) found in the process's cgroup.
//! Everything from the ECS agent is bounded: the response size, the number of containers
//! and the length of each value.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
    time::Duration,
};

use http::Uri;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::AttributionMetrics;
use crate::{
    state::{label_value, EcsContainer},
    telemetry::ResultLabel,
};

/// How often the ECS agent is asked (a new task's runtime is labelled within this), and
/// how long one answer may take.
pub const POLL_INTERVAL: Duration = Duration::from_secs(5);
pub const POLL_TIMEOUT: Duration = Duration::from_secs(2);
/// The ECS agent's response is a few KiB per task; more than this is not one.
pub const MAX_RESPONSE_BYTES: usize = 4 << 20;
/// Containers indexed at most (ECS places far fewer on one instance).
pub const MAX_CONTAINERS: usize = 4096;
/// Longest ARN, family or container name taken (ECS's own limits are 255 characters for
/// names; a task ARN is well under 200); a longer value leaves its container out.
pub const MAX_VALUE_BYTES: usize = 512;

/// Containers of the running tasks, by Docker container ID.
#[derive(Debug, Default)]
pub struct EcsIndex {
    containers: HashMap<String, Arc<EcsContainer>>,
    generation: u64,
}

pub type SharedEcs = Arc<RwLock<EcsIndex>>;

impl EcsIndex {
    pub fn container(&self, docker_id: &str) -> Option<&Arc<EcsContainer>> {
        self.containers.get(docker_id)
    }

    /// Bumped by every change, so that cached lookups know when to look again.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    pub fn len(&self) -> usize {
        self.containers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    pub(super) fn replace(&mut self, containers: HashMap<String, Arc<EcsContainer>>) {
        if containers != self.containers {
            self.containers = containers;
            self.generation += 1;
        }
    }
}

/// `GET /v1/tasks`, the fields used.
#[derive(Deserialize)]
struct TasksResponse {
    #[serde(rename = "Tasks", default)]
    tasks: Vec<Task>,
}

#[derive(Deserialize)]
struct Task {
    #[serde(rename = "Arn", default)]
    arn: String,
    #[serde(rename = "Family", default)]
    family: String,
    #[serde(rename = "KnownStatus", default)]
    known_status: String,
    #[serde(rename = "Containers", default)]
    containers: Vec<Container>,
}

#[derive(Deserialize)]
struct Container {
    #[serde(rename = "DockerId", default)]
    docker_id: String,
    #[serde(rename = "Name", default)]
    name: String,
}

/// The containers of a `/v1/tasks` response, without stopped tasks, containers not
/// started yet (no Docker ID) or values over [`MAX_VALUE_BYTES`]; the label values (ARN,
/// family, container name) made label values as a report's are ([`label_value`]), and
/// how many that changed.
pub fn parse_tasks(body: &[u8]) -> Result<(HashMap<String, Arc<EcsContainer>>, u64), serde_json::Error> {
    let response: TasksResponse = serde_json::from_slice(body)?;
    let fits = |s: &str| !s.is_empty() && s.len() <= MAX_VALUE_BYTES;
    let mut changed = 0;
    let mut containers = HashMap::new();
    for task in response.tasks.into_iter().filter(|t| t.known_status != "STOPPED") {
        if !fits(&task.arn) || !fits(&task.family) {
            continue;
        }
        let (arn, family) = (label_value(&task.arn, &mut changed), label_value(&task.family, &mut changed));
        for c in task.containers {
            if containers.len() >= MAX_CONTAINERS {
                return Ok((containers, changed));
            }
            if fits(&c.docker_id) && fits(&c.name) {
                let container = label_value(&c.name, &mut changed);
                let container = EcsContainer { task_arn: arn.clone(), family: family.clone(), container };
                containers.insert(c.docker_id, Arc::new(container));
            }
        }
    }
    Ok((containers, changed))
}

/// Why a poll of the ECS agent failed.
#[derive(Debug, thiserror::Error)]
enum PollError {
    #[error("connecting: {0}")]
    Connect(std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("status {0}")]
    Status(http::StatusCode),
    #[error("reading the response: {0}")]
    Body(Box<dyn std::error::Error + Send + Sync>),
    #[error("response: {0}")]
    Json(#[from] serde_json::Error),
    #[error("no answer within the timeout")]
    Timeout,
}

/// Keeps the [`EcsIndex`] current.
pub struct EcsPoller {
    /// The ECS agent's base URI, `http://127.0.0.1:51678`.
    pub agent: Uri,
    pub interval: Duration,
    pub timeout: Duration,
    pub index: SharedEcs,
    pub metrics: AttributionMetrics,
}

impl EcsPoller {
    pub async fn run(self, shutdown: CancellationToken) {
        let mut failing = false;
        loop {
            let result = match tokio::time::timeout(self.timeout, self.poll()).await {
                Ok(result) => result,
                Err(_) => Err(PollError::Timeout),
            };
            let label = match &result {
                Ok(_) => "ok",
                Err(PollError::Timeout) => "timeout",
                Err(_) => "error",
            };
            self.metrics.ecs_requests.get_or_create(&ResultLabel { result: label }).inc();
            match result {
                Ok((containers, changed)) => {
                    debug!(containers = containers.len(), "ECS tasks listed");
                    self.metrics.ecs_label_values_changed.set(changed as i64);
                    failing = false;
                    let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
                    index.replace(containers);
                    self.metrics.ecs_containers.set(index.len() as i64);
                }
                // The last known tasks stay: a restarting ECS agent does not stop the tasks.
                Err(e) if !failing => {
                    failing = true;
                    warn!(agent = %self.agent, error = %e, "the ECS agent's introspection API did not answer; keeping the last known tasks");
                }
                Err(e) => debug!(error = %e, "ECS agent still not answering"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
        }
    }

    async fn poll(&self) -> Result<(HashMap<String, Arc<EcsContainer>>, u64), PollError> {
        let authority = self.agent.authority().map(|a| a.as_str()).unwrap_or("127.0.0.1:51678");
        let address = if self.agent.port().is_some() { authority.to_owned() } else { format!("{authority}:80") };
        let stream = tokio::net::TcpStream::connect(&address).await.map_err(PollError::Connect)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let connection = tokio::spawn(connection);
        let request = http::Request::get("/v1/tasks")
            .header(http::header::HOST, authority)
            .body(Empty::<Bytes>::new())
            .map_err(|e| PollError::Body(e.into()))?;
        let response = sender.send_request(request).await?;
        if !response.status().is_success() {
            connection.abort();
            return Err(PollError::Status(response.status()));
        }
        let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES).collect().await.map_err(PollError::Body);
        connection.abort();
        Ok(parse_tasks(&body?.to_bytes())?)
    }
}

/// An ECS agent URI the poller can use: `http://host:port`, nothing after the authority.
pub fn parse_agent_uri(s: &str) -> Result<Uri, String> {
    let uri: Uri = s.parse().map_err(|e| format!("{e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err("expected http://host:port (the ECS agent's introspection API)".to_owned());
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
        return Err("expected no path: /v1/tasks is appended".to_owned());
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TASKS: &str = include_str!("testdata/ecs/tasks.json");

    #[test]
    fn running_containers_are_indexed_by_docker_id() {
        let (containers, changed) = parse_tasks(TASKS.as_bytes()).unwrap();
        assert_eq!(changed, 0);
        let train = &containers["5b1e7c2d9f3a4b6c8d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e"];
        assert_eq!(train.family, "bert-training");
        assert_eq!(train.container, "trainer");
        assert_eq!(train.task_arn, "arn:aws:ecs:us-west-2:123456789012:task/neuron/0f1e2d3c4b5a69788796a5b4c3d2e1f0");
        // The stopped task and the container not started yet are left out.
        assert_eq!(containers.len(), 2, "{containers:?}");
    }

    #[test]
    fn oversized_values_and_garbage_are_refused() {
        let long = "x".repeat(MAX_VALUE_BYTES + 1);
        let body = format!(
            r#"{{"Tasks":[{{"Arn":"{long}","Family":"f","KnownStatus":"RUNNING","Containers":[{{"DockerId":"a","Name":"n"}}]}},
                         {{"Arn":"arn","Family":"f","KnownStatus":"RUNNING","Containers":[{{"DockerId":"b","Name":"{long}"}}]}}]}}"#
        );
        assert!(parse_tasks(body.as_bytes()).unwrap().0.is_empty());
        assert!(parse_tasks(b"<html>").is_err());
        assert!(parse_tasks(b"{}").unwrap().0.is_empty());
    }

    /// Issue 24 (smaller): ECS values are label values as a report's are: control
    /// characters replaced, cut to the same bound, each change counted.
    #[test]
    fn label_values_are_sanitised_like_report_labels() {
        let long_family = "f".repeat(300);
        let body = format!(
            r#"{{"Tasks":[{{"Arn":"arn\nforged=\"1\"","Family":"{long_family}","KnownStatus":"RUNNING",
                 "Containers":[{{"DockerId":"a","Name":"main\u0007"}}]}}]}}"#
        );
        let (containers, changed) = parse_tasks(body.as_bytes()).unwrap();
        let c = &containers["a"];
        let mut report_changed = 0;
        assert_eq!(c.task_arn, label_value("arn\nforged=\"1\"", &mut report_changed));
        assert_eq!(c.task_arn, "arn\u{fffd}forged=\"1\"");
        assert_eq!(c.family, label_value(&long_family, &mut report_changed));
        assert_eq!(c.family.len(), api::limits::MAX_REPORT_LABEL_VALUE_BYTES);
        assert_eq!(c.container, "main\u{fffd}");
        assert_eq!(changed, 3);
    }

    #[test]
    fn at_most_max_containers_are_indexed() {
        let containers: Vec<String> =
            (0..MAX_CONTAINERS + 10).map(|i| format!(r#"{{"DockerId":"{i:064x}","Name":"c"}}"#)).collect();
        let body = format!(
            r#"{{"Tasks":[{{"Arn":"arn","Family":"f","KnownStatus":"RUNNING","Containers":[{}]}}]}}"#,
            containers.join(",")
        );
        assert_eq!(parse_tasks(body.as_bytes()).unwrap().0.len(), MAX_CONTAINERS);
    }

    #[test]
    fn agent_uris_are_checked() {
        assert!(parse_agent_uri("http://127.0.0.1:51678").is_ok());
        assert!(parse_agent_uri("http://127.0.0.1:51678/").is_ok());
        assert!(parse_agent_uri("https://127.0.0.1:51678").is_err());
        assert!(parse_agent_uri("http://127.0.0.1:51678/v1/tasks").is_err());
        assert!(parse_agent_uri("127.0.0.1:51678").is_err());
    }

    #[test]
    fn a_changed_listing_bumps_the_generation_and_an_equal_one_does_not() {
        let mut index = EcsIndex::default();
        index.replace(parse_tasks(TASKS.as_bytes()).unwrap().0);
        assert_eq!(index.generation(), 1);
        index.replace(parse_tasks(TASKS.as_bytes()).unwrap().0);
        assert_eq!(index.generation(), 1);
        index.replace(HashMap::new());
        assert_eq!(index.generation(), 2);
    }
}
