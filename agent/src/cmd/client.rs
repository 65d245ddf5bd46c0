//! The typed client of the local agent's API: what `memwatch events`,
//! `status` and `exec` ask, in the API's own response types, over the
//! agent's local socket or HTTP; callers do not see which.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{Context as _, bail};
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, StatusCode, body::Bytes, header};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;

use super::AgentArgs;
use crate::{
    api::{health::HealthBody, tasks::TaskAnswer},
    config::DEFAULT_SOCKET,
    daemon::status::AgentStatus,
    model::event::Event,
};
/// Where the token is when no `--token-file` is given.
pub(crate) const TOKEN_ENV: &str = "MEMWATCH_TOKEN";
/// The agent's address when neither `--agent` nor a socket is there.
pub(crate) const DEFAULT_AGENT: &str = "http://127.0.0.1:9750";
/// Bound on one request to the agent.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct AgentClient {
    transport: Transport,
    token: Option<String>,
}

/// How the client reaches the agent.
enum Transport {
    Http {
        base: String,
        http: reqwest::Client,
    },
    /// The agent's local socket: it knows the caller by its uid.
    Unix {
        path: PathBuf,
    },
}

/// What the agent said to a registration.
pub(crate) enum Registered {
    Accepted(TaskAnswer),
    Rejected(TaskAnswer),
}

/// One answer: its status and body.
struct Answer {
    status: StatusCode,
    body: Bytes,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).trim().to_string()
    }
}

impl AgentClient {
    pub(crate) fn new(args: &AgentArgs) -> anyhow::Result<Self> {
        let token = match &args.token_file {
            None => std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            // The agent's rule for its own token files: private to root or
            // the caller, else refused by name.
            Some(path) => Some(
                crate::model::secret_file::read_private(path)
                    .map_err(|problem| anyhow::anyhow!("--token-file {problem}"))?
                    .trim()
                    .to_string(),
            ),
        };
        let transport = match (&args.agent, &args.socket) {
            (Some(base), _) => Self::http(base)?,
            (None, Some(path)) => Transport::Unix { path: path.clone() },
            (None, None) if is_socket(Path::new(DEFAULT_SOCKET)) => Transport::Unix {
                path: DEFAULT_SOCKET.into(),
            },
            (None, None) => Self::http(DEFAULT_AGENT)?,
        };
        Ok(Self { transport, token })
    }

    fn http(base: &str) -> anyhow::Result<Transport> {
        Ok(Transport::Http {
            base: base.trim_end_matches('/').to_string(),
            // The token goes to the configured address and nowhere else:
            // no redirect is followed (a 3xx is an answer, and an error)
            // and no proxy from the environment is used.
            http: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .connect_timeout(Duration::from_secs(2))
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                .build()?,
        })
    }

    /// Where the agent is, for messages.
    fn place(&self) -> String {
        match &self.transport {
            Transport::Http { base, .. } => base.clone(),
            Transport::Unix { path } => format!("socket {}", path.display()),
        }
    }

