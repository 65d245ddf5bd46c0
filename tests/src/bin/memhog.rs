//! `memhog MIB [HOLD_SECS]`: touches MIB MiB of anonymous memory one page at
//! a time, then holds it for HOLD_SECS (default 60) and exits 0.
//!
//! With `MEMHOG_MARK_MIB=N` it prints `mark <unix nanoseconds>` on stdout the
//! moment it has touched N MiB (tests time the agent's reaction from it),
//! and `pace <nanoseconds per MiB>` over the 4 MiB before it (how fast this
//! machine, or emulator, lets it go on past the mark).
//!
//! With `MEMHOG_RATE_MIB_S=R` it touches R MiB a second: MiB n not before
//! n / R seconds from its start (a steady leak).
use std::{thread, time::Duration};

/// MiB before the mark over which the pace is measured.
const PACE_MIB: usize = 4;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: memhog MIB [HOLD_SECS]");
    let hold: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let page = 4096;
    let mark: Option<usize> = std::env::var(memwatch_test_support::memhog::MARK_ENV)
        .ok()
        .and_then(|v| v.parse().ok());
    let rate: Option<f64> = std::env::var(memwatch_test_support::memhog::RATE_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|r: &f64| *r > 0.0);
    let start = std::time::Instant::now();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    let mut pace_from = None;
    for n in 0..mib {
        if let Some(rate) = rate {
            let due = start + Duration::from_secs_f64(n as f64 / rate);
            thread::sleep(due.saturating_duration_since(std::time::Instant::now()));
        }
        if mark.is_some_and(|m| m >= PACE_MIB && n == m - PACE_MIB) {
            pace_from = Some(std::time::Instant::now());
        }
        if mark == Some(n) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
            if let Some(from) = pace_from {
                println!("pace {}", from.elapsed().as_nanos() / PACE_MIB as u128);
            }
            println!("mark {}", now.as_nanos());
            use std::io::Write as _;
            let _ = std::io::stdout().flush();
        }
        // Zeroed memory may arrive as untouched pages: the writes below fault
        // each one in, so RSS really grows by a MiB per chunk.
        let mut chunk = vec![0u8; 1 << 20];
        for offset in (0..chunk.len()).step_by(page) {
            chunk[offset] = 1;
        }
        chunks.push(chunk);
    }
    thread::sleep(Duration::from_secs(hold));
    std::hint::black_box(&chunks);
}
