//! Plots as inline SVG, drawn on the server: lines over time (throughput, queue depth,
//! latency) and a job's timeline. No script, no library: what the browser shows is what the
//! projection holds.

use std::fmt::Write as _;

use super::html::{esc, time};

const W: f64 = 900.0;
const H: f64 = 200.0;
const PAD_L: f64 = 56.0;
const PAD_B: f64 = 24.0;
const PAD_T: f64 = 10.0;
const PAD_R: f64 = 12.0;
const COLORS: &[&str] = &[
    "#2563eb", "#dc2626", "#16a34a", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4b5563",
];

/// Lines over time: each series is (label, points of (ms, value)).
pub(super) fn lines(title: &str, unit: &str, series: &[(String, Vec<(i64, f64)>)]) -> String {
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (i64::MAX, i64::MIN, 0.0_f64);
    for (x, y) in points {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y1 = y1.max(*y);
    }
    let mut svg = format!(
        "<figure><figcaption>{}</figcaption><svg role=\"img\" aria-label=\"{0}\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\">",
        esc(title)
    );
    if x0 > x1 {
        let _ = write!(
            svg,
            "<text x=\"{}\" y=\"{}\" fill=\"#6b7488\">no samples yet</text></svg></figure>",
            W / 2.0 - 40.0,
            H / 2.0
        );
        return svg;
    }
    let y1 = if y1 <= 0.0 { 1.0 } else { y1 * 1.1 };
    let span = (x1 - x0).max(1) as f64;
    let sx = |x: i64| PAD_L + (x - x0) as f64 / span * (W - PAD_L - PAD_R);
    let sy = |y: f64| H - PAD_B - y / y1 * (H - PAD_B - PAD_T);
    // Axes and their extremes.
    let _ = write!(
        svg,
        "<line x1=\"{PAD_L}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#9aa6bd\"/>\
         <line x1=\"{PAD_L}\" y1=\"{PAD_T}\" x2=\"{PAD_L}\" y2=\"{0}\" stroke=\"#9aa6bd\"/>\
         <text x=\"4\" y=\"{2}\" font-size=\"11\">{3}</text><text x=\"4\" y=\"{0}\" font-size=\"11\">0</text>\
         <text x=\"{PAD_L}\" y=\"{4}\" font-size=\"11\">{5}</text>\
         <text x=\"{1}\" y=\"{4}\" font-size=\"11\" text-anchor=\"end\">{6}</text>",
        H - PAD_B,
        W - PAD_R,
        PAD_T + 10.0,
        esc(&format!("{} {unit}", short(y1 / 1.1))),
        H - 6.0,
        esc(&time(Some(x0))),
        esc(&time(Some(x1))),
    );
    for (i, (label, pts)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = pts
            .iter()
            .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{}\"><title>{}</title></polyline>\
             <text x=\"{}\" y=\"{}\" font-size=\"11\" fill=\"{color}\">{}</text>",
            path.join(" "),
            esc(label),
            PAD_L + 8.0 + 140.0 * (i % 5) as f64,
            PAD_T + 12.0 + 13.0 * (i / 5) as f64,
            esc(label)
        );
    }
    svg.push_str("</svg></figure>");
    svg
}

/// A job's timeline: each event (ms, name, detail) a marker on one time axis, attempts
/// marked where they were dispatched.
pub(super) fn timeline(events: &[(i64, String, String)]) -> String {
    let mut svg = format!(
        "<figure><figcaption>Timeline</figcaption><svg role=\"img\" aria-label=\"job timeline\" width=\"{W}\" height=\"124\" viewBox=\"0 0 {W} 124\">"
    );
    let (Some(x0), Some(x1)) = (
        events.iter().map(|e| e.0).min(),
        events.iter().map(|e| e.0).max(),
    ) else {
        svg.push_str("</svg></figure>");
        return svg;
    };
    let span = (x1 - x0).max(1) as f64;
    let sx = |x: i64| 20.0 + (x - x0) as f64 / span * (W - 40.0);
    let _ = write!(
        svg,
        "<line x1=\"20\" y1=\"60\" x2=\"{}\" y2=\"60\" stroke=\"#9aa6bd\"/>\
         <text x=\"20\" y=\"116\" font-size=\"11\">{}</text>\
         <text x=\"{}\" y=\"116\" font-size=\"11\" text-anchor=\"end\">{} (+{} ms)</text>",
        W - 20.0,
        esc(&time(Some(x0))),
        W - 20.0,
        esc(&time(Some(x1))),
        x1 - x0
    );
    for (i, (at, name, detail)) in events.iter().enumerate() {
        let x = sx(*at);
        let color = match name.as_str() {
            "JobSucceeded" => "#16a34a",
            "JobFailed" | "JobTimedOut" | "JobDenied" | "DeadLettered" => "#dc2626",
            "JobRetrying" | "JobWaiting" | "ApprovalRequested" => "#d97706",
            "JobDispatched" | "JobRunning" => "#2563eb",
            _ => "#4b5563",
        };
        // Labels take turns on four rows, above and below the axis, so that events at
        // nearly the same moment stay readable.
        let y = [44.0, 84.0, 28.0, 100.0][i % 4];
        let _ = write!(
            svg,
            "<circle cx=\"{x:.1}\" cy=\"60\" r=\"5\" fill=\"{color}\"><title>{} {}: {}</title></circle>\
             <text x=\"{x:.1}\" y=\"{y}\" font-size=\"10\" text-anchor=\"middle\" fill=\"{color}\">{}</text>",
            esc(&time(Some(*at))),
            esc(name),
            esc(detail),
            esc(name.trim_start_matches("Job"))
        );
    }
    svg.push_str("</svg></figure>");
    svg
}

/// A number short enough for an axis label.
fn short(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_is_escaped_and_empty_series_say_so() {
        let svg = lines(
            "t",
            "jobs/s",
            &[("<b>".into(), vec![(0, 1.0), (1000, 3.0)])],
        );
        assert!(svg.contains("&lt;b&gt;") && !svg.contains("<b>"), "{svg}");
        assert!(svg.contains("<polyline"), "{svg}");
        assert!(lines("t", "", &[]).contains("no samples yet"));
        let tl = timeline(&[
            (0, "JobAccepted".into(), "<x>".into()),
            (50, "JobSucceeded".into(), "ok".into()),
        ]);
        assert_eq!(tl.matches("<circle").count(), 2, "{tl}");
        assert!(tl.contains("&lt;x&gt;"), "{tl}");
    }
}