    /// Sends one request (`path` with its query), with the token when
    /// there is one and `body` as JSON.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<Answer> {
        let sent = match &self.transport {
            Transport::Http { base, http } => {
                let mut request = http.request(method, format!("{base}{path}"));
                if let Some(token) = &self.token {
                    request = request.bearer_auth(token);
                }
                if let Some(body) = body {
                    request = request.json(body);
                }
                async {
                    let response = request.send().await?;
                    let status = response.status();
                    let body = response.bytes().await?;
                    anyhow::Ok(Answer { status, body })
                }
                .await
            }
            Transport::Unix { path: socket } => {
                tokio::time::timeout(REQUEST_TIMEOUT, self.call_unix(socket, method, path, body))
                    .await
                    .unwrap_or_else(|_| {
                        Err(anyhow::anyhow!("no answer within {REQUEST_TIMEOUT:?}"))
                    })
            }
        };
        sent.with_context(|| {
            format!(
                "cannot reach the agent at {} (is `memwatch run` running?)",
                self.place()
            )
        })
    }

    /// One HTTP/1.1 request over the local socket (reqwest has no unix
    /// sockets): hyper's client connection on a `UnixStream`.
    async fn call_unix(
        &self,
        socket: &Path,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> anyhow::Result<Answer> {
        let stream = tokio::net::UnixStream::connect(socket).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "localhost");
        if let Some(token) = &self.token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let payload = match body {
            Some(body) => {
                request = request.header(header::CONTENT_TYPE, "application/json");
                Bytes::from(serde_json::to_vec(body)?)
            }
            None => Bytes::new(),
        };
        let response = sender
            .send_request(request.body(Full::new(payload))?)
            .await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        driver.abort();
        Ok(Answer { status, body })
    }

    /// `GET /health` (its 503 is an answer too).
    pub(crate) async fn health(&self) -> anyhow::Result<HealthBody> {
        self.get("/health").await
    }

    /// `GET /v1/status`.
    pub(crate) async fn status(&self) -> anyhow::Result<AgentStatus> {
        self.get("/v1/status").await
    }

    /// `GET /v1/events`: up to `limit` events after seq `after`.
    pub(crate) async fn events(&self, after: u64, limit: u64) -> anyhow::Result<Vec<Event>> {
        self.get(&format!("/v1/events?after={after}&limit={limit}"))
            .await
    }

    /// GET a JSON document; any non-2xx is an error naming the answer.
    async fn get<T: DeserializeOwned>(&self, path: &str) -> anyhow::Result<T> {
        let answer = self.call(Method::GET, path, None).await?;
        let status = answer.status;
        if !status.is_success() && status != StatusCode::SERVICE_UNAVAILABLE {
            bail!("agent answered {status} for {path}: {}", answer.text());
        }
        serde_json::from_slice(&answer.body)
            .with_context(|| format!("agent's answer to {path} does not parse"))
    }

    pub(crate) async fn register(&self, body: &serde_json::Value) -> anyhow::Result<Registered> {
        let answer = self.call(Method::POST, "/v1/tasks", Some(body)).await?;
        let parsed = || {
            serde_json::from_slice::<TaskAnswer>(&answer.body)
                .context("agent's answer does not parse")
        };
        match answer.status {
            StatusCode::CREATED | StatusCode::OK => Ok(Registered::Accepted(parsed()?)),
            // 409 is a verdict (`rejected`), or a task id another caller
            // holds (an error, no verdict).
            StatusCode::CONFLICT => match parsed() {
                Ok(answer) => Ok(Registered::Rejected(answer)),
                Err(_) => bail!("agent refused the registration (409): {}", answer.text()),
            },
            other => bail!(
                "agent refused the registration ({other}): {}",
                answer.text()
            ),
        }
    }

    pub(crate) async fn finish(
        &self,
        task_id: &str,
        exit_code: Option<i32>,
        oom_killed: bool,
    ) -> anyhow::Result<()> {
        let mut path = format!("/v1/tasks/{}?oom_killed={oom_killed}", urlencode(task_id));
        if let Some(code) = exit_code {
            path.push_str(&format!("&exit_code={code}"));
        }
        let answer = self.call(Method::DELETE, &path, None).await?;
        if !answer.status.is_success() {
            bail!(
                "agent answered {} to the task's end: {}",
                answer.status,
                answer.text()
            );
        }
        Ok(())
    }
}

