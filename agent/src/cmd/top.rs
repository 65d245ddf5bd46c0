//! `memwatch top`: a live view of the local agent, refreshed every second:
//! the verdict and its reasons, each worker and task with its memory, soft
//! cap, nearest limit and whose it is, growth rate and trend, the seconds to a predicted OOM kill (ETA),
//! health, and the last events; what needs attention first. Keys: `s` sort, `f` filter by worker, `p` pause, `q`
//! quit. When the output is not a terminal it prints plain lines instead
//! (one screen per refresh), for logs and `watch`.
//!
//! The view is pure ([`Top`]: status and events in, lines out); the loop
//! around it only asks the agent and draws.

use std::{
    collections::{BTreeMap, VecDeque},
    io::{IsTerminal as _, Write as _},
    time::Duration,
};

use crossterm::{
    cursor, event, execute, queue,
    terminal::{self, ClearType},
};
use tokio::sync::mpsc;

use super::{TopArgs, client::AgentClient};
use crate::{
    api::health::HealthBody, daemon::status::AgentStatus, model::event::Event,
    model::health::Health, watchdog::predict::LimitFields,
};

/// Samples kept per row: a minute at the default interval.
const HISTORY: usize = 60;
/// Samples the growth rate is taken over.
const RATE_WINDOW: usize = 10;
/// Width of the trend column.
const TREND: usize = 8;
/// Events kept for the bottom of the screen.
const EVENTS: usize = 5;

/// How rows are ordered (`s` cycles).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sort {
    /// Unhealthy or flagged first, then the fastest growth, then the
    /// fullest (memory over soft cap).
    Attention,
    Memory,
    Rate,
    Name,
}

impl Sort {
    fn next(self) -> Self {
        match self {
            Self::Attention => Self::Memory,
            Self::Memory => Self::Rate,
            Self::Rate => Self::Name,
            Self::Name => Self::Attention,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Attention => "attention",
            Self::Memory => "memory",
            Self::Rate => "rate",
            Self::Name => "name",
        }
    }
}

/// One line of the table: a worker or a task.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    /// `worker` or `task`.
    pub kind: &'static str,
    pub name: String,
    pub worker: String,
    pub memory: Option<u64>,
    pub soft_cap: Option<u64>,
    /// The limit nearest to it (least headroom) and whose it is: `own`,
    /// `anc` (an ancestor cgroup's) or `host` (the host's memory).
    pub limit: Option<u64>,
    pub limit_of: &'static str,
    /// Bytes per second over the last samples; `None` with fewer than two.
    pub rate: Option<f64>,
    pub trend: String,
    /// Seconds to the predicted OOM kill, where the agent predicts one.
    pub eta: Option<f64>,
    /// `unhealthy`, `imminent`, `flagged`, `growing`, `ok`, …
    pub state: String,
    /// Larger: more in need of a look.
    attention: u8,
}

/// The view: what the agent said over the last minute, and the keys'
/// settings.
#[derive(Debug)]
pub(crate) struct Top {
    /// Per row key: `(seconds since start, bytes)`.
    history: BTreeMap<String, VecDeque<(f64, u64)>>,
    health: Option<HealthBody>,
    status: Option<AgentStatus>,
    events: VecDeque<String>,
    pub(crate) sort: Sort,
    /// Only this worker's rows, when set (`f` cycles through the workers).
    pub(crate) filter: Option<String>,
    pub(crate) paused: bool,
}

impl Default for Top {
    fn default() -> Self {
        Self {
            history: BTreeMap::new(),
            health: None,
            status: None,
            events: VecDeque::new(),
            sort: Sort::Attention,
            filter: None,
            paused: false,
        }
    }
}

