//! The API's accept loop, one for the TCP listener and the local socket
//! alike: a bound on open connections, a deadline for each request's
//! header, the peer of each connection handed to the handlers, and a
//! graceful end.
//!
//! The header deadline runs from the moment a connection waits for a
//! request, so it also closes an idle keep-alive connection (hyper's
//! timer starts when the connection is ready to read a head). A
//! connection past the bound is accepted and closed at once, and counted
//! (`memwatch_api_connections_refused_total`): a client sees the
//! connection reset or closed, never a hang.

use std::{io, sync::Arc, time::Duration};

use axum::{Router, extract::Request};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::IntCounter;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
    sync::{Semaphore, watch},
};
use tower::ServiceExt as _;
use tracing::{debug, warn};

use super::auth::Peer;

/// How long a client may take to send a request's header (and how long
/// an idle keep-alive connection stays open).
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections open at once per listener; more are closed at once.
pub(crate) const MAX_CONNECTIONS: usize = 256;
/// Pause after a failed accept (out of file descriptors): no busy loop.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// The limits of one listener.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub header_timeout: Duration,
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: HEADER_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

/// A listener the loop accepts from: each connection with its [`Peer`].
pub(crate) trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The `listener` label of the refused-connections counter.
    const KIND: &'static str;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::Io, Peer)>> + Send;
}

impl Listener for TcpListener {
    type Io = TcpStream;
    const KIND: &'static str = "tcp";
    async fn accept(&self) -> io::Result<(TcpStream, Peer)> {
        let (stream, addr) = TcpListener::accept(self).await?;
        Ok((stream, Peer::Tcp(addr)))
    }
}

impl Listener for UnixListener {
    type Io = UnixStream;
    const KIND: &'static str = "unix";
    /// The peer's uid and pid from SO_PEERCRED, as the kernel saw them
    /// when it connected: not something the client says.
    async fn accept(&self) -> io::Result<(UnixStream, Peer)> {
        let (stream, _) = UnixListener::accept(self).await?;
        let cred = stream.peer_cred()?;
        Ok((
            stream,
            Peer::Unix {
                uid: cred.uid(),
                pid: cred.pid(),
            },
        ))
    }
}

/// Serves `router` on `listener` until `shutdown` turns true, then lets
/// the requests in flight finish (idle connections close at once) and
/// returns once every connection is closed. The caller bounds that wait.
pub(crate) async fn serve<L: Listener>(
    listener: L,
    router: Router,
    limits: Limits,
    refused: IntCounter,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stopped(&mut shutdown) => break,
        };
        let (io, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                warn!(%error, listener = L::KIND, "cannot accept an API connection");
                tokio::select! {
                    () = tokio::time::sleep(ACCEPT_BACKOFF) => continue,
                    () = stopped(&mut shutdown) => break,
                }
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refused.inc();
            debug!(
                ?peer,
                limit = limits.max_connections,
                "API connection refused: too many open"
            );
            drop(io);
            continue;
        };
        let router = router.clone();
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(peer.clone());
            router.clone().oneshot(request)
        });
        let connection = http.serve_connection(TokioIo::new(io), service);
        let mut stop = shutdown.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(connection);
            let ended = tokio::select! {
                ended = connection.as_mut() => ended,
                () = stopped(&mut stop) => {
                    connection.as_mut().graceful_shutdown();
                    connection.await
                }
            };
            if let Err(error) = ended {
                debug!(%error, "API connection ended");
            }
        });
    }
    // Every slot back: every connection closed.
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
