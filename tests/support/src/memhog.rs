//! The `memhog` workload (a binary of memwatch-tests): what it reads and
//! what it prints.

/// `MEMHOG_MARK_MIB=N`: memhog prints `mark <unix ns>` when it has touched
/// N MiB, and `pace <ns per MiB>` over the MiB before it.
pub const MARK_ENV: &str = "MEMHOG_MARK_MIB";
/// `MEMHOG_RATE_MIB_S=R`: memhog touches R MiB a second (a steady leak)
/// instead of as fast as it can.
pub const RATE_ENV: &str = "MEMHOG_RATE_MIB_S";
/// `MEMHOG_SIGNAL_FILE=PATH`: memhog appends `signal <ns>` to PATH from its
/// SIGUSR1 handler, and `touched <ns>` each time it has touched one more
/// MiB (ns: CLOCK_MONOTONIC, the same clock for both).
pub const SIGNAL_FILE_ENV: &str = "MEMHOG_SIGNAL_FILE";

/// The number memhog printed on its `key` line (`mark`, `pace`).
pub fn printed(stdout: &str, key: &str) -> Option<i64> {
    crate::line_value(stdout, key)
}

#[cfg(test)]
mod tests {
    #[test]
    fn printed_lines() {
        let out = "pace 250000\nmark 1764000000123456789\n";
        assert_eq!(super::printed(out, "mark"), Some(1_764_000_000_123_456_789));
        assert_eq!(super::printed(out, "pace"), Some(250_000));
        assert_eq!(super::printed(out, "mar"), None);
    }
}