impl Top {
    /// Takes what the agent said at `at` seconds (ignored while paused).
    pub(crate) fn update(
        &mut self,
        at: f64,
        health: HealthBody,
        status: AgentStatus,
        events: &[Event],
    ) {
        if self.paused {
            return;
        }
        let mut seen = Vec::new();
        let memories = status
            .workers
            .iter()
            .map(|w| (format!("w/{}", w.name), w.memory_bytes))
            .chain(
                status
                    .tasks
                    .iter()
                    .map(|t| (format!("t/{}", t.task_id), t.memory_bytes)),
            );
        for (key, memory) in memories {
            if let Some(memory) = memory {
                let samples = self.history.entry(key.clone()).or_default();
                samples.push_back((at, memory));
                while samples.len() > HISTORY {
                    samples.pop_front();
                }
            }
            seen.push(key);
        }
        // Rows gone from the agent are forgotten: bounded by what is watched.
        self.history.retain(|k, _| seen.contains(k));
        for e in events {
            let body = &e.body;
            let who = [body.worker.as_deref(), body.task_id.as_deref()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" ");
            self.events.push_back(format!(
                "{} {} {who}",
                e.time.format("%H:%M:%S"),
                body.kind.as_str()
            ));
            while self.events.len() > EVENTS {
                self.events.pop_front();
            }
        }
        self.health = Some(health);
        self.status = Some(status);
    }

    /// A key press; `false` when it asks to quit.
    pub(crate) fn key(&mut self, key: char) -> bool {
        match key {
            'q' => return false,
            's' => self.sort = self.sort.next(),
            'p' => self.paused = !self.paused,
            'f' => self.filter = self.next_filter(),
            _ => {}
        }
        true
    }

    fn next_filter(&self) -> Option<String> {
        let workers: Vec<&str> = self
            .status
            .iter()
            .flat_map(|s| s.workers.iter().map(|w| w.name.as_str()))
            .collect();
        match &self.filter {
            None => workers.first().map(|w| w.to_string()),
            Some(now) => {
                let i = workers.iter().position(|w| w == now);
                i.and_then(|i| workers.get(i + 1)).map(|w| w.to_string())
            }
        }
    }

    fn trend(&self, key: &str) -> (Option<f64>, String) {
        let Some(samples) = self.history.get(key) else {
            return (None, String::new());
        };
        let recent: Vec<&(f64, u64)> = samples.iter().rev().take(RATE_WINDOW).collect();
        let rate = match (recent.last(), recent.first()) {
            (Some(first), Some(last)) if last.0 > first.0 => {
                Some((last.1 as f64 - first.1 as f64) / (last.0 - first.0))
            }
            _ => None,
        };
        let shown: Vec<u64> = samples
            .iter()
            .rev()
            .take(TREND)
            .rev()
            .map(|s| s.1)
            .collect();
        (rate, sparkline(&shown))
    }

    /// The rows, filtered and sorted.
    pub(crate) fn rows(&self) -> Vec<Row> {
        let Some(status) = &self.status else {
            return Vec::new();
        };
        let mut rows = Vec::new();
        for w in &status.workers {
            let (rate, trend) = self.trend(&format!("w/{}", w.name));
            let state = format!("{:?}", w.status).to_lowercase();
            let attention = match w.status {
                Health::Unhealthy => 3,
                Health::Degraded => 2,
                Health::Healthy => 0,
            };
            rows.push(Row {
                kind: "worker",
                name: w.name.clone(),
                worker: w.name.clone(),
                memory: w.memory_bytes,
                soft_cap: w.soft_cap_bytes,
                limit: w.limit.limit_bytes,
                limit_of: limit_of(&w.limit),
                rate,
                trend,
                eta: None,
                state,
                attention,
            });
        }
        for t in &status.tasks {
            let (rate, trend) = self.trend(&format!("t/{}", t.task_id));
            let (state, attention) = if t.eta_seconds.is_some() {
                ("imminent", 4)
            } else if t.flagged.is_some() {
                ("flagged", 3)
            } else if t.growing {
                ("growing", 1)
            } else {
                ("ok", 0)
            };
            rows.push(Row {
                kind: "task",
                name: t.task_id.clone(),
                worker: t.worker.clone(),
                memory: t.memory_bytes,
                soft_cap: t.soft_cap_bytes,
                limit: t.limit.limit_bytes,
                limit_of: limit_of(&t.limit),
                rate,
                trend,
                eta: t.eta_seconds,
                state: state.into(),
                attention,
            });
        }
        if let Some(only) = &self.filter {
            rows.retain(|r| &r.worker == only);
        }
        let fullness = |r: &Row| match (r.memory, r.soft_cap) {
            (Some(m), Some(c)) if c > 0 => m as f64 / c as f64,
            _ => 0.0,
        };
        let rate = |r: &Row| r.rate.unwrap_or(0.0);
        let eta = |r: &Row| r.eta.unwrap_or(f64::INFINITY);
        rows.sort_by(|a, b| match self.sort {
            Sort::Attention => b
                .attention
                .cmp(&a.attention)
                .then(eta(a).total_cmp(&eta(b)))
                .then(rate(b).total_cmp(&rate(a)))
                .then(fullness(b).total_cmp(&fullness(a)))
                .then(a.name.cmp(&b.name)),
            Sort::Memory => b.memory.cmp(&a.memory).then(a.name.cmp(&b.name)),
            Sort::Rate => rate(b).total_cmp(&rate(a)).then(a.name.cmp(&b.name)),
            Sort::Name => a.name.cmp(&b.name),
        });
        rows
    }

