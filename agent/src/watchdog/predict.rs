//! When will a cgroup hit its first limit: a robust trend over the part of
//! its memory that reclaim cannot free, against every limit above it.
//!
//! Pure: samples (monotonic time, unreclaimable bytes) and the limits in,
//! a [`Prediction`] out. How it judges (lower envelope, Theil–Sen, the
//! throttled rate above `memory.high`) is argued in docs/design.md,
//! "Predicting the kill".

use std::{collections::VecDeque, path::PathBuf, time::Duration};

use tokio::time::Instant;

/// How far back the trend looks.
pub(crate) const WINDOW: Duration = Duration::from_secs(30);
/// Samples kept at most (10/s over the window, with room).
pub(crate) const MAX_SAMPLES: usize = 400;
/// The trend is fitted on at most this many envelope points (evenly
/// thinned), so a fit costs at most ~5000 pairwise slopes.
const MAX_FIT_POINTS: usize = 100;
/// No judgement from fewer points or a shorter span than these.
const MIN_POINTS: usize = 5;
const MIN_SPAN: Duration = Duration::from_secs(2);
/// A rise is judged only once it has gone on this long: a garbage
/// collector's first tooth (2–5 s) falls before, and a leak that kills
/// sooner after it starts cannot be warned of seconds ahead anyway.
pub(crate) const MIN_RISE: Duration = Duration::from_secs(5);
/// A fall this large (the larger of 1 MiB and 2 % of the level) below the
/// running peak is a drop: the series is a sawtooth, judged by troughs.
pub(crate) const DROP_MIN_BYTES: u64 = 1 << 20;
const DROP_FRACTION: f64 = 0.02;
/// The recent half of the fit must still grow at this fraction of the
/// whole fit's rate, judged on this low quantile of its pairwise slopes:
/// growth that stopped (a plateau) predicts nothing.
const RECENT_FRACTION: f64 = 0.25;
const RECENT_QUANTILE: f64 = 0.35;
/// Growth must reach this share of the level (and at least a drop's
/// minimum) over the fit's span to count.
const GROWTH_FRACTION: f64 = 0.01;
/// Below this confidence nothing is predicted.
pub(crate) const MIN_CONFIDENCE: f64 = 0.5;
/// Up to this share above `memory.high` the kernel's throttling is light
/// (its penalty at 2 % is ~25 ms per 256 KiB charged); beyond it, growth
/// slows to a crawl (see [`throttled_trend`]).
const LIGHT_OVERAGE: f64 = 0.02;

/// Whose limit it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum LimitOwner {
    /// The cgroup's own limit.
    Own,
    /// An ancestor's, at this path.
    Ancestor(PathBuf),
    /// The host's memory (a global OOM).
    Host,
}

/// One limit the cgroup's growth counts against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Limit {
    pub owner: LimitOwner,
    /// The limit (`memory.max`, `limit_in_bytes`, `memsw.limit_in_bytes`,
    /// or the host's memory).
    pub bytes: u64,
    /// The unreclaimable usage that counts against it now (for an ancestor,
    /// the ancestor's own; for memsw, memory plus swap).
    pub used: u64,
}

/// The first limit the trend reaches.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Prediction {
    pub eta: Duration,
    /// Growth of the unreclaimable part, bytes per second (> 0).
    pub rate_bytes_per_second: f64,
    pub limit: Limit,
    /// 0..=1: how many of the fit's pairwise slopes agree it grows, scaled
    /// down while the fit has few points.
    pub confidence: f64,
    /// Above `memory.high` (below the limit): the kernel throttles the
    /// growth, and the rate is the throttled one.
    pub throttled: bool,
}

/// One cgroup's recent unreclaimable memory.
#[derive(Debug, Default)]
pub(crate) struct Series {
    /// (time, bytes), oldest first, within [`WINDOW`], at most [`MAX_SAMPLES`].
    samples: VecDeque<(Instant, u64)>,
    /// How many of the newest samples equal the newest: a series that never
    /// moved is known so without a scan (most followed cgroups are idle).
    flat: usize,
}

