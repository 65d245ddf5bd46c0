//! `memhog MIB [HOLD_SECS]`: touches MIB MiB of anonymous memory one page at
//! a time, then holds it for HOLD_SECS (default 60) and exits 0.
//!
//! With `MEMHOG_MARK_MIB=N` it prints `mark <unix nanoseconds>` on stdout the
//! moment it has touched N MiB (tests time the agent's reaction from it).
use std::{thread, time::Duration};

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: memhog MIB [HOLD_SECS]");
    let hold: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let page = 4096;
    let mark: Option<usize> = std::env::var("MEMHOG_MARK_MIB")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for n in 0..mib {
        if mark == Some(n) {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970");
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
