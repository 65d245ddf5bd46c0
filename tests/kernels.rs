//! The kernel matrix: the tests `cargo xtask vm-test` runs on every kernel
//! of the matrix (in VMs, and on this host after them). One binary, so the
//! agent is linked once; each file is a module (`kernel::oom::…`).
//! Every other integration test is in `host.rs`.

mod kernel {
    /// `memwatch doctor` on the kernel it runs on: what it finds and what it falls back to.
    mod doctor;
    /// Real OOM kills in real memory cgroups, reported once with their victim.
    mod oom;
    /// The kill predictor against a real leak and a real OOM kill (root).
    mod predict;
    /// memory.events, PSI, the pressure rule and trigger, NPD plugin mode (root).
    mod pressure;
    /// The soft cap's kernel path: a crossing seen in milliseconds, not at the next round (root).
    mod soft_cap;
    /// Soft caps, worker health and task registration against real cgroups.
    mod watchdog;
}
