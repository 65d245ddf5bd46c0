//! What the watchdog watches: workers and tasks, as configured or registered,
//! and the rules that turn cgroups into tasks.

use std::{path::PathBuf, time::Duration};

use serde::Serialize;

/// Where a worker's or a task's memory is read from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemorySource {
    /// A memory cgroup directory: its usage minus inactive file cache.
    Cgroup(PathBuf),
    /// A process and its descendants: their resident memory.
    Pid(u32),
    /// Every process whose command line contains this text, with descendants.
    Process(String),
    /// The whole host: MemTotal − MemAvailable.
    Host,
}

impl MemorySource {
    pub fn cgroup(&self) -> Option<&std::path::Path> {
        match self {
            Self::Cgroup(path) => Some(path),
            _ => None,
        }
    }
}

/// Name of the implicit worker when none is configured: the whole host.
pub(crate) const HOST_WORKER: &str = "host";
/// A worker above its soft cap this long, with no task growing, is unhealthy.
pub(crate) const DEFAULT_UNHEALTHY_AFTER: Duration = Duration::from_secs(60);
/// An unhealthy worker below its soft cap this long is healthy again.
pub(crate) const DEFAULT_RECOVER_AFTER: Duration = Duration::from_secs(30);

/// A worker: something that runs tasks for a scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSpec {
    pub name: String,
    pub source: MemorySource,
    /// Over this, the worker is over budget; `None`: no cap, never unhealthy
    /// for memory (still reported).
    pub soft_cap: Option<u64>,
    /// Above the soft cap this long, with no task growing → `unhealthy`.
    pub unhealthy_after: Duration,
    /// Below the soft cap this long → back to `healthy`.
    pub recover_after: Duration,
    /// The memory pressure rule (`pressure_limit`, `pressure_after`), when set.
    pub pressure: Option<PressureRule>,
}

/// A worker whose PSI `some avg10` (the share of the last 10 s in which
/// some of its tasks stalled on memory) stays above `limit` for `after` is
/// unhealthy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PressureRule {
    /// In basis points (1/10000, the kernel's own precision: two decimals
    /// of a percent): 2000 is 0.2, a fifth of the time.
    pub limit_bp: u32,
    pub after: Duration,
}

/// A fraction 0–1 in basis points, rounded.
pub(crate) fn basis_points(fraction: f64) -> u32 {
    (fraction.clamp(0.0, 1.0) * 10_000.0).round() as u32
}

impl WorkerSpec {
    /// The one worker there is when none is configured: the whole host,
    /// without a cap (its memory is still reported).
    pub fn host() -> Self {
        Self {
            name: HOST_WORKER.into(),
            source: MemorySource::Host,
            soft_cap: None,
            unhealthy_after: DEFAULT_UNHEALTHY_AFTER,
            recover_after: DEFAULT_RECOVER_AFTER,
            pressure: None,
        }
    }
}

/// Every cgroup whose path matches `pattern` is a task of `worker`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rule {
    pub worker: String,
    pub pattern: glob::Pattern,
    pub soft_cap: Option<u64>,
}

/// What to do with a task that starts on a worker already over its cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnResidualOverCap {
    /// Answer 409 and do not track the task (the scheduler places it elsewhere).
    #[default]
    Reject,
    /// Accept it, flagged, and still mark the worker unhealthy.
    Flag,
}

/// Knobs shared by every worker and task.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    /// A task is "growing" when its memory rose by more than `growth_min_bytes`
    /// over the last `growth_window`.
    pub growth_window: Duration,
    pub growth_min_bytes: u64,
    /// Fraction of the soft cap below it that counts as "clearly below":
    /// re-arms `soft_cap_exceeded` and is needed for recovery.
    pub hysteresis: f64,
    pub on_residual_over_cap: OnResidualOverCap,
    /// Finished tasks remembered for `/v1/status` and idempotent DELETEs.
    pub finished_tasks_kept: usize,
    /// Running tasks one worker may have: past it, a registration is
    /// refused (429), so a loop of registrations cannot grow the agent
    /// without bound.
    pub max_tasks_per_worker: usize,
    /// The kill predictor's rule, per worker (`predict`, `predict_horizon`).
    pub predict: PredictSettings,
}

/// Whether and how far ahead the kill is predicted for a worker's cgroups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PredictRule {
    /// `predict`: on by default.
    pub enabled: bool,
    /// `predict_horizon`: an ETA at most this far ahead is `oom_imminent`.
    pub horizon: Duration,
}

impl Default for PredictRule {
    fn default() -> Self {
        Self {
            enabled: true,
            // A minute: time enough to checkpoint or move data, short
            // enough that a slow drift is not called imminent.
            horizon: Duration::from_secs(60),
        }
    }
}

/// [`PredictRule`]s by worker name; a worker not named (the host, a
/// `[[rule]]`'s) has the default.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PredictSettings {
    pub workers: std::collections::BTreeMap<String, PredictRule>,
}

impl PredictSettings {
    /// The rule for `worker`.
    pub fn rule(&self, worker: &str) -> PredictRule {
        self.workers.get(worker).copied().unwrap_or_default()
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            // Ten seconds of samples: long enough to ride over a pause in an
            // allocation loop, short enough that a finished spike stops
            // excusing a worker quickly.
            growth_window: Duration::from_secs(10),
            // A MiB over the window: below this is noise (page cache, stacks).
            growth_min_bytes: 1 << 20,
            // 5 %: a worker flapping around its cap neither re-fires events
            // nor recovers until it is clearly below.
            hysteresis: 0.05,
            on_residual_over_cap: OnResidualOverCap::Reject,
            finished_tasks_kept: 1000,
            max_tasks_per_worker: 4096,
            predict: PredictSettings::default(),
        }
    }
}

/// A task registration (`POST /v1/tasks`, `memwatch exec`, a cgroup rule).
/// Also what the state directory keeps of a running task, so an agent
/// restarted mid-task still counts its memory as the task's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(crate) struct TaskRequest {
    pub task_id: String,
    /// `None`: the default worker.
    pub worker: Option<String>,
    /// `None`: known only by id (its memory counts as the worker's).
    pub source: Option<MemorySource>,
    pub soft_cap: Option<u64>,
    /// Who registered it (`token:task`, `uid:1000`, `anonymous`, `agent`):
    /// only that principal or an admin may end it. Kept tasks written by a
    /// build without owners read back as `anonymous`: exactly the callers
    /// that could end them then (anyone on loopback when no token was
    /// set; else the token holder, who is admin now).
    #[serde(default = "anonymous_owner")]
    pub owner: String,
}

/// The principal of a caller that gave no credentials, on an agent with no
/// token (and of tasks kept before owners were).
pub(crate) const ANONYMOUS: &str = "anonymous";
/// The owner of the tasks the agent finds itself (cgroup rules, pods).
pub(crate) const AGENT_OWNER: &str = "agent";

fn anonymous_owner() -> String {
    ANONYMOUS.into()
}

/// How a task ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "outcome")]
pub(crate) enum TaskOutcome {
    /// The client said it ended (DELETE), with the exit status when known.
    Ended { exit_code: Option<i32> },
    /// A process of the task was OOM-killed.
    OomKilled,
    /// Its cgroup disappeared (rule-discovered tasks).
    CgroupRemoved,
}

impl TaskOutcome {
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::Ended {
                exit_code: Some(code),
            } => format!("ended with exit status {code}"),
            Self::Ended { exit_code: None } => "ended".into(),
            Self::OomKilled => "OOM-killed".into(),
            Self::CgroupRemoved => "cgroup removed".into(),
        }
    }
}
