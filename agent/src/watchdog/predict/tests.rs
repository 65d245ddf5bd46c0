//! Synthetic series against the predictor: each shape a workload makes.

use super::*;

const MIB: f64 = (1u64 << 20) as f64;
const LIMIT: u64 = 512 << 20;
/// Samples per second, as the sampler takes them near a limit.
const HZ: f64 = 10.0;

/// Deterministic noise in ±`amp` bytes (a fixed-seed LCG).
struct Noise(u64);
impl Noise {
    fn next(&mut self, amp: f64) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * amp
    }
}

/// Feeds `shape(t)` (bytes at second t) at [`HZ`] from 0 to `secs`, and
/// calls `check(t, prediction)` after every sample.
fn run(
    secs: f64,
    shape: impl Fn(f64) -> f64,
    limits: impl Fn(u64) -> Vec<Limit>,
    high: Option<u64>,
    mut check: impl FnMut(f64, Option<Prediction>),
) {
    let start = Instant::now();
    let mut series = Series::default();
    let mut noise = Noise(42);
    let steps = (secs * HZ) as u64;
    for k in 0..=steps {
        let t = k as f64 / HZ;
        let bytes = (shape(t) + noise.next(128.0 * 1024.0)).max(0.0) as u64;
        series.push(start + Duration::from_secs_f64(t), bytes);
        check(t, series.predict(&limits(bytes), high));
    }
}

fn own(used: u64) -> Vec<Limit> {
    vec![Limit {
        owner: LimitOwner::Own,
        bytes: LIMIT,
        used,
    }]
}

/// A sawtooth between `low(t)` and `low(t) + amp`, period `period`.
fn sawtooth(t: f64, period: f64, low: f64, amp: f64) -> f64 {
    low + amp * (t % period) / period
}

#[test]
fn linear_leaks_get_an_eta_within_20_percent_of_the_truth() {
    for rate_mib in [2.0, 10.0, 40.0] {
        let rate = rate_mib * MIB;
        let base = 100.0 * MIB;
        // Judge once the leak has gone a quarter of the way to the limit.
        let at = (LIMIT as f64 - base) / rate / 4.0;
        let mut judged = 0;
        run(
            at * 3.0,
            |t| base + rate * t,
            own,
            None,
            |t, p| {
                if t < at.max(MIN_RISE.as_secs_f64() + 0.5) {
                    return;
                }
                let p = p.unwrap_or_else(|| panic!("{rate_mib} MiB/s at {t:.1}s: no prediction"));
                let truth = (LIMIT as f64 - (base + rate * t)) / rate;
                let eta = p.eta.as_secs_f64();
                // The last fraction of a second is all noise; 20 % of it is less
                // than one sample.
                if truth > 1.0 {
                    assert!(
                        (eta - truth).abs() <= 0.2 * truth,
                        "{rate_mib} MiB/s at {t:.1}s: eta {eta:.2} truth {truth:.2}"
                    );
                }
                assert!((p.rate_bytes_per_second / rate - 1.0).abs() < 0.2);
                assert_eq!(p.limit.owner, LimitOwner::Own);
                assert!(!p.throttled);
                assert!(p.confidence >= MIN_CONFIDENCE && p.confidence <= 1.0);
                judged += 1;
            },
        );
        assert!(judged > 10, "{rate_mib} MiB/s: judged {judged} times");
    }
}

#[test]
fn a_steady_sawtooth_between_50_and_90_percent_gives_none() {
    let l = LIMIT as f64;
    for period in [2.0, 3.5, 5.0] {
        let mut troughs_seen = false;
        run(
            300.0,
            |t| sawtooth(t, period, 0.5 * l, 0.4 * l),
            own,
            None,
            |t, p| {
                // The first tooth is a rise from nothing like a leak's: it can
                // only be told apart once it has fallen once, or while it
                // is younger than a rise that is judged.
                troughs_seen |= t > period || period < MIN_RISE.as_secs_f64();
                if troughs_seen {
                    assert_eq!(p, None, "period {period}s at {t:.1}s");
                }
            },
        );
    }
}

