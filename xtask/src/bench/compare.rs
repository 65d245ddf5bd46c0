//! A/B runs against a baseline: which benchmark was asked for, the order
//! the builds take turns in, and the ratio table every benchmark ends
//! with (this tree's figure, the baseline's, and this / baseline).

use anyhow::bail;

/// A benchmark `cargo xtask bench` knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bench {
    Overhead,
    Delay,
    Idle,
    Storm,
    Guard,
    Tasks,
    Predict,
    PredictV2,
}

impl Bench {
    const ALL: [Bench; 8] = [
        Bench::Overhead,
        Bench::Delay,
        Bench::Idle,
        Bench::Storm,
        Bench::Guard,
        Bench::Tasks,
        Bench::Predict,
        Bench::PredictV2,
    ];
    /// Those `bench all` runs: minutes each, not tens of minutes.
    pub(crate) const QUICK: [Bench; 2] = [Bench::Overhead, Bench::Delay];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Bench::Overhead => "overhead",
            Bench::Delay => "delay",
            Bench::Idle => "idle",
            Bench::Storm => "storm",
            Bench::Guard => "guard",
            Bench::Tasks => "tasks",
            Bench::Predict => "predict",
            Bench::PredictV2 => "predict-v2",
        }
    }

    /// Whether it can run beside a baseline (`--baseline`).
    /// (`predict` is measured against its rivals, on the same traces.)
    fn takes_baseline(self) -> bool {
        !matches!(self, Bench::Guard | Bench::Predict | Bench::PredictV2)
    }
}

/// The benchmarks `which` names (default: overhead; `all`: the quick
/// ones), checked against `baseline` (whether `--baseline` was given).
pub(crate) fn parse(which: Option<&str>, baseline: bool) -> anyhow::Result<Vec<Bench>> {
    let which = which.unwrap_or("overhead");
    if which == "all" {
        return Ok(Bench::QUICK.to_vec());
    }
    let Some(bench) = Bench::ALL.into_iter().find(|b| b.name() == which) else {
        let known: Vec<&str> = Bench::ALL.iter().map(|b| b.name()).collect();
        bail!(
            "unknown benchmark `{which}` (known: {}, and all: {})",
            known.join(", "),
            Bench::QUICK.map(Bench::name).join(", ")
        );
    };
    if baseline && !bench.takes_baseline() {
        bail!(
            "`--baseline` compares agents; `{which}` measures no agent against another \
             (run it without --baseline)"
        );
    }
    Ok(vec![bench])
}

/// The build (0: this tree, 1: the baseline) of each of `rounds` runs:
/// with two builds, pairs in turn A B, B A, A B, …, so that a drift
/// in the machine's load favours neither; with one, always 0.
pub(crate) fn interleaved(rounds: usize, builds: usize) -> Vec<usize> {
    (0..rounds)
        .map(|r| match builds {
            0 | 1 => 0,
            _ => {
                let pair = r / 2;
                let first = pair % 2;
                if r % 2 == 0 { first } else { 1 - first }
            }
        })
        .collect()
}

/// One figure of a benchmark, for this tree and (with a baseline) the
/// baseline.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Figure {
    pub(crate) bench: &'static str,
    /// What it is, with its unit ("OOM kill -> webhook p99 ms").
    pub(crate) name: String,
    pub(crate) this: f64,
    pub(crate) base: Option<f64>,
}

impl Figure {
    pub(crate) fn new(bench: &'static str, name: impl Into<String>, builds: &[f64]) -> Figure {
        Figure {
            bench,
            name: name.into(),
            this: builds.first().copied().unwrap_or(f64::NAN),
            base: builds.get(1).copied(),
        }
    }
}

/// this / base, when both are finite and base is not zero.
pub(crate) fn ratio(this: f64, base: f64) -> Option<f64> {
    let r = this / base;
    (this.is_finite() && base.is_finite() && base != 0.0 && r.is_finite()).then_some(r)
}

