//! `memwatch events`: the local agent's events, one per line: a short
//! line for a person, or with `--json` the event's JSON object.

use std::{fmt::Write as _, io::Write as _, time::Duration};

use super::{EventsArgs, client::AgentClient};
use crate::model::event::Event;

/// Pause between polls with `--follow` when nothing new came.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

pub(crate) async fn run(args: &EventsArgs) -> anyhow::Result<()> {
    let client = AgentClient::new(&args.agent)?;
    let mut after = args.after;
    let mut stdout = std::io::stdout().lock();
    loop {
        let page = client.events(after, args.limit).await?;
        for event in &page {
            if args.json {
                serde_json::to_writer(&mut stdout, event)?;
                stdout.write_all(b"\n")?;
            } else {
                writeln!(stdout, "{}", line(event))?;
            }
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

/// `<seq> <time> <kind> key=value…`: the event's own fields but its id,
/// host and epoch, and but nested ones (a heartbeat's `state`: `--json`
/// has it). A string with a space, a quote or a control character (a
/// workload's `comm`, a task id, a reason) is quoted and escaped, so one
/// event is one line.
pub(crate) fn line(event: &Event) -> String {
    let mut out = format!(
        "{:>6} {} {}",
        event.seq,
        event
            .time
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        event.body.kind.as_str()
    );
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(&event.body) else {
        return out;
    };
    for (key, value) in fields {
        match value {
            serde_json::Value::String(s) if key != "kind" => {
                let plain = !s.is_empty()
                    && !s
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control() || c == '"' || c == '=');
                if plain {
                    let _ = write!(out, " {key}={s}");
                } else {
                    let _ = write!(out, " {key}={s:?}");
                }
            }
            serde_json::Value::Number(n) => {
                let _ = write!(out, " {key}={n}");
            }
            serde_json::Value::Bool(b) => {
                let _ = write!(out, " {key}={b}");
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::event::{EventBody, EventKind};

    #[test]
    fn one_line_per_event_with_workload_strings_escaped() {
        let mut body = EventBody::new(EventKind::OomKill);
        body.pid = Some(42);
        body.comm = Some("evil\n     9 forged".into());
        body.task_id = Some("t1".into());
        let event = Event {
            id: "i".into(),
            seq: 7,
            time: "2026-01-02T03:04:05Z".parse().unwrap(),
            host: "h".into(),
            epoch: None,
            body,
        };
        let text = line(&event);
        assert!(!text.contains('\n'), "{text}");
        assert!(
            text.starts_with("     7 2026-01-02T03:04:05.000Z oom_kill "),
            "{text}"
        );
        assert!(text.contains(r#" comm="evil\n     9 forged""#), "{text}");
        assert!(text.contains(" task_id=t1"), "{text}");
        assert!(text.contains(" pid=42"), "{text}");
    }
}
