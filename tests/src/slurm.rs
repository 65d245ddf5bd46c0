//! A real one-host Slurm cluster: munged, slurmctld and two slurmd (`-N n1`,
//! `-N n2`) on 127.0.0.1, every file under a temp dir. Installed from
//! Debian when missing (as root; the machine's policy-rc.d keeps the
//! packaged services down, so the daemons are started here by hand).
//! Every daemon is killed on drop.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memwatch_test_support::http::free_port;

use crate::process::{Guarded, apt_install, root_or_skip, run_bounded};

const PACKAGES: [&str; 4] = ["slurmctld", "slurmd", "slurm-client", "munge"];
/// How long the cluster may take to have both nodes idle.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Time for one Slurm command.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(20);

/// Whether Slurm is here, installing it first (root, apt-get) when not.
/// `false` (reason printed) where it cannot be; a failure in CI.
pub fn slurm_available(test: &str) -> bool {
    let present = || {
        ["slurmctld", "slurmd", "scontrol", "sbatch", "munged"]
            .iter()
            .all(|b| which::which(b).is_ok())
    };
    if present() {
        return true;
    }
    if !root_or_skip(
        test,
        "to apt-get install slurmctld slurmd slurm-client munge",
    ) {
        return false;
    }
    apt_install(&PACKAGES, present);
    true
}

pub struct SlurmCluster {
    pub dir: tempfile::TempDir,
    // Dropped (killed) in this order: nodes, controller, munge.
    nodes: Vec<Guarded>,
    /// The controller; `None` while stopped ([`SlurmCluster::stop_controller`]).
    ctld: Option<Guarded>,
    _munged: Guarded,
}

