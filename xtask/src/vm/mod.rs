//! `cargo xtask vm-test`: the kernel tests on other kernels and on pure
//! cgroup v2, each kernel booted in QEMU with a small initramfs, plus this
//! host's own kernel (its tests run directly). Prints a summary per kernel,
//! writes docs/kernels.md from what ran, and fails when any kernel fails.
//!
//! Longer than 600 lines: one kernel run from image to summary (fetch,
//! initramfs, boot, parse the serial log); the pieces that stand alone are
//! already apart (kernel.rs: the Debian kernel package; initramfs.rs).

use std::{
    fs,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use memwatch_test_support::process::wait_timeout;

use crate::{kernels_doc, shell};

mod initramfs;
mod kernel;

use initramfs::{BOOTED, DOCTOR_BEGIN, DOCTOR_END, EXIT, TEST_END};
use kernel::Registry;

/// The kernel matrix's test binary of the memwatch-tests crate
/// (`tests/kernels.rs`: doctor, oom, predict, pressure, watchdog).
pub(crate) const KERNEL_TESTS: [&str; 1] = ["kernels"];
/// Workspace binaries the tests run.
const BINARIES: [&str; 2] = ["memwatch", "memhog"];

/// What one kernel's run gave.
#[derive(Default)]
pub(crate) struct Outcome {
    /// What `--kernel` said (`6.1`, `host`).
    pub spec: String,
    /// The Debian package booted (`host` for this machine).
    pub package: String,
    /// `uname -r` where the tests ran.
    pub release: String,
    /// Serial console until the init script's first line (or host: none).
    pub boot: Option<Duration>,
    pub tests: Duration,
    pub passed: u32,
    pub failed: u32,
    pub ignored: u32,
    /// The init script's exit line (`None`: it never came).
    pub exit: Option<i32>,
    /// `memwatch doctor --json` where the tests ran.
    pub doctor: Option<serde_json::Value>,
    /// Why the run is not a pass beyond failed tests (timeout, no exit line).
    pub problem: Option<String>,
    /// The failed tests' names and panic messages, repeated at the end of the
    /// run so that a log's tail says what failed.
    pub failures: Vec<String>,
}

impl Outcome {
    pub(crate) fn ok(&self) -> bool {
        self.exit == Some(0) && self.failed == 0 && self.passed > 0 && self.problem.is_none()
    }
}

pub(crate) struct Options {
    pub kernels: Vec<String>,
    /// Per kernel: boot and every test.
    pub timeout: Duration,
    /// Write docs/kernels.md from this run.
    pub write_docs: bool,
    /// Runs of the test binaries per kernel.
    pub repeat: u32,
    /// Passed to each test binary (a name filter, …).
    pub test_args: Vec<String>,
    /// The test executables `cargo xtask test` built before its run; `None`:
    /// build them. (Built again after that run, they were relinked: the
    /// upgrade test's old build shares the build directory.)
    pub built: Option<Vec<(String, PathBuf)>>,
}

pub(crate) fn run(options: &Options) -> anyhow::Result<()> {
    if !shell::is_root() {
        bail!("vm-test needs root (KVM, and the host kernel tests)");
    }
    let started = Instant::now();
    let root = shell::workspace_root();
    let vm_dir = root.join("target/vm");
    fs::create_dir_all(&vm_dir)?;
    ensure_tools()?;

    let kernels: Vec<String> = if options.kernels.is_empty() {
        kernel::DEFAULT_MATRIX.map(String::from).to_vec()
    } else {
        options.kernels.clone()
    };
    let (binaries, tests) = build(options.built.clone())?;
    let memwatch = binaries[0].clone();
    let workdir = root.join("tests");

    let needs_vm = kernels.iter().any(|k| k != "host");
    let accel = Accel::detect();
    let (registry, initramfs) = if needs_vm {
        let contents = initramfs::Contents {
            binaries: &binaries,
            tests: &tests,
            workdir: &workdir,
            memwatch: &memwatch,
            time_scale: accel.time_scale(),
            repeat: options.repeat,
            test_args: &options.test_args,
            command: None,
        };
        let cpio = initramfs::build(&vm_dir, &contents)?;
        eprintln!(
            "xtask: vm-test: initramfs {} ({} MiB)",
            cpio.display(),
            fs::metadata(&cpio)?.len() >> 20
        );
        (Some(Registry::open(&vm_dir)?), Some(cpio))
    } else {
        (None, None)
    };

    // The kernels are fetched one after another (one apt state), then every
    // VM boots at once: under TCG each guest runs on one host thread, so on
    // the 2-core build machines two VMs take about as long as one. The host
    // run comes after them, alone, as the tests expect.
    let mut vms = Vec::new();
    let mut outcomes: Vec<Option<Outcome>> = Vec::new();
    for spec in &kernels {
        if spec == "host" {
            outcomes.push(None);
            continue;
        }
        let registry = registry.as_ref().expect("opened when a VM is needed");
        match registry.fetch(spec) {
            Ok(kernel) => {
                vms.push((outcomes.len(), spec.clone(), kernel));
                outcomes.push(None);
            }
            Err(e) => outcomes.push(Some(Outcome {
                spec: spec.clone(),
                problem: Some(format!("{e:#}")),
                ..Outcome::default()
            })),
        }
    }
    let how = Boot {
        initramfs: initramfs.as_deref(),
        accel,
        timeout: options.timeout,
        vm_dir: &vm_dir,
        memory: "2G",
        console: Echo::Stdout,
    };
    let booted = boot_all(&vms, &how)?;
    for (at, outcome) in booted {
        outcomes[at] = Some(outcome);
    }
    let outcomes: Vec<Outcome> = outcomes
        .into_iter()
        .map(|outcome| outcome.unwrap_or_else(|| on_host(&tests, &workdir, &memwatch, options)))
        .inspect(|outcome| {
            eprintln!(
                "xtask: vm-test: {}: {}",
                outcome.spec,
                if outcome.ok() { "ok" } else { "FAILED" }
            );
        })
        .collect();

    finish(&outcomes, accel, options, started)
}

/// Prints the summary, writes docs/kernels.md when asked, and fails
/// naming every kernel whose run failed, with its failures.
fn finish(
    outcomes: &[Outcome],
    accel: Accel,
    options: &Options,
    started: Instant,
) -> anyhow::Result<()> {
    print!("{}", summary(outcomes, accel));
    if options.write_docs {
        let doc = shell::workspace_root().join("docs/kernels.md");
        fs::write(&doc, kernels_doc::render(outcomes, accel.name()))?;
        eprintln!("xtask: vm-test: wrote {}", doc.display());
    }
    eprintln!(
        "xtask: vm-test done in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok())
        .map(|o| o.spec.as_str())
        .collect();
    if !failed.is_empty() {
        for o in outcomes.iter().filter(|o| !o.ok()) {
            eprintln!("xtask: vm-test: {} failed:", o.spec);
            for line in &o.failures {
                eprintln!("  {line}");
            }
            if let Some(problem) = &o.problem {
                eprintln!("  {problem}");
            }
        }
        bail!("the kernel tests failed on: {}", failed.join(", "));
    }
    Ok(())
}

/// A console line from its first `MEMWATCH-` marker on: the firmware's
/// terminal resets can share a line with the init script's first words.
pub(crate) fn marker_line(raw: &str) -> &str {
    raw.find("MEMWATCH-").map_or(raw, |i| &raw[i..])
}

/// QEMU and the initramfs tools, installed when missing.
fn ensure_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = [
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("busybox", "busybox-static"),
        ("cpio", "cpio"),
        ("dpkg-deb", "dpkg"),
    ]
    .into_iter()
    .filter(|(program, _)| shell::output("which", &[program]).is_none())
    .map(|(_, package)| package)
    .collect();
    // busybox may be the dynamic build: the initramfs needs the static one.
    let static_busybox = shell::output("ldd", &["/bin/busybox"]).is_none();
    let mut packages = missing;
    if !static_busybox && !packages.contains(&"busybox-static") {
        packages.push("busybox-static");
    }
    if packages.is_empty() {
        return Ok(());
    }
    let mut args = vec!["install", "-y", "--no-install-recommends"];
    args.extend(&packages);
    shell::run("apt-get", &args)
}

/// The binaries and the kernel test executables: the debug builds that
/// `cargo xtask test` has just made and run on the host (its dependencies
/// are optimized, `[profile.dev.package."*"]`), so the matrix adds no build
/// of its own.
fn build(built: Option<Vec<(String, PathBuf)>>) -> anyhow::Result<(Vec<PathBuf>, Vec<PathBuf>)> {
    let built = match built {
        Some(built) => built,
        None => shell::build_tests()?,
    };
    let mut tests: Vec<(String, PathBuf)> = built
        .into_iter()
        .filter(|(name, _)| KERNEL_TESTS.contains(&name.as_str()))
        .collect();
    let debug = shell::workspace_root().join("target/debug");
    let binaries: Vec<PathBuf> = BINARIES.iter().map(|b| debug.join(b)).collect();
    tests.sort();
    if tests.len() != KERNEL_TESTS.len() {
        bail!(
            "expected {} kernel test executables, cargo gave {tests:?}",
            KERNEL_TESTS.len()
        );
    }
    Ok((binaries, tests.into_iter().map(|(_, exe)| exe).collect()))
}

#[derive(Clone, Copy)]
pub(crate) enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    fn detect() -> Accel {
        let kvm = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        if !kvm {
            eprintln!(
                "xtask: vm-test: /dev/kvm is missing or not usable: falling back to TCG \
                 (software emulation, several times slower; timeouts are scaled up)"
            );
            return Accel::Tcg;
        }
        // PVM (kvm_pvm, a nested KVM without hardware virtualisation) runs
        // only guest kernels built for it; a stock kernel hangs before its
        // first line, or QEMU aborts setting an MSR with `-cpu host`.
        if Path::new("/sys/module/kvm_pvm").exists() {
            eprintln!(
                "xtask: vm-test: /dev/kvm is PVM here (kvm_pvm loaded), which boots only \
                 PVM-enabled guest kernels, not Debian's: falling back to TCG (software \
                 emulation, several times slower; timeouts are scaled up)"
            );
            return Accel::Tcg;
        }
        Accel::Kvm
    }

    /// How much slower than hardware the agent runs in the VM: the tests'
    /// latency bounds (tens of milliseconds) are multiplied by it.
    fn time_scale(self) -> u32 {
        match self {
            Accel::Kvm => 1,
            Accel::Tcg => 4,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        }
    }

    fn args(self) -> [&'static str; 4] {
        match self {
            Accel::Kvm => ["-enable-kvm", "-cpu", "host", ""],
            // One host thread runs both vCPUs: with a thread each (MTTCG) a
            // vCPU can run a stale translation of kernel text another vCPU
            // just patched (a tracepoint being enabled) and oops on int3.
            Accel::Tcg => ["-accel", "tcg,thread=single", "-cpu", "max"],
        }
    }
}

