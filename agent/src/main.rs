//! `memwatch`: parse the command line, run the command (agent/src/cmd).

use std::process::ExitCode;

use clap::Parser as _;
use memwatch::{Cli, dispatch, limit_malloc_arenas};

/// Tokio worker threads at most: the agent waits far more than it works,
/// and each worker is a stack and a share of the heap on every host.
const MAX_WORKERS: usize = 2;

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = Cli::parse();
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(MAX_WORKERS);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build();
    match runtime {
        Ok(runtime) => runtime.block_on(dispatch(cli)),
        Err(error) => {
            eprintln!("memwatch: cannot start the async runtime: {error}");
            ExitCode::FAILURE
        }
    }
}