impl Series {
    /// A sample; time must not go back (an older one is ignored).
    pub(crate) fn push(&mut self, at: Instant, unreclaimable: u64) {
        if self.samples.back().is_some_and(|&(last, _)| at < last) {
            return;
        }
        self.flat = match self.last() {
            Some(last) if last == unreclaimable => self.flat + 1,
            _ => 1,
        };
        self.samples.push_back((at, unreclaimable));
        while self.samples.len() > MAX_SAMPLES
            || self
                .samples
                .front()
                .is_some_and(|&(t, _)| at.duration_since(t) > WINDOW)
        {
            self.samples.pop_front();
        }
        self.flat = self.flat.min(self.samples.len());
    }

    /// The last sample's bytes.
    pub(crate) fn last(&self) -> Option<u64> {
        self.samples.back().map(|&(_, b)| b)
    }

    /// The time until the first of `limits` is reached, if the memory grows.
    /// `high` is the cgroup's `memory.high` when it sits below its limits.
    pub(crate) fn predict(&self, limits: &[Limit], high: Option<u64>) -> Option<Prediction> {
        let last = self.last()?;
        // A series that never moved grows at no rate: no fit (the idle task
        // cgroups of a busy worker are most of what is followed).
        if self.flat == self.samples.len() {
            return None;
        }
        let throttled = high.is_some_and(|h| last >= h);
        // Above memory.high the kernel slows growth: only the samples since
        // the last crossing show the rate that will carry on.
        let from = match high.filter(|_| throttled) {
            Some(h) => self
                .samples
                .iter()
                .rposition(|&(_, b)| b < h)
                .map_or(0, |i| i + 1),
            None => 0,
        };
        let points: Vec<(f64, f64)> = {
            let start = self.samples.get(from)?.0;
            self.samples
                .range(from..)
                .map(|&(t, b)| (t.duration_since(start).as_secs_f64(), b as f64))
                .collect()
        };
        let trend = if throttled {
            throttled_trend(&points)?
        } else {
            trend(&points, from == 0)?
        };
        // Below memory.high the kernel will throttle the growth before it
        // reaches a limit well above memory.high (the penalty grows with the
        // square of the overage): the rate now does not carry on to such a
        // limit, and the throttled one is known only above memory.high. A
        // limit reached before the cgroup is LIGHT_OVERAGE past memory.high
        // (an ancestor's, or its own just above) counts as before.
        let reach = match high.filter(|_| !throttled) {
            Some(h) => (h as f64 * (1.0 + LIGHT_OVERAGE) - last as f64).max(0.0),
            None => f64::INFINITY,
        };
        let (eta, limit) = limits
            .iter()
            .filter(|l| l.bytes.saturating_sub(l.used) as f64 <= reach)
            .map(|l| {
                let headroom = l.bytes.saturating_sub(l.used) as f64 - trend.peak_above;
                (headroom.max(0.0) / trend.rate, l)
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))?;
        Some(Prediction {
            eta: Duration::from_secs_f64(eta),
            rate_bytes_per_second: trend.rate,
            limit: limit.clone(),
            confidence: trend.confidence,
            throttled,
        })
    }
}

/// A growth found in a series.
#[derive(Debug)]
struct Trend {
    rate: f64,
    confidence: f64,
    /// For a sawtooth: how much higher than its last sample the series
    /// will go at its next peak (its last trough plus its tallest tooth),
    /// which comes before the troughs reach any limit.
    peak_above: f64,
}

/// Troughs needed to fit a sawtooth on its troughs alone.
const MIN_TROUGHS: usize = 3;
/// Troughs must rise by this share of the tallest tooth over their span
/// to count as growth (see [`trough_trend`]).
const TOOTH_FRACTION: f64 = 0.1;

