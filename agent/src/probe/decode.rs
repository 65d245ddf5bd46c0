//! Kernel records → [`ProbeEvent`]s. Pure: bytes and clocks in, values out.

use agent_common::{CgroupRecord, GrowthRecord, OomVictimEvent, RecordKind};
use chrono::{DateTime, TimeDelta, Utc};

use super::{CgroupChange, GrowthLine, Line, OomVictim, ProbeEvent};
use crate::model::process::boot_time_ns;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("ring buffer record of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
    #[error("ring buffer record of unknown kind {0}")]
    Kind(u32),
}

/// Decodes any record by its leading kind.
pub fn record(bytes: &[u8], page_size: u64, clock: &ClockPair) -> Result<ProbeEvent, DecodeError> {
    let Some(head) = bytes.get(..4) else {
        return Err(DecodeError::Size {
            got: bytes.len(),
            want: 4,
        });
    };
    let kind = u32::from_ne_bytes(head.try_into().expect("4 bytes"));
    match RecordKind::from_u32(kind) {
        Some(RecordKind::OomVictim) => {
            oom_victim(bytes, page_size, clock).map(ProbeEvent::OomVictim)
        }
        Some(RecordKind::CgroupMkdir | RecordKind::CgroupRmdir) => {
            cgroup(bytes).map(ProbeEvent::Cgroup)
        }
        Some(RecordKind::Growth) => growth(bytes, page_size, clock).map(ProbeEvent::Growth),
        None => Err(DecodeError::Kind(kind)),
    }
}

/// Copies a `#[repr(C)]` record of plain integers out of `bytes`.
fn read_record<T: Copy>(bytes: &[u8]) -> Result<T, DecodeError> {
    let want = size_of::<T>();
    if bytes.len() != want {
        return Err(DecodeError::Size {
            got: bytes.len(),
            want,
        });
    }
    // SAFETY: the length is checked; callers only use integer-only records,
    // valid for every bit pattern; read_unaligned copes with any alignment.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// Decodes one `GrowthRecord`.
pub(crate) fn growth(
    bytes: &[u8],
    page_size: u64,
    clock: &ClockPair,
) -> Result<GrowthLine, DecodeError> {
    let raw: GrowthRecord = read_record(bytes)?;
    let line = match raw.line {
        GrowthRecord::ABOVE_CAP => Line::AboveCap,
        GrowthRecord::BELOW_CAP => Line::BelowCap,
        GrowthRecord::STEP => Line::Step,
        GrowthRecord::SAMPLE => Line::Sample,
        other => return Err(DecodeError::Kind(other)),
    };
    Ok(GrowthLine {
        time: clock.wall_time(raw.boot_time_ns),
        memcg_id: raw.memcg_id,
        line,
        usage_bytes: raw.usage_pages.saturating_mul(page_size),
        cap_bytes: (raw.cap_pages > 0).then(|| raw.cap_pages.saturating_mul(page_size)),
    })
}

/// Decodes one `CgroupRecord`.
pub(crate) fn cgroup(bytes: &[u8]) -> Result<CgroupChange, DecodeError> {
    let raw: CgroupRecord = read_record(bytes)?;
    let len = raw
        .path
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(raw.path.len());
    Ok(CgroupChange {
        id: raw.id,
        path: String::from_utf8_lossy(&raw.path[..len]).into_owned(),
        level: raw.level,
        removed: raw.kind == RecordKind::CgroupRmdir as u32,
    })
}

/// A pair of clock readings taken together, to turn the kernel's boot-time
/// stamps into wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct ClockPair {
    pub boot_ns: u64,
    pub wall: DateTime<Utc>,
}

impl ClockPair {
    /// Reads CLOCK_BOOTTIME (what `bpf_ktime_get_boot_ns` uses) between two
    /// wall-clock readings and pairs it with their midpoint, keeping the
    /// tightest of a few tries: a thread preempted between two readings
    /// (a busy host, a VM's vCPU descheduled) would otherwise shift every
    /// converted stamp by the gap.
    pub fn now() -> Self {
        let mut best: Option<(TimeDelta, Self)> = None;
        for _ in 0..3 {
            let before = Utc::now();
            let boot_ns = boot_time_ns();
            let after = Utc::now();
            let window = after - before;
            let pair = Self {
                boot_ns,
                wall: before + window / 2,
            };
            if best.as_ref().is_none_or(|(w, _)| window < *w) {
                best = Some((window, pair));
            }
            if window < TimeDelta::microseconds(20) {
                break;
            }
        }
        best.map(|(_, pair)| pair).expect("at least one reading")
    }

    /// Wall-clock time of a boot-time stamp.
    pub fn wall_time(&self, boot_ns: u64) -> DateTime<Utc> {
        let age = i64::try_from(self.boot_ns.saturating_sub(boot_ns)).unwrap_or(i64::MAX);
        self.wall - TimeDelta::nanoseconds(age)
    }
}

