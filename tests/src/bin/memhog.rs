//! `memhog MIB [HOLD_SECS]`: touches MIB MiB of anonymous memory one page at
//! a time, then holds it for HOLD_SECS (default 60) and exits 0.
use std::{thread, time::Duration};

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: memhog MIB [HOLD_SECS]");
    let hold: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(60);
    let page = 4096;
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
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
