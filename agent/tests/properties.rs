//! Property tests of the parsers that take outside input: kernel records,
//! the config file, mountinfo, sizes and durations. Each property is bounded
//! by case count so the whole file runs in a few seconds.

use std::path::Path;

use agent_common::{
    CGROUP_PATH_LEN, COMM_LEN, CgroupRecord, GrowthRecord, OomVictimEvent, RecordKind,
};
use chrono::{DateTime, TimeDelta};
use memwatch::{
    CgroupVersion, ClockPair, Config, ConfigError, MemoryHierarchy, Overrides, ProbeEvent, Size,
    Span, decode_record as record,
};
use proptest::prelude::*;

fn bounded(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    }
}

fn bytes_of<T: Copy>(value: &T) -> Vec<u8> {
    // SAFETY: only the agent-common records, #[repr(C)] integers without padding.
    unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
}

fn clock() -> ClockPair {
    ClockPair {
        boot_ns: 1_000_000_000_000,
        wall: DateTime::parse_from_rfc3339("2026-11-30T08:00:00Z")
            .unwrap()
            .to_utc(),
    }
}

/// Any size a real record could have, and the sizes around them.
fn record_bytes() -> impl Strategy<Value = Vec<u8>> {
    let sizes = [
        size_of::<OomVictimEvent>(),
        size_of::<CgroupRecord>(),
        size_of::<GrowthRecord>(),
    ];
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..400),
        prop::sample::select(sizes.to_vec())
            .prop_flat_map(|n| prop::collection::vec(any::<u8>(), n..=n)),
        // A valid kind in front of random bytes of the right length.
        (1u32..=4, prop::sample::select(sizes.to_vec())).prop_flat_map(|(kind, n)| {
            prop::collection::vec(any::<u8>(), n..=n).prop_map(move |mut b| {
                b[..4].copy_from_slice(&kind.to_ne_bytes());
                b
            })
        }),
    ]
}

proptest! {
    #![proptest_config(bounded(2_000))]

    #[test]
    fn decoding_arbitrary_bytes_never_panics(
        bytes in record_bytes(),
        page_size in prop_oneof![Just(4096u64), any::<u64>()],
        boot_ns in any::<u64>(),
    ) {
        let clock = ClockPair { boot_ns, ..clock() };
        if let Ok(event) = record(&bytes, page_size, &clock) {
            // Only full-size records with a known kind decode.
            let want = match event {
                ProbeEvent::OomVictim(_) => size_of::<OomVictimEvent>(),
                ProbeEvent::Cgroup(_) => size_of::<CgroupRecord>(),
                ProbeEvent::Growth(_) => size_of::<GrowthRecord>(),
                _ => unreachable!("decode makes only these"),
            };
            prop_assert_eq!(bytes.len(), want);
        }
    }

    #[test]
    fn oom_victim_round_trips(
        memcg_id in 1u64.., no_memcg in any::<bool>(), pages in 0i64..1 << 40,
        total in 0u64..1 << 40, pid in any::<u32>(), tgid in any::<u32>(),
        trigger in any::<u32>(), age_ns in 0u64..1_000_000_000_000,
        comm in "[a-z0-9_-]{0,15}",
    ) {
        let mut raw_comm = [0u8; COMM_LEN];
        raw_comm[..comm.len()].copy_from_slice(comm.as_bytes());
        let raw = OomVictimEvent {
            kind: RecordKind::OomVictim as u32,
            flags: if no_memcg { OomVictimEvent::FLAG_NO_MEMCG } else { 0 },
            boot_time_ns: clock().boot_ns - age_ns,
            memcg_id,
            total_vm_pages: total,
            anon_rss_pages: pages,
            file_rss_pages: 1,
            shmem_rss_pages: -pages, // percpu counters dip below zero
            pid,
            tgid,
            trigger_tgid: trigger,
            _reserved: 0,
            comm: raw_comm,
        };
        let Ok(ProbeEvent::OomVictim(v)) = record(&bytes_of(&raw), 4096, &clock()) else {
            panic!("a valid OOM record must decode");
        };
        prop_assert_eq!((v.pid, v.tid, v.trigger_pid), (tgid, pid, trigger));
        prop_assert_eq!(v.comm, comm);
        prop_assert_eq!(v.memcg_id, (!no_memcg).then_some(memcg_id));
        prop_assert_eq!(v.anon_rss_bytes, pages as u64 * 4096);
        prop_assert_eq!(v.file_rss_bytes, 4096);
        prop_assert_eq!(v.shmem_rss_bytes, 0);
        prop_assert_eq!(v.total_vm_bytes, total * 4096);
        prop_assert_eq!(v.time, clock().wall - TimeDelta::nanoseconds(age_ns as i64));
    }

    #[test]
    fn cgroup_record_round_trips(
        path in "(/[a-zA-Z0-9_.-]{1,20}){0,10}", id in any::<u64>(),
        level in any::<u32>(), removed in any::<bool>(), tail in any::<u8>(),
    ) {
        let mut raw_path = [tail; CGROUP_PATH_LEN];
        raw_path[..path.len()].copy_from_slice(path.as_bytes());
        raw_path[path.len()] = 0; // what follows the NUL is never read
        let kind = if removed { RecordKind::CgroupRmdir } else { RecordKind::CgroupMkdir };
        let raw = CgroupRecord { kind: kind as u32, level, id, boot_time_ns: 5, path: raw_path };
        let Ok(ProbeEvent::Cgroup(c)) = record(&bytes_of(&raw), 4096, &clock()) else {
            panic!("a valid cgroup record must decode");
        };
        prop_assert_eq!((c.id, c.level, c.removed), (id, level, removed));
        prop_assert_eq!(c.path, path);
    }

    #[test]
    fn growth_record_round_trips(
        line in 1u32..=3, memcg_id in any::<u64>(), usage in 0u64..1 << 40,
        cap in 0u64..1 << 40,
    ) {
        let raw = GrowthRecord {
            kind: RecordKind::Growth as u32, line, memcg_id,
            usage_pages: usage, cap_pages: cap, boot_time_ns: 7,
        };
        let Ok(ProbeEvent::Growth(g)) = record(&bytes_of(&raw), 4096, &clock()) else {
            panic!("a valid growth record must decode");
        };
        prop_assert_eq!(g.memcg_id, memcg_id);
        prop_assert_eq!(g.usage_bytes, usage * 4096);
        prop_assert_eq!(g.cap_bytes, (cap > 0).then_some(cap * 4096));
    }
}

