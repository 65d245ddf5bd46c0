//! The command line (the contract: docs/design.md): the arguments of every
//! command, and [`dispatch`] to the command's own module.

pub(crate) mod client;
pub(crate) mod doctor;
pub(crate) mod events;
pub(crate) mod exec;
pub(crate) mod run;
pub(crate) mod seccomp;
pub(crate) mod status;
pub(crate) mod top;
pub(crate) mod warn;

use std::{net::SocketAddr, path::PathBuf, process::ExitCode};

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, Overrides};

#[derive(Debug, Parser)]
#[command(
    name = "memwatch",
    version,
    about = "Per-host memory watchdog",
    propagate_version = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the agent in the foreground (needs CAP_BPF and CAP_PERFMON, or root).
    Run(RunArgs),
    /// Run CMD as a watched task in a fresh memory cgroup, registered with the agent.
    ///
    /// Exit status: CMD's own; 128+N when it died of signal N (137 when
    /// OOM-killed); 75 when the agent rejected the task (its worker is
    /// unhealthy: place it elsewhere); 69 when the agent could not be asked;
    /// 71 when the cgroup could not be set up; 126/127 when CMD cannot run.
    Exec(ExecArgs),
    /// Human summary of the local agent's health, workers and tasks.
    ///
    /// Exit status: 0 healthy, 1 degraded or unhealthy, 2 when the agent
    /// could not be asked (or bad flags).
    Status(StatusArgs),
    /// What this kernel and these privileges allow, as a table, and which
    /// source `run` would use (exit 1 when none is usable).
    Doctor(DoctorArgs),
    /// Print recent events from the local agent, one per line (`--json`:
    /// one JSON object per line).
    Events(EventsArgs),
    /// Live view of the local agent, refreshed every second: the verdict,
    /// each worker and task with memory, soft cap, growth rate and trend,
    /// what needs attention first, the last events. Keys: s sort, f filter
    /// by worker, p pause, q quit. Plain lines when the output is not a
    /// terminal.
    Top(TopArgs),
    /// Print the seccomp profile the agent's container needs (the runtime
    /// default plus bpf and perf_event_open for CAP_BPF and CAP_PERFMON),
    /// or write it to a file, e.g. under the kubelet's seccomp directory.
    SeccompProfile(SeccompArgs),
}

#[derive(Debug, Args)]
pub struct SeccompArgs {
    /// Write the profile to FILE (whole, replacing it; its directory made
    /// when missing) instead of printing it.
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Where the agent is, and the token for its routes.
#[derive(Debug, Args)]
pub struct AgentArgs {
    /// Base URL of the agent's API. Given (or MEMWATCH_AGENT set), the
    /// client speaks HTTP to it; else it uses the agent's socket when that
    /// exists, and http://127.0.0.1:9750 when not.
    #[arg(long, env = "MEMWATCH_AGENT", value_name = "URL")]
    pub agent: Option<String>,
    /// The agent's local socket [default: /run/memwatch/api.sock]: no token
    /// needed there, the agent knows the caller's uid.
    #[arg(long, env = "MEMWATCH_SOCKET", value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// File holding a token of the agent's (`api_token_file`,
    /// `task_token_file` or `read_token_file`); else the environment's
    /// `MEMWATCH_TOKEN`. Never a command-line argument: argv is readable by
    /// every user of the host.
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Soft cap of the task (e.g. 512MiB, 1G): over it, `soft_cap_exceeded`.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub soft_cap: Option<u64>,
    /// Hard cap: the kernel's memory limit of the task's cgroup (no swap beyond it).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub hard_cap: Option<u64>,
    /// Task id [default: exec-<pid>-<time>].
    #[arg(long, value_name = "ID")]
    pub task_id: Option<String>,
    /// Worker the task runs for [default: the agent's only worker].
    #[arg(long, value_name = "NAME")]
    pub worker: Option<String>,
    /// Send SIGNAL (SIGUSR1, USR1, TERM, a number) to CMD when the agent
    /// says its kill is imminent (`oom_imminent`), once per episode: again
    /// only after an `oom_averted`. CMD can checkpoint or shed load.
    #[arg(long, value_name = "SIGNAL", value_parser = warn::parse_signal)]
    pub warn_signal: Option<warn::WarnSignal>,
    #[command(flatten)]
    pub agent: AgentArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Kernel BTF to check.
    #[arg(long, value_name = "FILE", default_value = crate::probe::btf::VMLINUX_BTF)]
    pub btf_path: PathBuf,
    /// One JSON object (the checks, the hooks attached, the programs'
    /// sizes, the sources) instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Load the programs with their log statements on, as `run
    /// --probe-log` does (their sizes then include them).
    #[arg(long)]
    pub probe_log: bool,
    /// Tests only: load this eBPF object instead of the one built in.
    #[arg(long, hide = true, value_name = "FILE")]
    pub probe_object: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// The agent's status as JSON (`GET /v1/status`), for scripts.
    #[arg(long, conflicts_with = "npd")]
    pub json: bool,
    /// node-problem-detector's custom-plugin protocol: one line of at most
    /// 80 bytes, exit 0 when no worker is unhealthy, 1 when one is, 2 when
    /// the agent cannot be asked (deploy/npd/memwatch-monitor.json).
    #[arg(long)]
    pub npd: bool,
}

#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Milliseconds between refreshes (at least 100).
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub interval_ms: u64,
    /// Stop after N refreshes (default: until q).
    #[arg(long, value_name = "N")]
    pub iterations: Option<u64>,
    /// Plain lines even on a terminal (no keys, no screen drawing).
    #[arg(long)]
    pub plain: bool,
    /// Width of the plain lines.
    #[arg(long, value_name = "COLUMNS", default_value_t = 80)]
    pub width: usize,
}

