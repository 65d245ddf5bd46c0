//! The kernel's caps and followed cgroups against a fake WATCHED map.

use std::time::Duration;

use chrono::Utc;

use super::*;

fn moved(caps: &KernelCaps, cgroup: &Path, since: Instant) -> Option<bool> {
    caps.moved_since_each([Some((cgroup, since))])
        .pop()
        .flatten()
}

struct NoMap;

impl KernelWatch for NoMap {
    fn set(&self, _: u64, _: Option<Watch>) {}
}

/// The map as the kernel would hold it.
#[derive(Default)]
struct Map(Mutex<HashMap<u64, Watch>>);

impl KernelWatch for Map {
    fn set(&self, id: u64, watch: Option<Watch>) {
        let mut map = self.0.lock().unwrap();
        match watch {
            Some(w) => map.insert(id, w),
            None => map.remove(&id),
        };
    }
}

impl Map {
    fn get(&self, id: u64) -> Option<Watch> {
        self.0.lock().unwrap().get(&id).copied()
    }
}

fn line(memcg_id: u64, line: Line, usage_bytes: u64) -> GrowthLine {
    GrowthLine {
        time: Utc::now(),
        memcg_id,
        line,
        usage_bytes,
        cap_bytes: Some(100),
    }
}

/// Quiet since a moment: the kernel holds the cap and sent no line
/// after it, and its last line left the cgroup below the cap.
#[tokio::test(start_paused = true)]
async fn quiet_means_no_line_since_and_below_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let caps = KernelCaps::default();
    caps.push("t", dir.path(), 100);
    assert!(
        !caps.quiet_since("t", Instant::now()),
        "no probe: never quiet"
    );
    caps.attach(Arc::new(NoMap));
    caps.push("t", dir.path(), 100);
    let id = std::fs::metadata(dir.path()).unwrap().ino();
    let read = Instant::now();
    assert!(caps.quiet_since("t", read), "held, nothing said yet");
    assert!(!caps.quiet_since("other", read), "not held");
    tokio::time::advance(Duration::from_millis(5)).await;
    caps.line(&line(id, Line::Step, 50));
    assert!(!caps.quiet_since("t", read), "a step after the last read");
    assert!(caps.quiet_since("t", Instant::now()), "read again after it");
    caps.line(&line(id, Line::AboveCap, 120));
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(!caps.quiet_since("t", Instant::now()), "above its cap");
    caps.line(&line(id, Line::BelowCap, 90));
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(caps.quiet_since("t", Instant::now()));
    assert_eq!(caps.usage_of("t"), Some(90));
    caps.remove("t");
    assert!(!caps.quiet_since("t", Instant::now()), "taken back");
    assert_eq!(caps.usage_of("t"), None);
}

/// A read before the kernel got the cap, or before records were lost
/// to a full ring buffer, proves nothing: the task is read again, and a
/// loss wakes the sampling loop.
#[tokio::test(start_paused = true)]
async fn a_read_before_the_cap_was_pushed_or_records_were_lost_is_not_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let caps = KernelCaps::default();
    caps.attach(Arc::new(NoMap));
    let read = Instant::now();
    tokio::time::advance(Duration::from_millis(5)).await;
    caps.push("t", dir.path(), 100);
    assert!(!caps.quiet_since("t", read), "read before the push");
    assert!(caps.quiet_since("t", Instant::now()));

    let woken = caps.sample_now();
    let read = Instant::now();
    tokio::time::advance(Duration::from_millis(5)).await;
    caps.records_lost();
    assert!(!caps.quiet_since("t", read), "read before the loss");
    tokio::time::timeout(Duration::from_millis(1), woken.notified())
        .await
        .expect("a loss wakes the sampling loop");
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(caps.quiet_since("t", Instant::now()), "read after the loss");
}

