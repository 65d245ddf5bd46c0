//! Start-up data does not outlive attach. The agent runs in this process
//! (the library's `dispatch`, as `main` calls it) with its eBPF probe; once
//! `/ready` answers 200 the kernel's BTF was parsed here and no parsed copy
//! is alive: keeping one (tens of MiB of heap) fails this test. Root only;
//! never skipped in CI.

use std::{
    process::ExitCode,
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use clap::Parser as _;
use memwatch::{Cli, dispatch, parsed_btf};
use memwatch_test_support::http::{free_port, http_get, status_code};
use memwatch_tests::kernel_tests_enabled;

/// How long the agent may take to load and attach its probe.
const READY_WITHIN: Duration = Duration::from_secs(120);
/// How long it may take to stop after SIGTERM (its grace is 5 s).
const STOPPED_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn no_parsed_btf_is_alive_once_the_probe_is_attached() {
    if !kernel_tests_enabled("no_parsed_btf_is_alive_once_the_probe_is_attached") {
        return;
    }
    let state = tempfile::tempdir().expect("a state directory");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let socket = state.path().join("api.sock");
    let cli = Cli::try_parse_from([
        "memwatch".as_ref(),
        "run".as_ref(),
        "--listen".as_ref(),
        listen.as_ref(),
        "--state-dir".as_ref(),
        state.path().as_os_str(),
        "--socket".as_ref(),
        socket.as_os_str(),
    ])
    .expect("memwatch run's command line");
    let (done_tx, done) = mpsc::channel::<ExitCode>();
    let agent = thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let _ = done_tx.send(runtime.block_on(dispatch(cli)));
    });

    let deadline = Instant::now() + READY_WITHIN;
    loop {
        if let Ok(code) = done.try_recv() {
            panic!("the agent stopped before it was ready: {code:?}");
        }
        if http_get(port, "/ready").is_ok_and(|a| status_code(&a) == Some(200)) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not ready after {READY_WITHIN:?}"
        );
        thread::sleep(Duration::from_millis(50));
    }
    let status = http_get(port, "/v1/status").expect("/v1/status");
    let parsed = parsed_btf();

    // Stop it before asserting, so a failure leaves no agent behind.
    // SAFETY: a signal to this process, whose SIGTERM the agent handles.
    unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    let stopped = done.recv_timeout(STOPPED_WITHIN);
    assert!(
        stopped.is_ok(),
        "the agent did not stop within {STOPPED_WITHIN:?}"
    );
    agent.join().expect("the agent's thread");

    assert!(
        status.contains("\"ebpf\""),
        "the eBPF source ran (else nothing parsed BTF): {status}"
    );
    assert!(
        parsed.made >= 2,
        "the kernel's BTF was parsed in this process (offsets and tp_btf attach): {parsed:?}"
    );
    assert_eq!(
        parsed.alive, 0,
        "a parsed kernel BTF outlived attach: {parsed:?}"
    );
}
