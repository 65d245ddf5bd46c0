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
            let _ = writeln!(
                out,
                "{:<24} {:<16} {:<14} {:>12} {:>12} {:>7}s{}",
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
        };
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