#[test]
fn a_first_allocation_then_a_short_first_tooth_is_not_called_imminent() {
    // A heap's start as `bench predict`'s sawtooth makes it: nothing for
    // 2 s, half the limit at once, then a 40 % tooth over 2.8 s that falls.
    let l = LIMIT as f64;
    run(
        12.0,
        |t| match t {
            t if t < 2.0 => 0.0,
            t if t < 4.8 => 0.5 * l + 0.4 * l * (t - 2.0) / 2.8,
            t => sawtooth(t - 4.8, 3.5, 0.5 * l, 0.4 * l),
        },
        own,
        None,
        |t, p| assert_eq!(p, None, "at {t:.1}s"),
    );
}

#[test]
fn rising_troughs_give_a_prediction() {
    let l = LIMIT as f64;
    let rise = 2.0 * MIB;
    let mut first = None;
    run(
        60.0,
        |t| sawtooth(t, 3.0, 0.3 * l + rise * t, 0.2 * l),
        own,
        None,
        |t, p| {
            if let Some(p) = p {
                first.get_or_insert(t);
                if t > 15.0 {
                    assert!(
                        (p.rate_bytes_per_second / rise - 1.0).abs() < 0.5,
                        "rate {} at {t:.1}",
                        p.rate_bytes_per_second / MIB
                    );
                }
            } else {
                assert!(first.is_none() || t < 15.0, "lost the leak at {t:.1}s");
            }
        },
    );
    assert!(first.is_some_and(|t| t < 15.0), "first said at {first:?}");
}

#[test]
fn steps_with_plateaus_give_none_on_the_plateau() {
    // 64 MiB every 10 s, then flat: nothing once a step has settled.
    let step = 64.0 * MIB;
    let shape = |t: f64| 64.0 * MIB + step * (t / 10.0).floor().min(5.0);
    run(120.0, shape, own, None, |t, p| {
        let since_step = if t < 60.0 { t % 10.0 } else { t - 50.0 };
        if since_step >= 5.0 {
            assert_eq!(p, None, "at {t:.1}s, {since_step:.1}s into a plateau");
        }
    });
}

#[test]
fn page_cache_growth_alone_gives_none() {
    // The series is the unreclaimable part (cgroup::memory::unreclaimable
    // leaves page cache out; its own test shows cache growth does not move
    // it): flat anon under a cache stream that fills the cgroup.
    run(
        120.0,
        |_| 0.93 * LIMIT as f64,
        own,
        None,
        |t, p| {
            assert_eq!(p, None, "at {t:.1}s");
        },
    );
}

#[test]
fn above_memory_high_the_throttled_rate_is_used_and_said() {
    let l = LIMIT as f64;
    let high = (0.9 * l) as u64;
    let fast = 20.0 * MIB;
    let slow = 2.0 * MIB;
    let crossed = (high as f64 - 100.0 * MIB) / fast;
    let shape = |t: f64| {
        if t < crossed {
            100.0 * MIB + fast * t
        } else {
            high as f64 + slow * (t - crossed)
        }
    };
    let mut judged = 0;
    run(crossed + 15.0, shape, own, Some(high), |t, p| {
        if t < crossed + MIN_SPAN.as_secs_f64() + 1.0 {
            return;
        }
        let p = p.expect("a throttled leak is still a leak");
        assert!(p.throttled);
        let truth = (l - shape(t)) / slow;
        let eta = p.eta.as_secs_f64();
        assert!(
            (eta - truth).abs() <= 0.2 * truth,
            "at {t:.1}s eta {eta:.1} truth {truth:.1}"
        );
        judged += 1;
    });
    assert!(judged > 50);
}