/// Whether `path` is a socket (the agent's, when it runs).
fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt as _;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Percent-encodes a path segment.
fn urlencode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use prometheus::IntCounter;
    use tokio::sync::watch;

    use super::*;
    use crate::api::{
        auth::Tokens,
        serve::{Limits, serve},
        socket,
        tests::{MIB, reader, state_with_tokens},
    };

    #[test]
    fn task_ids_are_encoded_as_one_segment() {
        assert_eq!(super::urlencode("slurm/job 7"), "slurm%2Fjob%207");
        assert_eq!(super::urlencode("t-1_a.b~"), "t-1_a.b~");
    }

    fn args(agent: Option<&str>, socket: Option<&Path>) -> AgentArgs {
        AgentArgs {
            agent: agent.map(str::to_string),
            socket: socket.map(Path::to_path_buf),
            token_file: None,
        }
    }

    #[test]
    fn an_agent_url_given_means_http_even_with_a_socket() {
        let client =
            AgentClient::new(&args(Some("http://10.0.0.1:9750/"), Some(Path::new("/s")))).unwrap();
        assert!(
            matches!(&client.transport, Transport::Http { base, .. } if base == "http://10.0.0.1:9750")
        );
        let client = AgentClient::new(&args(None, Some(Path::new("/s")))).unwrap();
        assert!(matches!(&client.transport, Transport::Unix { path } if path == Path::new("/s")));
    }

    /// `--token-file` follows the agent's rule: a file group or others can
    /// read is refused by name, a private one is read.
    #[test]
    fn a_token_file_open_to_others_is_refused() {
        use std::os::unix::fs::PermissionsExt as _;

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "s3cret\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut given = args(Some("http://127.0.0.1:9750"), None);
        given.token_file = Some(path.clone());
        let error = AgentClient::new(&given).err().expect("refused").to_string();
        assert!(
            error.starts_with("--token-file ") && error.contains("mode 0644"),
            "{error}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let client = AgentClient::new(&given).unwrap();
        assert_eq!(client.token.as_deref(), Some("s3cret"));
    }

    /// Whatever answers on the agent's address may redirect: the client
    /// does not follow, so the token never reaches the other address, and
    /// the call fails saying what answered.
    #[tokio::test]
    async fn the_token_is_sent_only_to_the_configured_address() {
        use std::sync::{Arc, Mutex};

        use axum::{Router, http::HeaderMap, response::Redirect, routing::any};

        let seen: Arc<Mutex<Vec<Option<String>>>> = Arc::default();
        let elsewhere = {
            let seen = seen.clone();
            Router::new().fallback(any(move |headers: HeaderMap| {
                let seen = seen.clone();
                async move {
                    let auth = headers
                        .get("authorization")
                        .map(|v| v.to_str().unwrap().to_string());
                    seen.lock().unwrap().push(auth);
                    "{}"
                }
            }))
        };
        let other = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let other_url = format!("http://{}", other.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(other, elsewhere).await });
        let impostor = {
            let to = format!("{other_url}/v1/status");
            Router::new().fallback(any(move || {
                let to = to.clone();
                async move { Redirect::temporary(&to) }
            }))
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, impostor).await });

        let mut client = AgentClient::new(&args(Some(&base), None)).unwrap();
        client.token = Some("s3cret".into());
        let error = client.status().await.unwrap_err().to_string();
        assert!(error.contains("307"), "{error}");
        assert!(
            seen.lock().unwrap().is_empty(),
            "the redirect was followed: {:?}",
            seen.lock().unwrap()
        );
    }

    /// The typed client over a real socket and the real accept loop: no
    /// token, while the agent has one; the task is the caller's uid's.
    #[tokio::test]
    async fn over_the_socket_the_client_needs_no_token_and_its_tasks_are_its_uids() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("api.sock");
        let (listener, _file) = socket::bind(&path).unwrap();
        let state = state_with_tokens(reader(50 * MIB), Tokens::new(Some("s3cret"), None, None));
        let (stop, stopped) = watch::channel(false);
        let server = tokio::spawn(serve(
            listener,
            crate::api::router(state),
            Limits::default(),
            IntCounter::new("refused", "refused").unwrap(),
            stopped,
        ));
        let mut client = AgentClient::new(&args(None, Some(&path))).unwrap();
        client.token = None;

        let answer = client
            .register(&serde_json::json!({ "task_id": "c1" }))
            .await
            .unwrap();
        assert!(matches!(answer, Registered::Accepted(_)));
        // SAFETY: getuid(2) cannot fail and touches no memory.
        let me = format!("uid:{}", unsafe { libc::getuid() });
        let status = client.status().await.unwrap();
        assert_eq!(status.tasks.len(), 1);
        assert_eq!(status.tasks[0].owner, me);
        client.finish("c1", Some(0), false).await.unwrap();
        let status = client.status().await.unwrap();
        assert!(status.tasks.is_empty());
        assert_eq!(status.finished_tasks[0].owner, me);
        assert_eq!(
            client.events(0, 10).await.unwrap().len(),
            2,
            "started, finished"
        );

        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .unwrap()
            .unwrap();
    }
}
