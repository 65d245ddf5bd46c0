//! `memwatch status`: the local agent's verdict, for a person.

use std::fmt::Write as _;

use super::{StatusArgs, client::AgentClient};
use crate::{
    api::health::HealthBody,
    model::health::Health,
    watchdog::{
        task::TaskView,
        worker::{WorkerView, bytes},
    },
};

/// Prints the summary (or with `--json` the status); the host's verdict.
pub(crate) async fn run(args: &StatusArgs) -> anyhow::Result<Health> {
    let client = AgentClient::new(&args.agent)?;
    let health = client.health().await?;
    let status = client.status().await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", render(&health, &status.workers, &status.tasks));
    }
    Ok(health.status)
}

/// Scripts and health checks can test the verdict: 0 healthy, 1 degraded
/// or unhealthy ([`EXIT_UNREACHABLE`] when the agent could not be asked).
pub(crate) fn exit_code(verdict: Health) -> u8 {
    match verdict {
        Health::Healthy => 0,
        Health::Degraded | Health::Unhealthy => 1,
    }
}

/// The agent could not be asked (not running, no socket, a refused token);
/// also clap's code for bad flags.
pub(crate) const EXIT_UNREACHABLE: u8 = 2;

/// What node-problem-detector keeps of a plugin's output by default
/// (`max_output_length`): the line is cut here, by us, on a character.
pub(crate) const NPD_MAX_OUTPUT: usize = 80;

/// `memwatch status --npd`: node-problem-detector's custom-plugin
/// protocol. Prints one line and returns the exit code: 0 OK (healthy, or
/// degraded: the agent's own trouble is no node problem), 1 problem (a
/// worker is unhealthy), 2 unknown (the agent could not be asked). Only
/// `/health` is read: no token needed.
pub(crate) async fn npd(args: &StatusArgs) -> u8 {
    let health = match AgentClient::new(&args.agent) {
        Ok(client) => client.health().await,
        Err(error) => Err(error),
    };
    let (code, line) = match health {
        Ok(health) => npd_verdict(&health),
        Err(error) => (EXIT_UNREACHABLE, format!("memwatch unreachable: {error:#}")),
    };
    println!("{}", one_line(&line, NPD_MAX_OUTPUT));
    code
}

/// The exit code and message for node-problem-detector.
fn npd_verdict(health: &HealthBody) -> (u8, String) {
    let reasons = health.reasons.join("; ");
    match health.status {
        Health::Healthy => (0, "memwatch: healthy".to_string()),
        Health::Degraded => (0, format!("memwatch degraded: {reasons}")),
        Health::Unhealthy => (1, format!("memwatch unhealthy: {reasons}")),
    }
}

/// `text` on one line (control characters as spaces), cut to `max` bytes
/// on a character boundary, `...` marking a cut.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if flat.len() <= max {
        return flat;
    }
    let mut end = max.saturating_sub(3);
    while !flat.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &flat[..end])
}

