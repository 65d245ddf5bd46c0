//! `faultbench [MIB] [ROUNDS]`: the page-fault-heavy workload of the probe
//! overhead benchmark. Maps MIB MiB (default 2048) of anonymous memory with
//! transparent huge pages off, touches every 4 KiB page, unmaps; ROUNDS
//! times (default 3). Prints the elapsed seconds.
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(2048);
    let rounds: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(3);
    let len = mib << 20;
    let started = Instant::now();
    for _ in 0..rounds {
        // SAFETY: a fresh private anonymous mapping, written only inside
        // its bounds, unmapped before the next round.
        unsafe {
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            assert_ne!(ptr, libc::MAP_FAILED, "mmap {mib} MiB");
            libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE);
            let bytes = ptr.cast::<u8>();
            for offset in (0..len).step_by(4096) {
                bytes.add(offset).write_volatile(1);
            }
            libc::munmap(ptr, len);
        }
    }
    println!("{:.6}", started.elapsed().as_secs_f64());
}