impl SlurmCluster {
    /// munged, slurmctld and slurmd for `n1` and `n2` (n1 preferred by
    /// weight), job requeue allowed; waits until both nodes are idle.
    pub fn start() -> SlurmCluster {
        let dir = tempfile::Builder::new()
            .prefix("memwatch-slurm-")
            .tempdir()
            .expect("temp dir");
        let d = dir.path().to_path_buf();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).expect("chmod");
        let key = d.join("munge.key");
        let mut random = [0u8; 1024];
        std::io::Read::read_exact(
            &mut fs::File::open("/dev/urandom").expect("urandom"),
            &mut random,
        )
        .expect("random key");
        fs::write(&key, random).expect("munge key");
        fs::set_permissions(&key, fs::Permissions::from_mode(0o400)).expect("chmod key");
        let socket = d.join("munge.sock");
        let munged = spawn(
            Command::new("munged")
                .args(["-F", "-f"])
                .arg(format!("--key-file={}", key.display()))
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--pid-file={}", d.join("munged.pid").display()))
                .arg(format!("--log-file={}", d.join("munged.log").display()))
                .arg(format!("--seed-file={}", d.join("munged.seed").display())),
        );
        let deadline = Instant::now() + START_TIMEOUT;
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "munged did not create its socket"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let host = hostname();
        let (ctld_port, p1, p2) = (free_port(), free_port(), free_port());
        let conf = d.join("slurm.conf");
        fs::create_dir_all(d.join("ctld")).expect("state dir");
        fs::write(
            &conf,
            format!(
                "ClusterName=memwatch\n\
                 SlurmctldHost={host}(127.0.0.1)\n\
                 SlurmctldPort={ctld_port}\n\
                 AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
                 SlurmUser=root\nSlurmdUser=root\n\
                 StateSaveLocation={d}/ctld\nSlurmdSpoolDir={d}/spool-%n\n\
                 SlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
                 SlurmctldLogFile={d}/ctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 SelectType=select/linear\nSchedulerType=sched/builtin\nMpiDefault=none\n\
                 ReturnToService=2\nJobRequeue=1\nMinJobAge=300\n\
                 JobAcctGatherType=jobacct_gather/none\nAccountingStorageType=accounting_storage/none\n\
                 NodeName=n1 NodeHostname={host} NodeAddr=127.0.0.1 Port={p1} CPUs=1 RealMemory=1000 Weight=1 State=UNKNOWN\n\
                 NodeName=n2 NodeHostname={host} NodeAddr=127.0.0.1 Port={p2} CPUs=1 RealMemory=1000 Weight=2 State=UNKNOWN\n\
                 PartitionName=main Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP\n",
                sock = socket.display(),
                d = d.display(),
            ),
        )
        .expect("slurm.conf");
        // What memwatch runs: scontrol with this cluster's config.
        let wrapper = d.join("scontrol");
        fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nSLURM_CONF={} exec scontrol \"$@\"\n",
                conf.display()
            ),
        )
        .expect("scontrol wrapper");
        fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).expect("chmod");
        let ctld = spawn(Command::new("slurmctld").arg("-D").arg("-f").arg(&conf));
        let nodes = ["n1", "n2"]
            .iter()
            .map(|n| {
                spawn(
                    Command::new("slurmd")
                        .args(["-D", "-N", n])
                        .arg("-f")
                        .arg(&conf),
                )
            })
            .collect();
        let mut cluster = SlurmCluster {
            dir,
            nodes,
            ctld: Some(ctld),
            _munged: munged,
        };
        loop {
            let states = cluster.node_states();
            if states.len() == 2 && states.iter().all(|(_, s)| s == "idle") {
                break;
            }
            for n in &mut cluster.nodes {
                n.assert_running("slurmd");
            }
            assert!(
                Instant::now() < deadline,
                "Slurm nodes not idle: {states:?}; slurmctld log:\n{}",
                fs::read_to_string(d.join("ctld.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        cluster
    }

    /// Stops slurmctld (SIGTERM; its state is saved): every Slurm command
    /// fails until [`SlurmCluster::start_controller`].
    pub fn stop_controller(&mut self) {
        if let Some(ctld) = self.ctld.take() {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(ctld.id() as i32, libc::SIGTERM) };
            let mut ctld = ctld;
            let deadline = Instant::now() + START_TIMEOUT;
            while ctld.0.try_wait().ok().flatten().is_none() {
                assert!(Instant::now() < deadline, "slurmctld did not stop");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Starts slurmctld again from its saved state and waits until it
    /// answers (bounded).
    pub fn start_controller(&mut self) {
        assert!(self.ctld.is_none(), "slurmctld runs already");
        self.ctld = Some(spawn(
            Command::new("slurmctld")
                .arg("-D")
                .arg("-f")
                .arg(self.conf()),
        ));
        let deadline = Instant::now() + START_TIMEOUT;
        while self.node_states().len() != 2 {
            assert!(Instant::now() < deadline, "slurmctld did not come back");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// The `scontrol` wrapper to give memwatch (`[[slurm]] scontrol = ...`).
    pub fn scontrol_wrapper(&self) -> PathBuf {
        self.dir.path().join("scontrol")
    }

    /// Runs a Slurm client command against this cluster; its stdout.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let mut cmd = Command::new(program);
        cmd.args(args).env("SLURM_CONF", self.conf());
        let out = run_bounded(&format!("{program} {args:?}"), &mut cmd, COMMAND_TIMEOUT);
        assert!(
            out.status.success(),
            "{program} {args:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `(node, compact state)` from `sinfo`, e.g. `("n1", "drain")`.
    pub fn node_states(&self) -> Vec<(String, String)> {
        let mut cmd = Command::new("sinfo");
        cmd.args(["-N", "-h", "-o", "%N %t"])
            .env("SLURM_CONF", self.conf());
        let out = run_bounded("sinfo", &mut cmd, COMMAND_TIMEOUT);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' '))
            .map(|(n, s)| (n.to_string(), s.trim().to_string()))
            .collect()
    }

    /// `node|reason` lines of `sinfo -R`.
    pub fn drain_reasons(&self) -> String {
        self.run("sinfo", &["-R", "-h", "-o", "%N|%E"])
    }

    /// `Key=Value` fields of `scontrol show job <id>`.
    pub fn job(&self, id: u64) -> std::collections::BTreeMap<String, String> {
        let out = self.run("scontrol", &["show", "job", &id.to_string(), "-o"]);
        memwatch::scontrol_fields(out.lines().next().unwrap_or(""))
    }

    /// Submits `script` (a file) with `--requeue`; the job id.
    pub fn sbatch(&self, script: &Path) -> u64 {
        let out_pattern = self.dir.path().join("job-%j.out");
        let out = self.run(
            "sbatch",
            &[
                "--parsable",
                "--requeue",
                "-o",
                out_pattern.to_str().expect("UTF-8"),
                script.to_str().expect("UTF-8"),
            ],
        );
        out.trim()
            .split(';')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("sbatch answered {out:?}"))
    }
}

fn spawn(cmd: &mut Command) -> Guarded {
    Guarded(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {cmd:?}: {e}")),
    )
}

fn hostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("hostname")
        .trim()
        .to_string()
}
