//! The process's own heap: how many glibc malloc arenas it may use, and
//! freed start-up memory handed back to the kernel once the probe runs.
//!
//! glibc gives each thread that allocates an arena of its own (up to 8 per
//! core), each reserving up to 64 MiB and keeping what it once used. The
//! agent's threads (tokio workers, the blocking pool that runs samples and
//! the probe's load, the outbox writer) allocate little and rarely at the
//! same moment: two arenas serve them all. The kernel's BTF is parsed at
//! start (tens of MiB while it lasts) and dropped after attach; without a
//! trim glibc keeps those pages (docs/benchmarks.md, "Footprint").

/// Arenas glibc may make for the whole process.
const ARENAS: i32 = 2;

/// Limits glibc's malloc arenas to [`ARENAS`]. Call first in `main`, before
/// any thread starts. Nothing on other C libraries.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
    }
}

/// Hands every whole free page of every arena back to the kernel (after
/// start-up data such as the parsed BTF was dropped). Nothing on other C
/// libraries.
pub(crate) fn release_freed() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim is thread-safe and touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
