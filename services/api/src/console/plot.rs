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

/// Most jobs a side of the dependency graph draws; the rest are counted.
pub(super) const GRAPH_SIDE: usize = 12;

/// A job's dependencies as a graph: what it waits for (left, with their states as the store
/// has them; `None` when unknown to this shard or another tenant's), the job (middle), what
/// waits for it (right). Each box links to its job's page.
pub(super) fn dependencies(
    job: (&str, &str),
    waits_for: &[(String, Option<String>)],
    waited_by: &[String],
    more_waited_by: bool,
) -> String {
    const BOX_W: f64 = 250.0;
    const BOX_H: f64 = 22.0;
    const GAP: f64 = 8.0;
    let rows = waits_for
        .len()
        .max(waited_by.len())
        .clamp(1, GRAPH_SIDE + 1);
    let height = rows as f64 * (BOX_H + GAP) + 24.0;
    let mut svg = format!(
        "<figure><figcaption>Dependencies</figcaption><svg role=\"img\" aria-label=\"job dependencies\" width=\"{W}\" height=\"{height}\" viewBox=\"0 0 {W} {height}\" font-size=\"11\">"
    );
    let fill = |state: Option<&str>| match state {
        Some("SUCCEEDED") => "#d7f0dc",
        Some("FAILED" | "TIMEOUT" | "DENIED" | "OUTPUT_QUARANTINED") => "#f6d6d6",
        Some("CANCELLED") => "#e6e6e6",
        Some("BLOCKED" | "APPROVAL_REQUIRED" | "DELAYED") => "#fbeccb",
        Some(_) => "#dbe7fb",
        None => "#ffffff",
    };
    let node = |svg: &mut String, x: f64, y: f64, id: &str, state: Option<&str>| {
        let label = format!("{} {}", id, state.unwrap_or("(not known here)"));
        let shown: String = label.chars().take(40).collect();
        let _ = write!(
            svg,
            "<a href=\"/ui/jobs/{}\"><rect x=\"{x}\" y=\"{y}\" width=\"{BOX_W}\" height=\"{BOX_H}\" rx=\"3\" fill=\"{}\" stroke=\"#9aa6bd\"/><text x=\"{}\" y=\"{}\">{}</text></a>",
            super::html::url(id),
            fill(state),
            x + 6.0,
            y + 15.0,
            esc(&shown)
        );
    };
    let y_of = |i: usize| 12.0 + i as f64 * (BOX_H + GAP);
    let (left, mid, right) = (10.0, (W - BOX_W) / 2.0, W - BOX_W - 10.0);
    let y_mid = y_of((rows - 1) / 2);
    let side = |svg: &mut String, x: f64, items: Vec<(&str, Option<&str>)>, more: usize| {
        for (i, (id, state)) in items.iter().take(GRAPH_SIDE).enumerate() {
            let y = y_of(i);
            let (x1, x2) = if x < mid {
                (x + BOX_W, mid)
            } else {
                (mid + BOX_W, x)
            };
            let _ = write!(
                svg,
                "<line x1=\"{x1}\" y1=\"{}\" x2=\"{x2}\" y2=\"{}\" stroke=\"#9aa6bd\"/>",
                y + BOX_H / 2.0,
                y_mid + BOX_H / 2.0
            );
            node(svg, x, y, id, *state);
        }
        let hidden = items.len().saturating_sub(GRAPH_SIDE) + more;
        if hidden > 0 {
            let _ = write!(
                svg,
                "<text x=\"{}\" y=\"{}\">and {hidden}{} more</text>",
                x + 6.0,
                y_of(GRAPH_SIDE) + 15.0,
                if more > 0 { "+" } else { "" }
            );
        }
    };
    let deps: Vec<(&str, Option<&str>)> = (waits_for.iter())
        .map(|(id, s)| (id.as_str(), s.as_deref()))
        .collect();
    side(&mut svg, left, deps, 0);
    let dependents: Vec<(&str, Option<&str>)> = waited_by
        .iter()
        .map(|id| (id.as_str(), Some("BLOCKED")))
        .collect();
    side(&mut svg, right, dependents, usize::from(more_waited_by));
    node(&mut svg, mid, y_mid, job.0, Some(job.1));
    svg.push_str("</svg></figure>");
    svg
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

    #[test]
    fn a_dependency_graph_links_each_job_escapes_ids_and_counts_what_it_leaves_out() {
        let deps: Vec<(String, Option<String>)> = (0..15)
            .map(|i| (format!("a<{i}>"), (i == 0).then(|| "SUCCEEDED".to_owned())))
            .collect();
        let svg = super::dependencies(("job:1", "BLOCKED"), &deps, &["w".to_owned()], true);
        assert!(svg.contains("href=\"/ui/jobs/job%3A1\""), "{svg}");
        assert!(
            svg.contains("a&lt;0&gt; SUCCEEDED") && !svg.contains("a<0>"),
            "{svg}"
        );
        assert!(svg.contains("a&lt;1&gt; (not known here)"), "{svg}");
        assert_eq!(svg.matches("<rect").count(), super::GRAPH_SIDE + 2);
        assert!(
            svg.contains("and 3 more") && svg.contains("and 1+ more"),
            "{svg}"
        );
    }
}
