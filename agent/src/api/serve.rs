//! The API's accept loop, one for the TCP listener and the local socket
//! alike: a bound on open connections, a deadline for each request's
//! header, the peer of each connection handed to the handlers, and a
//! graceful end.
//!
//! The header deadline runs from the moment a connection waits for a
//! request, so it also closes an idle keep-alive connection (hyper's
//! timer starts when the connection is ready to read a head). Past the
//! bound, the connection idle the longest (no request in flight) is closed
//! to make room, so connections held open cannot starve `/live`, `/ready`
//! and `/health`; only when every connection has a request in flight is a
//! new one accepted and closed at once, and counted
//! (`memwatch_api_connections_refused_total`): a client sees the
//! connection reset or closed, never a hang.

use std::{
    collections::BTreeMap,
    io,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use axum::{Router, extract::Request};
use hyper::{body::Incoming, server::conn::http1};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus::IntCounter;
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::{TcpListener, TcpStream, UnixListener, UnixStream},
    sync::{Notify, Semaphore, watch},
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
/// How long a new connection waits for the slot of the idle one closed
/// for it.
const EVICT_WAIT: Duration = Duration::from_millis(500);

/// One open connection as the accept loop sees it.
#[derive(Debug)]
struct Conn {
    /// Requests in flight.
    busy: AtomicUsize,
    /// When it last accepted or answered a request.
    active: std::sync::Mutex<Instant>,
    /// Asks its task to close it (when idle).
    close: Notify,
}

impl Conn {
    fn touch(&self) {
        *self.active.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    fn active(&self) -> Instant {
        *self.active.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The open connections of one listener, by id; and the last id given.
#[derive(Debug, Default)]
struct Conns {
    last: u64,
    by_id: BTreeMap<u64, Arc<Conn>>,
}

/// The open connections of one listener.
#[derive(Clone, Debug, Default)]
struct Open(Arc<std::sync::Mutex<Conns>>);

impl Open {
    fn add(&self) -> (u64, Arc<Conn>) {
        let conn = Arc::new(Conn {
            busy: AtomicUsize::new(0),
            active: std::sync::Mutex::new(Instant::now()),
            close: Notify::new(),
        });
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        open.last += 1;
        let id = open.last;
        open.by_id.insert(id, Arc::clone(&conn));
        (id, conn)
    }

    fn remove(&self, id: u64) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_id
            .remove(&id);
    }

    /// The connection with no request in flight that was active the
    /// longest ago.
    fn idlest(&self) -> Option<Arc<Conn>> {
        let open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        open.by_id
            .values()
            .filter(|c| c.busy.load(Ordering::SeqCst) == 0)
            .min_by_key(|c| c.active())
            .cloned()
    }
}

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
                pid: cred.pid().map(crate::model::process::SeenProcess::now),
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
    let open = Open::default();
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
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => Some(slot),
            // Every slot held: the connection idle the longest (no request
            // in flight, oldest activity) makes room, so idle connections
            // cannot starve `/live`, `/ready` and `/health`.
            Err(_) => match open.idlest() {
                Some(idle) => {
                    idle.close.notify_one();
                    tokio::time::timeout(EVICT_WAIT, slots.clone().acquire_owned())
                        .await
                        .ok()
                        .and_then(Result::ok)
                }
                None => None,
            },
        };
        let Some(slot) = slot else {
            refused.inc();
            debug!(
                ?peer,
                limit = limits.max_connections,
                "API connection refused: too many open, none idle"
            );
            drop(io);
            continue;
        };
        let router = router.clone();
        let (id, conn) = open.add();
        let activity = Arc::clone(&conn);
        let service = hyper::service::service_fn(move |mut request: Request<Incoming>| {
            request.extensions_mut().insert(peer.clone());
            let answer = router.clone().oneshot(request);
            let conn = Arc::clone(&activity);
            conn.busy.fetch_add(1, Ordering::SeqCst);
            async move {
                let answered = answer.await;
                conn.busy.fetch_sub(1, Ordering::SeqCst);
                conn.touch();
                answered
            }
        });
        let connection = http.serve_connection(TokioIo::new(io), service);
        let mut stop = shutdown.clone();
        let open = open.clone();
        tokio::spawn(async move {
            let _slot = slot;
            tokio::pin!(connection);
            let ended = loop {
                tokio::select! {
                    ended = connection.as_mut() => break ended,
                    () = stopped(&mut stop) => {
                        connection.as_mut().graceful_shutdown();
                        break connection.await;
                    }
                    () = conn.close.notified() => {
                        if conn.busy.load(Ordering::SeqCst) == 0 {
                            debug!("idle API connection closed to make room for a new one");
                            break Ok(());
                        }
                    }
                }
            };
            open.remove(id);
            if let Err(error) = ended {
                debug!(%error, "API connection ended");
            }
        });
    }
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = slots.acquire_many(all).await;
}

/// Resolves once `shutdown` is true (or its sender is gone).
async fn stopped(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
