use super::*;
use crate::{
    model::source::SourceKind,
    outbox::OutboxStatus,
    watchdog::{predict::LimitFields, task::TaskView, worker::WorkerView},
};

fn worker(name: &str, status: Health, memory: u64, cap: u64) -> WorkerView {
    WorkerView {
        name: name.into(),
        status,
        reasons: vec![],
        cgroup: None,
        memory_bytes: Some(memory),
        residual_bytes: Some(memory),
        soft_cap_bytes: Some(cap),
        running_tasks: 0,
        kernel_usage_bytes: None,
        limit: Default::default(),
    }
}

fn task(id: &str, worker: &str, memory: u64, growing: bool) -> TaskView {
    TaskView {
        task_id: id.into(),
        worker: worker.into(),
        source: None,
        memory_bytes: Some(memory),
        soft_cap_bytes: Some(1 << 30),
        running_secs: 5,
        growing,
        flagged: None,
        outcome: None,
        owner: "root".into(),
        kernel_usage_bytes: None,
        eta_seconds: None,
        limit: Default::default(),
    }
}

fn status(workers: Vec<WorkerView>, tasks: Vec<TaskView>) -> AgentStatus {
    let mut status: AgentStatus = serde_json::from_value(serde_json::json!({
        "version": "0", "host": "h1", "source": "ebpf", "attach": "tp_btf",
        "health": {"status": "healthy", "reasons": []},
        "workers": [], "tasks": [], "finished_tasks": [],
        "outbox": serde_json::to_value(OutboxStatus::default()).unwrap(),
    }))
    .unwrap();
    status.workers = workers;
    status.tasks = tasks;
    status
}

fn health(status: Health, reasons: &[&str]) -> HealthBody {
    HealthBody {
        status,
        reasons: reasons.iter().map(|r| r.to_string()).collect(),
        workers: Vec::new(),
        source: Some(SourceKind::Ebpf),
        attach: Some("tp_btf".into()),
    }
}

/// Ten seconds of a task growing 1 MiB/s beside a steady one and two
/// workers, one unhealthy.
fn growing() -> Top {
    let mut top = Top::default();
    for s in 0..10u64 {
        top.update(
            s as f64,
            health(
                Health::Unhealthy,
                &["worker w2: residual memory over its cap"],
            ),
            status(
                vec![
                    worker("w1", Health::Healthy, 100 << 20, 1 << 30),
                    worker("w2", Health::Unhealthy, 900 << 20, 512 << 20),
                ],
                vec![
                    task("steady", "w1", 50 << 20, false),
                    task("leaky", "w1", (10 + s) << 20, true),
                ],
            ),
            &[],
        );
    }
    top
}

#[test]
fn the_unhealthy_and_the_growing_come_first_with_their_rate_and_trend() {
    let top = growing();
    let rows = top.rows();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    // w1 (100 MiB of 1 GiB) is fuller than steady (50 MiB of 1 GiB).
    assert_eq!(names, ["w2", "leaky", "w1", "steady"]);
    let leaky = &rows[1];
    let rate = leaky.rate.unwrap();
    assert!((rate - 1_048_576.0).abs() < 1.0, "{rate}");
    assert_eq!(leaky.trend, "▁▂▃▄▅▆▇█", "{}", leaky.trend);
    assert_eq!(rows[3].rate, Some(0.0));
    assert_eq!(leaky.state, "growing");
}

#[test]
fn a_predicted_kill_comes_first_soonest_first_with_its_eta() {
    let mut top = growing();
    let mut soon = task("soon", "w1", 400 << 20, true);
    soon.eta_seconds = Some(4.2);
    let mut later = task("later", "w1", 300 << 20, true);
    later.eta_seconds = Some(30.0);
    top.update(
        10.0,
        health(Health::Unhealthy, &[]),
        status(
            vec![worker("w2", Health::Unhealthy, 900 << 20, 512 << 20)],
            vec![later, soon],
        ),
        &[],
    );
    let rows = top.rows();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["soon", "later", "w2"]);
    let lines = top.lines(80, 24);
    let line = lines.iter().find(|l| l.contains("soon")).unwrap();
    assert!(
        line.starts_with("imminent") && line.ends_with("   4s"),
        "{line:?}"
    );
}

