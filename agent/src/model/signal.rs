//! Signals by name or number, as `memwatch exec --warn-signal` and the
//! Slurm sink's `imminent_signal` take them.

/// A signal to send: its number, and its name for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signal {
    pub number: i32,
    pub name: String,
}

/// Signal names memwatch knows, without the `SIG` prefix.
const SIGNALS: &[(&str, i32)] = &[
    ("HUP", libc::SIGHUP),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("ABRT", libc::SIGABRT),
    ("KILL", libc::SIGKILL),
    ("USR1", libc::SIGUSR1),
    ("SEGV", libc::SIGSEGV),
    ("USR2", libc::SIGUSR2),
    ("PIPE", libc::SIGPIPE),
    ("ALRM", libc::SIGALRM),
    ("TERM", libc::SIGTERM),
    ("CHLD", libc::SIGCHLD),
    ("CONT", libc::SIGCONT),
    ("STOP", libc::SIGSTOP),
    ("TSTP", libc::SIGTSTP),
    ("TTIN", libc::SIGTTIN),
    ("TTOU", libc::SIGTTOU),
    ("URG", libc::SIGURG),
    ("XCPU", libc::SIGXCPU),
    ("XFSZ", libc::SIGXFSZ),
    ("VTALRM", libc::SIGVTALRM),
    ("PROF", libc::SIGPROF),
    ("WINCH", libc::SIGWINCH),
    ("IO", libc::SIGIO),
    ("PWR", libc::SIGPWR),
    ("SYS", libc::SIGSYS),
];

/// The highest signal number Linux has (SIGRTMAX).
const MAX_SIGNAL: i32 = 64;

/// `SIGUSR1`, `USR1`, `usr1` or a number from 1 to 64.
pub(crate) fn parse_signal(text: &str) -> Result<Signal, String> {
    let trimmed = text.trim();
    if let Ok(number) = trimmed.parse::<i32>() {
        if !(1..=MAX_SIGNAL).contains(&number) {
            return Err(format!("signal numbers go from 1 to {MAX_SIGNAL}"));
        }
        let name = SIGNALS.iter().find(|(_, n)| *n == number).map_or_else(
            || format!("signal {number}"),
            |(name, _)| format!("SIG{name}"),
        );
        return Ok(Signal { number, name });
    }
    let upper = trimmed.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS
        .iter()
        .find(|(name, _)| *name == bare)
        .map(|(name, number)| Signal {
            number: *number,
            name: format!("SIG{name}"),
        })
        .ok_or_else(|| {
            format!("unknown signal {text:?} (a name such as SIGUSR1, USR1, TERM, or a number)")
        })
}
