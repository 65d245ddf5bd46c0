//! A webhook receiver on 127.0.0.1: a small HTTP/1.1 server (a thread per
//! connection, keep-alive) that takes `POST /hook` with a JSON array of
//! events, keeps every request it saw, and answers as told: 204 by default,
//! or an error status, or nothing for a while (to test a sink's retries).
//! Plain threads, no async runtime: xtask, blocking code and async tests
//! alike can use it.

use std::{
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, SystemTime},
};

use serde_json::Value;

/// The one path the receiver serves.
pub const PATH: &str = "/hook";
/// The largest body it reads (a batch of events is far smaller).
const MAX_BODY: usize = 64 << 20;

/// How the receiver answers a `POST /hook`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// 204 No Content; the events count as received. A body that is not a
    /// JSON array is answered 400 instead (and is not received).
    Accept,
    /// This status, the events not received.
    Status(u16),
    /// Nothing for this long (past a sink's timeout), then 200; the events
    /// not received.
    Hang(Duration),
    /// 413 Payload Too Large to a body over this many bytes (as servers
    /// with a body limit answer); the others as [`Answer::Accept`].
    LimitBody(usize),
}

/// One request as the receiver saw it.
#[derive(Clone, Debug)]
pub struct Request {
    pub arrived: SystemTime,
    /// What it was answered.
    pub answer: Answer,
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Shared {
    answer: Mutex<Option<Answer>>,
    requests: Mutex<Vec<Request>>,
    /// Events of accepted requests: (arrival, event).
    events: Mutex<Vec<(SystemTime, Value)>>,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves until dropped.
pub struct Receiver {
    addr: SocketAddr,
    shared: Arc<Shared>,
}

impl Receiver {
    /// A receiver on a free port of 127.0.0.1, accepting.
    pub fn start() -> Receiver {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)))
    }

    /// A receiver on `addr` (which must be free), accepting.
    pub fn start_on(addr: SocketAddr) -> Receiver {
        let listener =
            TcpListener::bind(addr).unwrap_or_else(|e| panic!("webhook receiver on {addr}: {e}"));
        let addr = listener.local_addr().expect("the receiver's address");
        let shared = Arc::new(Shared::default());
        let accepting = shared.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.stop.load(Ordering::Relaxed) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let shared = accepting.clone();
                thread::spawn(move || {
                    let _ = serve(stream, &shared);
                });
            }
        });
        Receiver { addr, shared }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>/hook`: the URL to give the agent (`--webhook`).
    pub fn url(&self) -> String {
        format!("http://{}{PATH}", self.addr)
    }

    /// How to answer from now on.
    pub fn answer(&self, answer: Answer) {
        *lock(&self.shared.answer) = Some(answer);
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Request> {
        lock(&self.shared.requests).clone()
    }

    /// How many requests were answered `answer`.
    pub fn count(&self, answer: Answer) -> usize {
        lock(&self.shared.requests)
            .iter()
            .filter(|r| r.answer == answer)
            .count()
    }

    /// The events of every accepted request, in arrival order, each with
    /// the time its request arrived.
    pub fn events(&self) -> Vec<(SystemTime, Value)> {
        lock(&self.shared.events).clone()
    }

    /// How many events were accepted (cheaper than `events().len()`).
    pub fn event_count(&self) -> usize {
        lock(&self.shared.events).len()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wake the accepting thread so it sees the flag and closes the port.
        let _ = TcpStream::connect(self.addr);
    }
}

/// Answers the requests of one connection until it closes.
fn serve(stream: TcpStream, shared: &Shared) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let mut words = line.split_whitespace();
        let (method, path, version) = (
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default().to_string(),
            words.next().unwrap_or_default().to_string(),
        );
        let mut headers = Vec::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Ok(());
            }
            let header = line.trim_end_matches(['\r', '\n']);
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                headers.push((name.trim().to_string(), value.trim().to_string()));
            }
        }
        let header = |name: &str| {
            headers
                .iter()
                .find(|(n, _)| n.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.as_str())
        };
        let chunked = header("transfer-encoding").is_some_and(|v| v.contains("chunked"));
        let length: usize = header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let close = header("connection").is_some_and(|v| v.eq_ignore_ascii_case("close"))
            || version == "HTTP/1.0";
        let body = if chunked {
            read_chunked(&mut reader)?
        } else if length > MAX_BODY {
            return Err(io::Error::other("body too large"));
        } else {
            let mut body = vec![0; length];
            reader.read_exact(&mut body)?;
            body
        };
        let arrived = SystemTime::now();
        let mut answer = lock(&shared.answer).unwrap_or(Answer::Accept);
        answer = match answer {
            Answer::LimitBody(limit) if body.len() > limit => Answer::Status(413),
            Answer::LimitBody(_) => Answer::Accept,
            other => other,
        };
        let mut events = None;
        if method != "POST" || path != PATH {
            answer = Answer::Status(404);
        } else if answer == Answer::Accept {
            match serde_json::from_slice::<Value>(&body) {
                Ok(Value::Array(batch)) => events = Some(batch),
                _ => answer = Answer::Status(400),
            }
        }
        lock(&shared.requests).push(Request {
            arrived,
            answer,
            method,
            path,
            headers,
            body,
        });
        if let Some(batch) = events {
            lock(&shared.events).extend(batch.into_iter().map(|e| (arrived, e)));
        }
        let status = match answer {
            Answer::Accept => "204 No Content".to_string(),
            Answer::Hang(pause) => {
                thread::sleep(pause);
                "200 OK".to_string()
            }
            Answer::Status(404) => "404 Not Found".to_string(),
            Answer::Status(400) => "400 Bad Request".to_string(),
            Answer::Status(413) => "413 Payload Too Large".to_string(),
            Answer::LimitBody(_) => unreachable!("resolved above"),
            Answer::Status(code) => format!("{code} Status"),
        };
        let connection = if close { "close" } else { "keep-alive" };
        writer.write_all(
            format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\nConnection: {connection}\r\n\r\n")
                .as_bytes(),
        )?;
        if close {
            return Ok(());
        }
    }
}

/// A `Transfer-Encoding: chunked` body.
fn read_chunked(reader: &mut BufReader<TcpStream>) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line)?;
        let size = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size, 16).map_err(io::Error::other)?;
        if size == 0 {
            // Trailers, up to the empty line.
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 || line.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        if body.len() + size > MAX_BODY {
            return Err(io::Error::other("body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        line.clear();
        reader.read_line(&mut line)?; // the CRLF after the chunk
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(addr: SocketAddr, extra_headers: &str, body: &str) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        write!(
            s,
            "POST /hook HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra_headers}Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    }

    #[test]
    fn accepts_arrays_refuses_the_rest_and_answers_as_told() {
        let rx = Receiver::start();
        let ok = post(
            rx.addr(),
            "X-Memwatch-Event-Id: e1\r\n",
            r#"[{"seq":1},{"seq":2}]"#,
        );
        assert!(ok.starts_with("HTTP/1.1 204"), "{ok}");
        let bad = post(rx.addr(), "", r#"{"seq":3}"#);
        assert!(bad.starts_with("HTTP/1.1 400"), "{bad}");
        rx.answer(Answer::Status(500));
        let failed = post(rx.addr(), "", r#"[{"seq":4}]"#);
        assert!(failed.starts_with("HTTP/1.1 500"), "{failed}");

        let seqs: Vec<u64> = rx
            .events()
            .iter()
            .map(|(_, e)| e["seq"].as_u64().unwrap())
            .collect();
        assert_eq!(seqs, [1, 2]);
        assert_eq!(rx.event_count(), 2);
        let requests = rx.requests();
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0].header("x-memwatch-event-id"), Some("e1"));
        assert_eq!(rx.count(Answer::Accept), 1);
        assert_eq!(rx.count(Answer::Status(400)), 1);
        assert_eq!(rx.count(Answer::Status(500)), 1);
    }

    #[test]
    fn reads_chunked_bodies_on_a_kept_alive_connection() {
        let rx = Receiver::start();
        let mut s = TcpStream::connect(rx.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        for seq in [1, 2] {
            let body = format!("[{{\"seq\":{seq}}}]");
            write!(
                s,
                "POST /hook HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
                body.len()
            )
            .unwrap();
            let mut reader = BufReader::new(s.try_clone().unwrap());
            let mut status = String::new();
            reader.read_line(&mut status).unwrap();
            assert!(status.starts_with("HTTP/1.1 204"), "{status}");
            let mut line = String::new();
            while reader.read_line(&mut line).unwrap() > 0 && line != "\r\n" {
                line.clear();
            }
        }
        assert_eq!(rx.event_count(), 2);
        let other = TcpStream::connect(rx.addr()).and_then(|mut s| {
            write!(s, "GET / HTTP/1.0\r\n\r\n")?;
            let mut answer = String::new();
            s.read_to_string(&mut answer)?;
            Ok(answer)
        });
        assert!(other.unwrap().starts_with("HTTP/1.1 404"));
    }
}