    /// The screen: at most `height` lines, none wider than `width`.
    pub(crate) fn lines(&self, width: usize, height: usize) -> Vec<String> {
        let mut out = Vec::new();
        let (Some(health), Some(status)) = (&self.health, &self.status) else {
            return vec!["memwatch top: waiting for the agent...".into()];
        };
        // What a key changed comes first: a long host name may cut the rest.
        out.push(format!(
            "memwatch top - {}{} - sort {} - {} - {} ({})",
            if self.paused { "PAUSED - " } else { "" },
            format!("{:?}", health.status).to_uppercase(),
            self.sort.label(),
            self.filter
                .as_deref()
                .map_or("all workers".to_string(), |w| format!("worker {w}")),
            status.host,
            health.source.map_or("?", |s| s.as_str()),
        ));
        for reason in health.reasons.iter().take(3) {
            out.push(format!("  ! {reason}"));
        }
        out.push(String::new());
        out.push(format!(
            "{:<9} {:<15} {:<8} {:>6} {:>5} {:>5} {:<4} {:>6} {:<8} {:>5}",
            "STATE", "NAME", "WORKER", "MEMORY", "CAP", "LIMIT", "OF", "RATE/s", "TREND", "ETA"
        ));
        let rows = self.rows();
        let room = height.saturating_sub(out.len() + EVENTS + 3);
        let size = |v: Option<u64>| v.map_or("-".to_string(), short);
        for r in rows.iter().take(room) {
            let name = if r.kind == "task" {
                format!("  {}", r.name)
            } else {
                r.name.clone()
            };
            out.push(format!(
                "{:<9} {:<15} {:<8} {:>6} {:>5} {:>5} {:<4} {:>6} {:<8} {:>5}",
                r.state,
                cut(&name, 15),
                cut(&r.worker, 8),
                size(r.memory),
                size(r.soft_cap),
                size(r.limit),
                r.limit_of,
                r.rate.map_or("-".into(), signed_bytes),
                r.trend,
                r.eta.map_or("-".into(), |s| format!("{s:.0}s")),
            ));
        }
        if rows.len() > room {
            out.push(format!("  ... {} more", rows.len() - room));
        }
        out.push(String::new());
        out.push("last events:".into());
        out.extend(self.events.iter().map(|e| format!("  {e}")));
        out.push("keys: q quit  s sort  f filter by worker  p pause".into());
        out.truncate(height.max(1));
        out.iter().map(|l| cut(l, width)).collect()
    }
}

/// Whose the nearest limit is, for the `OF` column (blank when unknown).
fn limit_of(limit: &LimitFields) -> &'static str {
    match limit.limit_owner.as_deref() {
        Some("own") => "own",
        Some("ancestor") => "anc",
        Some("host") => "host",
        _ => "",
    }
}

/// At most 5 characters below 100 TiB: `512B`, `900K`, `1.5G`, `512M`.
pub(crate) fn short(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit > 0 && value < 9.95 {
        format!("{value:.1}{}", UNITS[unit])
    } else {
        format!("{}{}", value.round() as u64, UNITS[unit])
    }
}

