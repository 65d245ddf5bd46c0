//! `memwatch run`: the daemon and the HTTP API beside it (on the listen
//! address and the local socket), until SIGTERM or SIGINT.

use anyhow::Context as _;
use tokio::{net::TcpListener, sync::watch, task::JoinSet};
use tracing::{info, warn};

use crate::{
    api::{
        self, AppState,
        auth::Tokens,
        serve::{Limits, Listener, serve},
        socket,
    },
    config::Config,
    daemon::{Daemon, SHUTDOWN_GRACE, status::SocketStatus},
    telemetry::{heap, notify::Notifier},
};

// Long, on purpose: the agent's lifetime in order (signals, notify,
// daemon, API listeners, readiness, run, shutdown with its grace); each
// step's early exit matters to the next, and a reader follows it once.
pub(crate) async fn run(config: Config) -> anyhow::Result<()> {
    let signal = shutdown_signal()?;
    // systemd's `Type=notify` and `WatchdogSec=` (nothing without them).
    let notifier = Notifier::from_env();
    notifier.status("starting");
    let mut daemon = Daemon::start(config).await?;
    // From here on every loop is registered as it starts: the watchdog is
    // kept alive only while none of them is stalled.
    let watchdog = notifier.spawn_watchdog(daemon.liveness().clone());
    let listen = daemon.config().listen;
    // Before the probe loads: `/ready` says "not yet" while it does, and a
    // port in use fails the start at once.
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen} (--listen / `listen`)"))?;
    info!(%listen, "API listening");
    let (unix, socket_status) = match daemon.config().socket.clone() {
        None => (None, None),
        Some(path) => match socket::bind(&path) {
            Ok(bound) => {
                info!(socket = %path.display(), "API listening on the local socket");
                let status = SocketStatus {
                    path: path.display().to_string(),
                    listening: true,
                    error: None,
                };
                (Some(bound), Some(status))
            }
            Err(error) => {
                warn!(%error, "no local API socket (--socket / `socket`): TCP only");
                let status = SocketStatus {
                    path: path.display().to_string(),
                    listening: false,
                    error: Some(error.to_string()),
                };
                (None, Some(status))
            }
        },
    };
    let config = daemon.config();
    let app = AppState {
        outbox: daemon.outbox().clone(),
        registry: daemon.registry().clone(),
        probe: daemon.probe_state().clone(),
        monitor: daemon.monitor().clone(),
        tokens: Tokens::new(
            config.api_token.as_deref(),
            config.task_token.as_deref(),
            config.read_token.as_deref(),
        ),
        // SAFETY: geteuid(2) cannot fail and touches no memory.
        agent_uid: unsafe { libc::geteuid() },
        owners: std::sync::Arc::new(api::owned::HostOwners),
        socket: socket_status,
        status: daemon.status().clone(),
        liveness: daemon.liveness().clone(),
        lent: daemon.lent().clone(),
    };
    let router = api::router(app);
    let (stop_server, server_stopped) = watch::channel(false);
    let mut servers = JoinSet::new();
    let refused = &daemon.metrics().api_connections_refused;
    servers.spawn(serve(
        listener,
        router.clone(),
        Limits::default(),
        refused.with_label_values(&[TcpListener::KIND]),
        server_stopped.clone(),
    ));
    let socket_file = match unix {
        Some((listener, file)) => {
            servers.spawn(serve(
                listener,
                router,
                Limits::default(),
                refused.with_label_values(&[tokio::net::UnixListener::KIND]),
                server_stopped,
            ));
            Some(file)
        }
        None => None,
    };
    notifier.status("attaching the event source");
    let ran = match daemon.attach().await {
        Ok(status) => {
            // The parsed BTF and the rest of start-up are dropped: their
            // pages go back to the kernel.
            heap::release_freed();
            // `/ready` answers 200 from now on.
            notifier.ready(&status);
            daemon.run(signal).await
        }
        Err(error) => Err(error),
    };
    notifier.stopping();
    daemon.shutdown().await;
    let _ = stop_server.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while let Some(ended) = servers.join_next().await {
            ended.context("API server task")?;
        }
        anyhow::Ok(())
    })
    .await;
    match drained {
        Ok(result) => result?,
        Err(_) => {
            warn!(grace = ?SHUTDOWN_GRACE, "API connections still open at the end of the grace period")
        }
    }
    drop(socket_file);
    if let Some(watchdog) = watchdog {
        watchdog.abort();
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
