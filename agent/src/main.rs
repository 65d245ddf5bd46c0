use std::process::ExitCode;

use clap::Parser as _;
use memwatch::{
    cli::{Cli, Command},
    config::Config,
};

/// Exit status for configuration errors (clap uses 2 for bad flags too).
const EXIT_CONFIG: u8 = 2;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => {
            let config = match Config::load(args.config.as_deref(), &args.overrides()) {
                Ok(config) => config,
                Err(error) => {
                    eprintln!("memwatch: {error}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            memwatch::telemetry::init_logging(&config.log_level);
            report(memwatch::agent::run(config).await)
        }
        Command::Events(args) => report(memwatch::client::events(&args).await),
        Command::Status(args) => report(memwatch::status_cmd::status(&args).await),
        Command::Doctor(args) => {
            let report = memwatch::doctor::report(&args.btf_path);
            if args.json {
                match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(error) => eprintln!("memwatch: doctor: {error}"),
                }
            } else {
                print!("{}", memwatch::doctor::render(&report.rows));
            }
            if report.usable {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Exec(args) => {
            memwatch::telemetry::init_logging("warn");
            ExitCode::from(memwatch::exec::exec(&args).await)
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