/// How the VMs of a run boot.
#[derive(Clone, Copy)]
struct Boot<'a> {
    initramfs: Option<&'a Path>,
    accel: Accel,
    /// Per kernel, before the TCG scaling.
    timeout: Duration,
    /// Where each kernel's console log goes (`<spec>.log`).
    vm_dir: &'a Path,
    /// QEMU's `-m`.
    memory: &'a str,
    console: Echo,
}

/// Where the console's lines are echoed as they come.
#[derive(Clone, Copy)]
enum Echo {
    Stdout,
    Stderr,
}

/// Boots every `(index, spec, kernel)` at once: under TCG each guest runs
/// on one host thread, so on the 2-core build machines two VMs take about
/// as long as one.
fn boot_all(
    vms: &[(usize, String, kernel::Kernel)],
    how: &Boot<'_>,
) -> anyhow::Result<Vec<(usize, Outcome)>> {
    thread::scope(|scope| {
        let running: Vec<_> = vms
            .iter()
            .map(|(at, spec, kernel)| {
                scope.spawn(move || boot(spec, kernel, how).map(|o| (*at, o)))
            })
            .collect();
        running
            .into_iter()
            .map(|vm| {
                vm.join()
                    .map_err(|_| anyhow::anyhow!("a VM's thread panicked"))?
            })
            .collect()
    })
}

