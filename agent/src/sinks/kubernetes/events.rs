//! Deduplicating and rate-limiting Events the way kubelet's recorder does:
//! an Event like one sent within the last 6 minutes (same object, type and
//! reason) counts in that Event's `series` instead of making a new one;
//! and each object gets at most 25 Events at once, then one per 5 minutes
//! (client-go's spam filter), the rest counted and not sent. Clocked by the
//! memwatch events' own times: pure, and the same after a replay.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};

use super::objects::{EventSpec, Regarding};

/// Like Events within this window of the last one are its series.
pub(crate) const SERIES_WINDOW: Duration = Duration::minutes(6);
/// Events an object may get at once.
pub(crate) const BURST: f64 = 25.0;
/// Then one per this.
pub(crate) const REFILL: Duration = Duration::minutes(5);
/// Objects and series remembered; past it the oldest are forgotten (an
/// Event then starts a new series: more Events, never fewer).
pub(crate) const MAX_TRACKED: usize = 4096;

/// What to do with the next Event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Create it under its own name.
    Create,
    /// Count it in the series of the Event `name` (`count` once patched).
    Series { name: String, count: i32 },
    /// Over the object's rate: not sent.
    RateLimited,
}

type Key = (Regarding, &'static str, &'static str);

#[derive(Debug)]
struct Series {
    name: String,
    count: i32,
    last: DateTime<Utc>,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: DateTime<Utc>,
}

/// The Events sent lately, per object and per series.
#[derive(Debug, Default)]
pub(crate) struct EventLog {
    series: HashMap<Key, Series>,
    buckets: HashMap<Regarding, Bucket>,
}

impl EventLog {
    /// What to do with `spec`, happening at `at`. Takes nothing: a send
    /// that fails and is tried again must not spend the object's rate.
    pub(crate) fn next(&mut self, spec: &EventSpec, at: DateTime<Utc>) -> Next {
        if self.bucket(&spec.regarding, at).tokens < 1.0 {
            return Next::RateLimited;
        }
        match self.series.get(&key(spec)) {
            Some(s) if at - s.last <= SERIES_WINDOW => Next::Series {
                name: s.name.clone(),
                count: s.count + 1,
            },
            _ => Next::Create,
        }
    }

    /// `spec` was sent: created as `name`, or counted in its series. Takes
    /// one of the object's tokens.
    pub(crate) fn sent(&mut self, spec: &EventSpec, next: &Next, name: &str, at: DateTime<Utc>) {
        let entry = match next {
            Next::Create => Series {
                name: name.to_string(),
                count: 1,
                last: at,
            },
            Next::Series { name, count } => Series {
                name: name.clone(),
                count: *count,
                last: at,
            },
            Next::RateLimited => return,
        };
        self.bucket(&spec.regarding, at).tokens -= 1.0;
        self.series.insert(key(spec), entry);
        self.forget_oldest();
    }

    /// The object's bucket, refilled up to `at`.
    fn bucket(&mut self, regarding: &Regarding, at: DateTime<Utc>) -> &mut Bucket {
        let bucket = self
            .buckets
            .entry(regarding.clone())
            .or_insert(Bucket { tokens: BURST, at });
        let elapsed = (at - bucket.at).max(Duration::zero());
        let refilled = elapsed.num_milliseconds() as f64 / REFILL.num_milliseconds() as f64;
        bucket.tokens = (bucket.tokens + refilled).min(BURST);
        bucket.at = bucket.at.max(at);
        bucket
    }

    /// A series whose Event the API no longer has (expired, 1 h by
    /// default): the next one starts anew.
    pub(crate) fn forget(&mut self, spec: &EventSpec) {
        self.series.remove(&key(spec));
    }

    fn forget_oldest(&mut self) {
        evict_oldest(&mut self.series, |s| s.last);
        evict_oldest(&mut self.buckets, |b| b.at);
    }
}

/// Past [`MAX_TRACKED`] entries, forgets the one `at` says is oldest.
fn evict_oldest<K: Clone + Eq + std::hash::Hash, V>(
    map: &mut HashMap<K, V>,
    at: impl Fn(&V) -> DateTime<Utc>,
) {
    if map.len() > MAX_TRACKED
        && let Some(oldest) = map
            .iter()
            .min_by_key(|(_, v)| at(v))
            .map(|(k, _)| k.clone())
    {
        map.remove(&oldest);
    }
}

fn key(spec: &EventSpec) -> Key {
    (spec.regarding.clone(), spec.type_, spec.reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(pod: &str) -> EventSpec {
        EventSpec {
            regarding: Regarding::Pod {
                namespace: "ns".into(),
                name: pod.into(),
                uid: format!("uid-{pod}"),
            },
            type_: "Warning",
            reason: "OOMKilling",
            action: "Observe",
            note: "killed".into(),
        }
    }

    fn at(secs: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap()
    }

    #[test]
    fn like_events_within_six_minutes_are_one_series() {
        let mut log = EventLog::default();
        let s = spec("a");
        assert_eq!(log.next(&s, at(0)), Next::Create);
        log.sent(&s, &Next::Create, "e1", at(0));
        let next = log.next(&s, at(60));
        assert_eq!(
            next,
            Next::Series {
                name: "e1".into(),
                count: 2
            }
        );
        log.sent(&s, &next, "", at(60));
        // 6 minutes after the last one, not the first.
        let next = log.next(&s, at(60 + 360));
        assert_eq!(
            next,
            Next::Series {
                name: "e1".into(),
                count: 3
            }
        );
        log.sent(&s, &next, "", at(420));
        assert_eq!(
            log.next(&s, at(420 + 361)),
            Next::Create,
            "past the window: a new Event"
        );
        // Another pod is another series.
        assert_eq!(log.next(&spec("b"), at(800)), Next::Create);
    }

    #[test]
    fn an_object_gets_25_events_then_one_per_five_minutes() {
        let mut log = EventLog::default();
        let s = spec("a");
        let send = |log: &mut EventLog, s: &EventSpec, t| {
            let next = log.next(s, at(t));
            log.sent(s, &next, "e", at(t));
            next != Next::RateLimited
        };
        // Asking again (a send that failed is retried) spends nothing.
        for _ in 0..40 {
            assert_ne!(log.next(&s, at(0)), Next::RateLimited);
        }
        let sent = (0..40).filter(|_| send(&mut log, &s, 0)).count();
        assert_eq!(sent, 25);
        assert!(!send(&mut log, &s, 299));
        assert!(send(&mut log, &s, 300), "one token back after 5 minutes");
        assert!(!send(&mut log, &s, 301));
        // Another object has its own bucket.
        assert!(send(&mut log, &spec("b"), 301));
    }

    #[test]
    fn what_it_remembers_is_bounded() {
        let mut log = EventLog::default();
        for i in 0..(MAX_TRACKED + 10) {
            let s = spec(&i.to_string());
            let next = log.next(&s, at(i as i64));
            log.sent(&s, &next, &i.to_string(), at(i as i64));
        }
        assert!(log.series.len() <= MAX_TRACKED && log.buckets.len() <= MAX_TRACKED);
        // The newest are kept.
        let last = spec(&(MAX_TRACKED + 9).to_string());
        assert!(matches!(
            log.next(&last, at(MAX_TRACKED as i64 + 20)),
            Next::Series { .. }
        ));
    }
}