/// A leak of 20 MiB/s up to `memory.high` (0.9 × the limit), then the
/// kernel's crawl above it: 1 MiB every `every` seconds (as bench predict's
/// v2 runs show it, 0.05–0.1 MiB/s), flat from `stops` seconds after the
/// crossing. Returns the shape and when it crossed.
fn throttled_staircase(every: f64, stops: f64) -> (impl Fn(f64) -> f64, f64, u64) {
    let high = (0.9 * LIMIT as f64) as u64;
    let fast = 20.0 * MIB;
    let crossed = (high as f64 - 100.0 * MIB) / fast;
    let shape = move |t: f64| {
        if t < crossed {
            100.0 * MIB + fast * t
        } else {
            high as f64 + ((t - crossed).min(stops) / every).floor() * MIB
        }
    };
    (shape, crossed, high)
}

#[test]
fn a_leak_throttled_to_a_crawl_above_memory_high_is_still_followed() {
    let every = 12.0;
    let (shape, crossed, high) = throttled_staircase(every, f64::INFINITY);
    let (mut judged, mut seen) = (0, 0);
    // From a whole window above memory.high on: the staircase's median
    // slope is 0 and its rise far below 1 % of the level.
    run(crossed + 150.0, &shape, own, Some(high), |t, p| {
        if t < crossed + WINDOW.as_secs_f64() {
            return;
        }
        judged += 1;
        let Some(p) = p else { return };
        seen += 1;
        assert!(p.throttled);
        let truth = (LIMIT as f64 - shape(t)) / (MIB / every);
        let eta = p.eta.as_secs_f64();
        assert!(
            (eta - truth).abs() <= 0.35 * truth,
            "at {t:.1}s eta {eta:.1} truth {truth:.1}"
        );
    });
    assert!(judged > 1000 && seen == judged, "{seen} of {judged}");
}

#[test]
fn growth_that_stops_above_memory_high_predicts_nothing() {
    let (shape, crossed, high) = throttled_staircase(10.0, 40.0);
    let mut judged = 0;
    run(crossed + 120.0, &shape, own, Some(high), |t, p| {
        // Half a window after the last step, the later half is flat.
        if t >= crossed + 40.0 + WINDOW.as_secs_f64() / 2.0 + 1.0 {
            assert!(p.is_none(), "at {t:.1}s: {p:?}");
            judged += 1;
        }
    });
    assert!(judged > 400);
}

#[test]
fn below_memory_high_only_a_limit_reached_before_the_throttling_counts() {
    let (shape, crossed, high) = throttled_staircase(10.0, f64::INFINITY);
    let judge = |limits: &dyn Fn(u64) -> Vec<Limit>, high: u64| {
        let (mut some, mut looks) = (0, 0);
        run(crossed - 0.5, &shape, limits, Some(high), |t, p| {
            if t > crossed - 4.0 {
                looks += 1;
                some += usize::from(p.is_some());
            }
        });
        (some, looks)
    };
    // Its own limit 11 % above memory.high: the kernel will hold the leak
    // at a crawl, which no ETA of the rate now describes.
    let (some, looks) = judge(&own, high);
    assert_eq!(
        some, 0,
        "{some} of {looks} predicted against a throttled limit"
    );
    // An ancestor's limit below memory.high is reached at the rate now.
    let ancestor = |used: u64| {
        let mut limits = own(used);
        limits.push(Limit {
            owner: LimitOwner::Ancestor("/sys/fs/cgroup/parent".into()),
            bytes: high - 4 * (1 << 20),
            used,
        });
        limits
    };
    let (some, looks) = judge(&ancestor, high);
    assert!(some == looks && looks > 30, "{some} of {looks}");
    // memory.high within 2 % of the limit throttles little: the limit counts.
    let (some, looks) = judge(&own, LIMIT / 100 * 99);
    assert!(some == looks && looks > 30, "{some} of {looks}");
}

