//! The named set of a binary's critical tasks: the long-lived tasks without which the
//! process is not doing its job (the monitor's supervisor, the sinks, the watches, the
//! HTTP server...).
//!
//! No such task may end unnoticed: one that returns or panics before shutdown is logged by
//! name, marks the process unhealthy ([`Health`]: `/healthz` and `/readyz` answer 503), and
//! [`CriticalTasks::first_end`] hands it to the binary, which stops the others and exits
//! non-zero so that the kubelet restarts it. On shutdown the tasks end without being
//! reported as failures ([`CriticalTasks::stop`]).

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::task::{Id, JoinError, JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{error, warn};

/// Test hook: a task of this name panics as soon as it starts, to drive the restart path
/// from outside the process (the end-to-end tests). Unset in any deployment; it can only
/// do what a bug in that task would.
pub const TEST_PANIC_ENV: &str = "NEURON_TEST_ONLY_PANIC_TASK";

/// Whether the process is healthy: false once a critical task ended unexpectedly.
/// Cloning shares it (the probes read it).
#[derive(Clone, Debug, Default)]
pub struct Health(Arc<Mutex<Option<&'static str>>>);

impl Health {
    /// The critical task whose end made the process unhealthy, if one did.
    pub fn failed_task(&self) -> Option<&'static str> {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn fail(&self, task: &'static str) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(task);
    }
}

/// How a task's own output reads when it ends: `()` says nothing, an error says why.
pub trait TaskOutput: Send + 'static {
    fn error(self) -> Option<String>;
}

impl TaskOutput for () {
    fn error(self) -> Option<String> {
        None
    }
}

impl<T: Send + 'static, E: fmt::Display + Send + 'static> TaskOutput for Result<T, E> {
    fn error(self) -> Option<String> {
        self.err().map(|e| format!("{e:#}"))
    }
}

/// How a critical task ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    /// It returned (with its error, if it gave one).
    Returned(Option<String>),
    /// It panicked (with the panic's message).
    Panicked(String),
    /// It was aborted from outside.
    Cancelled,
}

/// A critical task that ended, by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub task: &'static str,
    pub end: End,
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.end {
            End::Returned(None) => write!(f, "critical task {} returned", self.task),
            End::Returned(Some(e)) => write!(f, "critical task {} failed: {e}", self.task),
            End::Panicked(message) => write!(f, "critical task {} panicked: {message}", self.task),
            End::Cancelled => write!(f, "critical task {} was cancelled", self.task),
        }
    }
}

impl std::error::Error for Ended {}

/// The critical tasks of a process, by name.
#[derive(Default)]
pub struct CriticalTasks {
    set: JoinSet<Option<String>>,
    names: HashMap<Id, &'static str>,
    health: Health,
    panic_on_start: Option<String>,
}

impl CriticalTasks {
    pub fn new() -> Self {
        CriticalTasks { panic_on_start: std::env::var(TEST_PANIC_ENV).ok(), ..Default::default() }
    }

    /// The process's health, for its probes.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// Runs `task` as the critical task `name`.
    pub fn spawn<F>(&mut self, name: &'static str, task: F)
    where
        F: Future + Send + 'static,
        F::Output: TaskOutput,
    {
        let panics = self.panic_on_start.as_deref() == Some(name);
        let handle = self.set.spawn(async move {
            if panics {
                panic!("{TEST_PANIC_ENV} names this task");
            }
            task.await.error()
        });
        self.names.insert(handle.id(), name);
    }

    /// Runs `task` as the critical task `name` until `shutdown`, where it is dropped: for
    /// a task with nothing to finish (a watch filling a cache), which would otherwise hold
    /// the stop until its limit and be aborted.
    pub fn spawn_until<F>(&mut self, name: &'static str, shutdown: &CancellationToken, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let shutdown = shutdown.clone();
        self.spawn(name, async move {
            tokio::select! {
                () = task => {}
                () = shutdown.cancelled() => {}
            }
        });
    }

    /// Watches a task spawned elsewhere as the critical task `name`.
    pub fn adopt<T: TaskOutput>(&mut self, name: &'static str, handle: JoinHandle<T>) {
        self.spawn(name, async move {
            match handle.await {
                Ok(output) => output.error().map_or(Ok(()), Err),
                // Carries the task's panic on to this one, so it reads the same.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err("cancelled".to_owned()),
            }
        });
    }

    /// Waits for the first task to end, which is a failure: it is logged and the process
    /// marked unhealthy. Never returns while no task runs.
    pub async fn first_end(&mut self) -> Ended {
        let Some(joined) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let ended = self.ended(joined);
        self.health.fail(ended.task);
        error!(task = ended.task, end = %ended, "a critical task ended: stopping, to be restarted");
        ended
    }

    /// Waits up to `limit` for every task to end after the shutdown they all follow was
    /// signalled; a task that panics meanwhile is logged and returned, one still running
    /// at `limit` is named and aborted.
    pub async fn stop(mut self, limit: Duration) -> Vec<Ended> {
        let mut failures = Vec::new();
        let drained = tokio::time::timeout(limit, async {
            while let Some(joined) = self.set.join_next_with_id().await {
                let ended = self.ended(joined);
                if matches!(ended.end, End::Panicked(_) | End::Returned(Some(_))) {
                    error!(task = ended.task, end = %ended, "a critical task failed while stopping");
                    failures.push(ended);
                }
            }
        })
        .await;
        if drained.is_err() {
            let mut running: Vec<&str> = self.names.values().copied().collect();
            running.sort_unstable();
            warn!(tasks = ?running, ?limit, "critical tasks did not stop in time; aborting them");
        }
        failures
    }

    /// Names a joined task (and forgets its id).
    fn ended(&mut self, joined: Result<(Id, Option<String>), JoinError>) -> Ended {
        let (id, end) = match joined {
            Ok((id, error)) => (id, End::Returned(error)),
            Err(e) if e.is_panic() => (e.id(), End::Panicked(panic_message(e.into_panic()))),
            Err(e) => (e.id(), End::Cancelled),
        };
        let task = self.names.remove(&id).unwrap_or("unnamed");
        Ended { task, end }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload.downcast_ref::<&str>().map_or_else(|| "(no message)".to_owned(), |s| (*s).to_owned()),
    }
}

#[cfg(test)]
mod tests;
