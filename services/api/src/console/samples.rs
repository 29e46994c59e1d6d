//! What the overview plots: the scheduler's own metrics (the text `/metrics` serves),
//! sampled every few seconds into a bounded ring, so throughput, queue depth and latency
//! show over the last hour without a Prometheus.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;

/// Samples kept: an hour at [`EVERY_MS`].
pub(super) const KEEP: usize = 1_800;
/// How often a sample is taken.
pub(super) const EVERY_MS: u64 = 2_000;

/// One metric line: name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Line {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text exposition format (comments skipped, escaped label values
/// unescaped). Lines that do not parse are skipped.
pub(super) fn parse(text: &str) -> Vec<Line> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(parse_line)
        .collect()
}

fn parse_line(l: &str) -> Option<Line> {
    let (head, value) = l.trim().rsplit_once(' ')?;
    let value: f64 = value.parse().ok()?;
    let (name, labels) = match head.split_once('{') {
        None => (head.to_owned(), BTreeMap::new()),
        Some((name, rest)) => (name.to_owned(), labels(rest.strip_suffix('}')?)?),
    };
    Some(Line {
        name,
        labels,
        value,
    })
}

fn labels(s: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek() == Some(&',') || chars.peek() == Some(&' ') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        loop {
            match chars.next()? {
                '\\' => match chars.next()? {
                    'n' => value.push('\n'),
                    c => value.push(c),
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(key, value);
    }
}

/// The sum over every line named `name` (all shards, all labels).
pub(super) fn total(lines: &[Line], name: &str) -> f64 {
    lines
        .iter()
        .filter(|l| l.name == name)
        .map(|l| l.value)
        .sum()
}

/// The sum per value of `label` over the lines named `name`.
pub(super) fn by(lines: &[Line], name: &str, label: &str) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for l in lines.iter().filter(|l| l.name == name) {
        if let Some(v) = l.labels.get(label) {
            *out.entry(v.clone()).or_default() += l.value;
        }
    }
    out
}

/// One sample.
#[derive(Debug, Clone, Default)]
pub(super) struct Sample {
    pub at: i64,
    /// Journal entries per second since the previous sample.
    pub entries_per_s: f64,
    /// Dead letters per second since the previous sample.
    pub dead_letters_per_s: f64,
    pub queue_depth: BTreeMap<String, f64>,
    /// Dispatch latency (acceptance to first dispatch) of the jobs dispatched since the
    /// previous sample, from the histogram's buckets: (p50, p99) in ms, when any were.
    pub latency_ms: Option<(f64, f64)>,
}

/// The ring of samples, and the counters of the last one (rates are differences).
#[derive(Debug, Default)]
pub(crate) struct Samples {
    inner: Mutex<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    samples: VecDeque<Sample>,
    /// The last sample's time, journal entries and dead letters (counters).
    last_counts: Option<(i64, f64, f64)>,
    last_buckets: BTreeMap<String, f64>,
}

impl Samples {
    /// Takes a sample from the metrics text at `at` (ms).
    pub(super) fn take(&self, at: i64, metrics: &str) {
        let lines = parse(metrics);
        let entries = total(&lines, "ksched_journal_entries_total");
        let dead = total(&lines, "ksched_dead_letters_total");
        let buckets = by(&lines, "ksched_dispatch_latency_seconds_bucket", "le");
        let mut ring = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (entries_per_s, dead_letters_per_s) = match ring.last_counts {
            Some((t, n, d)) if at > t => {
                let per_s = |now: f64, then: f64| (now - then).max(0.0) * 1000.0 / (at - t) as f64;
                (per_s(entries, n), per_s(dead, d))
            }
            _ => (0.0, 0.0),
        };
        let delta: Vec<(f64, f64)> = buckets
            .iter()
            .map(|(le, n)| {
                let before = ring.last_buckets.get(le).copied().unwrap_or(0.0);
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap_or(f64::INFINITY)
                };
                (le, (n - before).max(0.0))
            })
            .collect();
        let latency_ms = quantile(&delta, 0.5).zip(quantile(&delta, 0.99));
        ring.last_counts = Some((at, entries, dead));
        ring.last_buckets = buckets;
        ring.samples.push_back(Sample {
            at,
            entries_per_s,
            dead_letters_per_s,
            queue_depth: by(&lines, "ksched_queue_depth", "pool"),
            latency_ms,
        });
        while ring.samples.len() > KEEP {
            ring.samples.pop_front();
        }
    }

    pub(super) fn all(&self) -> Vec<Sample> {
        let ring = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        ring.samples.iter().cloned().collect()
    }
}

/// The `q` quantile (ms) of a histogram given as (upper bound in seconds, cumulative count)
/// per bucket: the upper bound of the first bucket holding it (Prometheus' buckets are
/// cumulative). None without observations.
fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let mut sorted = buckets.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let count = sorted.last()?.1;
    if count <= 0.0 {
        return None;
    }
    let rank = q * count;
    let mut last_finite = 0.0;
    for (le, n) in sorted {
        if le.is_finite() {
            last_finite = le;
        }
        if n >= rank {
            return Some(if le.is_finite() { le } else { last_finite } * 1000.0);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP ksched_queue_depth jobs waiting
# TYPE ksched_queue_depth gauge
ksched_queue_depth{pool="default",shard="0"} 3
ksched_queue_depth{pool="gpu",shard="0"} 1
ksched_queue_depth{pool="default",shard="1"} 2
ksched_journal_entries_total{shard="0"} 100
ksched_dead_letters_total{reason="timeout"} 4
ksched_workers{pool="a \"b\"",alive="true"} 2
ksched_dispatch_latency_seconds_bucket{le="0.01"} 5
ksched_dispatch_latency_seconds_bucket{le="0.1"} 9
ksched_dispatch_latency_seconds_bucket{le="+Inf"} 10
garbage line
"#;

    #[test]
    fn the_metrics_text_is_read_back() {
        let lines = parse(TEXT);
        assert_eq!(
            by(&lines, "ksched_queue_depth", "pool"),
            BTreeMap::from([("default".into(), 5.0), ("gpu".into(), 1.0)])
        );
        assert_eq!(total(&lines, "ksched_journal_entries_total"), 100.0);
        assert_eq!(
            by(&lines, "ksched_workers", "pool")
                .keys()
                .next()
                .map(String::as_str),
            Some("a \"b\"")
        );
    }

    #[test]
    fn rates_and_latency_come_from_differences() {
        let s = Samples::default();
        s.take(1_000, TEXT);
        let later = TEXT
            .replace(
                "entries_total{shard=\"0\"} 100",
                "entries_total{shard=\"0\"} 300",
            )
            .replace("{reason=\"timeout\"} 4", "{reason=\"timeout\"} 10")
            .replace("{le=\"0.1\"} 9", "{le=\"0.1\"} 109")
            .replace("{le=\"+Inf\"} 10", "{le=\"+Inf\"} 110");
        s.take(3_000, &later);
        let all = s.all();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].entries_per_s, 100.0);
        assert_eq!(all[1].dead_letters_per_s, 3.0);
        // 100 new observations, all in (0.01, 0.1]: p50 and p99 are 100 ms.
        assert_eq!(all[1].latency_ms, Some((100.0, 100.0)));
        assert_eq!(all[1].queue_depth["default"], 5.0);
    }
}
