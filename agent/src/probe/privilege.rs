//! What the process may do, checked before touching the kernel so the error
//! names the missing capability instead of a bare EPERM.

use caps::{CapSet, Capability};

/// Capabilities missing to load and attach tracing programs: CAP_BPF and
/// CAP_PERFMON (Linux 5.8+), or CAP_SYS_ADMIN, which covers both.
pub(crate) fn missing_for_tracing() -> Vec<Capability> {
    let has = |cap| caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false);
    if has(Capability::CAP_SYS_ADMIN) {
        return Vec::new();
    }
    [Capability::CAP_BPF, Capability::CAP_PERFMON]
        .into_iter()
        .filter(|&cap| !has(cap))
        .collect()
}

/// `CAP_BPF, CAP_PERFMON`
pub(crate) fn names(caps: &[Capability]) -> String {
    caps.iter()
        .map(|c| c.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The process's seccomp mode from `/proc/self/status` (`Seccomp:`): 0
/// none, 1 strict, 2 filter (a container runtime's profile). `None` when
/// the kernel does not say.
pub(crate) fn seccomp_mode(status: &str) -> Option<u8> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Whether an error (or one it wraps) is an EPERM from the kernel.
pub(crate) fn is_eperm(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::raw_os_error)
            == Some(libc::EPERM)
        {
            return true;
        }
        next = e.source();
    }
    false
}

/// Why a load refused with EPERM although the capabilities are there:
/// a seccomp filter that does not allow bpf(2) (Debian 12's container
/// profile allows it only with CAP_SYS_ADMIN). `None` when no filter runs.
pub(crate) fn seccomp_refusal(error: &(dyn std::error::Error + 'static)) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    seccomp_blocks(error, &status)
}

fn seccomp_blocks(error: &(dyn std::error::Error + 'static), status: &str) -> Option<String> {
    (seccomp_mode(status) == Some(2) && is_eperm(error)).then(|| {
        "this process runs under a seccomp filter (Seccomp: 2 in /proc/self/status) that \
         refuses bpf(2) with EPERM although CAP_BPF and CAP_PERFMON are granted: give the \
         container memwatch's seccomp profile, which allows bpf and perf_event_open \
         (`memwatch seccomp-profile`; the Helm chart's seccomp.profile=localhost; \
         docs/install.md#seccomp), or run it unconfined"
            .to_string()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Wrapped(std::io::Error);

    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failed to create map `FAST_PATH`")
        }
    }

    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn an_eperm_under_a_seccomp_filter_is_named_as_seccomp() {
        let filtered = "Name:\tmemwatch\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        let eperm = Wrapped(std::io::Error::from_raw_os_error(libc::EPERM));
        let why = seccomp_blocks(&eperm, filtered).expect("seccomp named");
        assert!(
            why.contains("seccomp filter") && why.contains("bpf(2)"),
            "{why}"
        );
        // Not filtered, or not EPERM: something else.
        assert_eq!(seccomp_blocks(&eperm, "Seccomp:\t0\n"), None);
        let enomem = Wrapped(std::io::Error::from_raw_os_error(libc::ENOMEM));
        assert_eq!(seccomp_blocks(&enomem, filtered), None);
        assert_eq!(seccomp_mode("Name:\tx\n"), None);
    }
}
