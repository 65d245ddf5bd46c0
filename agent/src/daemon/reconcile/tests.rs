//! The OOM book against counter files in a temporary hierarchy.

use std::{fs, path::Path};

use super::*;
use crate::cgroup::CgroupVersion;
use crate::cgroup::temp_hierarchy as hierarchy;

fn control(path: &Path, kills: u64) {
    fs::create_dir_all(path).unwrap();
    fs::write(
        path.join("memory.oom_control"),
        format!("oom_kill_disable 0\nunder_oom 0\noom_kill {kills}\n"),
    )
    .unwrap();
}

fn recorder() -> Recorder {
    let metrics = crate::telemetry::Metrics::new(&prometheus::Registry::new()).unwrap();
    Recorder::new(
        crate::outbox::Outbox::new("h", 100, metrics.clone()),
        metrics,
    )
}

fn recovered(recorder: &Recorder) -> Vec<(Option<String>, String)> {
    recorder
        .outbox()
        .read(0, 100)
        .into_iter()
        .filter(|e| e.body.recovered == Some(true))
        .map(|e| (e.body.cgroup, e.body.reason.unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn kills_no_live_event_reported_are_reported_once_and_live_ones_never() {
    let (dir, h) = hierarchy(CgroupVersion::V1);
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    control(dir.path(), 0);
    control(&a, 1);
    control(&b, 0);
    let recorder = recorder();
    let mut book = OomBook::open(OomBook::baseline(&h).await.unwrap(), &recorder);
    let key = |p: &Path| p.display().to_string();
    assert_eq!(
        book.accounted,
        BTreeMap::from([(key(&a), 1)]),
        "zeros are not kept"
    );
    assert!(
        recovered(&recorder).is_empty(),
        "a first run knows no baseline"
    );

    // b: two kills, both reported live. c: five no event reported
    // (the ring buffer overflowed, say).
    control(&b, 2);
    control(&c, 5);
    let live = (BTreeMap::from([(b.clone(), 2)]), 2);
    let scan = book.to_read(&live.0);
    book.live(live);
    book.check(&recorder, scan.unwrap()).await;
    assert!(recovered(&recorder).is_empty(), "b's kills were live");

    // A loss was noticed: the walk finds c, and reports it once it is
    // still unaccounted at the next check (a live event gets that long).
    book.owe_walk();
    book.check(&recorder, book.to_read(&BTreeMap::new()).unwrap())
        .await;
    assert!(recovered(&recorder).is_empty(), "not yet: maybe in flight");
    let scan = book.to_read(&BTreeMap::new()).unwrap();
    assert!(
        matches!(&scan, OomScan::Cgroups(cg) if cg.contains(&c)),
        "c is read again"
    );
    book.check(&recorder, scan).await;
    let found = recovered(&recorder);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].0.as_deref(), Some(key(&c).as_str()));
    assert!(found[0].1.contains("5 OOM kills"), "{}", found[0].1);

    // Nothing twice: further checks and walks report nothing more.
    book.owe_walk();
    book.check(&recorder, OomScan::Full).await;
    book.check(&recorder, OomScan::Full).await;
    assert_eq!(recovered(&recorder).len(), 1);

    // A kill in flight when the check reads: counted by the kernel,
    // its live event noted before the next check: not reported.
    control(&a, 2);
    book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
        .await;
    book.live((BTreeMap::from([(a.clone(), 1)]), 1));
    book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
        .await;
    assert_eq!(recovered(&recorder).len(), 1);

    // A storm: at every check one more kill is counted whose live
    // event is still in flight, and the one in flight at the check
    // before has arrived meanwhile: nothing is missing, nothing is
    // reported (the count at the last check is what had its interval,
    // not the count now).
    for n in 3..8 {
        control(&a, n);
        book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
            .await;
        book.live((BTreeMap::from([(a.clone(), 1)]), 1));
    }
    assert_eq!(recovered(&recorder).len(), 1, "{:?}", recovered(&recorder));
    // The last one in flight was seen; two lost then (8 and 9) are
    // reported, once, and only they, though a tenth came meanwhile.
    control(&a, 9);
    book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
        .await;
    control(&a, 10);
    book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
        .await;
    let found = recovered(&recorder);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found[1].1.contains("2 OOM kills"), "{}", found[1].1);
    assert!(found[1].1.contains("7 -> 9"), "{}", found[1].1);
    book.live((BTreeMap::from([(a.clone(), 1)]), 1));
    book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
        .await;
    assert_eq!(recovered(&recorder).len(), 2, "the one in flight arrived");
    // (A new cgroup under a's name, for what follows.)
    control(&a, 2);
    book.check(&recorder, OomScan::Cgroups(BTreeSet::from([a.clone()])))
        .await;

    // A removed cgroup is forgotten; what was accounted is saved.
    fs::remove_file(b.join("memory.oom_control")).unwrap();
    fs::remove_dir(&b).unwrap();
    book.check(&recorder, OomScan::Full).await;
    assert_eq!(
        recorder.outbox().saved_oom_counts().unwrap(),
        BTreeMap::from([(key(&a), 2), (key(&c), 5)])
    );
}