fn parse_size(text: &str) -> Result<u64, String> {
    crate::model::units::Size::parse(text).map(|s| s.0)
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// TOML config file; flags (and their MEMWATCH_* variables) win over it.
    #[arg(long, value_name = "FILE", env = "MEMWATCH_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address of the HTTP API [default: 127.0.0.1:9750]. Beyond loopback
    /// only with a token (`--api-token-file`, `--task-token-file` or
    /// `--read-token-file`).
    #[arg(long, value_name = "ADDR", env = "MEMWATCH_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// File holding the `admin` token: every route (replaces `api_token` /
    /// `api_token_file` of the config file).
    #[arg(long, value_name = "FILE", env = "MEMWATCH_API_TOKEN_FILE")]
    pub api_token_file: Option<PathBuf>,
    /// File holding the `task` token: register tasks, end its own, read
    /// (replaces `task_token_file` of the config file).
    #[arg(long, value_name = "FILE", env = "MEMWATCH_TASK_TOKEN_FILE")]
    pub task_token_file: Option<PathBuf>,
    /// File holding the `read` token: `/v1/status` and `/v1/events`
    /// (replaces `read_token_file` of the config file).
    #[arg(long, value_name = "FILE", env = "MEMWATCH_READ_TOKEN_FILE")]
    pub read_token_file: Option<PathBuf>,
    /// The local API socket [default: /run/memwatch/api.sock]; local
    /// callers need no token there (root is admin, any other uid may
    /// register tasks and end its own).
    #[arg(long, value_name = "PATH", env = "MEMWATCH_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Name of this host on every event [default: the hostname].
    #[arg(long, value_name = "NAME", env = "MEMWATCH_NODE_NAME")]
    pub node_name: Option<String>,
    /// Directory of the durable outbox [default: /var/lib/memwatch].
    #[arg(long, value_name = "DIR", env = "MEMWATCH_STATE_DIR")]
    pub state_dir: Option<PathBuf>,
    /// POST events to this URL (repeatable; replaces `[[webhook]]` of the
    /// config file). MEMWATCH_WEBHOOK holds one URL.
    #[arg(long = "webhook", value_name = "URL", env = "MEMWATCH_WEBHOOK")]
    pub webhooks: Vec<String>,
    /// Benchmarks only: attach an empty program to the growth hook instead
    /// of the growth program (`cargo xtask bench overhead` measures the
    /// hook's own cost with it).
    #[arg(long, hide = true)]
    pub probe_floor: bool,
    /// Tests only: find OOM victims the way kernels older than 6.2 must
    /// (`mark_victim`'s pid, the task from `signal_generate`), on this one.
    #[arg(long, hide = true)]
    pub probe_oom_by_pid: bool,
    /// Tests only: the OOM ring's size in bytes (a power of two, whole
    /// pages), small enough for a test to overflow it.
    #[arg(long, hide = true, value_name = "BYTES")]
    pub probe_oom_ring_bytes: Option<u32>,
    /// The eBPF programs' own log records (aya-log) in the agent's log, for
    /// field debugging [default: `probe_log` of the config file, else off].
    /// Off, the plain programs are loaded: no logging code, no cost.
    #[arg(long, env = "MEMWATCH_PROBE_LOG")]
    pub probe_log: bool,
    /// Event source: `auto` (eBPF, else polling the cgroup files), `ebpf`, `poll`.
    #[arg(long, value_enum, env = "MEMWATCH_SOURCE")]
    pub source: Option<crate::config::SourceChoice>,
    /// Log filter [default: `log_level` of the config file, else info],
    /// e.g. `debug` or `memwatch=debug,info`. RUST_LOG, when set, wins.
    #[arg(long, value_name = "FILTER", env = "MEMWATCH_LOG")]
    pub log_level: Option<String>,
    /// Log lines as text (colour only on a terminal) or one JSON object
    /// each [default: `log_format` of the config file, else text].
    #[arg(long, value_enum, value_name = "FORMAT", env = "MEMWATCH_LOG_FORMAT")]
    pub log_format: Option<crate::telemetry::LogFormat>,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            api_token_file: self.api_token_file.clone(),
            task_token_file: self.task_token_file.clone(),
            read_token_file: self.read_token_file.clone(),
            socket: self.socket.clone(),
            node_name: self.node_name.clone(),
            state_dir: self.state_dir.clone(),
            webhooks: self.webhooks.clone(),
            probe_floor: self.probe_floor,
            probe_oom_by_pid: self.probe_oom_by_pid,
            probe_oom_ring_bytes: self.probe_oom_ring_bytes,
            probe_log: self.probe_log,
            source: self.source,
            log_level: self.log_level.clone(),
            log_format: self.log_format,
        }
    }
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    #[command(flatten)]
    pub agent: AgentArgs,
    /// Only events with a larger seq.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Events per request (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub limit: u64,
    /// Keep printing new events as they come (until interrupted).
    #[arg(long, short)]
    pub follow: bool,
    /// One JSON object per line (the events as `GET /v1/events` has
    /// them), for scripts; without it a short line per event.
    #[arg(long)]
    pub json: bool,
}

