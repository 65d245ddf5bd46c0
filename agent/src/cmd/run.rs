//! `memwatch run`: the daemon and the HTTP API beside it, until SIGTERM or
//! SIGINT.

use std::sync::Arc;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tracing::{info, warn};

use crate::{
    api::{self, AppState},
    config::Config,
    daemon::{Daemon, SHUTDOWN_GRACE},
};

pub(crate) async fn run(config: Config) -> anyhow::Result<()> {
    let signal = shutdown_signal()?;
    let mut daemon = Daemon::start(config).await?;
    let listen = daemon.config().listen;
    // Before the probe loads: `/ready` says "not yet" while it does, and a
    // port in use fails the start at once.
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (--listen / `listen`)"))?;
    info!(%listen, "API listening");
    let app = AppState {
        outbox: daemon.outbox().clone(),
        registry: daemon.registry().clone(),
        probe: daemon.probe_state().clone(),
        monitor: daemon.monitor().clone(),
        api_token: daemon.config().api_token.as_deref().map(Arc::from),
        status: daemon.status().clone(),
        liveness: daemon.liveness().clone(),
    };
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        axum::serve(listener, api::router(app))
            .with_graceful_shutdown(async {
                let _ = server_stopped.await;
            })
            .into_future(),
    );
    let ran = daemon.run(signal).await;
    daemon.shutdown().await;
    let _ = stop_server.send(());
    match tokio::time::timeout(SHUTDOWN_GRACE, server).await {
        Ok(result) => result.context("API server task")?.context("API server")?,
        Err(_) => {
            warn!(grace = ?SHUTDOWN_GRACE, "API connections still open at the end of the grace period")
        }
    }
    ran?;
    info!("stopped");
    Ok(())
}

/// Installs the SIGTERM and SIGINT handlers now (a signal that comes
/// before the main loop is kept, not fatal); the future resolves with the
/// signal's name.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        }
    })
}