/// The growth of `points` (seconds, bytes), judged on its lower envelope
/// (on its troughs, once it has [`MIN_TROUGHS`]); `None` when it does not
/// grow, or not clearly, or (`whole`: the points are all the series has)
/// it has risen for less than [`MIN_RISE`].
fn trend(points: &[(f64, f64)], whole: bool) -> Option<Trend> {
    let teeth = teeth(points);
    if teeth.troughs.len() >= MIN_TROUGHS {
        return trough_trend(points, &teeth);
    }
    let envelope = thin(&lower_envelope(points, &teeth), MAX_FIT_POINTS);
    if envelope.len() < MIN_POINTS {
        return None;
    }
    // How long the envelope has risen: from its first point a drop's size
    // above where the window starts (a process's first allocation counts
    // as the start of its rise, not as a rate).
    let rose = rise_start(&envelope).unwrap_or(envelope.len() - 1);
    if whole && envelope.last()?.0 - envelope[rose].0 < MIN_RISE.as_secs_f64() {
        return None;
    }
    // Nor is the jump of that first allocation a rate: with the whole
    // series in hand the fit starts where the rise did (the idle samples
    // before it would make a step look like steady growth).
    let envelope = if whole {
        &envelope[rose..]
    } else {
        &envelope[..]
    };
    let span = envelope.last()?.0 - envelope.first()?.0;
    if envelope.len() < MIN_POINTS || span < MIN_SPAN.as_secs_f64() {
        return None;
    }
    let mut all = slopes(envelope);
    let confidence = all.iter().filter(|&&s| s > 0.0).count() as f64 / all.len() as f64;
    let rate = quantile(&mut all, 0.5);
    // A step then a plateau: at most half the recent pairs span the step,
    // so a low quantile of the recent slopes is flat.
    let recent_rate = quantile(
        &mut slopes(&envelope[envelope.len() / 2..]),
        RECENT_QUANTILE,
    );
    let confidence = confidence * (envelope.len() as f64 / 20.0).min(1.0);
    // Growth smaller than a drop over the whole span is noise: the
    // troughs of a jittering flat line rise a little too.
    let level = envelope.last()?.1;
    let material = rate * span >= (level * GROWTH_FRACTION).max(DROP_MIN_BYTES as f64);
    (material && recent_rate >= RECENT_FRACTION * rate && confidence >= MIN_CONFIDENCE).then_some(
        Trend {
            rate,
            confidence,
            peak_above: 0.0,
        },
    )
}

/// Growth above `memory.high`. The kernel's penalty grows with the
/// square of the overage, so the rate falls to a crawl short of the limit,
/// and what the cgroup gains comes in steps (charge batches, the
/// workload's chunks): Theil–Sen's median slope of such a staircase can be
/// 0, its recent half flat, and its rise smaller than a share of the level,
/// while the cgroup still climbs to its kill. Without swap nothing above
/// `memory.high` is given back but by the workload, so the rate is the
/// rise of the lower envelope over the window; it counts from a drop's
/// size (1 MiB), and only while the later half of the window rose too
/// (by a quarter of that: more than the jitter of one reading).
fn throttled_trend(points: &[(f64, f64)]) -> Option<Trend> {
    let envelope = lower_envelope(points, &Teeth::default());
    let (first, last) = (envelope.first()?, envelope.last()?);
    let span = last.0 - first.0;
    let grown = last.1 - first.1;
    if envelope.len() < MIN_POINTS || span < MIN_SPAN.as_secs_f64() || grown < DROP_MIN_BYTES as f64
    {
        return None;
    }
    let mid = envelope.partition_point(|p| p.0 < first.0 + span / 2.0);
    let late = last.1 - envelope.get(mid)?.1;
    (late >= DROP_MIN_BYTES as f64 / 4.0).then(|| Trend {
        rate: grown / span,
        // 0.5 at a rise of 1 MiB over the window, 1 from 2 MiB.
        confidence: (grown / (2.0 * DROP_MIN_BYTES as f64)).clamp(MIN_CONFIDENCE, 1.0),
        peak_above: 0.0,
    })
}