fn render(health: &HealthBody, workers: &[WorkerView], tasks: &[TaskView]) -> String {
    let mut out = String::new();
    let status = format!("{:?}", health.status).to_lowercase();
    let _ = writeln!(
        out,
        "{}: {status} (source {}, {})",
        status.to_uppercase(),
        health.source.map_or("?", |s| s.as_str()),
        health.attach.as_deref().unwrap_or("?"),
    );
    for reason in &health.reasons {
        let _ = writeln!(out, "  - {reason}");
    }
    let size = |v: Option<u64>| v.map_or("-".to_string(), bytes);
    let _ = writeln!(
        out,
        "\n{:<16} {:<10} {:>12} {:>12} {:>12} {:>6}",
        "WORKER", "STATUS", "MEMORY", "RESIDUAL", "SOFT CAP", "TASKS"
    );
    for w in workers {
        let _ = writeln!(
            out,
            "{:<16} {:<10} {:>12} {:>12} {:>12} {:>6}",
            w.name,
            format!("{:?}", w.status).to_lowercase(),
            size(w.memory_bytes),
            size(w.residual_bytes),
            size(w.soft_cap_bytes),
            w.running_tasks
        );
    }
    if !tasks.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<24} {:<16} {:<14} {:>12} {:>12} {:>8}",
            "TASK", "WORKER", "OWNER", "MEMORY", "SOFT CAP", "RUNNING"
        );
        for t in tasks {
            // A predicted kill: the seconds left, as `oom_imminent` says.
            let eta = t
                .eta_seconds
                .map_or(String::new(), |eta| format!(" OOM KILL IN {eta:.0}s"));
            let _ = writeln!(
                out,
                "{:<24} {:<16} {:<14} {:>12} {:>12} {:>7}s{}{eta}",
                t.task_id,
                t.worker,
                t.owner,
                size(t.memory_bytes),
                size(t.soft_cap_bytes),
                t.running_secs,
                if t.growing { " growing" } else { "" }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::source::SourceKind;

    #[test]
    fn summary_names_status_reasons_workers_and_tasks() {
        let health = HealthBody {
            status: Health::Unhealthy,
            reasons: vec!["worker w1: residual memory 300.0 MiB ...".into()],
            workers: Vec::new(),
            source: Some(SourceKind::Ebpf),
            attach: Some("tp_btf".into()),
        };
        let worker = WorkerView {
            name: "w1".into(),
            status: Health::Unhealthy,
            reasons: vec![],
            cgroup: None,
            memory_bytes: Some(300 << 20),
            residual_bytes: Some(300 << 20),
            soft_cap_bytes: Some(200 << 20),
            running_tasks: 0,
            kernel_usage_bytes: None,
            limit: Default::default(),
        };
        let task: TaskView = serde_json::from_value(serde_json::json!({
            "task_id": "t1", "worker": "w1", "running_secs": 12, "growing": true,
            "memory_bytes": 200u64 << 20, "eta_seconds": 7.4, "owner": "root",
        }))
        .unwrap();
        let with_task = render(&health, &[], &[task]);
        assert!(
            with_task.contains("12s growing OOM KILL IN 7s"),
            "{with_task}"
        );
        let text = render(&health, &[worker], &[]);
        assert!(
            text.starts_with("UNHEALTHY: unhealthy (source ebpf, tp_btf)"),
            "{text}"
        );
        assert!(text.contains("  - worker w1: residual memory"), "{text}");
        assert!(
            text.contains("w1               unhealthy     300.0 MiB    300.0 MiB    200.0 MiB"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod npd_tests {
    use super::*;

    fn body(status: Health, reasons: &[&str]) -> HealthBody {
        HealthBody {
            status,
            reasons: reasons.iter().map(|r| r.to_string()).collect(),
            workers: Vec::new(),
            source: None,
            attach: None,
        }
    }

    #[test]
    fn only_an_unhealthy_worker_is_a_node_problem() {
        assert_eq!(
            npd_verdict(&body(Health::Healthy, &[])),
            (0, "memwatch: healthy".to_string())
        );
        assert_eq!(npd_verdict(&body(Health::Degraded, &["ring full"])).0, 0);
        let (code, line) = npd_verdict(&body(Health::Unhealthy, &["worker w1: over", "b"]));
        assert_eq!(
            (code, line.as_str()),
            (1, "memwatch unhealthy: worker w1: over; b")
        );
    }

    #[test]
    fn the_line_fits_npds_limit_on_a_character() {
        let long = format!("memwatch unhealthy: {}\nnext", "é".repeat(100));
        let line = one_line(&long, NPD_MAX_OUTPUT);
        assert!(line.len() <= NPD_MAX_OUTPUT, "{} bytes", line.len());
        assert!(line.ends_with("..."), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(one_line("a\nb", 80), "a b");
    }
}

#[cfg(test)]
mod task_tests {
    use super::*;

    #[test]
    fn each_running_task_names_its_owner() {
        let health = HealthBody {
            status: Health::Healthy,
            reasons: Vec::new(),
            workers: Vec::new(),
            source: None,
            attach: None,
        };
        let task = TaskView {
            task_id: "exec-1".into(),
            worker: "w1".into(),
            source: None,
            memory_bytes: Some(10 << 20),
            soft_cap_bytes: None,
            running_secs: 3,
            growing: false,
            flagged: None,
            outcome: None,
            owner: "uid:1000".into(),
            kernel_usage_bytes: None,
            eta_seconds: None,
            limit: Default::default(),
        };
        let text = render(&health, &[], &[task]);
        assert!(
            text.contains("TASK                     WORKER           OWNER"),
            "{text}"
        );
        assert!(
            text.contains("exec-1                   w1               uid:1000"),
            "{text}"
        );
    }
}

#[cfg(test)]
mod exit_tests {
    use super::*;

    #[test]
    fn the_exit_status_says_the_verdict() {
        assert_eq!(exit_code(Health::Healthy), 0);
        assert_eq!(exit_code(Health::Degraded), 1);
        assert_eq!(exit_code(Health::Unhealthy), 1);
    }
}