#[test]
fn each_row_shows_its_nearest_limit_and_whose_it_is() {
    let mut top = growing();
    let mut own = task("own", "w1", 400 << 20, true);
    own.limit = LimitFields {
        limit_bytes: Some(512 << 20),
        limit_owner: Some("own".into()),
        limit_cgroup: Some("/sys/fs/cgroup/own".into()),
    };
    let mut parents = task("parents", "w1", 100 << 20, false);
    parents.limit = LimitFields {
        limit_bytes: Some(3 << 29),
        limit_owner: Some("ancestor".into()),
        limit_cgroup: Some("/sys/fs/cgroup/job".into()),
    };
    let mut w1 = worker("w1", Health::Healthy, 500 << 20, 1 << 30);
    w1.limit = LimitFields {
        limit_bytes: Some(31 << 30),
        limit_owner: Some("host".into()),
        limit_cgroup: None,
    };
    top.update(
        10.0,
        health(Health::Healthy, &[]),
        status(
            vec![w1],
            vec![own, parents, task("bare", "w1", 1 << 20, false)],
        ),
        &[],
    );
    let lines = top.lines(80, 24);
    let header = lines.iter().find(|l| l.starts_with("STATE")).unwrap();
    let column = header.find("LIMIT").unwrap();
    let cell = |name: &str| {
        let line = lines
            .iter()
            .find(|l| l.get(10..25).is_some_and(|n| n.trim() == name))
            .unwrap();
        line[column..column + 10].to_string()
    };
    assert_eq!(cell("own"), " 512M own ", "{lines:#?}");
    assert_eq!(cell("parents"), " 1.5G anc ", "{lines:#?}");
    assert_eq!(cell("w1"), "  31G host", "{lines:#?}");
    assert_eq!(cell("bare"), "    -     ", "{lines:#?}");
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{lines:#?}");
}

#[test]
fn sizes_fit_five_characters() {
    assert_eq!(short(0), "0B");
    assert_eq!(short(1023), "1023B");
    assert_eq!(short(1536), "1.5K");
    assert_eq!(short(512 << 20), "512M");
    assert_eq!(short((10 << 30) - 1), "10G");
    assert_eq!(signed_bytes(-300.0 * 1024.0), "-300K");
    assert_eq!(signed_bytes(0.2), "0B");
}

#[test]
fn keys_sort_filter_pause_and_quit() {
    let mut top = growing();
    assert!(top.key('s'));
    assert_eq!(top.sort, Sort::Memory);
    assert_eq!(top.rows()[0].name, "w2");
    top.key('s');
    assert_eq!(top.sort, Sort::Rate);
    assert_eq!(top.rows()[0].name, "leaky");
    top.key('f');
    assert_eq!(top.filter.as_deref(), Some("w1"));
    assert!(top.rows().iter().all(|r| r.worker == "w1"));
    top.key('f');
    assert_eq!(top.filter.as_deref(), Some("w2"));
    top.key('f');
    assert_eq!(top.filter, None, "past the last worker: all again");
    top.key('p');
    let before = top.rows();
    top.update(
        20.0,
        health(Health::Healthy, &[]),
        status(vec![], vec![]),
        &[],
    );
    assert_eq!(top.rows(), before, "paused: nothing taken");
    assert!(top.lines(80, 24)[0].starts_with("memwatch top - PAUSED - "));
    assert!(!top.key('q'));
}

#[test]
fn the_screen_fits_80_by_24_and_says_the_verdict() {
    let mut top = growing();
    let many: Vec<TaskView> = (0..40)
        .map(|i| task(&format!("t{i:02}"), "w1", 1 << 20, false))
        .collect();
    top.update(
        11.0,
        health(
            Health::Unhealthy,
            &["worker w2: residual memory over its cap"],
        ),
        status(vec![worker("w1", Health::Healthy, 1 << 30, 2 << 30)], many),
        &[],
    );
    let lines = top.lines(80, 24);
    assert!(lines.len() <= 24, "{}", lines.len());
    assert!(lines.iter().all(|l| l.chars().count() <= 80), "{lines:#?}");
    assert_eq!(
        lines[0],
        "memwatch top - UNHEALTHY - sort attention - all workers - h1 (ebpf)"
    );
    assert!(
        lines[1].contains("worker w2: residual memory"),
        "{lines:#?}"
    );
    assert!(lines.iter().any(|l| l.contains("more")), "{lines:#?}");
    assert!(lines.last().unwrap().starts_with("keys: q quit"));
}

#[test]
fn rows_gone_from_the_agent_are_forgotten() {
    let mut top = growing();
    top.update(
        10.0,
        health(Health::Healthy, &[]),
        status(vec![worker("w1", Health::Healthy, 1, 2)], vec![]),
        &[],
    );
    assert_eq!(top.history.len(), 1);
}

#[test]
fn a_sparkline_spans_its_own_range() {
    assert_eq!(sparkline(&[]), "");
    assert_eq!(sparkline(&[5, 5, 5]), "▁▁▁");
    assert_eq!(sparkline(&[0, 7]), "▁█");
}