#[test]
fn an_ancestors_smaller_headroom_is_the_limit_chosen() {
    let parent = PathBuf::from("/sys/fs/cgroup/memory/job");
    let limits = |used: u64| {
        vec![
            Limit {
                owner: LimitOwner::Own,
                bytes: 4 * LIMIT,
                used,
            },
            // The parent holds a sibling's 200 MiB besides this cgroup.
            Limit {
                owner: LimitOwner::Ancestor(parent.clone()),
                bytes: LIMIT,
                used: used + (200 << 20),
            },
            Limit {
                owner: LimitOwner::Host,
                bytes: 16 * LIMIT,
                used: 2 * LIMIT,
            },
        ]
    };
    let rate = 10.0 * MIB;
    let mut judged = 0;
    run(
        12.0,
        |t| 50.0 * MIB + rate * t,
        limits,
        None,
        |t, p| {
            if t < MIN_RISE.as_secs_f64() + 0.5 {
                return;
            }
            let p = p.expect("a leak");
            assert_eq!(p.limit.owner, LimitOwner::Ancestor(parent.clone()));
            assert_eq!(p.limit.bytes, LIMIT);
            let truth = (LIMIT as f64 - 200.0 * MIB - (50.0 * MIB + rate * t)) / rate;
            assert!((p.eta.as_secs_f64() - truth).abs() <= 0.2 * truth);
            judged += 1;
        },
    );
    assert!(judged > 10);
}

#[test]
fn near_a_limit_is_within_half_of_any() {
    assert!(!near_a_limit(&own(LIMIT / 2 - 1)));
    assert!(near_a_limit(&own(LIMIT / 2)));
    assert!(!near_a_limit(&[]));
    let host = |used| Limit {
        owner: LimitOwner::Host,
        bytes: LIMIT,
        used,
    };
    assert!(
        !near_a_limit(&[host(LIMIT - 1)]),
        "the host's memory is not"
    );
}

#[test]
fn the_window_and_the_sample_count_are_bounded() {
    let start = Instant::now();
    let mut s = Series::default();
    for k in 0..10_000u64 {
        s.push(start + Duration::from_millis(k), k);
    }
    assert_eq!(s.samples.len(), MAX_SAMPLES);
    s.push(start, 0);
    assert_eq!(s.last(), Some(9_999), "a sample from the past is ignored");
    s.push(start + Duration::from_secs(100), 1);
    assert_eq!(s.samples.len(), 1, "older than the window: gone");
}

/// The count of flat newest samples (what spares an idle series its scan)
/// says "never moved" exactly when every sample in the window is the same,
/// through pushes, a sample from the past, the count bound and the window.
#[test]
fn a_series_is_flat_exactly_when_every_sample_is_the_same() {
    let start = Instant::now();
    let mut s = Series::default();
    let mut x = 0x9e37_79b9_7f4a_7c15_u64;
    let mut t = 0u64;
    for k in 0..20_000u64 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // Long flat runs, a change now and then, gaps past the window.
        let value = if x.is_multiple_of(97) {
            k
        } else {
            s.last().unwrap_or(0)
        };
        t += match x % 1000 {
            0 => 40_000,
            1 => 0,
            _ => 100,
        };
        let at = if x.is_multiple_of(501) {
            t.saturating_sub(5_000)
        } else {
            t
        };
        s.push(start + Duration::from_millis(at), value);
        let last = s.last().expect("a sample");
        let all_same = s.samples.iter().all(|&(_, b)| b == last);
        assert_eq!(s.flat == s.samples.len(), all_same, "after {k} pushes");
        assert!(s.flat >= 1 && s.flat <= s.samples.len());
    }
}

/// `memshape rising` of `cargo xtask bench predict`: teeth of 40 % of the
/// limit whose troughs rise 4 % a tooth, so a peak reaches the limit long
/// before a trough does.
fn rising_heap(t: f64) -> f64 {
    let l = LIMIT as f64;
    let period = 3.5;
    let tooth = (t / period).floor();
    let low = (0.40 + 0.04 * tooth) * l;
    let into = (t % period) / period;
    low + 0.40 * l * (into / 0.8).min(1.0)
}