/// The predictor follows a cgroup: the kernel gets its sample size
/// beside any cap, and a sample after a read marks it moved; a cgroup
/// it does not follow, or any before the probe runs, is unknown (the
/// predictor reads it). A cap taken back leaves the samples, and the
/// last of both removes the entry.
#[tokio::test(start_paused = true)]
async fn a_followed_cgroup_moved_when_a_sample_came_after_the_read() {
    let dir = tempfile::tempdir().unwrap();
    let cgroup = dir.path();
    let id = std::fs::metadata(cgroup).unwrap().ino();
    let caps = KernelCaps::default();
    assert!(!caps.follow(cgroup, 1 << 20), "no probe yet");
    assert_eq!(moved(&caps, cgroup, Instant::now()), None);
    let map = Arc::new(Map::default());
    caps.attach(map.clone());
    assert!(!caps.follow(&dir.path().join("gone"), 1 << 20));

    assert!(caps.follow(cgroup, 1 << 20));
    let held = map.get(id).expect("in the map");
    assert_eq!((held.cap_bytes, held.sample_bytes), (None, Some(1 << 20)));
    let before = Instant::now() - Duration::from_millis(1);
    assert_eq!(moved(&caps, cgroup, before), Some(true), "followed after");
    tokio::time::advance(Duration::from_millis(5)).await;
    let read = Instant::now();
    assert_eq!(moved(&caps, cgroup, read), Some(false));
    assert_eq!(moved(&caps, &dir.path().join("other"), read), None);

    // A cap on the same cgroup: one entry with both; the cap's lines
    // do not count as samples, and a sample is no cap line.
    caps.push("t", cgroup, 100);
    let held = map.get(id).unwrap();
    assert_eq!(
        (held.cap_bytes, held.sample_bytes),
        (Some(100), Some(1 << 20))
    );
    let generation = held.generation;
    tokio::time::advance(Duration::from_millis(5)).await;
    caps.line(&line(id, Line::Step, 50));
    assert_eq!(moved(&caps, cgroup, read), Some(false), "a step");
    let quiet = Instant::now();
    tokio::time::advance(Duration::from_millis(5)).await;
    caps.line(&GrowthLine {
        cap_bytes: None,
        ..line(id, Line::Sample, 70)
    });
    assert_eq!(moved(&caps, cgroup, read), Some(true), "a sample");
    assert!(caps.quiet_since("t", quiet), "a sample moves no cap line");
    assert_eq!(caps.usage_of("t"), Some(50));
    let read = Instant::now();
    assert_eq!(moved(&caps, cgroup, read), Some(false));

    // The same sample size again writes nothing; another one does, and
    // keeps the cap's generation (the kernel does not re-arm its cap).
    assert!(caps.follow(cgroup, 1 << 20));
    assert_eq!(moved(&caps, cgroup, read), Some(false));
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(caps.follow(cgroup, 4 << 20));
    let held = map.get(id).unwrap();
    assert_eq!(
        (held.generation, held.sample_bytes),
        (generation, Some(4 << 20))
    );
    assert_eq!(moved(&caps, cgroup, read), Some(true), "new size");

    // Lost records: every followed cgroup may have moved.
    tokio::time::advance(Duration::from_millis(5)).await;
    let read = Instant::now();
    tokio::time::advance(Duration::from_millis(5)).await;
    caps.records_lost();
    assert_eq!(moved(&caps, cgroup, read), Some(true), "records lost");

    // The cap goes, the samples stay; then they go too.
    caps.remove("t");
    let held = map.get(id).expect("still followed");
    assert_eq!((held.cap_bytes, held.sample_bytes), (None, Some(4 << 20)));
    assert!(held.generation > generation, "the kernel drops the cap");
    caps.unfollow(cgroup);
    assert_eq!(map.get(id), None);
    assert_eq!(moved(&caps, cgroup, read), None);

    // Removed: the path stands for that id no more.
    assert!(caps.follow(cgroup, 1 << 20));
    caps.cgroup_removed(id + 1);
    assert!(map.get(id).is_some(), "another cgroup");
    caps.cgroup_removed(id);
    assert_eq!(map.get(id), None);
    assert_eq!(moved(&caps, cgroup, read), None);

    // Two keys on one cgroup: the cap stays until the last goes.
    caps.push("a", cgroup, 100);
    caps.push("b", cgroup, 200);
    caps.push("b", cgroup, 200);
    caps.remove("a");
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(200));
    caps.remove("b");
    assert_eq!(map.get(id), None);
}

const MIB: u64 = 1 << 20;

fn figures(key: &str, bytes: u64) -> FastMap<String, u64> {
    [(key.to_string(), bytes)].into_iter().collect()
}

