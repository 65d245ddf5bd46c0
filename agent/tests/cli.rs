//! The binary's behaviour on bad input: no privilege needed.

use std::{
    fs,
    process::{Command, Output},
};

use memwatch_test_support::http::free_port;

fn memwatch(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_memwatch"))
        .args(args)
        .output()
        .expect("run memwatch")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn invalid_flag_value_exits_2_naming_the_flag() {
    let out = memwatch(&["run", "--listen", "nowhere"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--listen"), "{}", stderr(&out));
}

#[test]
fn unknown_command_exits_2() {
    let out = memwatch(&["launch"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unrecognized subcommand 'launch'"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn invalid_config_exits_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memwatch.toml");

    fs::write(&path, "listen = \"127.0.0.1:9750\"\nlisten_port = 1\n").unwrap();
    let out = memwatch(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unknown field `listen_port`"),
        "{}",
        stderr(&out)
    );

    fs::write(&path, "outbox_capacity = 0\n").unwrap();
    let out = memwatch(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`outbox_capacity` must be at least 1"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn invalid_delivery_settings_exit_2_naming_the_key() {
    let out = memwatch(&["run", "--webhook", "not a url"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`--webhook` is not a valid URL"),
        "{}",
        stderr(&out)
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("memwatch.toml");
    fs::write(
        &path,
        "[[webhook]]\nurl = \"http://127.0.0.1:1/\"\nretry_initial = \"often\"\n",
    )
    .unwrap();
    let out = memwatch(&["run", "--config", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`webhook[0].retry_initial` is not a duration"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn events_without_an_agent_says_so() {
    // A port that nothing listens on any more.
    let port = free_port();
    let out = memwatch(&["events", "--agent", &format!("http://127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("cannot reach the agent"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn version_and_help_work() {
    let out = memwatch(&["--version"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("memwatch "));
    let out = memwatch(&["run", "--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--config",
        "--listen",
        "--node-name",
        "--state-dir",
        "--webhook",
    ] {
        assert!(help.contains(flag), "{flag} in {help}");
    }
}

#[test]
fn listening_beyond_loopback_without_a_token_is_refused() {
    let out = memwatch(&["run", "--listen", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("`listen` is 0.0.0.0:0, beyond loopback, and no token is set")
            && err.contains("api_token_file"),
        "{err}"
    );
    // With a token file the address passes: the next key checked (a rule
    // naming no declared worker) is what fails, and the agent never starts.
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    fs::write(&token, "s3cret\n").unwrap();
    let config = dir.path().join("memwatch.toml");
    fs::write(
        &config,
        "[[rule]]\nworker = \"nobody\"\ncgroup = \"/x/*\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_memwatch"))
        .args(["run", "--listen", "0.0.0.0:0", "--config"])
        .arg(&config)
        .arg("--api-token-file")
        .arg(&token)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`rule.worker`"), "{}", stderr(&out));
}

#[test]
fn a_token_is_never_a_command_line_argument() {
    let out = memwatch(&["status", "--token", "s3cret"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("unexpected argument '--token'"),
        "{}",
        stderr(&out)
    );
}