/// `+1.2M`, `-300K`, `0B`.
fn signed_bytes(rate: f64) -> String {
    let magnitude = short(rate.abs() as u64);
    if rate >= 1.0 {
        format!("+{magnitude}")
    } else if rate <= -1.0 {
        format!("-{magnitude}")
    } else {
        magnitude
    }
}

/// `values` as bars, lowest to highest of themselves.
pub(crate) fn sparkline(values: &[u64]) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let (Some(low), Some(high)) = (values.iter().min(), values.iter().max()) else {
        return String::new();
    };
    let span = (high - low).max(1) as f64;
    values
        .iter()
        .map(|v| BARS[(((v - low) as f64 / span) * 7.0).round() as usize])
        .collect()
}

/// `text` cut to `width` characters.
fn cut(text: &str, width: usize) -> String {
    text.chars().take(width).collect()
}

/// Runs the view until `q` (a terminal) or `--iterations` refreshes.
pub(crate) async fn run(args: &TopArgs) -> anyhow::Result<()> {
    let client = AgentClient::new(&args.agent)?;
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let mut top = Top::default();
    let started = tokio::time::Instant::now();
    let mut after = None;
    let terminal = std::io::stdout().is_terminal() && !args.plain;
    let (keys, mut pressed) = mpsc::channel::<char>(16);
    let _screen = if terminal {
        Some(Screen::enter(keys)?)
    } else {
        None
    };
    let mut refreshes = 0u64;
    loop {
        let health = client.health().await?;
        let status = client.status().await?;
        let from = *after.get_or_insert(status.outbox.last_seq.saturating_sub(EVENTS as u64));
        let events = client.events(from, 100).await.unwrap_or_default();
        if let Some(last) = events.last() {
            after = Some(last.seq);
        }
        top.update(started.elapsed().as_secs_f64(), health, status, &events);
        refreshes += 1;
        if terminal {
            let (width, height) = terminal::size().unwrap_or((80, 24));
            draw(&top.lines(width.into(), height.into()))?;
        } else {
            let mut out = std::io::stdout().lock();
            for line in top.lines(args.width, 1000) {
                writeln!(out, "{line}")?;
            }
            writeln!(out)?;
            out.flush()?;
        }
        if args.iterations.is_some_and(|n| refreshes >= n) {
            return Ok(());
        }
        let deadline = tokio::time::sleep(interval);
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                _ = &mut deadline => break,
                key = pressed.recv() => match key {
                    Some(key) if !top.key(key) => return Ok(()),
                    Some(_) if terminal => {
                        let (width, height) = terminal::size().unwrap_or((80, 24));
                        draw(&top.lines(width.into(), height.into()))?;
                    }
                    _ => {}
                },
            }
        }
    }
}

fn draw(lines: &[String]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    queue!(out, cursor::MoveTo(0, 0), terminal::Clear(ClearType::All))?;
    for (i, line) in lines.iter().enumerate() {
        queue!(out, cursor::MoveTo(0, i as u16))?;
        write!(out, "{line}")?;
    }
    out.flush()?;
    Ok(())
}

/// The terminal in raw mode on the alternate screen, with a thread
/// reading keys; put back as it was when dropped (on `q`, an error or a
/// panic alike).
struct Screen {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Screen {
    fn enter(keys: mpsc::Sender<char>) -> anyhow::Result<Self> {
        terminal::enable_raw_mode()?;
        execute!(
            std::io::stdout(),
            terminal::EnterAlternateScreen,
            cursor::Hide
        )?;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                if !event::poll(Duration::from_millis(100)).unwrap_or(false) {
                    continue;
                }
                if let Ok(event::Event::Key(key)) = event::read() {
                    let pressed = match key.code {
                        event::KeyCode::Char('c')
                            if key.modifiers.contains(event::KeyModifiers::CONTROL) =>
                        {
                            'q'
                        }
                        event::KeyCode::Char(c) => c,
                        event::KeyCode::Esc => 'q',
                        _ => continue,
                    };
                    if keys.blocking_send(pressed).is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Self { stop })
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = execute!(
            std::io::stdout(),
            cursor::Show,
            terminal::LeaveAlternateScreen
        );
        let _ = terminal::disable_raw_mode();
    }
}

#[cfg(test)]
mod tests;
