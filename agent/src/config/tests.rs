//! Longer than 600 lines: the config reader's tests, one per key group, each
//! against the real file reader; they follow config/mod.rs section by
//! section.

use super::*;
#[cfg(feature = "nats")]
use crate::sinks::{
    config::Secret,
    webhook::{WebhookConfig, WebhookFormat},
};

fn file(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn defaults_listen_on_loopback() {
    let c = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(c.listen, "127.0.0.1:9750".parse().unwrap());
    assert!(!c.node_name.is_empty());
}

#[test]
fn flags_win_over_file() {
    let f = file("listen = \"127.0.0.1:1111\"\nnode_name = \"from-file\"\noutbox_capacity = 5\n");
    let flags = Overrides {
        listen: Some("127.0.0.1:2222".parse().unwrap()),
        ..Overrides::default()
    };
    let c = Config::load(Some(f.path()), &flags).unwrap();
    assert_eq!(c.listen.port(), 2222);
    assert_eq!(c.node_name, "from-file");
    assert_eq!(c.outbox_capacity, 5);
}

#[test]
fn unknown_key_is_named() {
    let f = file("listen = \"127.0.0.1:1\"\nlisten_addr = \"x\"\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(
        err.to_string().contains("unknown field `listen_addr`"),
        "{err}"
    );
}

#[test]
fn bad_value_is_named() {
    let f = file("outbox_capacity = 0\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid configuration: `outbox_capacity` must be at least 1"
    );
    let f = file("listen = \"not an address\"\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("listen"), "{err}");
}

#[test]
fn workers_and_rules_parse_with_units() {
    let f = file(
        r#"
sample_interval = "500ms"
on_residual_over_cap = "flag"
[[worker]]
name = "w1"
cgroup = "/sys/fs/cgroup/memory/w1"
soft_cap = "1GiB"
unhealthy_after = "90s"
recover_after = "2m"
pressure_limit = 0.25
[[worker]]
name = "dask"
process = "dask worker"
pressure_limit = 0.1
pressure_after = "20s"
predict = false
predict_horizon = "2m"
[[rule]]
worker = "w1"
cgroup = "/sys/fs/cgroup/memory/w1/job_*"
soft_cap = "512MiB"
"#,
    );
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    assert_eq!(c.sample_interval, Duration::from_millis(500));
    assert_eq!(c.watchdog.on_residual_over_cap, OnResidualOverCap::Flag);
    assert_eq!(c.workers.len(), 2);
    let w1 = &c.workers[0];
    assert_eq!(
        w1.source,
        MemorySource::Cgroup("/sys/fs/cgroup/memory/w1".into())
    );
    assert_eq!(w1.soft_cap, Some(1 << 30));
    assert_eq!(w1.unhealthy_after, Duration::from_secs(90));
    assert_eq!(w1.recover_after, Duration::from_secs(120));
    assert_eq!(
        c.workers[1].source,
        MemorySource::Process("dask worker".into())
    );
    assert_eq!(c.workers[1].unhealthy_after, DEFAULT_UNHEALTHY_AFTER);
    assert_eq!(
        w1.pressure,
        Some(PressureRule {
            limit_bp: 2500,
            after: Duration::from_secs(90)
        }),
        "pressure_after defaults to unhealthy_after"
    );
    assert_eq!(
        c.workers[1].pressure,
        Some(PressureRule {
            limit_bp: 1000,
            after: Duration::from_secs(20)
        })
    );
    assert_eq!(
        c.watchdog.predict.rule("w1"),
        PredictRule::default(),
        "the predictor is on by default, a minute ahead"
    );
    assert!(c.watchdog.predict.rule("w1").enabled);
    assert_eq!(
        c.watchdog.predict.rule("dask"),
        PredictRule {
            enabled: false,
            horizon: Duration::from_secs(120)
        }
    );
    assert!(c.rules[0].pattern.matches("/sys/fs/cgroup/memory/w1/job_7"));
    assert_eq!(c.rules[0].soft_cap, Some(512 << 20));
}

#[test]
fn worker_mistakes_are_named() {
    for (text, expected) in [
        (
            "[[worker]]\nname = \"a\"\n",
            "needs one of `cgroup`, `pid` or `process`",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\nprocess = \"x\"\n",
            "give only one of",
        ),
        (
            "[[worker]]\nname = \"a\"\ncgroup = \"rel\"\n",
            "must be an absolute path",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\n[[worker]]\nname = \"a\"\npid = 2\n",
            "`worker.name` `a` is declared twice",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\nsoft_cap = \"lots\"\n",
            "`lots` is not a size",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\nunhealthy_after = \"soon\"\n",
            "`soon` is not a duration",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\ncolour = 1\n",
            "unknown field `colour`",
        ),
        (
            "[[rule]]\nworker = \"b\"\ncgroup = \"/x/*\"\n",
            "`rule.worker` `b` is not a declared [[worker]]",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npressure_limit = 20\n",
            "`worker.pressure_limit` #1 (`a`): must be a fraction between 0 and 1",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npressure_limit = 0.0\n",
            "`worker.pressure_limit`",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npressure_limit = nan\n",
            "`worker.pressure_limit`",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npressure_after = \"30s\"\n",
            "`worker.pressure_after` #1 (`a`): needs `pressure_limit`",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npressure_limit = 0.2\npressure_after = \"later\"\n",
            "`later` is not a duration",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npredict_horizon = \"100ms\"\n",
            "`worker.predict_horizon` #1 (`a`): must be between 1s and 1h",
        ),
        (
            "[[worker]]\nname = \"a\"\npid = 1\npredict = \"yes\"\n",
            "predict",
        ),
    ] {
        let f = file(text);
        let err = Config::load(Some(f.path()), &Overrides::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
    }
}

#[test]
#[cfg(feature = "nats")]
fn delivery_keys_parse_with_defaults() {
    let f = file(
        "state_dir = \"/tmp/x\"\noutbox_max_age = \"2d\"\nheartbeat_interval = \"5s\"\n\
         [[webhook]]\nurl = \"http://127.0.0.1:1/hook\"\nsecret = \"s3\"\ntimeout = \"3s\"\n\
         [[webhook]]\nname = \"sched\"\nurl = \"https://sched.example/e\"\nbatch_size = 10\n\
         format = \"cloudevents\"\n\
         [[nats]]\nurl = \"nats://127.0.0.1:4222\"\n",
    );
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    assert_eq!(c.state_dir, Path::new("/tmp/x"));
    assert_eq!(c.outbox_max_age, Duration::from_secs(2 * 86400));
    assert_eq!(c.heartbeat_interval, Duration::from_secs(5));
    let hooks = webhooks(&c);
    assert_eq!(hooks[0].name, "webhook-1");
    assert_eq!(hooks[0].secret, Some(Secret("s3".into())));
    assert_eq!(hooks[0].delivery.timeout, Duration::from_secs(3));
    assert_eq!(hooks[0].format, WebhookFormat::Memwatch, "the default");
    assert_eq!(hooks[1].name, "sched");
    assert_eq!(hooks[1].format, WebhookFormat::CloudEvents);
    assert_eq!(hooks[1].delivery.batch_size, 10);
    let SinkConfig::Nats(nats) = &c.sinks[2] else {
        panic!("{:?}", c.sinks)
    };
    assert_eq!(nats.subject, "memwatch.events");
    assert_eq!(nats.stream, "MEMWATCH");
    assert!(!format!("{c:?}").contains("s3"), "secrets are not printed");

    // --webhook replaces the file's list; --state-dir wins.
    let flags = Overrides {
        state_dir: Some("/tmp/y".into()),
        webhooks: vec!["http://127.0.0.1:2/a".into()],
        ..Overrides::default()
    };
    let c = Config::load(Some(f.path()), &flags).unwrap();
    assert_eq!(c.state_dir, Path::new("/tmp/y"));
    let flagged = webhooks(&c);
    assert_eq!(flagged.len(), 1);
    assert_eq!(flagged[0].url.as_str(), "http://127.0.0.1:2/a");
    assert_eq!(c.sinks.len(), 2, "the [[nats]] stays");
}

#[test]
fn bad_delivery_values_are_named() {
    for (text, expected) in [
        (
            "heartbeat_interval = \"soon\"\n",
            "`heartbeat_interval` is not a duration",
        ),
        (
            "[[webhook]]\nurl = \"ftp://x\"\n",
            "`webhook[0].url` must be an http",
        ),
        (
            "[[webhook]]\nurl = \"http://x\"\nbatch_size = 0\n",
            "`webhook[0].batch_size`",
        ),
        (
            "[[webhook]]\nurl = \"http://x\"\ntimeout = \"0s\"\n",
            "`webhook[0].timeout`",
        ),
        (
            "[[webhook]]\nurl = \"http://x\"\nformat = \"cloudevent\"\n",
            "`webhook[0].format` is `cloudevent`: must be one of \"memwatch\", \"cloudevents\"",
        ),
        (
            "[[webhook]]\nurl = \"http://x\"\nsecret = \"whsec_%%%\"\n",
            "`webhook[0].secret` starts with `whsec_` but the rest is not base64",
        ),
        #[cfg(feature = "nats")]
        (
            "[[nats]]\nurl = \"n:1\"\nsubject = \"a.>\"\n",
            "`nats[0].subject`",
        ),
        #[cfg(feature = "nats")]
        (
            "[[webhook]]\nurl = \"http://x\"\nname = \"a\"\n[[nats]]\nurl = \"n\"\nname = \"a\"\n",
            "`name` of a sink must be unique",
        ),
    ] {
        let f = file(text);
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains(expected), "{text}: {err}");
    }
    let f = file("[[webhook]]\nurl = \"http://x\"\nretries = 3\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(err.to_string().contains("unknown field `retries`"), "{err}");
    let flags = Overrides {
        webhooks: vec!["not a url".into()],
        ..Overrides::default()
    };
    let err = Config::load(None, &flags).unwrap_err();
    assert!(err.to_string().contains("`--webhook`"), "{err}");
}

#[test]
fn missing_file_says_which() {
    let err = Config::load(
        Some(Path::new("/nonexistent/memwatch.toml")),
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot read config file /nonexistent/memwatch.toml")
    );
}

#[test]
fn kubernetes_pod_tasks_go_to_the_host_or_the_named_worker() {
    let c = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(
        c.kubernetes.pod_worker(&c.workers).unwrap(),
        None,
        "off by default"
    );
    let f = file("[kubernetes]\npod_tasks = true\n");
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    assert_eq!(
        c.kubernetes.pod_worker(&c.workers).unwrap().as_deref(),
        Some("host")
    );
    let f = file(
        "[kubernetes]\npod_tasks = true\nworker = \"b\"\n\
         [[worker]]\nname = \"a\"\npid = 1\n[[worker]]\nname = \"b\"\npid = 2\n",
    );
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    assert_eq!(
        c.kubernetes.pod_worker(&c.workers).unwrap().as_deref(),
        Some("b")
    );
    for (text, expected) in [
        (
            "[kubernetes]\npod_tasks = true\n[[worker]]\nname = \"a\"\npid = 1\n\
             [[worker]]\nname = \"b\"\npid = 2\n",
            "`kubernetes.worker` must name the worker",
        ),
        (
            "[kubernetes]\npod_tasks = true\nworker = \"zz\"\n",
            "`kubernetes.worker` `zz` is not a declared",
        ),
        #[cfg(feature = "kubernetes")]
        ("[kubernetes]\npods = true\n", "unknown field `pods`"),
    ] {
        let f = file(text);
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains(expected), "{text}: {err}");
    }
}

#[test]
#[cfg(feature = "kubernetes")]
fn kubernetes_api_is_one_sink_of_the_same_table() {
    let sink = |c: &Config| {
        c.sinks.iter().find_map(|s| match s {
            SinkConfig::Kubernetes(k) => Some(k.clone()),
            _ => None,
        })
    };
    let f = file("[kubernetes]\npod_tasks = true\n");
    assert!(sink(&Config::load(Some(f.path()), &Overrides::default()).unwrap()).is_none());
    let f = file("[kubernetes]\npod_tasks = true\napi = true\n");
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    assert!(c.kubernetes.pod_tasks);
    let k = sink(&c).expect("api = true starts the sink");
    assert_eq!(c.sinks[0].name(), "kubernetes");
    assert!(k.condition && k.events && k.pod_names && !k.taint, "{k:?}");
    assert_eq!(k.api_server, None, "in-cluster by default");
    assert_eq!(
        k.ca_file.as_deref(),
        Some(Path::new(crate::sinks::kubernetes::config::DEFAULT_CA_FILE))
    );
    let f = file(
        "[kubernetes]\napi = true\ntaint = true\nmin_remaining = 2\n\
         api_server = \"http://127.0.0.1:6443/\"\ntimeout = \"3s\"\n",
    );
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    let k = sink(&c).unwrap();
    assert!(k.taint);
    assert_eq!(k.guard.min_remaining, 2);
    assert_eq!(k.api_server.as_deref(), Some("http://127.0.0.1:6443"));
    assert_eq!(k.ca_file, None, "plain http to loopback has no CA");
    assert_eq!(k.delivery.timeout, std::time::Duration::from_secs(3));
    for (text, expected) in [
        (
            "[kubernetes]\ntaint = true\n",
            "`kubernetes.taint` needs `api = true`",
        ),
        (
            "[kubernetes]\ntimeout = \"1s\"\n",
            "`kubernetes.timeout` needs `api = true`",
        ),
        (
            "[kubernetes]\napi = true\napi_server = \"http://10.0.0.1\"\n",
            "`kubernetes.api_server` must be https://",
        ),
        (
            "[kubernetes]\napi = true\nmin_remaining_fraction = 2.0\n",
            "`kubernetes.min_remaining_fraction` must be between 0 and 1",
        ),
        (
            "[kubernetes]\napi = true\ntimeout = \"0s\"\n",
            "`kubernetes.timeout` must be more than 0",
        ),
        (
            "[kubernetes]\napi = true\ntaints = true\n",
            "unknown field `taints`",
        ),
        ("kubernetes = 1\n", "`kubernetes` must be a table"),
    ] {
        let f = file(text);
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(err.to_string().contains(expected), "{text}: {err}");
    }
}

#[cfg(feature = "nats")]
fn webhooks(c: &Config) -> Vec<&WebhookConfig> {
    c.sinks
        .iter()
        .filter_map(|s| match s {
            SinkConfig::Webhook(w) => Some(w),
            _ => None,
        })
        .collect()
}

#[test]
fn listening_beyond_loopback_needs_a_token() {
    let f = file("listen = \"0.0.0.0:9750\"\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("`listen` is 0.0.0.0:9750, beyond loopback"),
        "{err}"
    );
    let f = file("listen = \"[::]:9750\"\napi_token = \"t\"\n");
    Config::load(Some(f.path()), &Overrides::default()).unwrap();
    // The flag's file wins over the config file's token.
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("token");
    private(&token, "from-the-file\n");
    let f = file("listen = \"0.0.0.0:9750\"\n");
    let flags = Overrides {
        api_token_file: Some(token),
        ..Overrides::default()
    };
    let c = Config::load(Some(f.path()), &flags).unwrap();
    assert_eq!(c.api_token.as_deref(), Some("from-the-file"));
}

/// A directory with one file per `(name, text)`.
fn token_files(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        private(&dir.path().join(name), text);
    }
    dir
}

/// A token file as it must be: mode 0600, the test's own.
fn private(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o600)).unwrap();
}

