//! Schedules' times (SPEC §9): which firings a cron expression or an interval makes, read in
//! an IANA time zone, between a start and an end; the job id and the jitter of a firing.
//!
//! Everything here is pure: the same spec and the same time give the same firings on every
//! machine, since the time-zone database is the one bundled in the binary. The journal
//! records each firing's next one (`ScheduleFired.next_slot`), so a replay folds the times a
//! decision computed, whatever database a later binary carries.

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use jiff::Timestamp;
use jiff::tz::TimeZone;

use crate::records::{Millis, ScheduleSpec};

/// Longest schedule id, in bytes.
pub const MAX_SCHEDULE_ID_BYTES: usize = 128;
/// Shortest interval of an interval schedule, in ms.
pub const MIN_INTERVAL_MS: i64 = 1_000;
/// Longest cron expression, in bytes.
const MAX_CRON_BYTES: usize = 256;
/// What ends the job id of a firing made by a TRIGGER command.
pub const TRIGGER_SUFFIX: &str = "/trigger";
/// Labels a schedule's jobs carry: the schedule's id, and the firing's time (RFC 3339).
pub const LABEL_SCHEDULE: &str = "ksched.schedule";
pub const LABEL_SLOT: &str = "ksched.slot";

/// When a schedule fires: its expression or interval, read in its zone, within its bounds.
#[derive(Debug, Clone)]
pub struct Times {
    rule: Rule,
    start: Option<Millis>,
    end: Option<Millis>,
}

#[derive(Debug, Clone)]
enum Rule {
    Cron {
        cron: Box<Cron>,
        zone: TimeZone,
    },
    /// Firings at `anchor + k * every`, k >= 0.
    Interval {
        anchor: Millis,
        every: Millis,
    },
}

impl Times {
    /// The times of `spec`, or what is wrong with it. An interval counts from `start_at`, or
    /// else from `anchor` (the schedule's creation).
    pub fn of(spec: &ScheduleSpec, anchor: Millis) -> Result<Times, String> {
        let rule = match (&spec.cron, spec.interval_ms) {
            (Some(expr), None) => Rule::Cron {
                cron: Box::new(parse_cron(expr)?),
                zone: zone(&spec.time_zone)?,
            },
            (None, Some(every)) => {
                if every < MIN_INTERVAL_MS {
                    return Err(format!(
                        "interval_ms {every} is shorter than {MIN_INTERVAL_MS}"
                    ));
                }
                zone(&spec.time_zone)?;
                Rule::Interval {
                    anchor: spec.start_at.unwrap_or(anchor),
                    every,
                }
            }
            (Some(_), Some(_)) => return Err("give cron or interval_ms, not both".into()),
            (None, None) => return Err("give cron or interval_ms".into()),
        };
        Ok(Times {
            rule,
            start: spec.start_at,
            end: spec.end_at,
        })
    }

    /// The first firing strictly after `t`, or None when the schedule has ended (or the
    /// expression never matches again).
    pub fn next_after(&self, t: Millis) -> Option<Millis> {
        // Not before the start: the first firing at or after it.
        let from = match self.start {
            Some(start) if start > t => start - 1,
            _ => t,
        };
        let next = match &self.rule {
            Rule::Interval { anchor, every } => {
                if from < *anchor {
                    *anchor
                } else {
                    let k = (from - anchor) / every + 1;
                    anchor.checked_add(k.checked_mul(*every)?)?
                }
            }
            Rule::Cron { cron, zone } => {
                let at = Timestamp::from_millisecond(from)
                    .ok()?
                    .to_zoned(zone.clone());
                let next = cron.find_next_occurrence(&at, false).ok()?;
                let ms = next.timestamp().as_millisecond();
                // Cron firings are whole seconds; `from` may lie within one.
                if ms > from {
                    ms
                } else {
                    let at = Timestamp::from_millisecond(ms + 1)
                        .ok()?
                        .to_zoned(zone.clone());
                    cron.find_next_occurrence(&at, false)
                        .ok()?
                        .timestamp()
                        .as_millisecond()
                }
            }
        };
        self.end.is_none_or(|end| next <= end).then_some(next)
    }

