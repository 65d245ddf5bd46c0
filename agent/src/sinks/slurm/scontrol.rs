//! Running `scontrol`: bounded in time, failures classified.

use std::{collections::BTreeMap, path::Path, process::Stdio, time::Duration};

use tokio::process::Command;

use crate::sinks::delivery::FailureClass;

/// Why an `scontrol` run failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ScontrolError {
    /// The controller did not answer, or `scontrol` itself hung: try again later.
    #[error("scontrol {args} did not finish within {timeout:?}")]
    Timeout { args: String, timeout: Duration },
    /// The controller cannot be reached now: try again later.
    #[error("scontrol {args}: controller unreachable: {stderr}")]
    Unreachable { args: String, stderr: String },
    /// `scontrol` answered no for good (unknown node or job, job not
    /// requeueable): retrying would not help.
    #[error("scontrol {args} refused: {stderr}")]
    Refused { args: String, stderr: String },
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
}

impl ScontrolError {
    /// Whether the same call may succeed later.
    pub(crate) fn transient(&self) -> bool {
        !matches!(self, Self::Refused { .. })
    }

    pub(crate) fn class(&self) -> FailureClass {
        match self {
            Self::Timeout { .. } => FailureClass::Timeout,
            Self::Unreachable { .. } => FailureClass::Connect,
            Self::Refused { .. } => FailureClass::Status,
            Self::Spawn { .. } => FailureClass::Other,
        }
    }
}

/// Words of `scontrol`'s errors that mean "not now" rather than "no".
const TRANSIENT: [&str; 6] = [
    "unable to contact slurm controller",
    "connection refused",
    "timed out",
    "try again",
    "completing",
    "communication",
];

/// Runs `program args...`, killed after `timeout`; its stdout on success.
pub(crate) async fn run(
    program: &Path,
    args: &[String],
    timeout: Duration,
) -> Result<String, ScontrolError> {
    run_with_env(program, args, &[], timeout).await
}

/// [`run`] with more environment variables.
pub(crate) async fn run_with_env(
    program: &Path,
    args: &[String],
    env: &[(&str, &str)],
    timeout: Duration,
) -> Result<String, ScontrolError> {
    let shown = args.join(" ");
    let child = Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| ScontrolError::Spawn {
            program: program.display().to_string(),
            source,
        })?;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(Ok(output)) => output,
        Ok(Err(source)) => {
            return Err(ScontrolError::Spawn {
                program: program.display().to_string(),
                source,
            });
        }
        Err(_) => {
            return Err(ScontrolError::Timeout {
                args: shown,
                timeout,
            });
        }
    };
    if output.status.success() {
        return Ok(String::from_utf8_lossy(&output.stdout).into_owned());
    }
    let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
    let lower = stderr.to_lowercase();
    if TRANSIENT.iter().any(|w| lower.contains(w)) {
        return Err(ScontrolError::Unreachable {
            args: shown,
            stderr,
        });
    }
    Err(ScontrolError::Refused {
        args: shown,
        stderr: if stderr.is_empty() {
            format!("exit status {}", output.status)
        } else {
            stderr
        },
    })
}

/// `Key=Value` pairs of one `scontrol show ... -o` line. `Reason=` runs to
/// the end of its value, which may hold spaces, up to the next known key.
pub fn fields(line: &str) -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    let mut key: Option<String> = None;
    for word in line.split_whitespace() {
        match word.split_once('=') {
            Some((k, v))
                if !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == ':') =>
            {
                map.insert(k.to_string(), v.to_string());
                key = Some(k.to_string());
            }
            _ => {
                if let Some(value) = key.as_ref().and_then(|k| map.get_mut(k)) {
                    value.push(' ');
                    value.push_str(word);
                }
            }
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_of_a_node_line_keep_reasons_with_spaces() {
        let f = fields(
            "NodeName=n1 Arch=x86_64 State=IDLE+DRAIN ThreadsPerCore=1 \
             Reason=memwatch: worker w1 unhealthy [root@2026-11-30T08:00:00]",
        );
        assert_eq!(f["NodeName"], "n1");
        assert_eq!(f["State"], "IDLE+DRAIN");
        assert_eq!(
            f["Reason"],
            "memwatch: worker w1 unhealthy [root@2026-11-30T08:00:00]"
        );
    }

    #[tokio::test]
    async fn failures_are_classified() {
        let sh = Path::new("/bin/sh");
        let args = |s: &str| vec!["-c".to_string(), s.to_string()];
        let out = run(sh, &args("echo ok"), Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(out, "ok\n");
        let e = run(
            sh,
            &args("echo 'Unable to contact slurm controller' >&2; exit 1"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(e.transient() && e.class() == FailureClass::Connect, "{e}");
        let e = run(
            sh,
            &args("echo 'Invalid job id specified' >&2; exit 1"),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert!(!e.transient() && e.class() == FailureClass::Status, "{e}");
        let e = run(sh, &args("sleep 5"), Duration::from_millis(100))
            .await
            .unwrap_err();
        assert!(e.transient() && e.class() == FailureClass::Timeout, "{e}");
        let e = run(
            Path::new("/nonexistent/scontrol"),
            &[],
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
        assert_eq!(e.class(), FailureClass::Other);
    }
}