/// A token file others may read is refused at start, naming the key, the
/// file and its mode; nothing is read from it.
#[test]
fn a_token_file_open_to_others_is_refused_naming_key_file_and_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = token_files(&[("token", "s3cret\n")]);
    let path = dir.path().join("token");
    for key in ["api_token_file", "task_token_file", "read_token_file"] {
        for mode in [0o644, 0o640, 0o604] {
            fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
            let f = file(&format!("{key} = \"{}\"\n", path.display()));
            let text = Config::load(Some(f.path()), &Overrides::default())
                .unwrap_err()
                .to_string();
            assert!(text.contains(&format!("`{key}` ")), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(text.contains(&format!("mode {mode:04o}")), "{text}");
            assert!(!text.contains("s3cret"), "never the token: {text}");
        }
    }
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let flags = Overrides {
        api_token_file: Some(path.clone()),
        ..Overrides::default()
    };
    let c = Config::load(None, &flags).unwrap();
    assert_eq!(c.api_token.as_deref(), Some("s3cret"));
}

#[test]
fn each_scope_has_its_token_file_and_the_flags_win() {
    let dir = token_files(&[
        ("admin", "a-token\n"),
        ("task", "  t-token\n"),
        ("read", "r-token"),
        ("task2", "t-flag\n"),
        ("read2", "r-flag\n"),
    ]);
    let path = |name: &str| dir.path().join(name).display().to_string();
    let f = file(&format!(
        "api_token_file = \"{}\"\ntask_token_file = \"{}\"\nread_token_file = \"{}\"\n\
         socket = \"/tmp/memwatch-test/api.sock\"\n",
        path("admin"),
        path("task"),
        path("read")
    ));
    let c = Config::load(Some(f.path()), &Overrides::default()).unwrap();
    assert_eq!(c.api_token.as_deref(), Some("a-token"));
    assert_eq!(c.task_token.as_deref(), Some("t-token"));
    assert_eq!(c.read_token.as_deref(), Some("r-token"));
    assert_eq!(c.socket, Some(PathBuf::from("/tmp/memwatch-test/api.sock")));

    let flags = Overrides {
        task_token_file: Some(dir.path().join("task2")),
        read_token_file: Some(dir.path().join("read2")),
        socket: Some("/tmp/other.sock".into()),
        ..Overrides::default()
    };
    let c = Config::load(Some(f.path()), &flags).unwrap();
    assert_eq!(c.task_token.as_deref(), Some("t-flag"));
    assert_eq!(c.read_token.as_deref(), Some("r-flag"));
    assert_eq!(c.socket, Some(PathBuf::from("/tmp/other.sock")));
}