/// TOML that is mostly shaped like a memwatch config, with wrong values.
fn config_toml() -> impl Strategy<Value = String> {
    let key = prop::sample::select(vec![
        "name",
        "cgroup",
        "pid",
        "process",
        "soft_cap",
        "unhealthy_after",
        "recover_after",
        "listen",
        "node_name",
        "state_dir",
        "source",
        "growth_step",
        "webhook",
        "url",
        "secret",
        "bogus",
    ]);
    let value = prop_oneof![
        "\"[ -~]{0,20}\"".prop_map(|s| s.replace('\\', "/")),
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| format!("{f:?}")),
        Just("true".to_string()),
        Just("\"512MiB\"".to_string()),
        Just("\"18446744073709551616\"".to_string()),
        Just("\"90s\"".to_string()),
        Just("\"999999999999999999999h\"".to_string()),
        Just("[]".to_string()),
        Just("{}".to_string()),
    ];
    let table = prop::sample::select(vec!["", "[[worker]]", "[[webhook]]", "[[rule]]", "[probe]"]);
    prop::collection::vec((table, prop::collection::vec((key, value), 0..5)), 0..5).prop_map(
        |sections| {
            let mut text = String::new();
            for (table, pairs) in sections {
                text.push_str(table);
                text.push('\n');
                for (k, v) in pairs {
                    text.push_str(&format!("{k} = {v}\n"));
                }
            }
            text
        },
    )
}

fn load(text: &[u8], dir: &Path) -> Result<Config, ConfigError> {
    let path = dir.join("memwatch.toml");
    std::fs::write(&path, text).unwrap();
    Config::load(Some(&path), &Overrides::default())
}

proptest! {
    #![proptest_config(bounded(500))]

    #[test]
    fn any_config_file_loads_or_is_a_config_error(
        text in prop_oneof![
            config_toml().prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..200),
        ],
    ) {
        let dir = tempfile::tempdir().unwrap();
        match load(&text, dir.path()) {
            Ok(_) | Err(ConfigError::Parse { .. } | ConfigError::Invalid { .. }) => {}
            // The file exists: only bytes that are not UTF-8 may fail the read.
            Err(ConfigError::Read { source, .. })
                if source.kind() == std::io::ErrorKind::InvalidData => {}
            Err(e @ ConfigError::Read { .. }) => panic!("the file exists: {e}"),
        }
    }

    #[test]
    fn mountinfo_never_panics_and_finds_v1_memory(
        lines in prop::collection::vec("[ -~]{0,80}", 0..8),
        mount_point in "/[a-z]{1,8}(/[a-z]{1,8}){0,2}",
        at in 0usize..8,
    ) {
        // Arbitrary lines never panic and never invent a hierarchy.
        let noise = lines.join("\n");
        let found = MemoryHierarchy::from_mountinfo(&noise, |_| None);
        prop_assert!(found.is_none() || noise.contains("cgroup"));
        // A real v1 memory line among them is always found.
        let memory = format!(
            "35 25 0:30 / {mount_point} rw,nosuid - cgroup cgroup rw,memory"
        );
        let mut with = lines.clone();
        with.retain(|l| !l.contains("cgroup"));
        with.insert(at.min(with.len()), memory);
        let h = MemoryHierarchy::from_mountinfo(&with.join("\n"), |_| None)
            .expect("the v1 memory mount");
        prop_assert_eq!(h.root, Path::new(&mount_point));
        prop_assert_eq!(h.version, CgroupVersion::V1);
    }

    #[test]
    fn sizes_and_spans_parse_or_err_without_panic(text in "\\PC{0,24}") {
        let _ = Size::parse(&text);
        let _ = Span::parse(&text);
    }

    #[test]
    fn sizes_round_trip(n in 0u64..1 << 20, unit in 0usize..4) {
        let (suffix, scale) = [("", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("G", 1 << 30)][unit];
        prop_assert_eq!(Size::parse(&format!("{n}{suffix}")), Ok(Size(n * scale)));
        prop_assert_eq!(Span::parse(&format!("{n}s")).map(|s| s.0.as_secs()), Ok(n));
    }
}
