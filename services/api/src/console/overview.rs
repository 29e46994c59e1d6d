//! The overview page: counts by state, pools, breakers and dead letters, with plots of the
//! recent rates, kept live over server-sent events.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::State as AxState;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use ksched_core::events::JobState;
use ksched_runtime::clock::wall_clock_ms;

use super::failed;
use super::html::{esc, flash, page, table, time, url};
use super::plot;
use super::samples;
use crate::Api;
use crate::auth::Identity;
use crate::fleet::dead_letter_counts;

/// The overview's numbers: what the stores and the metrics say now.
fn stats(api: &Api, who: &Identity) -> Result<String, crate::ApiError> {
    let mut out = String::from("<div id=\"live\">");
    let metrics = samples::parse(&api.shards.render_metrics());
    if who.sees_all() {
        let mut counts: BTreeMap<JobState, u64> = BTreeMap::new();
        for s in &api.stores {
            for (st, n) in s.job_counts().map_err(crate::internal)? {
                *counts.entry(st).or_default() += n;
            }
        }
        out.push_str("<h2>Jobs</h2><div class=\"cards\">");
        for st in JobState::ALL {
            let n = counts.get(&st).copied().unwrap_or(0);
            let _ = write!(
                out,
                "<a class=\"card\" href=\"/ui/jobs?state={0}\"><b id=\"count-{0}\">{n}</b>{0}</a>",
                st.as_str()
            );
        }
        out.push_str("</div>");
    } else {
        out.push_str(
            "<p class=\"muted\">Job counts span every tenant; this sign-in sees some.</p>",
        );
    }
    let lag = samples::by(&metrics, "ksched_consumer_lag", "topic");
    let depth = samples::by(&metrics, "ksched_queue_depth", "pool");
    let rows: Vec<Vec<String>> = depth
        .iter()
        .map(|(p, d)| vec![esc(p), format!("{d}")])
        .collect();
    let _ = write!(out, "<h2>Queues</h2>{}", table(&["POOL", "PENDING"], &rows));
    let mut breakers = Vec::new();
    for s in &api.stores {
        breakers.extend(s.breakers().map_err(crate::internal)?);
    }
    let rows: Vec<Vec<String>> = breakers
        .iter()
        .map(|(p, b)| {
            vec![
                esc(p),
                esc(&format!("{:?}", b.state)),
                b.consecutive_failures.to_string(),
                time(b.opened_at),
            ]
        })
        .collect();
    let _ = write!(
        out,
        "<h2>Circuit breakers</h2>{}",
        table(&["POOL", "STATE", "CONSECUTIVE FAILURES", "OPENED"], &rows)
    );
    let rows: Vec<Vec<String>> = lag
        .iter()
        .map(|(t, n)| vec![esc(t), format!("{n}")])
        .collect();
    let _ = write!(
        out,
        "<h2>Consumer lag</h2>{}",
        table(&["TOPIC", "RECORDS NOT PROCESSED"], &rows)
    );
    if let Some(dlq) = dead_letter_counts(api, who)? {
        let rows: Vec<Vec<String>> = dlq
            .iter()
            .map(|(r, n)| {
                vec![
                    format!("<a href=\"/ui/dlq?reason={}\">{}</a>", url(r), esc(r)),
                    n.to_string(),
                ]
            })
            .collect();
        let _ = write!(
            out,
            "<h2>Dead letters</h2>{}",
            table(&["REASON", "COUNT"], &rows)
        );
    }
    let _ = write!(
        out,
        "<p class=\"muted\">as of {} UTC</p></div>",
        time(Some(wall_clock_ms()))
    );
    Ok(out)
}

pub(super) async fn overview(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
) -> Response {
    let stats = match stats(&api, &who) {
        Ok(s) => s,
        Err(e) => return failed(&who, "Overview", e),
    };
    let samples = api.samples.all();
    let throughput = vec![(
        "journal entries/s".to_owned(),
        samples.iter().map(|s| (s.at, s.entries_per_s)).collect(),
    )];
    let dead_letters = vec![(
        "dead letters/s".to_owned(),
        samples
            .iter()
            .map(|s| (s.at, s.dead_letters_per_s))
            .collect(),
    )];
    let mut depth: BTreeMap<String, Vec<(i64, f64)>> = BTreeMap::new();
    for s in &samples {
        for (p, d) in &s.queue_depth {
            depth.entry(p.clone()).or_default().push((s.at, *d));
        }
    }
    let latency = vec![
        (
            "p50".to_owned(),
            samples
                .iter()
                .filter_map(|s| Some((s.at, s.latency_ms?.0)))
                .collect(),
        ),
        (
            "p99".to_owned(),
            samples
                .iter()
                .filter_map(|s| Some((s.at, s.latency_ms?.1)))
                .collect(),
        ),
    ];
    let body = format!(
        "<h1>Overview</h1>{stats}<h2>Over time</h2>{}{}{}{}",
        plot::lines("Throughput", "entries/s", &throughput),
        plot::lines("Dead-letter rate", "/s", &dead_letters),
        plot::lines(
            "Queue depth by pool",
            "jobs",
            &depth.into_iter().collect::<Vec<_>>()
        ),
        plot::lines(
            "Dispatch latency (acceptance to first dispatch)",
            "ms",
            &latency
        ),
    );
    Html(page("Overview", "/ui", Some(&who), &body)).into_response()
}

/// The overview's numbers again every few seconds, as server-sent events.
/// Live overview streams open at once in the process: each reads the stores every few
/// seconds for as long as it stays open.
const MAX_LIVE_STREAMS: usize = 64;

static LIVE_STREAMS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_LIVE_STREAMS);

pub(super) async fn live(
    AxState(api): AxState<Arc<Api>>,
    Extension(who): Extension<Identity>,
) -> Response {
    let Ok(turn) = LIVE_STREAMS.try_acquire() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live overviews are open; reload the page later",
        )
            .into_response();
    };
    let stream = futures_util::stream::unfold(
        (api, who, true, turn),
        |(api, who, first, turn)| async move {
            if !first {
                tokio::time::sleep(Duration::from_millis(samples::EVERY_MS)).await;
            }
            let data = stats(&api, &who).unwrap_or_else(|e| flash(&e.1, true));
            Some((
                Ok::<_, Infallible>(SseEvent::default().event("overview").data(data)),
                (api, who, false, turn),
            ))
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}