/// A sawtooth's growth: Theil–Sen over its troughs (what the heap keeps
/// after each collection). Its next peak is its last trough, grown at
/// that rate, plus its tallest tooth.
fn trough_trend(points: &[(f64, f64)], teeth: &Teeth) -> Option<Trend> {
    let troughs: Vec<(f64, f64)> = teeth.troughs.iter().map(|&i| points[i]).collect();
    let (first, last) = (troughs.first()?, troughs.last()?);
    let span = last.0 - first.0;
    let mut all = slopes(&troughs);
    let confidence = all.iter().filter(|&&s| s > 0.0).count() as f64 / all.len().max(1) as f64;
    let rate = quantile(&mut all, 0.5);
    let recent_rate = quantile(
        &mut slopes(&troughs[troughs.len().saturating_sub(MIN_TROUGHS)..]),
        RECENT_QUANTILE,
    );
    // A trough is sampled up to one interval into the next tooth's ramp,
    // so troughs jitter by a part of a tooth: growth smaller than
    // TOOTH_FRACTION of the tallest tooth is that jitter, not a leak.
    let material = rate * span
        >= (last.1 * GROWTH_FRACTION)
            .max(DROP_MIN_BYTES as f64)
            .max(TOOTH_FRACTION * teeth.tallest);
    let now = points.last()?;
    let next_peak = last.1 + rate * (now.0 - last.0) + teeth.tallest;
    (material
        && span >= MIN_SPAN.as_secs_f64()
        && recent_rate >= RECENT_FRACTION * rate
        && confidence >= MIN_CONFIDENCE)
        .then_some(Trend {
            rate,
            confidence,
            peak_above: (next_peak - now.1).max(0.0),
        })
}

/// Where a series dropped and bottomed out (its troughs, by index), and
/// its tallest tooth (a trough to the peak before the next drop).
#[derive(Debug, Default)]
struct Teeth {
    troughs: Vec<usize>,
    tallest: f64,
}

fn teeth(points: &[(f64, f64)]) -> Teeth {
    let mut teeth = Teeth::default();
    let mut peak = f64::MIN;
    let mut falling = false;
    for (i, &(_, b)) in points.iter().enumerate() {
        let drop = drop_size(b);
        if b <= peak - drop && !falling {
            falling = true;
            if let Some(&last) = teeth.troughs.last() {
                teeth.tallest = teeth.tallest.max(peak - points[last].1);
            }
        }
        // The last sample may be caught in the middle of a collection: it
        // is a trough only once a higher sample follows.
        let next_higher = points.get(i + 1).is_some_and(|&(_, n)| n > b);
        if falling && next_higher {
            teeth.troughs.push(i);
            falling = false;
            peak = b;
        }
        peak = peak.max(b);
    }
    teeth
}

/// Where `points` began to rise: the first point a drop's size above the
/// first, if any is.
fn rise_start(points: &[(f64, f64)]) -> Option<usize> {
    let base = points.first()?.1;
    points.iter().position(|p| p.1 > base + drop_size(base))
}

/// The troughs: each point replaced by the lowest at or after it (the
/// largest non-decreasing curve under the series). When the series has
/// dropped (a sawtooth), the rise since its last trough is a tooth that may
/// fall again: it is left out unless it has lasted longer than the longest
/// tooth seen and [`MIN_RISE`], when it is a rise of its own. The first
/// tooth counts from where the series rose (idle samples before a process
/// starts are no part of a tooth).
fn lower_envelope(points: &[(f64, f64)], teeth: &Teeth) -> Vec<(f64, f64)> {
    let troughs = &teeth.troughs;
    let end = match troughs.last() {
        Some(&last) => {
            let first = troughs[0];
            let rose = rise_start(&points[..=first]).unwrap_or(0);
            let mut longest = points[first].0 - points[rose].0;
            for pair in troughs.windows(2) {
                longest = longest.max(points[pair[1]].0 - points[pair[0]].0);
            }
            let tail = points[points.len() - 1].0 - points[last].0;
            if tail > longest.max(MIN_RISE.as_secs_f64()) {
                points.len()
            } else {
                last + 1
            }
        }
        None => points.len(),
    };
    let mut envelope: Vec<(f64, f64)> = points[..end].to_vec();
    let mut low = f64::MAX;
    for p in envelope.iter_mut().rev() {
        low = low.min(p.1);
        p.1 = low;
    }
    envelope
}

