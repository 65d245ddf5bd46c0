//! Shell completions and man pages of `memwatch`, made from its clap
//! definitions: `cargo xtask dist` runs this into target/dist/.
//!
//! ```text
//! cargo run -p memwatch --example cli_docs -- OUT_DIR
//! ```
//!
//! Writes `OUT_DIR/completions/{memwatch.bash, _memwatch, memwatch.fish}`
//! and `OUT_DIR/man/memwatch.1` with one page per command
//! (`memwatch-run.1`, …).

use std::path::{Path, PathBuf};

use clap::CommandFactory as _;
use clap_complete::Shell;

/// The files written, completions first.
pub(crate) fn write(out_dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let completions = out_dir.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let mut cmd = memwatch::Cli::command();
        written.push(clap_complete::generate_to(
            shell,
            &mut cmd,
            "memwatch",
            &completions,
        )?);
    }
    let man = out_dir.join("man");
    std::fs::create_dir_all(&man)?;
    clap_mangen::generate_to(memwatch::Cli::command(), &man)?;
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&man)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    pages.sort();
    written.extend(pages);
    Ok(written)
}

fn main() -> std::process::ExitCode {
    let Some(out_dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: cli_docs OUT_DIR");
        return std::process::ExitCode::from(2);
    };
    match write(Path::new(&out_dir)) {
        Ok(files) => {
            for file in files {
                println!("{}", file.display());
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cli_docs: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
