//! systemd's notification protocol (`Type=notify`, `WatchdogSec=`): one
//! datagram of `KEY=value` lines to the socket named by `$NOTIFY_SOCKET`
//! (a path, or an abstract name when it starts with `@`). The agent says
//! `READY=1` once its event source runs (when `/ready` turns 200),
//! `STATUS=` as it goes, `WATCHDOG=1` every half of `$WATCHDOG_USEC` only
//! while [`Liveness`] finds no loop stalled (so systemd restarts an agent
//! that answers but no longer watches or ships, as `/live` tells
//! Kubernetes), and `STOPPING=1` at shutdown. Without `$NOTIFY_SOCKET`
//! (not under systemd, or `Type=simple`) every call does nothing.
//!
//! Written here rather than with the `sd-notify` crate: that crate reads
//! `$NOTIFY_SOCKET` from the environment at every call, so a test could
//! point it at its own socket only by changing the process environment
//! (unsafe, and racy among tests running in threads); the protocol is a
//! datagram of text.

use std::{
    ffi::OsString,
    os::unix::{ffi::OsStrExt as _, net::UnixDatagram},
    time::Duration,
};

use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use super::liveness::Liveness;

/// Where systemd listens, as `$NOTIFY_SOCKET` names it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Address {
    Path(std::path::PathBuf),
    /// Linux's abstract namespace (`@name`: the name without the `@`).
    Abstract(Vec<u8>),
}

/// The service manager's ends: where to notify, and the watchdog period.
#[derive(Clone, Debug, Default)]
pub(crate) struct Notifier {
    address: Option<Address>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// From systemd's variables: `$NOTIFY_SOCKET`, and `$WATCHDOG_USEC`
    /// when `$WATCHDOG_PID` is unset or this process's.
    pub(crate) fn from_env() -> Self {
        Self::from_vars(
            std::env::var_os("NOTIFY_SOCKET"),
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )
    }

    /// [`Self::from_env`] on given values (tests).
    pub(crate) fn from_vars(
        socket: Option<OsString>,
        watchdog_usec: Option<&str>,
        watchdog_pid: Option<&str>,
        pid: u32,
    ) -> Self {
        let address =
            socket
                .filter(|s| !s.is_empty())
                .map(|s| match s.as_bytes().strip_prefix(b"@") {
                    Some(name) => Address::Abstract(name.to_vec()),
                    None => Address::Path(s.into()),
                });
        let ours = watchdog_pid.is_none_or(|p| p.trim().parse::<u32>().ok() == Some(pid));
        let watchdog = watchdog_usec
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|&u| u > 0 && ours && address.is_some())
            .map(Duration::from_micros);
        Self { address, watchdog }
    }

    /// Whether a service manager listens.
    #[cfg(test)]
    fn enabled(&self) -> bool {
        self.address.is_some()
    }

    /// The watchdog period systemd asked for, if any.
    #[cfg(test)]
    fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `lines` (`KEY=value`, one a line) as one datagram. Best effort:
    /// a service manager that does not answer is no reason to stop watching.
    pub(crate) fn send(&self, lines: &str) {
        let Some(address) = &self.address else {
            return;
        };
        if let Err(error) = send_to(address, lines.as_bytes()) {
            debug!(%error, ?address, "systemd notification not sent");
        }
    }

    /// The event source runs: `READY=1` with a status line.
    pub(crate) fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={}\n", one_line(status)));
    }

    pub(crate) fn status(&self, status: &str) {
        self.send(&format!("STATUS={}\n", one_line(status)));
    }

    pub(crate) fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping\n");
    }

    /// With a watchdog period, spawns the task that sends `WATCHDOG=1` every
    /// half period while no loop of `liveness` is stalled, and a `STATUS=`
    /// naming the stalled loops (and no `WATCHDOG=1`) while some are: systemd
    /// then kills and restarts the agent when the period runs out.
    pub(crate) fn spawn_watchdog(&self, liveness: Liveness) -> Option<JoinHandle<()>> {
        let period = self.watchdog?;
        let every = (period / 2).max(Duration::from_millis(1));
        info!(watchdog = ?period, "systemd watchdog: kept alive while every loop makes progress");
        let notifier = self.clone();
        Some(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut was_stalled = false;
            loop {
                ticker.tick().await;
                let stalled = liveness.stalled();
                if stalled.is_empty() {
                    if was_stalled {
                        notifier
                            .send("WATCHDOG=1\nSTATUS=running: every loop makes progress again\n");
                        was_stalled = false;
                    } else {
                        notifier.send("WATCHDOG=1\n");
                    }
                    continue;
                }
                let names = stalled
                    .iter()
                    .map(|(name, silent)| format!("{name} ({}s)", silent.as_secs()))
                    .collect::<Vec<_>>()
                    .join(", ");
                if !was_stalled {
                    warn!(stalled = %names, "systemd watchdog no longer kept alive");
                }
                was_stalled = true;
                notifier.status(&format!("stalled: {names}"));
            }
        }))
    }
}

