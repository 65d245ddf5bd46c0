//! `memwatch status`: the local agent's verdict, for a person.

use std::fmt::Write as _;

use crate::{
    cli::StatusArgs,
    client::AgentClient,
    watchdog::{
        task::TaskView,
        worker::{WorkerView, bytes},
    },
};

pub async fn status(args: &StatusArgs) -> anyhow::Result<()> {
    let client = AgentClient::new(&args.agent)?;
    let health: serde_json::Value = client.get("/health").await?;
    let status: serde_json::Value = client.get("/v1/status").await?;
    let workers: Vec<WorkerView> = serde_json::from_value(status["workers"].clone())?;
    let tasks: Vec<TaskView> = serde_json::from_value(status["tasks"].clone())?;
    print!("{}", render(&health, &workers, &tasks));
    Ok(())
}

fn render(health: &serde_json::Value, workers: &[WorkerView], tasks: &[TaskView]) -> String {
    let mut out = String::new();
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("?").to_string();
    let _ = writeln!(
        out,
        "{}: {} (source {}, {})",
        text(&health["status"]).to_uppercase(),
        text(&health["status"]),
        text(&health["source"]),
        text(&health["attach"]),
    );
    for reason in health["reasons"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "  - {}", text(reason));
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
            "\n{:<24} {:<16} {:>12} {:>12} {:>8}",
            "TASK", "WORKER", "MEMORY", "SOFT CAP", "RUNNING"
        );
        for t in tasks {
            let _ = writeln!(
                out,
                "{:<24} {:<16} {:>12} {:>12} {:>7}s{}",
                t.task_id,
                t.worker,
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
    use crate::model::health::Health;

    #[test]
    fn summary_names_status_reasons_workers_and_tasks() {
        let health = serde_json::json!({
            "status": "unhealthy", "source": "ebpf", "attach": "tp_btf",
            "reasons": ["worker w1: residual memory 300.0 MiB ..."]
        });
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
