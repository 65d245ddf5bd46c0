//! A real Dask cluster on 127.0.0.1: a scheduler with its HTTP API on, and
//! nanny workers each in a memory cgroup of its own. Installed with pip
//! when missing (as root); every process is killed on drop.

use std::{
    fs,
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use memwatch_test_support::http::free_port;

use crate::{
    cgroup::TestCgroup,
    process::{Guarded, root_or_skip, run_bounded},
};

/// The scheduler's HTTP routes with the API on (off by default).
const ROUTES: &str = r#"["distributed.http.scheduler.api","distributed.http.health","distributed.http.scheduler.prometheus","distributed.http.scheduler.info","distributed.http.scheduler.json","distributed.http.proxy","distributed.http.statics"]"#;
/// How long the scheduler, or a worker, may take to come up.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one client script may run (the longest: the prediction test's job).
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// The client side of the tests: leak memory on a worker, free it, run a
/// computation and say which workers ran it.
const CLIENT: &str = r#"
import builtins, json, os, sys, time
from distributed import Client, get_worker, wait

def leak(mib):
    # Unmanaged memory: held by the worker process, unknown to Dask.
    if not hasattr(builtins, "_memwatch_leak"):
        builtins._memwatch_leak = []
    builtins._memwatch_leak.append(b"x" * (mib << 20))
    return len(builtins._memwatch_leak)

def free():
    builtins.__dict__.pop("_memwatch_leak", None)

def spike(mib):
    # Transient memory: more than the worker's cgroup allows.
    block = b"y" * (mib << 20)
    return len(block) >> 20

def square(x):
    return x * x, get_worker().address

def part(i, seconds, runs):
    # One result kept in the worker's memory; every run of it is logged.
    with open(runs, "a") as f:
        f.write("%d %s\n" % (i, get_worker().name))
    time.sleep(seconds)
    return i

def grow(mib, rate, marker):
    # The first attempt grows toward `mib` at `rate` MiB/s (past its
    # worker's limit); a retry after that worker went away holds 32 MiB.
    first = not os.path.exists(marker)
    open(marker, "a").close()
    held, step = [], 2
    for _ in range((mib if first else 32) // step):
        held.append(b"z" * (step << 20))
        time.sleep(step / rate)
    return len(held) * step

def total(parts, grown):
    return sum(parts)

client = Client(sys.argv[1], timeout=30)
cmd = sys.argv[2]
if cmd == "leak":
    client.submit(leak, int(sys.argv[4]), workers=[sys.argv[3]], allow_other_workers=False, pure=False).result(timeout=60)
    print(json.dumps({"ok": True}))
elif cmd == "free":
    client.run(free, workers=[sys.argv[3]])
    print(json.dumps({"ok": True}))
elif cmd == "spike":
    f = client.submit(spike, int(sys.argv[4]), workers=[sys.argv[3]], allow_other_workers=True, pure=False)
    squares = client.map(square, range(100), pure=False)
    got = [s for s, _ in client.gather(squares)]
    print(json.dumps({"spike": f.result(timeout=90), "total": sum(got)}))
elif cmd == "job":
    # Results on one worker, then a task there that grows toward its limit;
    # the job ends when the results are summed. How long it took, and how
    # often each result was computed (in the runs file).
    w, n, seconds, mib, rate, runs = sys.argv[3], int(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7]), sys.argv[8]
    start = time.monotonic()
    # On that worker, or another when it is gone (a restarted worker has
    # another address; work stealing may move a few to the idle one).
    parts = client.map(part, range(n), seconds=seconds, runs=runs, workers=[w], allow_other_workers=True, pure=False)
    wait(parts, timeout=120)
    parted = time.monotonic() - start
    grown = client.submit(grow, mib, rate, runs + ".grow", workers=[w], allow_other_workers=True, pure=False)
    answer = client.submit(total, parts, grown, pure=False).result(timeout=170)
    print(json.dumps({"total": answer, "seconds": time.monotonic() - start, "parted": parted}))
elif cmd == "compute":
    results = client.gather(client.map(square, range(100), pure=False))
    print(json.dumps({"total": sum(r[0] for r in results), "workers": sorted({r[1] for r in results})}))
client.close()
"#;

/// `python3` with `distributed` importable: as found, or after `pip
/// install dask distributed` (root). `None` (reason printed) where neither.
pub fn python_with_dask(test: &str) -> Option<PathBuf> {
    let python = which::which("python3").ok()?;
    let importable = || {
        Command::new(&python)
            .args(["-c", "import distributed"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if importable() {
        return Some(python);
    }
    if !root_or_skip(test, "to pip install dask distributed") {
        return None;
    }
    // Another test may be installing the same packages: wait, look again.
    let _one_at_a_time = crate::process::install_lock();
    if importable() {
        return Some(python);
    }
    let pip = |extra: &[&str]| {
        let mut cmd = Command::new(&python);
        cmd.args(["-m", "pip", "install", "-q", "dask", "distributed"])
            .args(extra);
        run_bounded("pip install", &mut cmd, Duration::from_secs(300))
            .status
            .success()
    };
    // Debian marks its Python "externally managed"; a test machine is ours.
    assert!(
        pip(&[]) || pip(&["--break-system-packages"]),
        "pip install dask distributed failed"
    );
    assert!(importable(), "distributed not importable after pip install");
    Some(python)
}

pub struct DaskWorker {
    pub name: String,
    pub cgroup: TestCgroup,
    pub nanny: Guarded,
    /// The worker's address, once the scheduler lists it.
    pub address: String,
}

pub struct DaskCluster {
    python: PathBuf,
    pub port: u16,
    pub http_port: u16,
    client_script: PathBuf,
    http: reqwest::Client,
    // Workers first: they are killed before the scheduler.
    pub workers: Vec<DaskWorker>,
    _scheduler: Guarded,
}

impl DaskCluster {
    /// A scheduler and one nanny worker per name, each worker in a fresh
    /// memory cgroup (`limits`: its hard limit, when `Some`). Waits until
    /// the scheduler lists every worker.
    pub async fn start(python: PathBuf, names: &[&str], limits: &[Option<u64>]) -> DaskCluster {
        let port = free_port();
        let http_port = free_port();
        let scheduler = Command::new(&python)
            .args([
                "-m",
                "distributed.cli.dask_scheduler",
                "--host",
                "127.0.0.1",
            ])
            .args(["--port", &port.to_string()])
            .args(["--dashboard-address", &format!("127.0.0.1:{http_port}")])
            .args(["--no-show"])
            .env("DASK_DISTRIBUTED__SCHEDULER__HTTP__ROUTES", ROUTES)
            // A task that OOM-kills a worker is tried elsewhere, not given up after 3.
            .env("DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES", "10")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start dask scheduler");
        let client_script = std::env::temp_dir().join(format!(
            "memwatch-dask-client-{}-{port}.py",
            std::process::id()
        ));
        fs::write(&client_script, CLIENT).expect("write the client script");
        let mut cluster = DaskCluster {
            python: python.clone(),
            port,
            http_port,
            client_script,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client"),
            workers: Vec::new(),
            _scheduler: Guarded(scheduler),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        while cluster.try_workers().await.is_none() {
            cluster._scheduler.assert_running("dask scheduler");
            assert!(Instant::now() < deadline, "Dask scheduler API not up");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (name, limit) in names.iter().zip(limits) {
            let cgroup = TestCgroup::create(&format!("dask-{name}"));
            if let Some(bytes) = limit {
                cgroup.limit(*bytes);
            }
            let worker = format!(
                "{} -m distributed.cli.dask_worker tcp://127.0.0.1:{port} --nanny --name {name} \
                 --host 127.0.0.1 --nthreads 1 --memory-limit 0 --no-dashboard",
                python.display()
            );
            let nanny = Command::new("sh")
                .arg("-c")
                .arg(cgroup.exec_line(&worker))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start dask worker");
            cluster.workers.push(DaskWorker {
                name: name.to_string(),
                cgroup,
                nanny: Guarded(nanny),
                address: String::new(),
            });
        }
        for i in 0..cluster.workers.len() {
            let name = cluster.workers[i].name.clone();
            let address = loop {
                if let Some(a) = cluster.address_of(&name).await {
                    break a;
                }
                cluster.workers[i].nanny.assert_running("dask nanny");
                assert!(Instant::now() < deadline, "Dask worker {name} not listed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            cluster.workers[i].address = address;
        }
        cluster
    }

    pub fn scheduler(&self) -> String {
        format!("tcp://127.0.0.1:{}", self.port)
    }

    pub fn http_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// `(name, address)` of every worker the scheduler lists, or `None`
    /// when it does not answer.
    pub async fn try_workers(&self) -> Option<Vec<(String, String)>> {
        let r = self
            .http
            .get(format!("{}/api/v1/get_workers", self.http_url()))
            .send()
            .await
            .ok()?;
        let v: serde_json::Value = r.json().await.ok()?;
        Some(
            v["workers"]
                .as_array()?
                .iter()
                .map(|w| {
                    let name = match &w["name"] {
                        serde_json::Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    (name, w["address"].as_str().unwrap_or("").to_string())
                })
                .collect(),
        )
    }

    pub async fn listed(&self) -> Vec<(String, String)> {
        self.try_workers()
            .await
            .expect("Dask scheduler answers get_workers")
    }

    pub async fn address_of(&self, name: &str) -> Option<String> {
        self.try_workers()
            .await?
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
    }

    /// Runs the client script with `args`; its JSON answer.
    pub fn client(&self, args: &[&str]) -> serde_json::Value {
        let mut cmd = Command::new(&self.python);
        cmd.arg(&self.client_script)
            .arg(self.scheduler())
            .args(args);
        let out = run_bounded(&format!("dask client {args:?}"), &mut cmd, CLIENT_TIMEOUT);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "dask client {args:?}: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let line = stdout.lines().last().unwrap_or("");
        serde_json::from_str(line).unwrap_or_else(|e| panic!("client answer {line:?}: {e}"))
    }

    /// Like [`client`](Self::client), started in the background.
    pub fn client_background(&self, args: &[&str]) -> Guarded {
        Guarded(
            Command::new(&self.python)
                .arg(&self.client_script)
                .arg(self.scheduler())
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start dask client"),
        )
    }
}

impl Drop for DaskCluster {
    fn drop(&mut self) {
        for w in &self.workers {
            w.cgroup.kill_all();
        }
        let _ = fs::remove_file(&self.client_script);
    }
}
