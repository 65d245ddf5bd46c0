//! Loopback ports and bare HTTP requests (xtask keeps no HTTP client).

use std::{
    io::{self, Read, Write},
    net::{TcpListener, TcpStream},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port on 127.0.0.1")
        .port()
}

/// `GET path` over HTTP/1.0 on 127.0.0.1:`port` (5 s timeouts): the whole
/// answer, status line and headers included.
pub fn http_get(port: u16, path: &str) -> io::Result<String> {
    http_request(port, "GET", path, "")
}

/// `method path` with a JSON `body` (empty: none) over HTTP/1.0 on
/// 127.0.0.1:`port` (5 s timeouts): the whole answer.
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> io::Result<String> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    request_on(stream, method, path, body)
}

/// [`http_request`] on the agent's local socket at `socket`: the caller is
/// known by its uid (root: admin), no token needed.
pub fn unix_request(socket: &Path, method: &str, path: &str, body: &str) -> io::Result<String> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    request_on(stream, method, path, body)
}

fn request_on(
    mut stream: impl Read + Write,
    method: &str,
    path: &str,
    body: &str,
) -> io::Result<String> {
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The status code of an HTTP answer (`HTTP/1.x 200 OK…` → 200).
pub fn status_code(answer: &str) -> Option<u16> {
    let mut words = answer.lines().next()?.split_whitespace();
    words
        .next()
        .filter(|v| v.starts_with("HTTP/"))
        .and_then(|_| words.next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::status_code;

    #[test]
    fn status_line() {
        assert_eq!(status_code("HTTP/1.1 200 OK\r\nx: y\r\n\r\n"), Some(200));
        assert_eq!(status_code("HTTP/1.0 503 Service Unavailable"), Some(503));
        assert_eq!(status_code("garbage"), None);
        assert_eq!(status_code(""), None);
    }
}
