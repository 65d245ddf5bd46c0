use super::*;

#[test]
fn the_resolver_stays_bounded_on_every_path_and_keeps_what_it_was_asked() {
    let root = tempfile::tempdir().unwrap();
    let mut resolver = CgroupResolver::new(MemoryHierarchy {
        root: root.path().into(),
        version: CgroupVersion::V2,
    });
    resolver.max_entries = 40;
    // remember(): 100 cgroups, each removed right after (gone ones are
    // forgotten first).
    for i in 0..100 {
        let dir = root.path().join(format!("gone{i}"));
        fs::create_dir(&dir).unwrap();
        resolver.remember(&dir);
        fs::remove_dir(&dir).unwrap();
        assert!(resolver.by_id.len() <= 40, "{}", resolver.by_id.len());
    }
    // learn() and walks: 100 live cgroups, more than the bound.
    let mut ids = Vec::new();
    for i in 0..100 {
        let dir = root.path().join(format!("live{i}"));
        fs::create_dir(&dir).unwrap();
        let id = inode(&dir).unwrap();
        assert!(resolver.learn(id, &format!("live{i}")).is_some());
        assert!(resolver.by_id.len() <= 40, "{}", resolver.by_id.len());
        ids.push(id);
    }
    // A walk finds any live one again, and keeps it.
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            resolver.resolve(*id),
            Some(root.path().join(format!("live{i}")))
        );
        assert!(resolver.by_id.len() <= 40);
        assert!(resolver.known_path(*id).is_some());
    }
}

const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

const PURE_V2: &str = "\
25 20 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

#[test]
fn hybrid_host_uses_v1_memory() {
    let h = MemoryHierarchy::from_mountinfo(HYBRID, |_| Some("cpu io".into())).unwrap();
    assert_eq!(h.root, Path::new("/sys/fs/cgroup/memory"));
    assert_eq!(h.version, CgroupVersion::V1);
}

#[test]
fn pure_v2_needs_memory_in_controllers() {
    let with =
        MemoryHierarchy::from_mountinfo(PURE_V2, |_| Some("cpuset cpu io memory pids".into()));
    assert_eq!(
        with,
        Some(MemoryHierarchy {
            root: "/sys/fs/cgroup".into(),
            version: CgroupVersion::V2
        })
    );
    let without = MemoryHierarchy::from_mountinfo(PURE_V2, |_| Some("cpu io pids".into()));
    assert_eq!(without, None);
}

#[test]
fn resolver_finds_directories_by_inode_and_keeps_removed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let child = dir.path().join("a/b");
    fs::create_dir_all(&child).unwrap();
    let id = inode(&child).unwrap();
    let hierarchy = MemoryHierarchy {
        root: dir.path().into(),
        version: CgroupVersion::V2,
    };
    let mut resolver = CgroupResolver::new(hierarchy.clone());
    assert_eq!(resolver.resolve(id), Some(child.clone()));
    fs::remove_dir(&child).unwrap();
    assert_eq!(
        resolver.resolve(id),
        Some(child.clone()),
        "seen before removal"
    );

    // Told about by a registration, never walked: still resolves once gone.
    let late = dir.path().join("late");
    fs::create_dir(&late).unwrap();
    let late_id = inode(&late).unwrap();
    let mut fresh = CgroupResolver::new(hierarchy.clone());
    fresh.remember(&late);
    fs::remove_dir(&late).unwrap();
    assert_eq!(fresh.resolve(late_id), Some(late));
    assert_eq!(fresh.resolve(u64::MAX), None);

    // Learned from the mkdir probe: kept only when the id matches.
    let made = dir.path().join("made");
    fs::create_dir(&made).unwrap();
    let made_id = inode(&made).unwrap();
    let mut learner = CgroupResolver::new(hierarchy);
    assert_eq!(
        learner.learn(made_id + 1, "/made"),
        None,
        "another hierarchy's cgroup"
    );
    assert_eq!(learner.learn(made_id, "/made"), Some(made.clone()));
    fs::remove_dir(&made).unwrap();
    assert_eq!(learner.known_path(made_id), Some(made.as_path()));
}
