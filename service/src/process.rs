//! The process side of a service: its logs and the signal that stops it.

use anyhow::Context;

/// Logs to stderr, filtered by `filter` (tracing's EnvFilter syntax), as text or JSON.
pub fn init_logs(filter: &str, json: bool) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter).context("parsing the log filter")?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// Waits for SIGTERM (what the kubelet sends) or SIGINT.
pub async fn stop_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
