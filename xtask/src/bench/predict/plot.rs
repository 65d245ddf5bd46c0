//! One run of a cell drawn as SVG: the cgroup's usage and its part reclaim
//! cannot free (usage less file cache), the limit, the kill, and the ETA
//! memwatch gave (counted down between its events, on the right axis).

use std::fmt::Write as _;

use super::trace::{Trace, Warnings};

const W: f64 = 720.0;
const H: f64 = 260.0;
const PAD: f64 = 44.0;
const MIB: f64 = (1u64 << 20) as f64;
/// The ETA axis: 0 to memwatch's default horizon.
const ETA_MAX: f64 = 60.0;

pub(crate) fn svg(title: &str, trace: &Trace, memwatch: &Warnings) -> String {
    let t0 = trace.start;
    let t1 = trace.kill.unwrap_or(trace.end).max(t0 + 1.0) + 1.0;
    let top = trace.limit as f64 * 1.1 / MIB;
    let x = |t: f64| PAD + (t - t0) / (t1 - t0) * (W - 2.0 * PAD);
    let y = |mib: f64| H - PAD + -(mib / top) * (H - 2.0 * PAD);
    let y_eta = |s: f64| H - PAD - (s.clamp(0.0, ETA_MAX) / ETA_MAX) * (H - 2.0 * PAD);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<rect width="{W}" height="{H}" fill="white"/><text x="{PAD}" y="16" font-size="13">{title}</text>"#
    );
    let line = |points: Vec<(f64, f64)>, style: &str| {
        let pts: Vec<String> = points
            .iter()
            .map(|(a, b)| format!("{a:.1},{b:.1}"))
            .collect();
        format!(
            r#"<polyline fill="none" {style} points="{}"/>"#,
            pts.join(" ")
        )
    };
    let thin = |v: Vec<(f64, f64)>| {
        let step = (v.len() / 700).max(1);
        v.into_iter().step_by(step).collect::<Vec<_>>()
    };
    let usage = thin(
        trace
            .samples
            .iter()
            .map(|s| (x(s.t), y(s.usage as f64 / MIB)))
            .collect(),
    );
    let hard = thin(
        trace
            .samples
            .iter()
            .map(|s| {
                let clean = s.usage.saturating_sub(s.inactive_file + s.active_file);
                (x(s.t), y(clean as f64 / MIB))
            })
            .collect(),
    );
    if !trace.held.is_empty() {
        // The allocation log, as steps: what the workload held.
        let mut held = Vec::new();
        for (i, (t, bytes)) in trace.held.iter().enumerate() {
            let next = trace
                .held
                .get(i + 1)
                .map_or(trace.kill.unwrap_or(trace.end), |n| n.0);
            held.push((x(*t), y(*bytes as f64 / MIB)));
            held.push((x(next), y(*bytes as f64 / MIB)));
        }
        let _ = writeln!(
            out,
            "{}",
            line(thin(held), r##"stroke="#aaaaaa" stroke-width="1""##)
        );
    }
    let _ = writeln!(
        out,
        "{}",
        line(usage, r##"stroke="#9bb8d8" stroke-width="1.5""##)
    );
    let _ = writeln!(
        out,
        "{}",
        line(hard, r##"stroke="#1f4e8c" stroke-width="1.5""##)
    );
    let limit = y(trace.limit as f64 / MIB);
    let _ = writeln!(
        out,
        r##"<line x1="{PAD}" x2="{}" y1="{limit:.1}" y2="{limit:.1}" stroke="#c0392b" stroke-dasharray="5,3"/>"##,
        W - PAD
    );
    if let Some(kill) = trace.kill {
        let k = x(kill);
        let _ = writeln!(
            out,
            r##"<line x1="{k:.1}" x2="{k:.1}" y1="{PAD}" y2="{}" stroke="#c0392b"/><text x="{:.1}" y="{}" fill="#c0392b">OOM kill</text>"##,
            H - PAD,
            k - 48.0,
            PAD - 4.0
        );
    }
    // The ETA a reader holds: each one said, counted down to the next.
    let mut eta = Vec::new();
    for (i, (t, e)) in memwatch.said.iter().enumerate() {
        let Some(e) = e else { continue };
        let next = memwatch.said.get(i + 1).map_or(t1, |n| n.0);
        let end = memwatch
            .episodes
            .iter()
            .find(|(s, _)| s <= t)
            .and_then(|(_, end)| *end)
            .map_or(next, |end| end.min(next));
        eta.push((x(*t), y_eta(*e)));
        eta.push((x(end), y_eta(e - (end - t))));
    }
    if !eta.is_empty() {
        let _ = writeln!(
            out,
            "{}",
            line(eta, r##"stroke="#e67e22" stroke-width="2""##)
        );
    }
    axes(&mut out, t1 - t0, top);
    out.push_str("</svg>\n");
    out
}

fn axes(out: &mut String, span: f64, top: f64) {
    let (x0, x1, y0, y1) = (PAD, W - PAD, H - PAD, PAD);
    let _ = writeln!(
        out,
        r##"<path d="M{x0},{y1} V{y0} H{x1} V{y1}" fill="none" stroke="#555"/>"##
    );
    for i in 0..=4 {
        let f = f64::from(i) / 4.0;
        let yy = y0 - f * (y0 - y1);
        let xx = x0 + f * (x1 - x0);
        let _ = writeln!(
            out,
            r##"<text x="4" y="{:.1}">{:.0} MiB</text><text x="{:.1}" y="{:.1}">{:.0} s</text><text x="{:.1}" y="{:.1}" fill="#e67e22">{:.0} s</text>"##,
            yy + 4.0,
            top * f,
            xx - 8.0,
            y0 + 16.0,
            span * f,
            x1 + 4.0,
            yy + 4.0,
            ETA_MAX * f
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{x0}" y="{}"><tspan fill="#aaaaaa">allocated</tspan> · <tspan fill="#9bb8d8">usage</tspan> · <tspan fill="#1f4e8c">usage less file cache</tspan> · <tspan fill="#c0392b">limit, kill</tspan> · <tspan fill="#e67e22">memwatch's ETA (right axis)</tspan></text>"##,
        H - 8.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::predict::trace::Sample;

    #[test]
    fn a_run_draws_its_lines_and_kill() {
        let trace = Trace {
            limit: 100 << 20,
            start: 0.0,
            end: 10.0,
            kill: Some(9.0),
            samples: (0..10)
                .map(|i| Sample {
                    t: f64::from(i),
                    usage: (i as u64 * 10) << 20,
                    ..Sample::default()
                })
                .collect(),
            ..Trace::default()
        };
        let said = Warnings::from_looks([(4.0, Some(Some(5.0)))]);
        let svg = svg("leak", &trace, &said);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
        assert!(svg.contains("OOM kill"));
    }
}