/// Exit status for configuration errors (clap uses 2 for bad flags too).
const EXIT_CONFIG: u8 = 2;

/// Runs the command `cli` names; its exit status.
pub async fn dispatch(cli: Cli) -> ExitCode {
    match cli.command {
        Command::Run(args) => {
            let config = match Config::load(args.config.as_deref(), &args.overrides()) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("memwatch: {error}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            crate::telemetry::init_logging(&config.log_level, config.log_format);
            report(run::run(config).await)
        }
        Command::Events(args) => report(events::run(&args).await),
        Command::Top(args) => report(top::run(&args).await),
        Command::Status(args) if args.npd => ExitCode::from(status::npd(&args).await),
        Command::Status(args) => match status::run(&args).await {
            Ok(verdict) => ExitCode::from(status::exit_code(verdict)),
            Err(error) => {
                eprintln!("memwatch: {error:#}");
                ExitCode::from(status::EXIT_UNREACHABLE)
            }
        },
        Command::Doctor(args) => doctor::run(&args),
        Command::SeccompProfile(args) => report(seccomp::run(&args)),
        Command::Exec(args) => {
            crate::telemetry::init_logging("warn", crate::telemetry::LogFormat::Text);
            ExitCode::from(exec::exec(&args).await)
        }
    }
}

fn report(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("memwatch: {error:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn exec_takes_sizes_and_a_command() {
        let cli =
            Cli::try_parse_from(["memwatch", "exec", "--soft-cap", "64M", "--", "sleep", "1"])
                .unwrap();
        let Command::Exec(args) = cli.command else {
            panic!()
        };
        assert_eq!(args.soft_cap, Some(64 << 20));
        assert_eq!(args.command, ["sleep", "1"]);
        let err =
            Cli::try_parse_from(["memwatch", "exec", "--hard-cap", "lots", "--", "x"]).unwrap_err();
        assert!(err.to_string().contains("`lots` is not a size"), "{err}");
        assert!(
            Cli::try_parse_from(["memwatch", "exec"]).is_err(),
            "a command is required"
        );
    }

    #[test]
    fn exec_takes_a_warn_signal_by_name_or_number() {
        for (text, number) in [
            ("SIGUSR1", libc::SIGUSR1),
            ("TERM", libc::SIGTERM),
            ("12", 12),
        ] {
            let cli = Cli::try_parse_from(["memwatch", "exec", "--warn-signal", text, "--", "x"])
                .unwrap();
            let Command::Exec(args) = cli.command else {
                panic!()
            };
            assert_eq!(args.warn_signal.map(|s| s.number), Some(number), "{text}");
        }
        let err = Cli::try_parse_from(["memwatch", "exec", "--warn-signal", "SIGFOO", "--", "x"])
            .unwrap_err();
        assert!(err.to_string().contains("--warn-signal"), "{err}");
        assert!(err.to_string().contains("unknown signal"), "{err}");
    }

    #[test]
    fn bad_listen_address_is_rejected_with_the_flag_named() {
        let err = Cli::try_parse_from(["memwatch", "run", "--listen", "nowhere"]).unwrap_err();
        assert!(err.to_string().contains("--listen"), "{err}");
    }
}
