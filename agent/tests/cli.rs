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
    // A token others may read is refused before anything else.
    fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
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

#[test]
fn status_without_an_agent_exits_2() {
    let port = free_port();
    for extra in [&[][..], &["--json"][..]] {
        let agent = format!("http://127.0.0.1:{port}");
        let mut args = vec!["status", "--agent", &agent];
        args.extend_from_slice(extra);
        let out = memwatch(&args);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("cannot reach the agent"),
            "{}",
            stderr(&out)
        );
    }
}

/// A real agent configured through MEMWATCH_* variables alone, logging
/// JSON lines; its one worker (this test process) is over its soft cap, so
/// `status` says `degraded` and exits 1.
#[test]
fn an_agent_from_the_environment_logs_json_and_status_says_degraded() {
    use memwatch_test_support::agent::{Agent, Options};
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("memwatch.toml");
    fs::write(
        &config,
        format!(
            "[[worker]]\nname = \"w1\"\npid = {}\nsoft_cap = \"1MiB\"\nunhealthy_after = \"1h\"\n",
            std::process::id()
        ),
    )
    .unwrap();
    let node = "env-node";
    let agent = Agent::start(
        std::path::Path::new(env!("CARGO_BIN_EXE_memwatch")),
        &Options {
            env: vec![
                ("MEMWATCH_CONFIG".into(), config.display().to_string()),
                ("MEMWATCH_SOURCE".into(), "poll".into()),
                ("MEMWATCH_LOG_FORMAT".into(), "json".into()),
                ("MEMWATCH_LOG".into(), "debug".into()),
                ("MEMWATCH_NODE_NAME".into(), node.into()),
            ],
            log: true,
            ..Options::default()
        },
    )
    .expect("the agent starts");
    let url = agent.base_url();

    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    let out = loop {
        let out = memwatch(&["status", "--agent", &url]);
        let code = out.status.code();
        assert!(matches!(code, Some(0 | 1)), "{code:?}: {}", stderr(&out));
        if code == Some(1) || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(out.status.code(), Some(1), "degraded: {}", stderr(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("DEGRADED"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let out = memwatch(&["status", "--json", "--agent", &url]);
    assert_eq!(out.status.code(), Some(1));
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(status["host"], node, "MEMWATCH_NODE_NAME");
    assert_eq!(status["source"], "poll", "MEMWATCH_SOURCE");

    let out = memwatch(&["events", "--json", "--agent", &url]);
    assert!(out.status.success(), "{}", stderr(&out));
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["kind"], "agent_started");
    let out = memwatch(&["events", "--agent", &url]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().next().unwrap().contains(" agent_started"),
        "{text}"
    );

    let log = agent.log_text();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "DEBUG"),
        "MEMWATCH_LOG=debug: {log}"
    );
}