/// A status is one line: a newline would start another assignment.
fn one_line(status: &str) -> String {
    status.replace(['\n', '\r'], " ")
}

fn send_to(address: &Address, message: &[u8]) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    match address {
        Address::Path(path) => socket.send_to(message, path)?,
        Address::Abstract(name) => {
            use std::os::linux::net::SocketAddrExt as _;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
            socket.send_to_addr(message, &addr)?
        }
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    /// Every datagram waiting on `socket`, in order.
    fn received(socket: &UnixDatagram) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = socket.recv(&mut buf) {
            out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        out
    }

    /// Lets the watchdog task run after the clock moved.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn listener() -> (tempfile::TempDir, UnixDatagram, OsString) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let socket = UnixDatagram::bind(&path).unwrap();
        socket.set_nonblocking(true).unwrap();
        (dir, socket, path.into_os_string())
    }

    #[test]
    fn without_notify_socket_nothing_is_sent_and_no_watchdog_runs() {
        let n = Notifier::from_vars(None, Some("120000000"), None, 1);
        assert!(!n.enabled());
        assert_eq!(n.watchdog(), None);
        n.ready("x");
        n.stopping();
        assert!(n.spawn_watchdog(Liveness::default()).is_none());
    }

    #[test]
    fn the_watchdog_is_ours_only_for_our_pid() {
        let sock = Some(OsString::from("/run/x"));
        let ours = Notifier::from_vars(sock.clone(), Some("120000000"), Some("7"), 7);
        assert_eq!(ours.watchdog(), Some(Duration::from_secs(120)));
        let theirs = Notifier::from_vars(sock.clone(), Some("120000000"), Some("8"), 7);
        assert_eq!(theirs.watchdog(), None);
        let unset = Notifier::from_vars(sock, Some("120000000"), None, 7);
        assert_eq!(unset.watchdog(), Some(Duration::from_secs(120)));
    }

    #[test]
    fn an_abstract_socket_is_reached() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("memwatch-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        socket.set_nonblocking(true).unwrap();
        let n = Notifier::from_vars(Some(format!("@{name}").into()), None, None, 1);
        n.ready("ready: source poll");
        assert_eq!(received(&socket), ["READY=1\nSTATUS=ready: source poll\n"]);
    }

    #[tokio::test(start_paused = true)]
    async fn ready_then_watchdog_only_while_every_loop_progresses_then_stopping() {
        let (_dir, socket, path) = listener();
        // WatchdogSec=20s: a ping every 10 s.
        let n = Notifier::from_vars(Some(path), Some("20000000"), None, 1);
        let liveness = Liveness::default();
        let sampler = liveness.register("sampler", Duration::from_secs(1));
        n.status("attaching the event source");
        n.ready("ready: source ebpf");
        let task = n.spawn_watchdog(liveness.clone()).expect("watchdog on");
        settle().await;
        let first = received(&socket);
        assert_eq!(
            first,
            [
                "STATUS=attaching the event source\n",
                "READY=1\nSTATUS=ready: source ebpf\n",
                "WATCHDOG=1\n",
            ]
        );
        // Live: a ping every half period.
        for _ in 0..5 {
            sampler.beat();
            tokio::time::advance(Duration::from_secs(10)).await;
            settle().await;
            assert_eq!(received(&socket), ["WATCHDOG=1\n"]);
        }
        // The sampler stops beating: pings go on until it counts as stalled
        // (60 s), then stop, with a status naming it.
        let mut after_stall = Vec::new();
        for _ in 0..12 {
            tokio::time::advance(Duration::from_secs(10)).await;
            settle().await;
            let got = received(&socket);
            if !liveness.stalled().is_empty() {
                after_stall.extend(got);
            }
        }
        assert!(!after_stall.is_empty());
        assert!(
            after_stall.iter().all(|m| !m.contains("WATCHDOG=1")),
            "no ping while stalled: {after_stall:?}"
        );
        assert!(
            after_stall[0].starts_with("STATUS=stalled: sampler ("),
            "{after_stall:?}"
        );
        // Progress again: pings again.
        sampler.beat();
        tokio::time::advance(Duration::from_secs(10)).await;
        settle().await;
        let got = received(&socket);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(got[0].starts_with("WATCHDOG=1\n"), "{got:?}");
        task.abort();
        n.stopping();
        assert_eq!(received(&socket), ["STOPPING=1\nSTATUS=stopping\n"]);
    }
}
