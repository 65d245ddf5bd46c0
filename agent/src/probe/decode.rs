//! Kernel records → [`ProbeEvent`]s. Pure: bytes and clocks in, values out.

use agent_common::OomVictimEvent;
use chrono::{DateTime, TimeDelta, Utc};

use super::OomVictim;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("ring buffer record of {got} bytes, expected {want}")]
    Size { got: usize, want: usize },
}

/// A pair of clock readings taken together, to turn the kernel's boot-time
/// stamps into wall-clock time.
#[derive(Clone, Copy, Debug)]
pub struct ClockPair {
    pub boot_ns: u64,
    pub wall: DateTime<Utc>,
}

impl ClockPair {
    /// Reads CLOCK_BOOTTIME (what `bpf_ktime_get_boot_ns` uses) and the wall clock.
    pub fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec; CLOCK_BOOTTIME exists on every
        // kernel that can run the probe.
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        let boot_ns = (ts.tv_sec as u64).saturating_mul(1_000_000_000) + ts.tv_nsec as u64;
        Self {
            boot_ns,
            wall: Utc::now(),
        }
    }

    /// Wall-clock time of a boot-time stamp.
    pub fn wall_time(&self, boot_ns: u64) -> DateTime<Utc> {
        let age = i64::try_from(self.boot_ns.saturating_sub(boot_ns)).unwrap_or(i64::MAX);
        self.wall - TimeDelta::nanoseconds(age)
    }
}

/// Decodes one `OomVictimEvent` record.
pub fn oom_victim(
    record: &[u8],
    page_size: u64,
    clock: &ClockPair,
) -> Result<OomVictim, DecodeError> {
    let want = size_of::<OomVictimEvent>();
    if record.len() != want {
        return Err(DecodeError::Size {
            got: record.len(),
            want,
        });
    }
    // SAFETY: the length is checked; OomVictimEvent is plain integers, valid
    // for every bit pattern; read_unaligned copes with any alignment.
    let raw: OomVictimEvent = unsafe { std::ptr::read_unaligned(record.as_ptr().cast()) };
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
    })
}

#[cfg(test)]
mod tests {
    use agent_common::COMM_LEN;

    use super::*;

    fn record(event: &OomVictimEvent) -> Vec<u8> {
        // SAFETY: a #[repr(C)] struct of integers without padding.
        unsafe {
            std::slice::from_raw_parts(
                (event as *const OomVictimEvent).cast::<u8>(),
                size_of::<OomVictimEvent>(),
            )
        }
        .to_vec()
    }

    fn sample() -> OomVictimEvent {
        let mut comm = [0u8; COMM_LEN];
        comm[..6].copy_from_slice(b"memhog");
        OomVictimEvent {
            boot_time_ns: 9_000_000_000,
            memcg_id: 4242,
            total_vm_pages: 100,
            anon_rss_pages: 50,
            file_rss_pages: 2,
            shmem_rss_pages: -1, // percpu counters can dip below zero
            pid: 11,
            tgid: 10,
            trigger_tgid: 10,
            flags: 0,
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