/// Boots each of `kernels` (Debian lines or versions, as `--kernel`
/// takes them) in QEMU, all at once, with an initramfs of `binaries` whose
/// init runs the shell line `command` instead of the kernel tests, with
/// `memory` (QEMU's `-m`) and at most `timeout` each (scaled under TCG).
/// The console is echoed to stderr; returns each kernel's outcome and the
/// lines of its console log.
pub(crate) fn run_command(
    kernels: &[&str],
    binaries: &[PathBuf],
    command: &str,
    dir: &Path,
    memory: &str,
    timeout: Duration,
) -> anyhow::Result<Vec<(Outcome, Vec<String>)>> {
    if !shell::is_root() {
        bail!("booting a VM needs root");
    }
    ensure_tools()?;
    fs::create_dir_all(dir)?;
    let root = shell::workspace_root();
    let accel = Accel::detect();
    let contents = initramfs::Contents {
        binaries,
        tests: &[],
        workdir: &root,
        memwatch: binaries.first().context("the agent's binary comes first")?,
        time_scale: accel.time_scale(),
        repeat: 1,
        test_args: &[],
        command: Some(command),
    };
    let cpio = initramfs::build(dir, &contents)?;
    let registry = Registry::open(&root.join("target/vm"))?;
    let mut vms = Vec::new();
    for (at, spec) in kernels.iter().enumerate() {
        vms.push((at, spec.to_string(), registry.fetch(spec)?));
    }
    let how = Boot {
        initramfs: Some(&cpio),
        accel,
        timeout,
        vm_dir: dir,
        memory,
        console: Echo::Stderr,
    };
    let mut booted = boot_all(&vms, &how)?;
    booted.sort_by_key(|(at, _)| *at);
    booted
        .into_iter()
        .map(|(_, outcome)| {
            let log = dir.join(format!("{}.log", outcome.spec));
            let text =
                fs::read_to_string(&log).with_context(|| format!("read {}", log.display()))?;
            Ok((outcome, text.lines().map(String::from).collect()))
        })
        .collect()
}

