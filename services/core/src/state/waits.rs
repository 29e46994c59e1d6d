//! Queued jobs' timers, kept so that a backlog costs storage, not memory.
//!
//! A queued job has up to three timers: its placement timeout, its deadline (where set) and
//! its next aging step (where its pools age). The store indexes each kind by the time it
//! counts from, then the job id ([`wait_keys_of`]), written with the job's record; in memory
//! each kind is a [`Stored`] index that holds its first keys, as a lane does. A Tick fires
//! the first due timers only, at most an entry's work, so the first keys are all a decision
//! reads: each index is read back before a decision when it holds fewer than an entry may
//! take ([`State::refill_windows`]), and the records of the timers a Tick may fire are read
//! with them.
//!
//! A placement timeout is kept by when it starts, not when it is due: it is due its timeout
//! after the later of its start and the liveness floor, which a clock gap raises for every
//! queued job at once ([`crate::events::ClockGap`]). Kept by its start, its place in the
//! index does not move when the floor does, and the order of the index is the order the
//! timers fall due in. Timers due at one time fire in (due time, kind, start, job id) order,
//! in memory or not ([`State::due_timers`]).

use crate::records::Millis;
use crate::rules::{Rules, Timing};

use super::lanes::{JobKey, Stored};
use super::{Job, State, Timer, TimerKind};

/// A queued job's timer in its kind's index: when it counts from, then the job.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct TimerAt {
    pub at: Millis,
    pub job_id: String,
}

impl JobKey for TimerAt {
    fn job_id(&self) -> &str {
        &self.job_id
    }
}

/// The kinds of timer a queued job has, each in an index of its own ([`Waits`]).
pub const WAIT_KINDS: [TimerKind; 3] = [
    TimerKind::Deadline,
    TimerKind::PlacementTimeout,
    TimerKind::Aging,
];

/// Whether a queued job's timer of `kind` is in [`Waits`] (its others, none today, would be
/// in [`State::timers`]).
pub(super) fn is_wait_kind(kind: TimerKind) -> bool {
    WAIT_KINDS.contains(&kind)
}

/// The queued jobs' timers by kind ([`State::waits`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Waits {
    pub deadline: Stored<TimerAt>,
    pub placement: Stored<TimerAt>,
    pub aging: Stored<TimerAt>,
}

impl Default for Waits {
    /// Every timer in memory: a state that began empty.
    fn default() -> Self {
        Waits {
            deadline: Stored::whole(),
            placement: Stored::whole(),
            aging: Stored::whole(),
        }
    }
}

impl Waits {
    /// Nothing known yet: for a state loaded from a store that may hold queued jobs.
    pub fn unknown() -> Waits {
        Waits {
            deadline: Stored::default(),
            placement: Stored::default(),
            aging: Stored::default(),
        }
    }

    /// The index of `kind`, if queued jobs' timers of that kind are kept here.
    pub fn of(&self, kind: TimerKind) -> Option<&Stored<TimerAt>> {
        match kind {
            TimerKind::Deadline => Some(&self.deadline),
            TimerKind::PlacementTimeout => Some(&self.placement),
            TimerKind::Aging => Some(&self.aging),
            _ => None,
        }
    }

    pub(super) fn of_mut(&mut self, kind: TimerKind) -> Option<&mut Stored<TimerAt>> {
        match kind {
            TimerKind::Deadline => Some(&mut self.deadline),
            TimerKind::PlacementTimeout => Some(&mut self.placement),
            TimerKind::Aging => Some(&mut self.aging),
            _ => None,
        }
    }

    /// Each kind's index.
    pub fn each(&self) -> impl Iterator<Item = (TimerKind, &Stored<TimerAt>)> {
        [
            (TimerKind::Deadline, &self.deadline),
            (TimerKind::PlacementTimeout, &self.placement),
            (TimerKind::Aging, &self.aging),
        ]
        .into_iter()
    }

    /// Keys held in memory, in every kind's index (head and past it).
    pub fn keys_in_memory(&self) -> usize {
        self.each()
            .map(|(_, s)| s.head().len() + s.beyond().len())
            .sum()
    }
}

