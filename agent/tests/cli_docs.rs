//! The completions and man pages `cargo xtask dist` ships
//! (agent/examples/cli_docs.rs): every file is written and knows `memwatch
//! run` and its flags.

#[path = "../examples/cli_docs.rs"]
#[allow(dead_code)] // its `main` is the example's
mod cli_docs;

#[test]
fn completions_and_man_pages_are_written_and_name_memwatch_run() {
    let dir = tempfile::tempdir().unwrap();
    let files = cli_docs::write(dir.path()).unwrap();
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(dir.path()).unwrap().display().to_string())
        .collect();
    for expected in [
        "completions/memwatch.bash",
        "completions/_memwatch",
        "completions/memwatch.fish",
        "man/memwatch.1",
        "man/memwatch-run.1",
        "man/memwatch-status.1",
        "man/memwatch-events.1",
        "man/memwatch-doctor.1",
        "man/memwatch-exec.1",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} in {names:?}"
        );
    }
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    // Completions offer `run` and its flags, the new ones too.
    for name in [
        "completions/memwatch.bash",
        "completions/_memwatch",
        "completions/memwatch.fish",
    ] {
        let text = read(name);
        for word in ["run", "state-dir", "log-format"] {
            assert!(text.contains(word), "{name} lacks {word}");
        }
    }
    // roff escapes '-' as '\-'.
    let page = read("man/memwatch.1").replace("\\-", "-");
    assert!(
        page.contains("memwatch-run(1)") || page.contains("memwatch run"),
        "{page}"
    );
    let run = read("man/memwatch-run.1").replace("\\-", "-");
    assert!(
        run.contains("memwatch run") || run.contains("memwatch-run"),
        "{run}"
    );
    assert!(run.contains("--log-format"), "{run}");
    let status = read("man/memwatch-status.1");
    assert!(status.contains("degraded or unhealthy"), "{status}");
    // The hidden test-only flags stay hidden.
    assert!(!run.contains("probe-floor"), "{run}");
}
