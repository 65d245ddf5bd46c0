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

/// Freed memory the arenas may keep resident before the agent hands it
/// back: a burst (thousands of tasks registered or ended at once, a
/// catch-up of the outbox) leaves tens of MiB of freed pages that glibc
/// would otherwise keep for good (docs/benchmarks.md, "Footprint").
pub const KEEP_FREE_BYTES: u64 = 4 << 20;

/// What the heap holds now: resident anonymous memory of the process and
/// the bytes the allocator has handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub resident_anon: u64,
    pub in_use: u64,
}

impl Held {
    /// Now, from `/proc/self/status` (`RssAnon`) and glibc's `mallinfo2`;
    /// `None` where either cannot say.
    pub fn now() -> Option<Held> {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            let status = procfs::process::Process::myself().ok()?.status().ok()?;
            let resident_anon = status.rssanon? * 1024;
            // SAFETY: mallinfo2 only reads the allocator's statistics.
            let info = unsafe { libc::mallinfo2() };
            Some(Held {
                resident_anon,
                in_use: (info.uordblks as u64).saturating_add(info.hblkhd as u64),
            })
        }
        #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
        None
    }

    /// Resident anonymous memory beyond what is in use: freed pages kept
    /// (and thread stacks, a few hundred KiB).
    pub fn kept_free(&self) -> u64 {
        self.resident_anon.saturating_sub(self.in_use)
    }
}

/// Trims the arenas when they keep more than [`KEEP_FREE_BYTES`] of
/// freed memory resident; returns the resident anonymous bytes handed
/// back (`None`: nothing to hand back, or no way to tell). With nothing
/// to do it costs a read of `/proc/self/status` and a `mallinfo2` (a walk
/// of the arenas' free lists under their locks).
pub fn release_if_kept() -> Option<u64> {
    let before = Held::now()?;
    if before.kept_free() <= KEEP_FREE_BYTES {
        return None;
    }
    release_freed();
    let after = Held::now()?;
    Some(before.resident_anon.saturating_sub(after.resident_anon))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `RssAnon` is read in bytes (procfs gives KiB): a test process holds
    /// more than a MiB resident and the allocator has handed some out.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn resident_anon_is_read_in_bytes() {
        let kib = procfs::process::Process::myself()
            .and_then(|p| p.status())
            .ok()
            .and_then(|s| s.rssanon)
            .expect("RssAnon");
        let held = Held::now().expect("glibc and /proc");
        assert!(held.resident_anon >= 1 << 20, "{held:?}");
        // Read twice, a moment apart: within a few MiB of each other.
        assert!(
            held.resident_anon.abs_diff(kib * 1024) < 8 << 20,
            "{held:?} vs {kib} KiB"
        );
        assert!(held.in_use > 0, "{held:?}");
    }

    #[test]
    fn freed_memory_beyond_what_is_in_use_is_what_is_kept() {
        let held = Held {
            resident_anon: 50 << 20,
            in_use: 12 << 20,
        };
        assert_eq!(held.kept_free(), 38 << 20);
        let lean = Held {
            resident_anon: 10 << 20,
            in_use: 12 << 20,
        };
        assert_eq!(lean.kept_free(), 0);
    }
}