/// The long-interval rescan: with the host-wide count it reads only the
/// cgroups accounted for (a removed one is forgotten), never every
/// cgroup of the host; without that count it walks them all.
#[tokio::test]
async fn the_rescan_reads_the_accounted_cgroups_unless_the_host_count_is_missing() {
    let (dir, h) = hierarchy(CgroupVersion::V1);
    let (a, gone, quiet) = (
        dir.path().join("a"),
        dir.path().join("gone"),
        dir.path().join("quiet"),
    );
    control(dir.path(), 0);
    control(&a, 1);
    control(&gone, 2);
    control(&quiet, 0);
    let recorder = recorder();
    let mut book = OomBook::open(OomBook::baseline(&h).await.unwrap(), &recorder);
    let key = |p: &Path| p.display().to_string();
    assert!(
        book.host_base.is_some(),
        "this host has /proc/vmstat oom_kill"
    );
    assert!(
        book.to_read(&BTreeMap::new()).is_none(),
        "nothing to do yet"
    );

    fs::remove_file(gone.join("memory.oom_control")).unwrap();
    fs::remove_dir(&gone).unwrap();
    book.rescan();
    let scan = book.to_read(&BTreeMap::new()).expect("the rescan reads");
    let OomScan::Cgroups(cgroups) = &scan else {
        panic!("with the host-wide count, no full walk");
    };
    assert_eq!(cgroups, &BTreeSet::from([a.clone(), gone.clone()]));
    book.check(&recorder, scan).await;
    assert_eq!(
        book.accounted,
        BTreeMap::from([(key(&a), 1)]),
        "gone is forgotten"
    );
    assert!(recovered(&recorder).is_empty());
    assert!(
        book.to_read(&BTreeMap::new()).is_none(),
        "done until the next rescan"
    );

    book.host_base = None;
    book.rescan();
    assert!(
        matches!(book.to_read(&BTreeMap::new()), Some(OomScan::Full)),
        "without the host-wide count the rescan walks every cgroup"
    );
}

#[test]
fn kills_since_the_saved_counts_become_events() {
    let now = BTreeMap::from([
        ("/cg/a".to_string(), 3),
        ("/cg/b".to_string(), 1),
        ("/cg/new".to_string(), 2),
        ("/cg/reused".to_string(), 1),
    ]);
    assert!(
        recovered_kills(None, &now).is_empty(),
        "first run: no baseline"
    );
    let saved = BTreeMap::from([
        ("/cg/a".to_string(), 1),
        ("/cg/b".to_string(), 1),
        ("/cg/reused".to_string(), 9),
    ]);
    let events = recovered_kills(Some(&saved), &now);
    let summary: Vec<(&str, &str)> = events
        .iter()
        .map(|e| (e.cgroup.as_deref().unwrap(), e.reason.as_deref().unwrap()))
        .collect();
    assert_eq!(summary.len(), 3, "{summary:?}");
    assert!(events.iter().all(|e| e.kind == EventKind::OomKill));
    assert_eq!(summary[0].0, "/cg/a");
    assert!(
        summary[0]
            .1
            .starts_with("recovered after the fact: 2 OOM kills")
    );
    assert!(summary[0].1.contains("1 -> 3"));
    assert_eq!(summary[1].0, "/cg/new");
    assert_eq!(summary[2].0, "/cg/reused");
    assert!(summary[2].1.contains("1 OOM kill in"), "{}", summary[2].1);
}