    /// The latest firing at or before `t`, or None when there is none (before the start).
    pub fn latest_at_or_before(&self, t: Millis) -> Option<Millis> {
        let t = self.end.map_or(t, |end| t.min(end));
        let latest = match &self.rule {
            Rule::Interval { anchor, every } => {
                if t < *anchor {
                    return None;
                }
                anchor + (t - anchor) / every * every
            }
            Rule::Cron { cron, zone } => {
                let at = Timestamp::from_millisecond(t).ok()?.to_zoned(zone.clone());
                cron.find_previous_occurrence(&at, true)
                    .ok()?
                    .timestamp()
                    .as_millisecond()
            }
        };
        (latest <= t && self.start.is_none_or(|s| latest >= s)).then_some(latest)
    }
}

fn parse_cron(expr: &str) -> Result<Cron, String> {
    let trimmed = expr.trim();
    if trimmed.is_empty() || expr.len() > MAX_CRON_BYTES {
        return Err(format!(
            "cron must be 1 to {MAX_CRON_BYTES} bytes, got {}",
            expr.len()
        ));
    }
    if trimmed.eq_ignore_ascii_case("@reboot") {
        return Err("@reboot has no time to fire at".into());
    }
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(trimmed)
        .map_err(|e| {
            format!(
                "cron {:?}: {e}",
                crate::records::truncate_for_display(trimmed, 64)
            )
        })
}

fn zone(name: &str) -> Result<TimeZone, String> {
    if name.is_empty() || name.eq_ignore_ascii_case("UTC") {
        return Ok(TimeZone::UTC);
    }
    TimeZone::get(name).map_err(|_| {
        format!(
            "time_zone {:?} is not an IANA time zone name",
            crate::records::truncate_for_display(name, 64)
        )
    })
}

/// What is wrong with a schedule spec, if anything; `anchor` is the schedule's creation,
/// `max_delay_ms` bounds its jitter (a firing's job waits DELAYED for it).
pub fn invalid_spec(spec: &ScheduleSpec, anchor: Millis, max_delay_ms: i64) -> Option<String> {
    let times = match Times::of(spec, anchor) {
        Ok(t) => t,
        Err(e) => return Some(e),
    };
    if spec.jitter_ms < 0 || spec.jitter_ms > max_delay_ms {
        return Some(format!(
            "jitter_ms {} must be between 0 and limits.max_delay_ms {max_delay_ms}",
            spec.jitter_ms
        ));
    }
    if spec.catch_up_window_ms < 0 {
        return Some(format!(
            "catch_up_window_ms {} must not be negative",
            spec.catch_up_window_ms
        ));
    }
    for (what, t) in [("start_at", spec.start_at), ("end_at", spec.end_at)] {
        if t.is_some_and(|t| t < 0) {
            return Some(format!("{what} is before 1970"));
        }
    }
    if let (Some(start), Some(end)) = (spec.start_at, spec.end_at)
        && end < start
    {
        return Some(format!("end_at {end} is before start_at {start}"));
    }
    if spec.template.topic.trim().is_empty() {
        return Some("template.topic is empty".into());
    }
    if times.next_after(anchor - 1).is_none() {
        return Some("the schedule never fires (its times have ended, or never match)".into());
    }
    None
}