/// A crossing the read found to be page cache raises the kernel's line
/// above its usage by the room left below the cap, so the kernel speaks
/// again by the time the working set can have reached the cap; the true
/// cap goes back when the kernel says the usage fell, or a read finds the
/// working set well below. A read over the cap raises nothing.
#[tokio::test(start_paused = true)]
async fn a_crossing_that_was_page_cache_raises_the_kernels_line() {
    let dir = tempfile::tempdir().unwrap();
    let id = std::fs::metadata(dir.path()).unwrap().ino();
    let caps = KernelCaps::default();
    let map = Arc::new(Map::default());
    caps.attach(map.clone());
    let cap = 64 * MIB;
    caps.push("t", dir.path(), cap);
    let pushed = map.get(id).unwrap().generation;

    // Above at 66 MiB, the working set 62: the line goes to 66 + 2.
    caps.line(&line(id, Line::AboveCap, 66 * MIB));
    caps.judged(&figures("t", 62 * MIB), Instant::now());
    let held = map.get(id).unwrap();
    assert_eq!(held.cap_bytes, Some(68 * MIB));
    assert!(held.generation > pushed, "the kernel re-reads it");
    assert_eq!(caps.take_crossing("t"), None, "judged: page cache");
    let read = Instant::now();
    assert!(!caps.quiet_since("t", read), "still read every round");

    // At the raised line again within a second, the working set 63: the
    // margin doubles (the room, 1 MiB, is less than the floor 2 MiB).
    tokio::time::advance(Duration::from_millis(300)).await;
    caps.line(&line(id, Line::AboveCap, 69 * MIB));
    caps.judged(&figures("t", 63 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(73 * MIB));

    // A second later the room is the margin again: 30 MiB of room.
    tokio::time::advance(Duration::from_millis(1500)).await;
    caps.line(&line(id, Line::AboveCap, 74 * MIB));
    caps.judged(&figures("t", 34 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(104 * MIB));

    // A read within margin and floor of the cap keeps it raised; one
    // below them gives the kernel its true cap back, and the task is
    // quiet after the next read.
    let generation = map.get(id).unwrap().generation;
    caps.judged(&figures("t", 33 * MIB), Instant::now());
    assert_eq!(
        map.get(id).unwrap().generation,
        generation,
        "33 + 30 + 2 > 64"
    );
    caps.judged(&figures("t", 32 * MIB), Instant::now());
    let held = map.get(id).unwrap();
    assert_eq!(held.cap_bytes, Some(cap));
    assert!(held.generation > generation);
    tokio::time::advance(Duration::from_millis(5)).await;
    assert!(caps.quiet_since("t", Instant::now()), "well below");

    // The kernel says at once it is still above (page cache grew): the
    // read raises it again, doubling the last margin (within a second).
    caps.line(&line(id, Line::AboveCap, 80 * MIB));
    caps.judged(&figures("t", 40 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(140 * MIB), "80 + 60");

    // The kernel says the usage fell below the raised line: the true cap.
    let generation = map.get(id).unwrap().generation;
    caps.line(&line(id, Line::BelowCap, 50 * MIB));
    let held = map.get(id).unwrap();
    assert_eq!(held.cap_bytes, Some(cap));
    assert!(held.generation > generation);

    // A read over the cap judges the crossing and raises nothing; a
    // closed crossing no read saw is said as before.
    tokio::time::advance(Duration::from_secs(2)).await;
    let generation = map.get(id).unwrap().generation;
    caps.line(&line(id, Line::AboveCap, 70 * MIB));
    caps.judged(&figures("t", 65 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().generation, generation);
    assert_eq!(caps.take_crossing("t"), None, "judged: over the cap");
    caps.line(&line(id, Line::BelowCap, 50 * MIB));
    caps.line(&line(id, Line::AboveCap, 67 * MIB));
    caps.line(&line(id, Line::BelowCap, 50 * MIB));
    assert_eq!(caps.take_unjudged().get("t"), Some(&(67 * MIB)));

    // A cap handed again drops the raise: no later read lowers it.
    caps.line(&line(id, Line::AboveCap, 66 * MIB));
    caps.judged(&figures("t", 62 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(68 * MIB));
    caps.push("t", dir.path(), 80 * MIB);
    caps.judged(&figures("t", 10 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(80 * MIB));

    // A working set that climbs toward the cap: the line follows it
    // within the second, no doubling (48 MiB of page cache, anonymous
    // memory growing; the read lags the kernel's line a little).
    caps.push("t", dir.path(), cap);
    caps.line(&line(id, Line::AboveCap, 65 * MIB));
    caps.judged(&figures("t", 17 * MIB), Instant::now());
    assert_eq!(map.get(id).unwrap().cap_bytes, Some(112 * MIB));
    tokio::time::advance(Duration::from_millis(100)).await;
    caps.line(&line(id, Line::AboveCap, 112 * MIB));
    caps.judged(&figures("t", 63 * MIB), Instant::now());
    assert_eq!(
        map.get(id).unwrap().cap_bytes,
        Some(114 * MIB),
        "112 + floor"
    );
}
