//! The accept loop on real sockets: the local socket's callers known by
//! their uid, a stalled header cut off, connections past the bound closed
//! and counted, a graceful end. Waits are bounded; none is an assertion.

use std::{
    os::unix::fs::PermissionsExt as _,
    path::Path,
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use prometheus::IntCounter;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream, UnixStream},
    sync::watch,
    task::JoinHandle,
};

use super::*;
use crate::api::{
    auth::Tokens,
    serve::{Limits, serve},
    socket,
};

/// Generous: a loaded CI machine, not the figure under test.
const BOUND: Duration = Duration::from_secs(5);

fn my_uid() -> u32 {
    // SAFETY: getuid(2) cannot fail and touches no memory.
    unsafe { libc::getuid() }
}

/// One request over the unix socket at `path` (hyper's client
/// connection, as `memwatch` itself does).
async fn over_socket(
    path: &Path,
    method: &str,
    uri: &str,
    body: Option<&str>,
) -> (StatusCode, serde_json::Value) {
    let stream = UnixStream::connect(path)
        .await
        .expect("connect to the socket");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driver = tokio::spawn(connection);
    let mut req = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "localhost");
    if body.is_some() {
        req = req.header("content-type", JSON);
    }
    let req = req
        .body(Full::new(Bytes::from(body.unwrap_or_default().to_string())))
        .unwrap();
    let response = tokio::time::timeout(BOUND, sender.send_request(req))
        .await
        .expect("an answer in time")
        .unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    driver.abort();
    (status, serde_json::from_slice(&bytes).unwrap_or_default())
}

fn start<L: crate::api::serve::Listener>(
    listener: L,
    state: AppState,
    limits: Limits,
    refused: IntCounter,
) -> (watch::Sender<bool>, JoinHandle<()>) {
    let (stop, stopped) = watch::channel(false);
    let server = tokio::spawn(serve(listener, router(state), limits, refused, stopped));
    (stop, server)
}

