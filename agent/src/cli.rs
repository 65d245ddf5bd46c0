//! Command-line interface (the contract in ../shared/DESIGN.md).

use std::{net::SocketAddr, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::config::Overrides;

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
    /// Print recent events from the local agent, one JSON object per line.
    Events(EventsArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// TOML config file; flags win over it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the HTTP API [default: 127.0.0.1:9750].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Name of this host on every event [default: the hostname].
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Directory of the durable outbox [default: /var/lib/memwatch].
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// POST events to this URL (repeatable; replaces `[[webhook]]` of the config file).
    #[arg(long = "webhook", value_name = "URL")]
    pub webhooks: Vec<String>,
}

impl RunArgs {
    pub fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen,
            node_name: self.node_name.clone(),
            state_dir: self.state_dir.clone(),
            webhooks: self.webhooks.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Base URL of the agent's API.
    #[arg(long, env = "MEMWATCH_AGENT", default_value = "http://127.0.0.1:9750")]
    pub agent: String,
    /// Only events with a larger seq.
    #[arg(long, default_value_t = 0)]
    pub after: u64,
    /// Events per request (1 to 1000).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub limit: u64,
    /// Keep printing new events as they come (until interrupted).
    #[arg(long, short)]
    pub follow: bool,
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
    fn bad_listen_address_is_rejected_with_the_flag_named() {
        let err = Cli::try_parse_from(["memwatch", "run", "--listen", "nowhere"]).unwrap_err();
        assert!(err.to_string().contains("--listen"), "{err}");
    }
}
