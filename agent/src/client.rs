//! `memwatch events`: reads the local agent's outbox over HTTP.

use std::{io::Write as _, time::Duration};

use anyhow::{Context as _, bail};

use crate::{cli::EventsArgs, event::Event};

/// Pause between polls with `--follow` when nothing new came.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);
/// Bound on one request to the agent.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn events(args: &EventsArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(2))
        .build()?;
    let base = args.agent.trim_end_matches('/');
    let mut after = args.after;
    let mut stdout = std::io::stdout().lock();
    loop {
        let url = format!("{base}/v1/events?after={after}&limit={}", args.limit);
        let response = client.get(&url).send().await.with_context(|| {
            format!("cannot reach the agent at {base} (is `memwatch run` running?)")
        })?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            bail!("agent answered {status} for {url}: {}", body.trim());
        }
        let page: Vec<Event> = response
            .json()
            .await
            .context("agent sent events that do not parse")?;
        for event in &page {
            serde_json::to_writer(&mut stdout, event)?;
            stdout.write_all(b"\n")?;
            after = event.seq;
        }
        stdout.flush()?;
        let full_page = page.len() as u64 == args.limit;
        match (full_page, args.follow) {
            (true, _) => continue,
            (false, true) => tokio::time::sleep(FOLLOW_INTERVAL).await,
            (false, false) => return Ok(()),
        }
    }
}