/// Decodes one `OomVictimEvent` record.
pub(crate) fn oom_victim(
    record: &[u8],
    page_size: u64,
    clock: &ClockPair,
) -> Result<OomVictim, DecodeError> {
    let raw: OomVictimEvent = read_record(record)?;
    let pages = |n: i64| u64::try_from(n).unwrap_or(0).saturating_mul(page_size);
    let comm_len = raw
        .comm
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(raw.comm.len());
    Ok(OomVictim {
        time: clock.wall_time(raw.boot_time_ns),
        pid: raw.tgid,
        tid: raw.pid,
        comm: String::from_utf8_lossy(&raw.comm[..comm_len]).into_owned(),
        memcg_id: (raw.flags & OomVictimEvent::FLAG_NO_MEMCG == 0 && raw.memcg_id != 0)
            .then_some(raw.memcg_id),
        anon_rss_bytes: pages(raw.anon_rss_pages),
        file_rss_bytes: pages(raw.file_rss_pages),
        shmem_rss_bytes: pages(raw.shmem_rss_pages),
        total_vm_bytes: raw.total_vm_pages.saturating_mul(page_size),
        trigger_pid: raw.trigger_tgid,
        read_at: std::time::Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use agent_common::COMM_LEN;

    use super::*;

    fn bytes_of<T>(value: &T) -> Vec<u8> {
        // SAFETY: callers pass #[repr(C)] structs of integers without padding.
        unsafe { std::slice::from_raw_parts((value as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    fn record(event: &OomVictimEvent) -> Vec<u8> {
        bytes_of(event)
    }

    #[test]
    fn records_are_told_apart_by_kind() {
        let oom = super::record(&record(&sample()), 4096, &ClockPair::now()).unwrap();
        assert!(matches!(oom, ProbeEvent::OomVictim(_)));
        let mut path = [0u8; agent_common::CGROUP_PATH_LEN];
        path[..6].copy_from_slice(b"/a/job");
        let raw = CgroupRecord {
            kind: RecordKind::CgroupRmdir as u32,
            level: 2,
            id: 77,
            boot_time_ns: 1,
            path,
        };
        let ProbeEvent::Cgroup(change) =
            super::record(&bytes_of(&raw), 4096, &ClockPair::now()).unwrap()
        else {
            panic!("a cgroup record")
        };
        assert_eq!(
            change,
            CgroupChange {
                id: 77,
                path: "/a/job".into(),
                level: 2,
                removed: true
            }
        );
        let mut junk = bytes_of(&raw);
        junk[..4].copy_from_slice(&9u32.to_ne_bytes());
        assert_eq!(
            super::record(&junk, 4096, &ClockPair::now()),
            Err(DecodeError::Kind(9))
        );
        assert!(super::record(&[1, 0], 4096, &ClockPair::now()).is_err());

        let growth = GrowthRecord {
            kind: RecordKind::Growth as u32,
            line: GrowthRecord::ABOVE_CAP,
            memcg_id: 5,
            usage_pages: 100,
            cap_pages: 64,
            boot_time_ns: 1,
        };
        let ProbeEvent::Growth(line) =
            super::record(&bytes_of(&growth), 4096, &ClockPair::now()).unwrap()
        else {
            panic!("a growth record")
        };
        assert_eq!(
            (line.line, line.usage_bytes, line.cap_bytes),
            (Line::AboveCap, 409600, Some(262144))
        );
        let sample = GrowthRecord {
            line: GrowthRecord::SAMPLE,
            cap_pages: 0,
            ..growth
        };
        let ProbeEvent::Growth(line) =
            super::record(&bytes_of(&sample), 4096, &ClockPair::now()).unwrap()
        else {
            panic!("a growth record")
        };
        assert_eq!(
            (line.line, line.usage_bytes, line.cap_bytes),
            (Line::Sample, 409600, None)
        );
        let unknown = GrowthRecord { line: 9, ..growth };
        assert_eq!(
            super::record(&bytes_of(&unknown), 4096, &ClockPair::now()),
            Err(DecodeError::Kind(9))
        );
    }

    fn sample() -> OomVictimEvent {
        let mut comm = [0u8; COMM_LEN];
        comm[..6].copy_from_slice(b"memhog");
        OomVictimEvent {
            kind: RecordKind::OomVictim as u32,
            flags: 0,
            boot_time_ns: 9_000_000_000,
            memcg_id: 4242,
            total_vm_pages: 100,
            anon_rss_pages: 50,
            file_rss_pages: 2,
            shmem_rss_pages: -1, // percpu counters can dip below zero
            pid: 11,
            tgid: 10,
            trigger_tgid: 10,
            _reserved: 0,
            comm,
        }
    }

    #[test]
    fn decodes_fields_and_converts_pages_and_time() {
        let wall = DateTime::parse_from_rfc3339("2026-11-30T08:00:00Z")
            .unwrap()
            .to_utc();
        let clock = ClockPair {
            boot_ns: 10_000_000_000,
            wall,
        };
        let v = oom_victim(&record(&sample()), 4096, &clock).unwrap();
        assert_eq!((v.pid, v.tid, v.comm.as_str()), (10, 11, "memhog"));
        assert_eq!(v.memcg_id, Some(4242));
        assert_eq!(v.anon_rss_bytes, 50 * 4096);
        assert_eq!(v.shmem_rss_bytes, 0);
        assert_eq!(v.rss_bytes(), 52 * 4096);
        assert_eq!(v.total_vm_bytes, 100 * 4096);
        assert_eq!(v.time, wall - TimeDelta::seconds(1));
    }

    #[test]
    fn unreadable_memcg_is_none() {
        let mut raw = sample();
        raw.flags = OomVictimEvent::FLAG_NO_MEMCG;
        let v = oom_victim(&record(&raw), 4096, &ClockPair::now()).unwrap();
        assert_eq!(v.memcg_id, None);
    }

    #[test]
    fn wrong_size_is_an_error() {
        let err = oom_victim(&[0u8; 7], 4096, &ClockPair::now()).unwrap_err();
        assert_eq!(
            err,
            DecodeError::Size {
                got: 7,
                want: size_of::<OomVictimEvent>()
            }
        );
    }
}