#[test]
fn the_socket_is_on_by_default_and_an_empty_path_turns_it_off() {
    let c = Config::load(None, &Overrides::default()).unwrap();
    assert_eq!(c.socket, Some(PathBuf::from(DEFAULT_SOCKET)));
    let f = file("socket = \"\"\n");
    assert_eq!(
        Config::load(Some(f.path()), &Overrides::default())
            .unwrap()
            .socket,
        None
    );
    let f = file("socket = \"relative.sock\"\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("`socket` must be an absolute path"),
        "{err}"
    );
}

#[test]
fn an_empty_or_missing_token_file_is_an_error_naming_its_key() {
    let dir = token_files(&[("empty", " \n")]);
    let empty = dir.path().join("empty");
    let missing = dir.path().join("missing");
    for key in ["api_token_file", "task_token_file", "read_token_file"] {
        for (path, problem) in [(&empty, "is empty"), (&missing, "cannot be read")] {
            let f = file(&format!("{key} = \"{}\"\n", path.display()));
            let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
            let text = err.to_string();
            assert!(text.contains(&format!("`{key}` ")), "{key}: {text}");
            assert!(text.contains(problem), "{key}: {text}");
        }
    }
    // The same from the flags.
    let flags = Overrides {
        task_token_file: Some(empty.clone()),
        ..Overrides::default()
    };
    let err = Config::load(None, &flags).unwrap_err();
    assert!(err.to_string().contains("`task_token_file` "), "{err}");
    let f = file("api_token = \"\"\n");
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(
        err.to_string().contains("`api_token` must not be empty"),
        "{err}"
    );
}