/// What is wrong with a schedule id, if anything: 1 to 128 ASCII letters, digits, `-`, `_`
/// and `.`, not beginning with `.`. (`:` `@` `/` separate the parts of its jobs' ids; URLs
/// collapse `.` and `..`; invisible characters would let one id pass for another.)
pub fn invalid_schedule_id(id: &str) -> Option<String> {
    if id.is_empty()
        || id.len() > MAX_SCHEDULE_ID_BYTES
        || id.starts_with('.')
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Some(format!(
            "schedule id {:?} must be 1 to {MAX_SCHEDULE_ID_BYTES} ASCII letters, digits, '-', '_' or '.', not beginning with '.'",
            crate::records::truncate_for_display(id, 64)
        ));
    }
    None
}

/// The key a schedule is held under: its tenant and id.
pub fn schedule_key(tenant: &str, schedule_id: &str) -> String {
    format!("{tenant}:{schedule_id}")
}

/// A firing's time as its job id and label spell it: RFC 3339, UTC, milliseconds only when
/// it has them.
pub fn slot_text(slot: Millis) -> String {
    match Timestamp::from_millisecond(slot) {
        Ok(t) => t.to_string(),
        Err(_) => slot.to_string(),
    }
}

/// The job id of a schedule's firing: `<tenant>:<schedule id>@<time>`, with `/trigger` for
/// one a TRIGGER command made. The same firing always gets the same id, so it runs once.
pub fn firing_job_id(tenant: &str, schedule_id: &str, slot: Millis, triggered: bool) -> String {
    let mut id = format!("{tenant}:{schedule_id}@{}", slot_text(slot));
    if triggered {
        id.push_str(TRIGGER_SUFFIX);
    }
    id
}

/// Whether `job_id` has the form of a schedule firing's id (producers may not take one).
pub fn is_firing_job_id(job_id: &str) -> bool {
    let Some((_, tail)) = job_id.rsplit_once('@') else {
        return false;
    };
    let tail = tail.strip_suffix(TRIGGER_SUFFIX).unwrap_or(tail);
    tail.parse::<Timestamp>().is_ok()
}

/// How long a firing's job waits after its time: the same for the same schedule and time,
/// spread over `0..=jitter_ms`.
pub fn jitter_of(tenant: &str, schedule_id: &str, slot: Millis, jitter_ms: i64) -> Millis {
    if jitter_ms <= 0 {
        return 0;
    }
    let h = crate::hash::fnv1a64(&[
        tenant.as_bytes(),
        b"\x1f",
        schedule_id.as_bytes(),
        &slot.to_be_bytes(),
    ]);
    (h % (jitter_ms as u64 + 1)) as Millis
}

