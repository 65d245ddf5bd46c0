//! `memshape SHAPE LIMIT_MIB SEED SECONDS [DIR]`: holds anonymous memory in
//! the shape SHAPE for SECONDS (then exits 0), scaled to a cgroup limit of
//! LIMIT_MIB, with every random choice drawn from SEED: the workloads of
//! `cargo xtask bench predict`. Memory is taken and given back in 1 MiB
//! chunks, each page written (so the cgroup is charged at once) and freed
//! with munmap (uncharged at once). After every change it prints
//! `held <unix ns> <bytes>` on stdout: the allocation log.
//!
//! Shapes (fractions of LIMIT_MIB):
//! - `leak:R`: 30 % at once, then R MiB a second, without end (a kill);
//! - `steps`: 64 MiB every 10 s (only the step that crosses the limit kills);
//! - `sawtooth`: teeth between 50 and 90 %, each 2–5 s long: a garbage
//!   collected heap that never leaks;
//! - `rising`: the same teeth with troughs rising 4 % a tooth (a kill);
//! - `pagecache`: 93 % at once, then a file of twice the limit written in
//!   DIR (default /var/tmp; fdatasync'd every 8 MiB) and read again and again:
//!   page cache that reclaim frees;
//! - `spikes`: 60 %, and every 2–8 s a spike to 85–97 % held 0.2–1 s.

use std::{
    fs::File,
    io::{Read as _, Write as _},
    thread,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

const MIB: usize = 1 << 20;
const PAGE: usize = 4096;

/// splitmix64: reproducible draws from the seed without a dependency.
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [lo, hi).
    fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The memory held, in 1 MiB chunks, and its log.
struct Heap {
    chunks: Vec<Vec<u8>>,
    start: Instant,
    until: Duration,
}

impl Heap {
    fn mib(&self) -> usize {
        self.chunks.len()
    }

    /// Whether the run's time is up.
    fn done(&self) -> bool {
        self.start.elapsed() >= self.until
    }

    fn log(&self) {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970")
            .as_nanos();
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "held {now} {}", self.chunks.len() * MIB);
        let _ = out.flush();
    }

    fn take_one(&mut self) {
        let mut chunk = vec![0u8; MIB];
        for offset in (0..MIB).step_by(PAGE) {
            chunk[offset] = 1;
        }
        self.chunks.push(chunk);
    }

    /// Takes or gives back chunks until `mib` are held, at once.
    fn set(&mut self, mib: usize) {
        while self.mib() < mib {
            self.take_one();
        }
        self.chunks.truncate(mib);
        self.log();
    }

    /// Grows (or shrinks) to `mib` at `rate` MiB a second, a chunk at a time.
    fn ramp(&mut self, mib: usize, rate: f64) {
        let from = Instant::now();
        let first = self.mib();
        while self.mib() < mib && !self.done() {
            let n = (self.mib() - first + 1) as f64;
            let due = from + Duration::from_secs_f64(n / rate);
            thread::sleep(due.saturating_duration_since(Instant::now()));
            self.take_one();
            self.log();
        }
        if self.mib() > mib {
            self.set(mib);
        }
    }

    /// Holds what it has for `secs` (or until the run's time is up).
    fn hold(&self, secs: f64) {
        let left = self.until.saturating_sub(self.start.elapsed());
        thread::sleep(Duration::from_secs_f64(secs).min(left));
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: memshape SHAPE LIMIT_MIB SEED SECONDS [DIR]";
    let (Some(shape), Some(limit), Some(seed), Some(secs)) = (
        args.first(),
        args.get(1).and_then(|a| a.parse::<usize>().ok()),
        args.get(2).and_then(|a| a.parse::<u64>().ok()),
        args.get(3).and_then(|a| a.parse::<f64>().ok()),
    ) else {
        eprintln!("{usage}");
        std::process::exit(64);
    };
    let dir = args.get(4).map_or("/var/tmp", String::as_str);
    let mut draws = Draws(seed);
    let mut heap = Heap {
        chunks: Vec::new(),
        start: Instant::now(),
        until: Duration::from_secs_f64(secs),
    };
    let part = |f: f64| (limit as f64 * f) as usize;
    match shape.as_str() {
        "steps" => {
            while !heap.done() {
                heap.set(heap.mib() + 64);
                heap.hold(10.0);
            }
        }
        "sawtooth" | "rising" => {
            let mut trough = if shape == "rising" { 0.40 } else { 0.50 };
            heap.set(part(trough));
            while !heap.done() {
                let period = draws.between(2.0, 5.0);
                let (low, high) = (part(trough), part(trough + 0.40).max(part(trough) + 1));
                heap.ramp(high, (high - low) as f64 / (0.8 * period));
                heap.hold(0.2 * period);
                if shape == "rising" {
                    trough += 0.04;
                }
                heap.set(part(trough));
            }
        }
        "pagecache" => {
            heap.set(part(0.93));
            stream_page_cache(dir, 2 * limit, &heap);
        }
        "spikes" => {
            heap.set(part(0.60));
            while !heap.done() {
                heap.hold(draws.between(2.0, 8.0));
                if heap.done() {
                    break;
                }
                heap.set(part(draws.between(0.85, 0.97)));
                heap.hold(draws.between(0.2, 1.0));
                heap.set(part(0.60));
            }
        }
        leak => {
            let Some(rate) = leak
                .strip_prefix("leak:")
                .and_then(|r| r.parse::<f64>().ok())
                .filter(|r| *r > 0.0)
            else {
                eprintln!("memshape: unknown shape {leak:?} ({usage})");
                std::process::exit(64);
            };
            heap.set(part(0.30));
            heap.ramp(usize::MAX, rate);
        }
    }
    std::hint::black_box(&heap.chunks);
}

/// Writes a file of `mib` MiB in `dir` (fdatasync'd every 8 MiB, so dirty
/// pages stay few), then reads it over and over until the run is done.
fn stream_page_cache(dir: &str, mib: usize, heap: &Heap) {
    let path = format!("{dir}/memshape-{}.cache", std::process::id());
    let block = vec![7u8; MIB];
    {
        let mut file = File::create(&path).expect("create the page-cache file");
        for n in 0..mib {
            file.write_all(&block).expect("write the page-cache file");
            if n % 8 == 7 {
                file.sync_data().expect("fdatasync");
            }
            if heap.done() {
                break;
            }
        }
        file.sync_data().expect("fdatasync");
    }
    let mut buf = vec![0u8; MIB];
    while !heap.done() {
        let mut file = File::open(&path).expect("open the page-cache file");
        while !heap.done() && file.read(&mut buf).is_ok_and(|n| n > 0) {}
    }
    let _ = std::fs::remove_file(&path);
}