#[test]
fn rising_troughs_are_warned_of_before_a_peak_reaches_the_limit() {
    let l = LIMIT as f64;
    // The first peak at the limit: trough 0.60, in the 6th tooth's rise.
    let kill = 5.0 * 3.5 + 0.8 * 3.5;
    let mut first = None;
    let mut at_five = None;
    run(kill - 0.1, rising_heap, own, None, |t, p| {
        if let Some(p) = &p
            && p.eta.as_secs_f64() <= 60.0
        {
            first.get_or_insert(t);
        }
        if (t - (kill - 5.0)).abs() < 0.05 {
            at_five = p.map(|p| p.eta.as_secs_f64());
        }
    });
    let first = first.expect("never warned");
    assert!(
        kill - first >= 5.0,
        "warned {:.1} s before the kill",
        kill - first
    );
    // Five seconds before the kill the ETA counts the next peak, not the
    // troughs' far later arrival at the limit.
    let eta = at_five.expect("an ETA 5 s before the kill");
    assert!(
        eta < 10.0,
        "ETA {eta:.1} s with 5 s left (troughs alone: {:.0} s)",
        (l * 0.4) / (0.04 * l / 3.5)
    );
}

/// `memshape sawtooth` of `cargo xtask bench predict`: idle for 2 s, then
/// teeth from 50 to 90 % of the limit, each 2–5 s long (drawn from
/// `seed`): a ramp over 80 % of the tooth, a hold, and a collection that
/// frees 40 % of the limit over 150 ms.
fn memshape_sawtooth(seed: u64, secs: f64) -> impl Fn(f64) -> f64 {
    let l = LIMIT as f64;
    let mut draws = Noise(seed);
    let mut teeth = Vec::new();
    let mut at = 2.0;
    while at < secs {
        let period = 3.5 + draws.next(1.5);
        teeth.push((at, period));
        at += period;
    }
    move |t| {
        let Some(&(start, period)) = teeth.iter().rev().find(|(s, _)| *s <= t) else {
            return 0.0;
        };
        let into = t - start;
        let fall = (0.15 - into).max(0.0) / 0.15;
        // The end of the previous tooth's collection, then this one's ramp.
        let ramp = (into / (0.8 * period)).min(1.0);
        if start > 2.0 && fall > 0.0 {
            0.5 * l + 0.4 * l * fall
        } else {
            0.5 * l + 0.4 * l * ramp
        }
    }
}

/// A steady garbage-collected heap, sampled as the agent samples it (once
/// a second until half the limit, then ten times a second, at any phase):
/// no sample caught mid-collection, no first tooth shorter than the next,
/// no trough sampled a little into the next ramp is read as a leak.
#[test]
fn a_collected_heap_sampled_at_any_phase_is_never_called_imminent() {
    let secs = 240.0;
    for seed in 1..=8u64 {
        let shape = memshape_sawtooth(seed, secs);
        for phase in [0.0, 0.025, 0.05, 0.075] {
            let start = Instant::now();
            let mut series = Series::default();
            let (mut t, mut last_full) = (phase, f64::MIN);
            while t < secs {
                let near = series.last().is_some_and(|b| 2 * b >= LIMIT);
                if near || t - last_full >= 1.0 {
                    if t - last_full >= 1.0 {
                        last_full = t;
                    }
                    let bytes = shape(t) as u64;
                    series.push(start + Duration::from_secs_f64(t), bytes);
                    if let Some(p) = series.predict(&own(bytes), None) {
                        assert!(
                            p.eta.as_secs_f64() > 60.0,
                            "seed {seed}, phase {phase}: at {t:.2}s ({:.0} MiB) \
                             a kill in {:.1}s at {:.2} MiB/s",
                            bytes as f64 / MIB,
                            p.eta.as_secs_f64(),
                            p.rate_bytes_per_second / MIB,
                        );
                    }
                }
                t += 0.1;
            }
        }
    }
}