#[test]
fn one_token_for_two_scopes_is_refused() {
    let dir = token_files(&[("same", "s3cret\n")]);
    let f = file(&format!(
        "api_token = \"s3cret\"\nread_token_file = \"{}\"\n",
        dir.path().join("same").display()
    ));
    let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("`read_token_file` holds the same token as `api_token`"),
        "{err}"
    );
}

#[test]
fn any_scope_s_token_allows_listening_beyond_loopback() {
    let dir = token_files(&[("t", "t0ken\n")]);
    for key in ["task_token_file", "read_token_file"] {
        let f = file(&format!(
            "listen = \"0.0.0.0:9750\"\n{key} = \"{}\"\n",
            dir.path().join("t").display()
        ));
        Config::load(Some(f.path()), &Overrides::default()).unwrap();
    }
}

#[test]
fn a_sink_left_out_of_the_build_is_refused_by_name() {
    let table: toml::Table =
        toml::from_str("[[otlp]]\nname = \"o\"\nendpoint = \"http://127.0.0.1:4318\"\n").unwrap();
    let err = refuse_left_out(&table, &[("otlp", "otlp")]).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("otlp"), "{text}");
    assert!(
        text.contains("built without its `otlp` sink") && text.contains("--features otlp"),
        "{text}"
    );
    refuse_left_out(&table, &[]).unwrap();
    // This build's own list: the default build leaves nothing out.
    #[cfg(all(feature = "otlp", feature = "nats"))]
    assert!(crate::sinks::LEFT_OUT.is_empty());
    #[cfg(not(feature = "nats"))]
    {
        let f = file("[[nats]]\nurl = \"nats://127.0.0.1:4222\"\n");
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().contains("built without its `nats` sink"),
            "{err}"
        );
    }
    // `[kubernetes]` is one table: its pod-task keys are read whatever the
    // build, the sink's keys are refused by name without the sink.
    #[cfg(not(feature = "kubernetes"))]
    {
        let f = file("[kubernetes]\npod_tasks = true\n");
        Config::load(Some(f.path()), &Overrides::default()).unwrap();
        let f = file("[kubernetes]\npod_tasks = true\napi = true\n");
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(
            err.to_string()
                .contains("built without its `kubernetes` sink"),
            "{err}"
        );
    }
    #[cfg(not(feature = "otlp"))]
    {
        let f = file("[[otlp]]\nname = \"o\"\nendpoint = \"http://127.0.0.1:4318\"\n");
        let err = Config::load(Some(f.path()), &Overrides::default()).unwrap_err();
        assert!(
            err.to_string().contains("built without its `otlp` sink"),
            "{err}"
        );
    }
}