/// A fall below the running peak at `level` bytes smaller than this is
/// noise, not a drop.
pub(crate) fn drop_size(level: f64) -> f64 {
    (level * DROP_FRACTION).max(DROP_MIN_BYTES as f64)
}

/// At most `max` of `points`, evenly spaced, the last always kept.
fn thin(points: &[(f64, f64)], max: usize) -> Vec<(f64, f64)> {
    if points.len() <= max {
        return points.to_vec();
    }
    let step = points.len() as f64 / max as f64;
    let mut out: Vec<_> = (0..max)
        .map(|k| points[(k as f64 * step) as usize])
        .collect();
    out[max - 1] = points[points.len() - 1];
    out
}

/// The pairwise slopes of `points` (Theil–Sen's estimate is their median).
fn slopes(points: &[(f64, f64)]) -> Vec<f64> {
    let mut slopes = Vec::with_capacity(points.len() * points.len() / 2);
    for (i, a) in points.iter().enumerate() {
        for b in &points[i + 1..] {
            let dt = b.0 - a.0;
            if dt > 0.0 {
                slopes.push((b.1 - a.1) / dt);
            }
        }
    }
    slopes
}

/// The `q` quantile of `values` (0 when empty).
fn quantile(values: &mut [f64], q: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let at = ((values.len() - 1) as f64 * q) as usize;
    *values.select_nth_unstable_by(at, f64::total_cmp).1
}

/// The limit with the least headroom (bytes left before it): the one a
/// reader of `/v1/status` and `memwatch top` wants to see beside the
/// memory, whether or not a kill is predicted.
pub(crate) fn nearest(limits: &[Limit]) -> Option<&Limit> {
    limits
        .iter()
        .min_by_key(|l| (l.bytes.saturating_sub(l.used), l.bytes))
}

/// The nearest limit as `/v1/status` shows a task or worker (flattened
/// into its view: `limit_bytes`, `limit_owner`, `limit_cgroup`).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct LimitFields {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<u64>,
    /// `own` (the cgroup's own), `ancestor` or `host` (the host's memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_owner: Option<String>,
    /// The cgroup whose limit it is (absent for the host's memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_cgroup: Option<String>,
}

impl LimitFields {
    /// `limit` of `cgroup` (the cgroup it was read for).
    pub(crate) fn of(limit: &Limit, cgroup: &std::path::Path) -> Self {
        let (owner, whose) = match &limit.owner {
            LimitOwner::Own => ("own", Some(cgroup)),
            LimitOwner::Ancestor(path) => ("ancestor", Some(path.as_path())),
            LimitOwner::Host => ("host", None),
        };
        Self {
            limit_bytes: Some(limit.bytes),
            limit_owner: Some(owner.into()),
            limit_cgroup: whose.map(|p| p.display().to_string()),
        }
    }
}

/// Within half of a cgroup limit: the cgroup is worth sampling fast. The
/// host's memory is not counted: half of it used would make every
/// followed cgroup "near" (it still counts in the prediction).
pub(crate) fn near_a_limit(limits: &[Limit]) -> bool {
    limits
        .iter()
        .any(|l| l.owner != LimitOwner::Host && l.used.saturating_mul(2) >= l.bytes)
}

#[cfg(test)]
mod tests;