#[tokio::test]
async fn socket_callers_are_known_by_uid_and_need_no_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run/memwatch/api.sock");
    // A stale socket file from an agent that did not stop cleanly.
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());

    let (listener, file) = socket::bind(&path).expect("bind over the stale file");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o666, "any local user may connect");
    let state = state_with_tokens(
        reader(50 * MIB),
        Tokens::new(Some("admin-s3cret"), None, None),
    );
    let (stop, server) = start(
        listener,
        state.clone(),
        Limits::default(),
        IntCounter::new("x", "x").unwrap(),
    );
    // A second agent on the same path is refused: the socket is live.
    let err = socket::bind(&path).unwrap_err();
    assert!(
        err.to_string().contains("served by another process"),
        "{err}"
    );

    let me = format!("uid:{}", my_uid());
    let (code, json) = over_socket(&path, "POST", "/v1/tasks", Some(r#"{"task_id":"mine"}"#)).await;
    assert_eq!(
        code,
        StatusCode::CREATED,
        "no token needed on the socket: {json}"
    );
    let (code, status) = over_socket(&path, "GET", "/v1/status", None).await;
    assert_eq!(code, StatusCode::OK, "{status}");
    assert_eq!(status["tasks"][0]["task_id"], "mine");
    assert_eq!(status["tasks"][0]["owner"], me.as_str(), "{status}");

    // Another principal's task: only an admin (root, on the socket) may end it.
    state
        .monitor
        .register(crate::model::spec::TaskRequest {
            task_id: "theirs".into(),
            worker: None,
            source: None,
            soft_cap: None,
            owner: "token:task".into(),
        })
        .unwrap();
    let (code, json) = over_socket(&path, "DELETE", "/v1/tasks/theirs", None).await;
    let (reset, _) = over_socket(&path, "POST", "/v1/workers/w1/reset", None).await;
    if my_uid() == 0 {
        assert_eq!(code, StatusCode::OK, "root is admin: {json}");
        assert_eq!(reset, StatusCode::OK);
    } else {
        assert_eq!(code, StatusCode::FORBIDDEN, "{json}");
        assert_eq!(reset, StatusCode::FORBIDDEN);
    }
    let (code, json) = over_socket(&path, "DELETE", "/v1/tasks/mine?exit_code=0", None).await;
    assert_eq!(code, StatusCode::OK, "its own task: {json}");
    assert_eq!(json["owner"], me.as_str());

    stop.send(true).unwrap();
    tokio::time::timeout(BOUND, server)
        .await
        .expect("stops")
        .unwrap();
    drop(file);
    assert!(!path.exists(), "the socket file is removed at the end");
}

#[tokio::test]
async fn a_socket_path_holding_something_else_is_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("api.sock");
    std::fs::write(&path, "not a socket").unwrap();
    let err = socket::bind(&path).unwrap_err();
    assert!(err.to_string().contains("is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

/// Waits (bounded) until the server closes `stream`: EOF or a reset.
/// How long that took.
async fn closed_within(stream: &mut TcpStream, bound: Duration) -> Duration {
    let started = Instant::now();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at((started + bound).into(), stream.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open past {bound:?}"),
            Ok(Ok(0) | Err(_)) => return started.elapsed(),
            // A response (to a request sent before): read on.
            Ok(Ok(_)) => {}
        }
    }
}

async fn tcp_server(
    limits: Limits,
) -> (
    std::net::SocketAddr,
    IntCounter,
    watch::Sender<bool>,
    JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let refused = IntCounter::new("refused", "refused").unwrap();
    let (stop, server) = start(listener, state(), limits, refused.clone());
    (addr, refused, stop, server)
}

/// A full request on a kept-alive connection, and its answer's status line.
async fn request_on(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /live HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(BOUND, stream.read(&mut buf))
        .await
        .expect("an answer in time")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_client_that_stalls_in_its_header_is_disconnected() {
    let timeout = Duration::from_millis(200);
    let (addr, _, _stop, _server) = tcp_server(Limits {
        header_timeout: timeout,
        max_connections: 8,
    })
    .await;
    let mut stalled = TcpStream::connect(addr).await.unwrap();
    stalled
        .write_all(b"GET /live HTTP/1.1\r\nhost: x\r\nx-half: ")
        .await
        .unwrap();
    let took = closed_within(&mut stalled, BOUND).await;
    assert!(
        took >= timeout / 2,
        "closed after {took:?}: not by the timer?"
    );

    // An idle keep-alive connection is closed on the same timer.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request_on(&mut idle).await, "HTTP/1.1 200 OK");
    closed_within(&mut idle, BOUND).await;
}

#[tokio::test]
async fn past_the_bound_the_idlest_connection_makes_room_so_live_always_answers() {
    let (addr, refused, stop, server) = tcp_server(Limits {
        header_timeout: Duration::from_secs(30),
        max_connections: 2,
    })
    .await;
    // Two connections served and kept alive: the bound is reached.
    let mut first = TcpStream::connect(addr).await.unwrap();
    let mut second = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request_on(&mut first).await, "HTTP/1.1 200 OK");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(request_on(&mut second).await, "HTTP/1.1 200 OK");

    // A third is served: the first, idle the longest, is closed for it.
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request_on(&mut third).await, "HTTP/1.1 200 OK");
    closed_within(&mut first, BOUND).await;
    assert_eq!(
        request_on(&mut second).await,
        "HTTP/1.1 200 OK",
        "the others stay"
    );

    // Connections opened and held silent, many times the bound: a new
    // client still gets its answer, at once.
    let mut held = Vec::new();
    for _ in 0..50 {
        held.push(TcpStream::connect(addr).await.unwrap());
    }
    let asked = Instant::now();
    let mut probe = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request_on(&mut probe).await, "HTTP/1.1 200 OK");
    eprintln!(
        "/live answered in {:?} past 50 held connections",
        asked.elapsed()
    );
    assert_eq!(refused.get(), 0, "idle ones made room: nothing refused");

    // The end: connections close, the loop returns.
    stop.send(true).unwrap();
    tokio::time::timeout(BOUND, server)
        .await
        .expect("stops")
        .unwrap();
    closed_within(&mut probe, BOUND).await;
}