/// A figure with three significant digits at most (a dash for none).
pub(crate) fn number(x: f64) -> String {
    if !x.is_finite() {
        return "–".to_string();
    }
    let digits = match x.abs() {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    format!("{x:.digits$}")
}

/// The ratio column: two decimals, or a dash when there is none.
pub(crate) fn ratio_cell(this: f64, base: Option<f64>) -> String {
    base.and_then(|b| ratio(this, b))
        .map_or("–".to_string(), |r| format!("{r:.2}"))
}

/// The table: one row per figure; with a baseline (`base` its name), its
/// column and the ratio.
pub(crate) fn table(this: &str, base: Option<&str>, figures: &[Figure]) -> String {
    let mut out = match base {
        Some(base) => format!(
            "| bench | figure | {this} | {base} | ratio {this} / {base} |\n|---|---|---|---|---|\n"
        ),
        None => format!("| bench | figure | {this} |\n|---|---|---|\n"),
    };
    for f in figures {
        out += &format!("| {} | {} | {} |", f.bench, f.name, number(f.this));
        if base.is_some() {
            let b = f.base.map_or("–".to_string(), number);
            out += &format!(" {b} | {} |", ratio_cell(f.this, f.base));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_all_is_the_quick_ones() {
        assert_eq!(parse(None, false).unwrap(), vec![Bench::Overhead]);
        assert_eq!(parse(Some("storm"), true).unwrap(), vec![Bench::Storm]);
        assert_eq!(
            parse(Some("all"), true).unwrap(),
            vec![Bench::Overhead, Bench::Delay]
        );
        for b in Bench::ALL {
            assert_eq!(parse(Some(b.name()), false).unwrap(), vec![b]);
        }
    }

    #[test]
    fn argument_errors_say_what_is_known_and_what_is_wrong() {
        let unknown = parse(Some("dealy"), false).unwrap_err().to_string();
        assert!(unknown.contains("unknown benchmark `dealy`"), "{unknown}");
        assert!(unknown.contains("overhead, delay, idle, storm, guard, tasks"));
        assert!(unknown.contains("all: overhead, delay"), "{unknown}");
        let guard = parse(Some("guard"), true).unwrap_err().to_string();
        assert!(guard.contains("`guard`"), "{guard}");
        assert!(parse(Some("guard"), false).is_ok());
    }

    #[test]
    fn two_builds_take_turns_in_pairs_that_swap() {
        assert_eq!(interleaved(8, 2), [0, 1, 1, 0, 0, 1, 1, 0]);
        assert_eq!(interleaved(3, 2), [0, 1, 1]);
        assert_eq!(interleaved(4, 1), [0, 0, 0, 0]);
        assert!(interleaved(0, 2).is_empty());
        // Over whole pairs of pairs each build goes first as often.
        let order = interleaved(12, 2);
        let firsts = order.chunks(2).filter(|p| p[0] == 1).count();
        assert_eq!(firsts, 3);
        assert_eq!(order.iter().filter(|&&b| b == 1).count(), 6);
    }

    #[test]
    fn ratios_need_two_finite_figures_and_a_nonzero_base() {
        assert_eq!(ratio(3.0, 2.0), Some(1.5));
        assert_eq!(ratio(1.0, 0.0), None);
        assert_eq!(ratio(f64::NAN, 1.0), None);
        assert_eq!(ratio(1.0, f64::INFINITY), None);
        assert_eq!(ratio_cell(2.0, Some(4.0)), "0.50");
        assert_eq!(ratio_cell(2.0, None), "–");
        assert_eq!(ratio_cell(2.0, Some(0.0)), "–");
    }

    #[test]
    fn numbers_keep_three_significant_digits() {
        assert_eq!(number(1234.4), "1234");
        assert_eq!(number(12.345), "12.3");
        assert_eq!(number(1.2345), "1.23");
        assert_eq!(number(0.01234), "0.012");
        assert_eq!(number(f64::NAN), "–");
    }

    #[test]
    fn the_table_has_a_column_per_build_and_the_ratio() {
        let figures = [
            Figure::new("delay", "OOM kill p99 ms", &[3.0, 6.0]),
            Figure::new("delay", "missed", &[0.0, 0.0]),
        ];
        let with = table("abc1234", Some("00cc42c"), &figures);
        let lines: Vec<&str> = with.lines().collect();
        assert_eq!(
            lines,
            [
                "| bench | figure | abc1234 | 00cc42c | ratio abc1234 / 00cc42c |",
                "|---|---|---|---|---|",
                "| delay | OOM kill p99 ms | 3.00 | 6.00 | 0.50 |",
                "| delay | missed | 0.000 | 0.000 | – |",
            ]
        );
        let alone = table("abc1234", None, &figures[..1]);
        assert_eq!(
            alone.lines().collect::<Vec<_>>(),
            [
                "| bench | figure | abc1234 |",
                "|---|---|---|",
                "| delay | OOM kill p99 ms | 3.00 |",
            ]
        );
    }
}
