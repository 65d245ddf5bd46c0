//! `memwatch events`: the local agent's events, one JSON object per line.

use std::{io::Write as _, time::Duration};

use super::{EventsArgs, client::AgentClient};

/// Pause between polls with `--follow` when nothing new came.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

pub(crate) async fn run(args: &EventsArgs) -> anyhow::Result<()> {
    let client = AgentClient::new(&args.agent)?;
    let mut after = args.after;
    let mut stdout = std::io::stdout().lock();
    loop {
        let page = client.events(after, args.limit).await?;
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
