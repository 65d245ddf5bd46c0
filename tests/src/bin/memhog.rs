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
//!
//! With `MEMHOG_SIGNAL_FILE=PATH` its SIGUSR1 handler appends `signal <ns>`
//! to PATH, and it appends `touched <ns>` after each MiB it touched (ns:
//! CLOCK_MONOTONIC): the last `touched` line is no later than its OOM kill.
use std::{
    os::fd::IntoRawFd as _,
    sync::atomic::{AtomicI32, Ordering},
    thread,
    time::Duration,
};

/// The signal file's descriptor, -1 without one.
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

/// CLOCK_MONOTONIC in nanoseconds (async-signal-safe).
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a timespec of ours.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Appends `<key> <now>` to the signal file with one write(2), formatted on
/// the stack: safe inside a signal handler.
fn record(key: &[u8]) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let mut line = [0u8; 64];
    line[..key.len()].copy_from_slice(key);
    let mut len = key.len();
    line[len] = b' ';
    len += 1;
    let mut digits = [0u8; 20];
    let mut n = monotonic_ns();
    let mut count = 0;
    loop {
        digits[count] = b'0' + (n % 10) as u8;
        count += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for digit in digits[..count].iter().rev() {
        line[len] = *digit;
        len += 1;
    }
    line[len] = b'\n';
    len += 1;
    // SAFETY: write(2) of our buffer to our fd.
    unsafe { libc::write(fd, line.as_ptr().cast(), len) };
}

extern "C" fn on_usr1(_: libc::c_int) {
    record(b"signal");
}

/// Opens PATH for appending and installs the SIGUSR1 handler.
fn watch_signal(path: &str) {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .expect("open MEMHOG_SIGNAL_FILE");
    SIGNAL_FD.store(file.into_raw_fd(), Ordering::Relaxed);
    // SAFETY: a handler that only calls async-signal-safe functions.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_usr1 as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGUSR1, &action, std::ptr::null_mut()),
            0,
            "sigaction"
        );
    }
}

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
    if let Ok(path) = std::env::var(memwatch_test_support::memhog::SIGNAL_FILE_ENV) {
        watch_signal(&path);
    }
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
        record(b"touched");
    }
    thread::sleep(Duration::from_secs(hold));
    std::hint::black_box(&chunks);
}
