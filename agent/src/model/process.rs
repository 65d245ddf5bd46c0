//! A process as the kernel named it at one instant. A pid is reused once
//! its process has ended, so a pid alone proves nothing later: paired with
//! the boot-clock time it was seen (`CLOCK_BOOTTIME`, the clock of the
//! start time in `/proc/<pid>/stat`), a process that started after that
//! instant is told apart as another one.

/// `pid`, seen at `seen_boot_ns` (e.g. the peer of a local-socket
/// connection, when it was accepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeenProcess {
    pub pid: i32,
    pub seen_boot_ns: u64,
}

impl SeenProcess {
    /// `pid`, seen now.
    pub(crate) fn now(pid: i32) -> Self {
        Self {
            pid,
            seen_boot_ns: boot_time_ns(),
        }
    }

    /// Whether the process at `pid` now, whose `stat` line is `stat`, can
    /// be the one seen: it started no later than it was seen. Its start
    /// time is in clock ticks (10 ms at the usual USER_HZ), rounded down,
    /// so a pid reused within the tick it was seen in is not told apart.
    pub(crate) fn same_as(&self, stat: &str) -> bool {
        start_boot_ns(stat).is_some_and(|start| start <= self.seen_boot_ns)
    }
}

/// CLOCK_BOOTTIME, nanoseconds.
pub(crate) fn boot_time_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec; CLOCK_BOOTTIME exists on every
    // kernel memwatch runs on.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64
}

/// A process's start (boot clock, ns) from its `/proc/<pid>/stat` line:
/// field 22, after the command in parentheses (which may hold spaces and
/// parentheses itself).
fn start_boot_ns(stat: &str) -> Option<u64> {
    let after_comm = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the command: the start time is the 20th of them.
    let ticks: u64 = after_comm.split_whitespace().nth(19)?.parse().ok()?;
    // SAFETY: sysconf has no memory effects.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    Some(ticks.saturating_mul(1_000_000_000) / hz)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_stat() -> String {
        std::fs::read_to_string("/proc/self/stat").unwrap()
    }

    #[test]
    fn this_process_started_before_now_and_after_boot() {
        let stat = own_stat();
        let start = start_boot_ns(&stat).expect("a start time");
        assert!(start > 0 && start <= boot_time_ns(), "{start}");
        assert!(SeenProcess::now(std::process::id() as i32).same_as(&stat));
        let before_it_started = SeenProcess {
            pid: std::process::id() as i32,
            seen_boot_ns: start.saturating_sub(1_000_000_000),
        };
        assert!(
            !before_it_started.same_as(&stat),
            "a process that started after the instant is another one"
        );
    }

    #[test]
    fn a_command_with_spaces_and_parentheses_is_skipped_whole() {
        let stat = own_stat();
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let odd = format!("4242 (a) b (c) {rest}");
        assert_eq!(start_boot_ns(&odd), start_boot_ns(&stat));
        assert_eq!(start_boot_ns("4242 (gone"), None);
        assert!(!SeenProcess::now(1).same_as(""));
    }
}
