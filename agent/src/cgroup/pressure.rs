//! Pressure stall information (the host's `/proc/pressure/memory`, a v2
//! cgroup's `memory.pressure`) and a cgroup's memory event counters (v2
//! `memory.events`; v1 `memory.failcnt` and `memory.oom_control`).

use std::{
    collections::HashSet,
    fs, io,
    path::{Path, PathBuf},
    sync::{LazyLock, Mutex},
};

use crate::model::pressure::{MEMORY_EVENTS, MemoryEvents, Pressure, PsiLine};

/// The host-wide memory PSI file.
pub(crate) const HOST_PRESSURE: &str = "/proc/pressure/memory";

/// Why a PSI file gave no figures.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PressureError {
    /// No such file (no PSI in this kernel, a v1 cgroup) or EOPNOTSUPP
    /// (PSI built in but off: `psi=0` on the kernel command line).
    #[error("no pressure stall information: {0}")]
    Unsupported(io::Error),
    #[error("{0}")]
    Io(io::Error),
    /// Read, but no well-formed `some` line.
    #[error("no well-formed `some` line")]
    Malformed,
}

/// A parsed PSI file, and how many of its lines were skipped as malformed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Parsed {
    pub pressure: Option<Pressure>,
    pub malformed: usize,
}

/// Parses a PSI file. A line that is not `some|full avg10=F avg60=F
/// avg300=F total=N` is skipped and counted; without a `some` line there
/// is no figure. Never panics.
pub(crate) fn parse(text: &str) -> Parsed {
    let mut some = None;
    let mut full = None;
    let mut malformed = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match parse_line(line) {
            Some(("some", psi)) => some = Some(psi),
            Some(("full", psi)) => full = Some(psi),
            _ => malformed += 1,
        }
    }
    Parsed {
        pressure: some.map(|some| Pressure { some, full }),
        malformed,
    }
}

fn parse_line(line: &str) -> Option<(&'static str, PsiLine)> {
    let mut words = line.split_whitespace();
    let kind = match words.next()? {
        "some" => "some",
        "full" => "full",
        _ => return None,
    };
    let (mut avg10, mut avg60, mut avg300, mut total) = (None, None, None, None);
    for word in words {
        let (key, value) = word.split_once('=')?;
        let share = || {
            value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
                .map(|v| v / 100.0)
        };
        match key {
            "avg10" => avg10 = Some(share()?),
            "avg60" => avg60 = Some(share()?),
            "avg300" => avg300 = Some(share()?),
            "total" => total = Some(value.parse::<u64>().ok()?),
            // A key a later kernel may add: not ours to judge.
            _ => {}
        }
    }
    Some((
        kind,
        PsiLine {
            avg10: avg10?,
            avg60: avg60?,
            avg300: avg300?,
            total_us: total?,
        },
    ))
}

/// Files whose malformed lines were logged already: once per file.
static WARNED: LazyLock<Mutex<HashSet<PathBuf>>> = LazyLock::new(Mutex::default);

/// Reads and parses a PSI file; malformed lines are logged once per file.
pub(crate) fn read(path: &Path) -> Result<Pressure, PressureError> {
    let text = fs::read_to_string(path).map_err(|e| {
        let unsupported = e.kind() == io::ErrorKind::NotFound
            || e.kind() == io::ErrorKind::Unsupported
            || e.raw_os_error() == Some(libc::EOPNOTSUPP);
        if unsupported {
            PressureError::Unsupported(e)
        } else {
            PressureError::Io(e)
        }
    })?;
    let parsed = parse(&text);
    if parsed.malformed > 0
        && WARNED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.to_path_buf())
    {
        tracing::warn!(
            file = %path.display(),
            lines = parsed.malformed,
            "malformed pressure lines skipped (said once per file)"
        );
    }
    parsed.pressure.ok_or(PressureError::Malformed)
}

/// The host's memory pressure.
pub(crate) fn host() -> Result<Pressure, PressureError> {
    read(Path::new(HOST_PRESSURE))
}

