use std::{
    cell::RefCell,
    collections::VecDeque,
    future::{Future, pending},
    pin::pin,
};

use chrono::Utc;
use tokio::time::Instant;

use super::*;
use crate::model::event::EventBody;

fn event(seq: u64, kind: EventKind, task: &str, eta: Option<f64>) -> Event {
    let mut body = EventBody::new(kind);
    body.task_id = Some(task.into());
    body.eta_seconds = eta;
    Event {
        id: seq.to_string(),
        seq,
        time: Utc::now(),
        host: "h".into(),
        epoch: None,
        body,
    }
}

fn imminent(seq: u64, task: &str, eta: f64) -> Event {
    event(seq, EventKind::OomImminent, task, Some(eta))
}

fn averted(seq: u64, task: &str) -> Event {
    event(seq, EventKind::OomAverted, task, None)
}

#[test]
fn signal_names_and_numbers() {
    for text in ["SIGUSR1", "USR1", "usr1", "sigusr1", "10"] {
        let signal = parse_signal(text).unwrap();
        assert_eq!(signal.number, libc::SIGUSR1, "{text}");
        assert_eq!(signal.name, "SIGUSR1", "{text}");
    }
    assert_eq!(parse_signal("TERM").unwrap().number, libc::SIGTERM);
    assert_eq!(parse_signal("40").unwrap().name, "signal 40");
    for bad in ["", "SIGFOO", "USR3", "0", "65", "-1"] {
        assert!(parse_signal(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn warns_once_per_episode_of_its_own_task() {
    let mut policy = WarnPolicy::new("t1");
    let warned: Vec<Option<f64>> = [
        imminent(1, "other", 3.0),
        event(2, EventKind::SoftCapExceeded, "t1", None),
        imminent(3, "t1", 12.5),
        imminent(4, "t1", 11.0),
        averted(5, "other"),
        imminent(6, "t1", 9.0),
        averted(7, "t1"),
        imminent(8, "t1", 4.0),
        imminent(9, "t1", 3.0),
    ]
    .iter()
    .map(|e| policy.on_event(e))
    .collect();
    assert_eq!(
        warned,
        [
            None,
            None,
            Some(12.5),
            None,
            None,
            None,
            None,
            Some(4.0),
            None
        ]
    );
}

#[test]
fn an_imminent_without_an_eta_still_warns() {
    let mut policy = WarnPolicy::new("t1");
    let eta = policy.on_event(&event(1, EventKind::OomImminent, "t1", None));
    assert!(eta.is_some_and(f64::is_nan));
}

/// What a fake agent answers, one script step per request.
enum Step {
    Page(Vec<Event>),
    Down,
    Hang,
}

/// An agent that plays a script, then answers empty pages; it records the
/// `after` of every request and when it came.
struct Script {
    steps: RefCell<VecDeque<Step>>,
    asked: RefCell<Vec<(u64, Instant)>>,
    /// The outbox's epoch it answers.
    epoch: RefCell<String>,
}

impl Script {
    fn new(steps: Vec<Step>) -> Self {
        Self {
            steps: RefCell::new(steps.into()),
            asked: RefCell::new(Vec::new()),
            epoch: RefCell::new("e1".into()),
        }
    }
}

impl EventSource for Script {
    fn events(&self, after: u64, limit: u64) -> impl Future<Output = anyhow::Result<Vec<Event>>> {
        assert_eq!(limit, PAGE);
        self.asked.borrow_mut().push((after, Instant::now()));
        let step = self.steps.borrow_mut().pop_front();
        async move {
            match step {
                None => Ok(Vec::new()),
                Some(Step::Page(events)) => Ok(events),
                Some(Step::Down) => anyhow::bail!("connection refused"),
                Some(Step::Hang) => pending().await,
            }
        }
    }

    async fn epoch(&self) -> anyhow::Result<String> {
        Ok(self.epoch.borrow().clone())
    }
}

/// Runs the follower on `script` for `run` (paused clock) and returns when
/// each warning came (since the start) with its ETA.
async fn follow_for(script: &Script, after: u64, run: Duration) -> Vec<(Duration, f64)> {
    let start = Instant::now();
    let warned = RefCell::new(Vec::new());
    {
        let cursor = Cursor {
            epoch: "e1".into(),
            after,
        };
        let follower = pin!(follow(script, WarnPolicy::new("t1"), cursor, |eta| {
            warned.borrow_mut().push((start.elapsed(), eta));
        }));
        tokio::select! {
            never = follower => match never {},
            () = tokio::time::sleep(run) => {}
        }
    }
    warned.into_inner()
}

#[tokio::test(start_paused = true)]
async fn polls_from_the_registration_seq_and_signals_on_the_first_imminent() {
    let script = Script::new(vec![
        Step::Page(vec![]),
        Step::Page(vec![imminent(43, "t1", 20.0), imminent(44, "t1", 19.0)]),
        Step::Page(vec![imminent(45, "t1", 18.0)]),
    ]);
    let warned = follow_for(&script, 42, Duration::from_secs(2)).await;
    assert_eq!(warned, [(POLL_INTERVAL, 20.0)]);
    let asked = script.asked.borrow();
    assert_eq!(
        asked.iter().take(4).map(|(a, _)| *a).collect::<Vec<_>>(),
        [42, 42, 44, 45]
    );
    // One request per interval: 2 s is 10 intervals (the 11th at 2 s may
    // or may not have been asked before the end).
    assert!((10..=11).contains(&asked.len()), "{} requests", asked.len());
}

#[tokio::test(start_paused = true)]
async fn a_full_page_is_followed_at_once() {
    let full: Vec<Event> = (1..=PAGE)
        .map(|seq| event(seq, EventKind::SoftCapExceeded, "t1", None))
        .collect();
    let script = Script::new(vec![
        Step::Page(full),
        Step::Page(vec![imminent(PAGE + 1, "t1", 7.0)]),
    ]);
    let warned = follow_for(&script, 0, Duration::from_secs(1)).await;
    assert_eq!(warned, [(Duration::ZERO, 7.0)]);
}

#[tokio::test(start_paused = true)]
async fn an_agent_down_is_retried_with_backoff_and_the_warning_still_comes() {
    let script = Script::new(vec![
        Step::Down,
        Step::Down,
        Step::Down,
        Step::Page(vec![imminent(5, "t1", 30.0)]),
    ]);
    let warned = follow_for(&script, 0, Duration::from_secs(10)).await;
    // Pauses of 200, 400 and 800 ms after the three failures.
    assert_eq!(warned, [(Duration::from_millis(1400), 30.0)]);
    let asked = script.asked.borrow();
    let gaps: Vec<Duration> = asked.windows(2).map(|w| w[1].1 - w[0].1).collect();
    assert_eq!(
        gaps[..4],
        [
            Duration::from_millis(200),
            Duration::from_millis(400),
            Duration::from_millis(800),
            POLL_INTERVAL
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn the_backoff_is_capped() {
    let script = Script::new((0..20).map(|_| Step::Down).collect());
    follow_for(&script, 0, Duration::from_secs(60)).await;
    let asked = script.asked.borrow();
    let longest = asked.windows(2).map(|w| w[1].1 - w[0].1).max().unwrap();
    assert_eq!(longest, MAX_BACKOFF);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_never_answers_is_bounded() {
    let script = Script::new(vec![Step::Hang, Step::Page(vec![imminent(1, "t1", 9.0)])]);
    let warned = follow_for(&script, 0, Duration::from_secs(10)).await;
    assert_eq!(warned, [(REQUEST_TIMEOUT + POLL_INTERVAL, 9.0)]);
}

#[tokio::test(start_paused = true)]
async fn a_new_episode_after_averted_warns_again() {
    let script = Script::new(vec![
        Step::Page(vec![imminent(1, "t1", 9.0)]),
        Step::Page(vec![averted(2, "t1")]),
        Step::Page(vec![imminent(3, "t1", 4.0)]),
    ]);
    let warned = follow_for(&script, 0, Duration::from_secs(1)).await;
    assert_eq!(warned, [(Duration::ZERO, 9.0), (POLL_INTERVAL * 2, 4.0)]);
}

#[tokio::test(start_paused = true)]
async fn back_from_down_with_a_new_outbox_it_reads_that_one_from_its_start() {
    let script = Script::new(vec![Step::Down, Step::Page(vec![imminent(2, "t1", 8.0)])]);
    *script.epoch.borrow_mut() = "e2".into();
    let warned = follow_for(&script, 900, Duration::from_secs(1)).await;
    assert_eq!(warned, [(POLL_INTERVAL, 8.0)]);
    let asked: Vec<u64> = script.asked.borrow().iter().map(|(a, _)| *a).collect();
    assert_eq!(asked[..3], [900, 0, 2]);
}

#[tokio::test(start_paused = true)]
async fn back_from_down_with_the_same_outbox_it_goes_on_where_it_was() {
    let script = Script::new(vec![Step::Down, Step::Page(vec![imminent(901, "t1", 8.0)])]);
    let warned = follow_for(&script, 900, Duration::from_secs(1)).await;
    assert_eq!(warned, [(POLL_INTERVAL, 8.0)]);
    let asked: Vec<u64> = script.asked.borrow().iter().map(|(a, _)| *a).collect();
    assert_eq!(asked[..3], [900, 900, 901]);
}