/// Epoch ms of an RFC 3339 time (`2026-12-06T10:00:00Z`, offsets too).
pub fn parse_time(text: &str) -> Option<Millis> {
    text.parse::<Timestamp>().ok().map(|t| t.as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(text: &str) -> Millis {
        parse_time(text).unwrap()
    }

    fn cron(expr: &str, zone: &str) -> ScheduleSpec {
        ScheduleSpec {
            cron: Some(expr.into()),
            time_zone: zone.into(),
            template: crate::records::JobTemplate {
                topic: "jobs".into(),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn times(spec: &ScheduleSpec) -> Times {
        Times::of(spec, 0).unwrap()
    }

    #[test]
    fn five_fields_fire_on_the_minute_and_six_on_the_second() {
        let t = times(&cron("*/15 * * * *", "UTC"));
        assert_eq!(
            t.next_after(ms("2026-12-06T10:07:30.500Z")),
            Some(ms("2026-12-06T10:15:00Z"))
        );
        // Strictly after: a firing time itself is not its own next.
        assert_eq!(
            t.next_after(ms("2026-12-06T10:15:00Z")),
            Some(ms("2026-12-06T10:30:00Z"))
        );
        assert_eq!(
            t.latest_at_or_before(ms("2026-12-06T10:15:00Z")),
            Some(ms("2026-12-06T10:15:00Z"))
        );
        let t = times(&cron("*/10 * * * * *", "UTC"));
        assert_eq!(
            t.next_after(ms("2026-12-06T10:00:00.001Z")),
            Some(ms("2026-12-06T10:00:10Z"))
        );
        let t = times(&cron("@daily", "UTC"));
        assert_eq!(
            t.next_after(ms("2026-12-06T10:00:00Z")),
            Some(ms("2026-12-07T00:00:00Z"))
        );
    }

    #[test]
    fn a_zone_moves_the_firings_and_dst_gaps_and_folds_fire_once() {
        // 09:00 in New York is 14:00 UTC in winter, 13:00 in summer.
        let t = times(&cron("0 9 * * *", "America/New_York"));
        assert_eq!(
            t.next_after(ms("2026-12-06T00:00:00Z")),
            Some(ms("2026-12-06T14:00:00Z"))
        );
        assert_eq!(
            t.next_after(ms("2026-07-01T00:00:00Z")),
            Some(ms("2026-07-01T13:00:00Z"))
        );
        // 2026-03-08 02:30 does not exist in New York (the clocks jump 02:00 -> 03:00): the
        // firing happens once, at the first time after the gap (OCPS).
        let t = times(&cron("30 2 * * *", "America/New_York"));
        let gap_day = t.next_after(ms("2026-03-08T05:00:00Z")).unwrap();
        assert_eq!(gap_day, ms("2026-03-08T07:00:00Z"), "03:00 EDT");
        assert_eq!(t.next_after(gap_day), Some(ms("2026-03-09T06:30:00Z")));
        // 2026-11-01 01:30 happens twice (01:00-02:00 repeats): it fires once.
        let t = times(&cron("30 1 * * *", "America/New_York"));
        let first = t.next_after(ms("2026-11-01T04:00:00Z")).unwrap();
        assert_eq!(first, ms("2026-11-01T05:30:00Z"), "01:30 EDT");
        assert_eq!(t.next_after(first), Some(ms("2026-11-02T06:30:00Z")));
    }

    #[test]
    fn sub_hourly_schedules_keep_firing_through_a_fold() {
        // 2026-11-01 in New York: 01:00-02:00 happens twice (EDT, then EST).
        let t = times(&cron("*/30 * * * *", "America/New_York"));
        let mut at = ms("2026-11-01T04:45:00Z");
        let mut firings = Vec::new();
        for _ in 0..5 {
            at = t.next_after(at).unwrap();
            firings.push(at);
        }
        assert_eq!(
            firings,
            [
                ms("2026-11-01T05:00:00Z"),
                ms("2026-11-01T05:30:00Z"),
                ms("2026-11-01T06:00:00Z"),
                ms("2026-11-01T06:30:00Z"),
                ms("2026-11-01T07:00:00Z"),
            ],
            "every real half hour, both 01:00s and 01:30s"
        );
    }

    #[test]
    fn intervals_count_from_the_start_and_stop_at_the_end() {
        let spec = ScheduleSpec {
            interval_ms: Some(60_000),
            start_at: Some(1_000_000),
            end_at: Some(1_180_000),
            template: crate::records::JobTemplate {
                topic: "jobs".into(),
                ..Default::default()
            },
            ..Default::default()
        };
        let t = times(&spec);
        assert_eq!(t.next_after(0), Some(1_000_000));
        assert_eq!(t.next_after(1_000_000), Some(1_060_000));
        assert_eq!(t.next_after(1_150_000), Some(1_180_000));
        assert_eq!(t.next_after(1_180_000), None, "the end is the last firing");
        assert_eq!(t.latest_at_or_before(999_999), None);
        assert_eq!(t.latest_at_or_before(1_130_000), Some(1_120_000));
        assert_eq!(t.latest_at_or_before(9_000_000), Some(1_180_000));
        // A cron schedule's start and end bound it alike.
        let mut spec = cron("0 * * * *", "UTC");
        spec.start_at = Some(ms("2026-12-06T10:30:00Z"));
        spec.end_at = Some(ms("2026-12-06T12:00:00Z"));
        let t = times(&spec);
        assert_eq!(t.next_after(0), Some(ms("2026-12-06T11:00:00Z")));
        assert_eq!(t.latest_at_or_before(ms("2026-12-06T10:59:00Z")), None);
        assert_eq!(
            t.latest_at_or_before(ms("2026-12-07T00:00:00Z")),
            Some(ms("2026-12-06T12:00:00Z"))
        );
        assert_eq!(t.next_after(ms("2026-12-06T12:00:00Z")), None);
    }

    #[test]
    fn bad_specs_are_named() {
        let anchor = ms("2026-12-06T10:00:00Z");
        let max = 366 * 86_400_000;
        let bad = |spec: ScheduleSpec, says: &str| {
            let why = invalid_spec(&spec, anchor, max).expect("refused");
            assert!(why.contains(says), "{why:?} should say {says:?}");
        };
        bad(cron("61 * * * *", "UTC"), "cron");
        bad(cron("* * * * * * 2027", "UTC"), "cron");
        bad(cron("@reboot", "UTC"), "@reboot");
        bad(cron("", "UTC"), "cron must be");
        bad(cron("0 9 * * *", "Mars/Olympus"), "IANA");
        bad(cron("0 0 30 2 *", "UTC"), "never fires");
        let mut s = cron("0 9 * * *", "UTC");
        s.interval_ms = Some(60_000);
        bad(s, "not both");
        let mut s = cron("0 9 * * *", "UTC");
        s.cron = None;
        bad(s.clone(), "give cron or interval_ms");
        s.interval_ms = Some(999);
        bad(s, "shorter");
        let mut s = cron("0 9 * * *", "UTC");
        s.jitter_ms = -1;
        bad(s, "jitter_ms");
        let mut s = cron("0 9 * * *", "UTC");
        s.end_at = Some(anchor - 86_400_000);
        bad(s, "never fires");
        let mut s = cron("0 9 * * *", "UTC");
        s.start_at = Some(anchor + 10);
        s.end_at = Some(anchor);
        bad(s, "before start_at");
        let mut s = cron("0 9 * * *", "UTC");
        s.template.topic = String::new();
        bad(s, "template.topic");
        assert_eq!(
            invalid_spec(&cron("0 9 * * 1-5", "Europe/Berlin"), anchor, max),
            None
        );
        assert_eq!(invalid_spec(&cron("@hourly", ""), anchor, max), None);
    }

    #[test]
    fn firing_ids_are_reserved_and_jitter_is_stable() {
        let slot = ms("2026-12-06T10:00:00Z");
        let id = firing_job_id("acme", "nightly", slot, false);
        assert_eq!(id, "acme:nightly@2026-12-06T10:00:00Z");
        assert!(is_firing_job_id(&id));
        assert!(is_firing_job_id(&firing_job_id("acme", "n", slot, true)));
        assert!(!is_firing_job_id("acme:order-17"));
        assert!(!is_firing_job_id("user@example.com"));
        assert!(invalid_schedule_id("nightly-report").is_none());
        for bad in [
            "",
            "a:b",
            "a@b",
            "a/b",
            " a",
            "a\n",
            ".",
            "..",
            "a\u{200b}b",
            "ü",
            &"x".repeat(129),
        ] {
            assert!(invalid_schedule_id(bad).is_some(), "{bad:?}");
        }
        let j = jitter_of("acme", "nightly", slot, 5_000);
        assert!((0..=5_000).contains(&j));
        assert_eq!(j, jitter_of("acme", "nightly", slot, 5_000));
        let spread: std::collections::BTreeSet<Millis> = (0..50)
            .map(|i| jitter_of("acme", "nightly", slot + i * 60_000, 5_000))
            .collect();
        assert!(spread.len() > 40, "jitter spreads firings: {spread:?}");
        assert_eq!(jitter_of("acme", "nightly", slot, 0), 0);
    }
}
