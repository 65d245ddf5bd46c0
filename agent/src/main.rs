//! `memwatch`: parse the command line, run the command (agent/src/cmd).

use std::process::ExitCode;

use clap::Parser as _;
use memwatch::{Cli, dispatch};

#[tokio::main]
async fn main() -> ExitCode {
    dispatch(Cli::parse()).await
}