/// Boots `kernel` with the initramfs and follows its serial console until
/// the exit line, the VM's end, or `timeout`.
// Long: QEMU's command, its two output readers and the console loop share
// the child and the deadline; could be split into named steps later.
fn boot(spec: &str, kernel: &kernel::Kernel, how: &Boot<'_>) -> anyhow::Result<Outcome> {
    let Boot {
        initramfs,
        accel,
        timeout,
        vm_dir,
        memory,
        console: echo,
    } = *how;
    let initramfs = initramfs.context("an initramfs is built when a VM is needed")?;
    let timeout = match accel {
        Accel::Kvm => timeout,
        Accel::Tcg => timeout * 4,
    };
    let log_path = vm_dir.join(format!("{spec}.log"));
    eprintln!(
        "xtask: vm-test: booting {} ({}), console log in {}",
        kernel.package,
        accel.name(),
        log_path.display()
    );
    let mut log = fs::File::create(&log_path)?;
    let mut qemu = Command::new("qemu-system-x86_64");
    qemu.args(accel.args().iter().filter(|a| !a.is_empty()));
    qemu.args(["-m", memory, "-smp", "2", "-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args([
            "-append",
            // psi=1: Debian builds PSI in but off by default
            // (CONFIG_PSI_DEFAULT_DISABLED); the pressure tests need it.
            "console=ttyS0 panic=-1 loglevel=4 cgroup_no_v1=all psi=1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let started = Instant::now();
    let mut child = qemu.spawn().context("cannot start qemu-system-x86_64")?;
    let (tx, rx) = mpsc::channel::<String>();
    for stream in [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    ]
    .into_iter()
    .flatten()
    {
        let tx = tx.clone();
        thread::spawn(move || {
            for line in BufReader::new(stream).split(b'\n').map_while(Result::ok) {
                let line = String::from_utf8_lossy(&line)
                    .trim_end_matches('\r')
                    .to_string();
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
    }
    drop(tx);

    let mut outcome = Outcome {
        spec: spec.to_string(),
        package: kernel.package.clone(),
        ..Outcome::default()
    };
    let mut console = Console::default();
    let deadline = started + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(raw) => {
                use std::io::Write as _;
                let _ = writeln!(log, "{raw}");
                match echo {
                    Echo::Stdout => println!("[{spec}] {raw}"),
                    Echo::Stderr => eprintln!("[{spec}] {raw}"),
                }
                let line = marker_line(&raw);
                if line.starts_with(BOOTED) && outcome.boot.is_none() {
                    outcome.boot = Some(started.elapsed());
                    outcome.release = field(line, "kernel=").unwrap_or_default();
                }
                console.take(line);
                if console.exit.is_some() {
                    // The VM powers off by itself; give it a moment, no more.
                    let _ = wait_timeout(&mut child, Duration::from_secs(10));
                    break;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                outcome.problem = Some(format!("timed out after {}s", timeout.as_secs()));
                break;
            }
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let booted = outcome.boot.unwrap_or_default();
    outcome.tests = started.elapsed().saturating_sub(booted);
    console.fill(&mut outcome);
    if outcome.boot.is_none() && outcome.problem.is_none() {
        outcome.problem = Some(format!("never booted (see {})", log_path.display()));
    }
    if outcome.exit.is_none() && outcome.problem.is_none() {
        outcome.problem = Some(format!("no exit line (see {})", log_path.display()));
    }
    Ok(outcome)
}

/// The same kernel tests, run directly on this host (its cgroups as they are).
fn on_host(tests: &[PathBuf], workdir: &Path, memwatch: &Path, options: &Options) -> Outcome {
    let mut outcome = Outcome {
        spec: "host".into(),
        package: "host".into(),
        release: fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        ..Outcome::default()
    };
    let mut console = Console::default();
    if let Ok(out) = Command::new(memwatch).args(["doctor", "--json"]).output() {
        console.take(DOCTOR_BEGIN);
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            console.take(line);
        }
        console.take(DOCTOR_END);
    }
    let started = Instant::now();
    let mut rc = 0;
    let runs = (0..options.repeat).flat_map(|_| tests.iter());
    for test in runs {
        let name = initramfs::test_name(test);
        eprintln!("xtask: vm-test: host: {name}");
        let out = Command::new(test)
            .arg("--show-output")
            .args(&options.test_args)
            .current_dir(workdir)
            .env("CI", "true")
            .stderr(Stdio::inherit())
            .output();
        let code = match out {
            Ok(out) => {
                for line in String::from_utf8_lossy(&out.stdout).lines() {
                    println!("[host] {line}");
                    console.take(line);
                }
                out.status.code().unwrap_or(-1)
            }
            Err(e) => {
                eprintln!("xtask: vm-test: cannot run {}: {e}", test.display());
                -1
            }
        };
        console.take(&format!("{TEST_END} {name} rc={code}"));
        if code != 0 {
            rc = 1;
        }
    }
    outcome.tests = started.elapsed();
    console.take(&format!("{EXIT}{rc}"));
    console.fill(&mut outcome);
    outcome
}

/// What the serial console (or the host's test output) said.
#[derive(Default)]
struct Console {
    passed: u32,
    failed: u32,
    ignored: u32,
    exit: Option<i32>,
    doctor: Option<String>,
    failed_binaries: Vec<String>,
    failures: Vec<String>,
    /// Lines of a panic message still to keep.
    panic_lines: usize,
}

/// At most this many lines of failures are kept per kernel.
const MAX_FAILURE_LINES: usize = 60;

impl Console {
    fn take(&mut self, line: &str) {
        self.keep_failure(line);
        // libtest: `test result: ok. 7 passed; 0 failed; 0 ignored; …`
        if let Some(rest) = line.strip_prefix("test result: ") {
            for part in rest.split([';', '.']) {
                let mut words = part.split_whitespace();
                if let (Some(n), Some(what)) = (words.next(), words.next())
                    && let Ok(n) = n.parse::<u32>()
                {
                    match what {
                        "passed" => self.passed += n,
                        "failed" => self.failed += n,
                        "ignored" => self.ignored += n,
                        _ => {}
                    }
                }
            }
        } else if let Some(code) = line.strip_prefix(EXIT) {
            self.exit = code.trim().parse().ok().or(Some(-1));
        } else if line == DOCTOR_BEGIN {
            self.doctor = Some(String::new());
        } else if line == DOCTOR_END {
            // Closed: later lines are not the doctor's.
            if let Some(doc) = self.doctor.take() {
                self.doctor = Some(format!("{doc}\u{0}"));
            }
        } else if let Some(doc) = self.doctor.as_mut().filter(|d| !d.ends_with('\u{0}')) {
            doc.push_str(line);
            doc.push('\n');
        } else if let Some(rest) = line.strip_prefix(TEST_END)
            && !rest.trim_end().ends_with("rc=0")
        {
            self.failed_binaries.push(rest.trim().to_string());
        }
    }

    /// Keeps `test … FAILED` lines and panic messages (the panic line and
    /// the few after it, which hold the assertion's message).
    fn keep_failure(&mut self, line: &str) {
        let keep = if line.starts_with("test ") && line.ends_with("FAILED") {
            true
        } else if line.contains("panicked at") {
            self.panic_lines = 4;
            true
        } else if self.panic_lines > 0 {
            // The message ends at a blank line, a note or a backtrace.
            let ended = line.trim().is_empty()
                || line.starts_with("note: ")
                || line.starts_with("stack backtrace:");
            self.panic_lines = if ended { 0 } else { self.panic_lines - 1 };
            !ended
        } else {
            false
        };
        if keep && self.failures.len() < MAX_FAILURE_LINES {
            self.failures.push(line.to_string());
        }
    }

    fn fill(self, outcome: &mut Outcome) {
        outcome.failures = self.failures;
        outcome.passed = self.passed;
        outcome.failed = self.failed;
        outcome.ignored = self.ignored;
        outcome.exit = self.exit;
        outcome.doctor = self
            .doctor
            .and_then(|d| serde_json::from_str(d.trim_end_matches('\u{0}')).ok());
        if !self.failed_binaries.is_empty() && outcome.problem.is_none() && self.failed == 0 {
            outcome.problem = Some(format!(
                "exited non-zero: {}",
                self.failed_binaries.join(", ")
            ));
        }
    }
}

fn field(line: &str, key: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key))
        .map(str::to_string)
}

fn summary(outcomes: &[Outcome], accel: Accel) -> String {
    let mut out = format!(
        "\n{:<8} {:<44} {:<26} {:>7} {:>7} {:>6} {:>6} {:>7}  result\n",
        "kernel", "package", "release", "boot s", "test s", "pass", "fail", "ignored"
    );
    for o in outcomes {
        let boot = o
            .boot
            .map_or_else(|| "-".to_string(), |b| format!("{:.1}", b.as_secs_f64()));
        let result = match (&o.problem, o.ok()) {
            (_, true) => "ok".to_string(),
            (Some(p), false) => format!("FAIL: {p}"),
            (None, false) => "FAIL".to_string(),
        };
        out.push_str(&format!(
            "{:<8} {:<44} {:<26} {:>7} {:>7.1} {:>6} {:>6} {:>7}  {result}\n",
            o.spec,
            o.package,
            o.release,
            boot,
            o.tests.as_secs_f64(),
            o.passed,
            o.failed,
            o.ignored,
        ));
    }
    out.push_str(&format!("(VMs: {}, 2 vCPUs, 2 GiB)\n", accel.name()));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_give_counts_exit_and_doctor() {
        let mut console = Console::default();
        for line in [
            "test result: ok. 7 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 3.1s",
            DOCTOR_BEGIN,
            "{\"rows\": []}",
            DOCTOR_END,
            "test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out",
            "MEMWATCH-VM-TEST-END kernels rc=101",
            "MEMWATCH-VM-EXIT=1",
        ] {
            console.take(line);
        }
        let mut outcome = Outcome::default();
        console.fill(&mut outcome);
        assert_eq!((outcome.passed, outcome.failed, outcome.ignored), (9, 1, 1));
        assert_eq!(outcome.exit, Some(1));
        assert_eq!(outcome.doctor, Some(serde_json::json!({"rows": []})));
        assert!(!outcome.ok());
    }

    #[test]
    fn failed_tests_and_their_panics_are_kept_for_the_summary() {
        let mut console = Console::default();
        for line in [
            "test fine ... ok",
            "test worker_stuck ... FAILED",
            "---- worker_stuck stdout ----",
            "thread 'worker_stuck' panicked at tests/kernel/watchdog.rs:10:5:",
            "gap 247 ms, bound 200 ms",
            "note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace",
            "",
            "unrelated line",
        ] {
            console.take(line);
        }
        assert_eq!(
            console.failures,
            [
                "test worker_stuck ... FAILED",
                "thread 'worker_stuck' panicked at tests/kernel/watchdog.rs:10:5:",
                "gap 247 ms, bound 200 ms",
            ]
        );
    }
}
