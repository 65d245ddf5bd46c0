//! The typed client of the local agent's HTTP API: what `memwatch events`,
//! `status` and `exec` ask, in the API's own response types.

use std::time::Duration;

use anyhow::{Context as _, bail};
use reqwest::StatusCode;
use serde::de::DeserializeOwned;

use super::AgentArgs;
use crate::{
    api::{health::HealthBody, tasks::TaskAnswer},
    daemon::status::AgentStatus,
    model::event::Event,
};
/// Where the token is when no `--token-file` is given.
pub(crate) const TOKEN_ENV: &str = "MEMWATCH_TOKEN";
/// Bound on one request to the agent.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct AgentClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

/// What the agent said to a registration.
pub(crate) enum Registered {
    Accepted(TaskAnswer),
    Rejected(TaskAnswer),
}

impl AgentClient {
    pub(crate) fn new(args: &AgentArgs) -> anyhow::Result<Self> {
        let token = match &args.token_file {
            None => std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()),
            Some(path) => Some(
                std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read --token-file {}", path.display()))?
                    .trim()
                    .to_string(),
            ),
        };
        Ok(Self {
            base: args.agent.trim_end_matches('/').to_string(),
            token,
            http: reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                .connect_timeout(Duration::from_secs(2))
                .build()?,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    async fn send(&self, builder: reqwest::RequestBuilder) -> anyhow::Result<reqwest::Response> {
        builder.send().await.with_context(|| {
            format!(
                "cannot reach the agent at {} (is `memwatch run` running?)",
                self.base
            )
        })
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
        let response = self.send(self.request(reqwest::Method::GET, path)).await?;
        let status = response.status();
        if !status.is_success() && status != StatusCode::SERVICE_UNAVAILABLE {
            let body = response.text().await.unwrap_or_default();
            bail!("agent answered {status} for {path}: {}", body.trim());
        }
        response
            .json()
            .await
            .with_context(|| format!("agent's answer to {path} does not parse"))
    }

    pub(crate) async fn register(&self, body: &serde_json::Value) -> anyhow::Result<Registered> {
        let response = self
            .send(self.request(reqwest::Method::POST, "/v1/tasks").json(body))
            .await?;
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let answer =
            || serde_json::from_str::<TaskAnswer>(&text).context("agent's answer does not parse");
        match status {
            StatusCode::CREATED | StatusCode::OK => Ok(Registered::Accepted(answer()?)),
            StatusCode::CONFLICT => Ok(Registered::Rejected(answer()?)),
            other => bail!("agent refused the registration ({other}): {}", text.trim()),
        }
    }

    pub(crate) async fn finish(
        &self,
        task_id: &str,
        exit_code: Option<i32>,
        oom_killed: bool,
    ) -> anyhow::Result<()> {
        let mut query = vec![("oom_killed", oom_killed.to_string())];
        if let Some(code) = exit_code {
            query.push(("exit_code", code.to_string()));
        }
        let path = format!("/v1/tasks/{}", urlencode(task_id));
        let response = self
            .send(self.request(reqwest::Method::DELETE, &path).query(&query))
            .await?;
        if !response.status().is_success() {
            let status = response.status();
            bail!(
                "agent answered {status} to the task's end: {}",
                response.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }
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
    #[test]
    fn task_ids_are_encoded_as_one_segment() {
        assert_eq!(super::urlencode("slurm/job 7"), "slurm%2Fjob%207");
        assert_eq!(super::urlencode("t-1_a.b~"), "t-1_a.b~");
    }
}