/// Arms a PSI trigger on a v2 cgroup's `memory.pressure`
/// (Documentation/accounting/psi.rst): the kernel signals POLLPRI on the
/// returned file (at most once a window) whenever some of the cgroup's
/// tasks stalled on memory for `stall_us` within a `window_us` window.
/// Needs write access to the file (a read-only cgroupfs, as the DaemonSet
/// mounts it, refuses: EROFS); a v1 cgroup has none (ENOENT).
pub(crate) fn memory_trigger(cgroup: &Path, stall_us: u64, window_us: u64) -> io::Result<fs::File> {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _};
    let mut file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(cgroup.join("memory.pressure"))?;
    // The kernel parses the whole write, NUL included (psi.rst's example).
    file.write_all(format!("some {stall_us} {window_us}\0").as_bytes())?;
    Ok(file)
}

/// A v2 cgroup's `memory.pressure` (a v1 memory cgroup has none).
pub(crate) fn of_cgroup(cgroup: &Path) -> Result<Pressure, PressureError> {
    read(&cgroup.join("memory.pressure"))
}

/// The memory event counters of a cgroup: v2 `memory.events` (this cgroup
/// and its descendants), else v1 `memory.failcnt` (plus
/// `memory.memsw.failcnt`, the memory+swap limit's) as `max` and
/// `memory.oom_control`'s `oom_kill`, with its `under_oom` state (0 or 1)
/// under that name. `None` when neither version's files are readable.
pub(crate) fn memory_events(cgroup: &Path) -> Option<MemoryEvents> {
    if let Ok(text) = fs::read_to_string(cgroup.join("memory.events")) {
        return Some(parse_memory_events(&text));
    }
    let mut events = MemoryEvents::new();
    // A charge tries the memory+swap counter first (where swap accounting
    // is on), then the memory one: each refusal counts in one failcnt,
    // never both, so the limit was hit as often as their sum.
    let failcnt = |file: &str| -> Option<u64> {
        fs::read_to_string(cgroup.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    if let Some(memory) = failcnt("memory.failcnt") {
        let memsw = failcnt("memory.memsw.failcnt").unwrap_or(0);
        events.insert("max", memory + memsw);
    }
    if let Ok(text) = fs::read_to_string(cgroup.join("memory.oom_control")) {
        for (key, name) in [("oom_kill", "oom_kill"), ("under_oom", UNDER_OOM)] {
            if let Some(n) = value_of(&text, key) {
                events.insert(name, n);
            }
        }
    }
    (!events.is_empty()).then_some(events)
}

/// v1's state "the cgroup is in OOM now", in [`memory_events`]'s map.
pub(crate) const UNDER_OOM: &str = "under_oom";

/// The counters of a v2 `memory.events` text the agent exports.
pub(crate) fn parse_memory_events(text: &str) -> MemoryEvents {
    MEMORY_EVENTS
        .iter()
        .filter_map(|&name| value_of(text, name).map(|n| (name, n)))
        .collect()
}

fn value_of(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Linux 5.13+ (host and cgroup files alike).
    const WITH_FULL: &str = "\
some avg10=1.53 avg60=0.87 avg300=0.25 total=1234567
full avg10=0.50 avg60=0.10 avg300=0.00 total=345678
";
    /// The host file of kernels before 5.13: no `full` line.
    const SOME_ONLY: &str = "some avg10=0.00 avg60=0.00 avg300=0.01 total=878361\n";

    #[test]
    fn parses_some_and_full_lines_as_fractions_and_microseconds() {
        let parsed = parse(WITH_FULL);
        assert_eq!(parsed.malformed, 0);
        let p = parsed.pressure.unwrap();
        assert!((p.some.avg10 - 0.0153).abs() < 1e-12);
        assert!((p.some.avg60 - 0.0087).abs() < 1e-12);
        assert!((p.some.avg300 - 0.0025).abs() < 1e-12);
        assert_eq!(p.some.total_us, 1_234_567);
        let full = p.full.unwrap();
        assert!((full.avg10 - 0.005).abs() < 1e-12);
        assert_eq!(full.total_us, 345_678);
    }

    #[test]
    fn the_full_line_may_be_absent() {
        let parsed = parse(SOME_ONLY);
        assert_eq!(parsed.malformed, 0);
        let p = parsed.pressure.unwrap();
        assert_eq!(p.full, None);
        assert!((p.some.avg300 - 0.0001).abs() < 1e-12);
        assert_eq!(p.some.total_us, 878_361);
    }

    #[test]
    fn malformed_lines_are_skipped_and_counted_never_a_panic() {
        let text = "\
garbage
some avg10=x avg60=0.00 avg300=0.00 total=1
full avg10=0.1 avg60=0.2 avg300=0.3
some avg10=2.00 avg60=1.00 avg300=0.50 total=99 extra=7
half avg10=1 avg60=1 avg300=1 total=1
full avg10=101.0 avg60=0 avg300=0 total=1
some=
";
        let parsed = parse(text);
        assert_eq!(parsed.malformed, 6, "{parsed:?}");
        let p = parsed.pressure.unwrap();
        assert!(
            (p.some.avg10 - 0.02).abs() < 1e-12,
            "a later key is ignored"
        );
        assert_eq!(p.some.total_us, 99);
        assert_eq!(p.full, None, "no well-formed full line");
        // Nothing usable at all.
        for text in [
            "",
            "\n\n",
            "full avg10=1 avg60=1 avg300=1 total=1",
            "\u{0}\u{ff}",
        ] {
            assert_eq!(parse(text).pressure, None, "{text:?}");
        }
    }

    #[test]
    fn a_missing_file_is_unsupported_and_an_unparsable_one_malformed() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            of_cgroup(dir.path()),
            Err(PressureError::Unsupported(_))
        ));
        fs::write(dir.path().join("memory.pressure"), "nonsense\n").unwrap();
        assert!(matches!(
            of_cgroup(dir.path()),
            Err(PressureError::Malformed)
        ));
        fs::write(dir.path().join("memory.pressure"), WITH_FULL).unwrap();
        assert_eq!(of_cgroup(dir.path()).unwrap().some.total_us, 1_234_567);
    }

    /// This host's own file. It may be missing elsewhere (no PSI in the
    /// kernel): then skipped, but not in CI, whose hosts have it.
    #[test]
    fn reads_this_hosts_pressure_file() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        if !Path::new(HOST_PRESSURE).exists() && !ci {
            eprintln!("{HOST_PRESSURE} is missing: no PSI in this kernel; skipped");
            return;
        }
        let text = fs::read_to_string(HOST_PRESSURE).unwrap();
        let parsed = parse(&text);
        assert_eq!(parsed.malformed, 0, "{text}");
        let p = host().unwrap();
        for line in std::iter::once(p.some).chain(p.full) {
            for (_, share) in line.windows() {
                assert!((0.0..=1.0).contains(&share), "{text}");
            }
        }
        assert!(p.full.is_some() || !text.contains("full"), "{text}");
    }

    #[test]
    fn memory_events_v2_and_their_v1_equivalents() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(memory_events(dir.path()), None);
        fs::write(
            dir.path().join("memory.events"),
            "low 0\nhigh 12\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\nsock_throttled 5\n",
        )
        .unwrap();
        let v2 = memory_events(dir.path()).unwrap();
        assert_eq!(
            v2.into_iter().collect::<Vec<_>>(),
            [
                ("high", 12),
                ("low", 0),
                ("max", 3),
                ("oom", 1),
                ("oom_group_kill", 0),
                ("oom_kill", 1)
            ]
        );
        // A kernel before oom_group_kill (5.17): only what is there.
        assert!(!parse_memory_events("high 1\n").contains_key("oom_group_kill"));

        let v1 = tempfile::tempdir().unwrap();
        fs::write(v1.path().join("memory.failcnt"), "42\n").unwrap();
        fs::write(
            v1.path().join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 1\noom_kill 2\n",
        )
        .unwrap();
        let events = memory_events(v1.path()).unwrap();
        assert_eq!(events.get("max"), Some(&42));
        // With swap accounting, refusals of the memory+swap limit too.
        fs::write(v1.path().join("memory.memsw.failcnt"), "8\n").unwrap();
        let events = memory_events(v1.path()).unwrap();
        assert_eq!(events.get("max"), Some(&50));
        assert_eq!(events.get("oom_kill"), Some(&2));
        assert_eq!(events.get(UNDER_OOM), Some(&1));
    }
}
