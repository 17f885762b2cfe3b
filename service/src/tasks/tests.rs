use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::*;

/// A task that runs until `shutdown`, as the binaries' tasks do.
async fn until(shutdown: CancellationToken) {
    shutdown.cancelled().await;
}

/// A task that panics with `message` once `after` passed.
async fn panics(after: Duration, message: &str) {
    tokio::time::sleep(after).await;
    panic!("{message}");
}

#[tokio::test]
async fn a_panicking_task_is_named_and_makes_the_process_unhealthy() {
    let shutdown = CancellationToken::new();
    let mut tasks = CriticalTasks::new();
    let health = tasks.health();
    tasks.spawn("reloader", until(shutdown.clone()));
    tasks.spawn("tainter", panics(Duration::from_millis(10), "lost the node"));
    assert_eq!(health.failed_task(), None);

    let ended = tokio::time::timeout(Duration::from_secs(5), tasks.first_end()).await.expect("an end");
    assert_eq!(ended, Ended { task: "tainter", end: End::Panicked("lost the node".to_owned()) });
    assert_eq!(health.failed_task(), Some("tainter"));
    // The others stop on the shutdown that follows, without failures.
    shutdown.cancel();
    assert_eq!(tasks.stop(Duration::from_secs(5)).await, vec![]);
}

#[tokio::test]
async fn a_task_that_returns_or_fails_is_an_end_too() {
    let mut tasks = CriticalTasks::new();
    tasks.spawn("feed", async { Err::<(), _>(anyhow::anyhow!("stream closed")) });
    let ended = tasks.first_end().await;
    assert_eq!(ended.task, "feed");
    assert_eq!(ended.end, End::Returned(Some("stream closed".to_owned())));
    assert_eq!(ended.to_string(), "critical task feed failed: stream closed");

    let mut tasks = CriticalTasks::new();
    tasks.spawn("follower", async {});
    assert_eq!(tasks.first_end().await.to_string(), "critical task follower returned");
}

#[tokio::test]
async fn an_adopted_task_carries_its_panic_and_name() {
    let mut tasks = CriticalTasks::new();
    let handle = tokio::spawn(panics(Duration::ZERO, "watch gone"));
    tasks.adopt("pod watch", handle);
    let ended = tasks.first_end().await;
    assert_eq!(ended, Ended { task: "pod watch", end: End::Panicked("watch gone".to_owned()) });
}

#[tokio::test]
async fn on_shutdown_tasks_end_without_failures_and_stragglers_are_aborted() {
    let shutdown = CancellationToken::new();
    let mut tasks = CriticalTasks::new();
    let health = tasks.health();
    tasks.spawn("sinks", until(shutdown.clone()));
    tasks.spawn("server", until(shutdown.clone()));
    // Ignores the shutdown: stopped at the limit.
    tasks.spawn("stuck", std::future::pending::<()>());
    shutdown.cancel();
    let start = std::time::Instant::now();
    assert_eq!(tasks.stop(Duration::from_millis(200)).await, vec![]);
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(health.failed_task(), None);
}

#[tokio::test]
async fn a_panic_while_stopping_is_reported() {
    let shutdown = CancellationToken::new();
    let mut tasks = CriticalTasks::new();
    let stop = shutdown.clone();
    tasks.spawn("sinks", async move {
        stop.cancelled().await;
        panics(Duration::ZERO, "flush failed").await;
    });
    shutdown.cancel();
    let failures = tasks.stop(Duration::from_secs(5)).await;
    assert_eq!(failures, vec![Ended { task: "sinks", end: End::Panicked("flush failed".to_owned()) }]);
}

#[tokio::test]
async fn with_no_task_first_end_waits() {
    let mut tasks = CriticalTasks::new();
    assert!(tokio::time::timeout(Duration::from_millis(50), tasks.first_end()).await.is_err());
}
