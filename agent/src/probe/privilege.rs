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
