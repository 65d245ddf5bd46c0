//! Bounded waits: poll a condition until it holds, or panic naming what was
//! awaited and for how long.

use std::time::{Duration, Instant};

/// How often [`wait_until`] and [`wait_until_async`] look.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `check` every [`POLL`] until it holds; the time that took.
/// Panics, naming `what` and `timeout`, when it still does not hold after
/// `timeout`.
pub fn wait_until(what: &str, timeout: Duration, check: impl FnMut() -> bool) -> Duration {
    wait_until_every(what, timeout, POLL, check)
}

/// [`wait_until`], polling every `every` (a check that runs a command
/// wants fewer looks).
pub fn wait_until_every(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: impl FnMut() -> bool,
) -> Duration {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < timeout, "{}", timed_out(what, timeout));
        std::thread::sleep(every);
    }
    start.elapsed()
}

/// [`wait_until`] for async code and async checks (a plain condition:
/// `async || done()`); sleeps on tokio's clock.
#[cfg(feature = "tokio")]
pub async fn wait_until_async(
    what: &str,
    timeout: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> Duration {
    let start = tokio::time::Instant::now();
    while !check().await {
        assert!(start.elapsed() < timeout, "{}", timed_out(what, timeout));
        tokio::time::sleep(POLL).await;
    }
    start.elapsed()
}

fn timed_out(what: &str, timeout: Duration) -> String {
    format!("timed out waiting for {what} (not within {timeout:?})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_once_the_condition_holds() {
        let mut looks = 0;
        wait_until("three looks", Duration::from_secs(5), || {
            looks += 1;
            looks == 3
        });
        assert_eq!(looks, 3);
    }

    #[test]
    #[should_panic(expected = "timed out waiting for nothing (not within 50ms)")]
    fn panics_naming_what_and_the_bound() {
        wait_until("nothing", Duration::from_millis(50), || false);
    }
}