/// When a queued job's timer of `kind` kept at `at` is due, with the liveness floor at
/// `floor`: a placement timeout counts from the later of the two.
pub fn due_of(kind: TimerKind, at: Millis, floor: Millis, timing: Option<&Timing>) -> Millis {
    match (kind, timing) {
        (TimerKind::PlacementTimeout, Some(t)) => {
            at.max(floor).saturating_add(t.placement_timeout_ms)
        }
        _ => at,
    }
}

/// The (kind, key) entries of a queued job's timers under `rules`: what the store's index
/// of queued timers holds for it. None for a job not queued.
pub fn wait_keys_of(id: &str, job: &Job, rules: Option<&Rules>) -> Vec<(TimerKind, TimerAt)> {
    let mut out = Vec::new();
    let Some(rules) = rules else {
        return out;
    };
    // Queued as the indexes judge it (`Entries::of`).
    if super::index::queue_place(job).is_none() {
        return out;
    }
    super::index::each_timer(job, rules, Millis::MIN, None, |_, kind, at| {
        if is_wait_kind(kind) {
            out.push((
                kind,
                TimerAt {
                    at,
                    job_id: id.to_owned(),
                },
            ));
        }
    });
    out
}

/// A timer that may fire: one of [`State::timers`], or a queued job's (`at`: its key in
/// [`Waits`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DueTimer {
    pub timer: Timer,
    pub at: Option<Millis>,
}

impl DueTimer {
    /// The order timers due together fire in: due time, kind, then when it counts from
    /// (its due time, for a timer in memory), then the job.
    fn order(&self) -> (Millis, TimerKind, Millis, &str) {
        let t = &self.timer;
        (t.due, t.kind, self.at.unwrap_or(t.due), &t.job_id)
    }
}

impl State {
    /// The first `cap` timers due by `judged` (but aging steps), in the order they fire,
    /// with the liveness floor at `floor`: those in memory and those of queued jobs
    /// together. Exact while each index of queued timers holds at least `cap` first keys
    /// or all of them, as it does before every decision.
    pub fn due_timers(&self, judged: Millis, floor: Millis, cap: usize) -> Vec<DueTimer> {
        let timing = self.rules().map(|r| &r.timing);
        let mut due: Vec<DueTimer> = (self.timers.iter())
            .take_while(|t| t.due <= judged)
            .take(cap)
            .map(|t| DueTimer {
                timer: t.clone(),
                at: None,
            })
            .collect();
        for kind in [TimerKind::Deadline, TimerKind::PlacementTimeout] {
            due.extend(self.due_waits(kind, judged, floor, timing, cap));
        }
        due.sort_by(|a, b| a.order().cmp(&b.order()));
        due.truncate(cap);
        due
    }

    /// The first `cap` aging steps due by `judged`, in order.
    pub fn due_aging(&self, judged: Millis, cap: usize) -> Vec<DueTimer> {
        let timing = self.rules().map(|r| &r.timing);
        self.due_waits(TimerKind::Aging, judged, Millis::MIN, timing, cap)
            .collect()
    }

    /// The first `cap` queued timers of `kind` due by `judged`, from its index's head.
    pub(super) fn due_waits<'a>(
        &'a self,
        kind: TimerKind,
        judged: Millis,
        floor: Millis,
        timing: Option<&'a Timing>,
        cap: usize,
    ) -> impl Iterator<Item = DueTimer> + 'a {
        (self.waits.of(kind).into_iter())
            .flat_map(|s| s.head().iter())
            .map(move |k| (due_of(kind, k.at, floor, timing), k))
            .take_while(move |(due, _)| *due <= judged)
            .take(cap)
            .map(move |(due, k)| DueTimer {
                timer: Timer {
                    due,
                    kind,
                    job_id: k.job_id.clone(),
                },
                at: Some(k.at),
            })
    }

    /// Whether a timer still stands (an earlier one of the same entry may have settled its
    /// job).
    pub fn timer_stands(&self, t: &DueTimer) -> bool {
        match t.at {
            None => self.timers.contains(&t.timer),
            Some(at) => self.waits.of(t.timer.kind).is_some_and(|s| {
                s.head().contains(&TimerAt {
                    at,
                    job_id: t.timer.job_id.clone(),
                })
            }),
        }
    }
}
