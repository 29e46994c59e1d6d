//! Worker selection strategies (SPEC §3.8), behind one trait.
//!
//! Filtering that is the same for every strategy (liveness, pool, placement labels, dispatch
//! partitions, draining, CPU/GPU/parallelism overload) happens in `decide::placement`; a
//! strategy sees only workers that passed it and says which one it prefers, with a score per
//! worker so the placement event can explain the choice. Lower scores win; ties go to the
//! lowest worker_id, so a choice never depends on iteration order.

use crate::rules::StrategyKind;
use crate::state::{Job, Worker};

/// A worker that passed the common filters, as a strategy sees it.
#[derive(Debug, Clone, Copy)]
pub struct Eligible<'a> {
    pub worker_id: &'a str,
    pub worker: &'a Worker,
}

/// A strategy's verdict on one worker.
#[derive(Debug, Clone, PartialEq)]
pub enum Assessment {
    Score(f64),
    /// The worker cannot take this job under this strategy (e.g. not enough memory).
    Unfit(String),
}

/// Picks a worker for a job among eligible workers.
pub trait Strategy {
    fn name(&self) -> &'static str;

    /// Assesses one worker for one job.
    fn assess(&self, job: &Job, worker: &Eligible<'_>) -> Assessment;

    /// The winner among `workers` (sorted by worker_id): lowest score, ties to the lowest id.
    fn choose(&self, job: &Job, workers: &[Eligible<'_>]) -> (Option<usize>, Vec<Assessment>) {
        let assessments: Vec<Assessment> = workers.iter().map(|w| self.assess(job, w)).collect();
        let mut best: Option<(usize, f64)> = None;
        for (i, a) in assessments.iter().enumerate() {
            if let Assessment::Score(s) = a
                && best.is_none_or(|(_, b)| *s < b)
            {
                best = Some((i, *s));
            }
        }
        (best.map(|(i, _)| i), assessments)
    }
}

/// The strategy configured for a pool.
pub fn for_kind(kind: StrategyKind) -> &'static dyn Strategy {
    match kind {
        StrategyKind::LeastLoaded => &LeastLoaded,
        StrategyKind::Throttled => &Throttled,
        StrategyKind::Capacity => &Capacity,
    }
}

/// `active_jobs + cpu_load/100 + gpu_utilization/100` (SPEC §3.6).
#[derive(Debug, Clone, Copy)]
pub struct LeastLoaded;

impl Strategy for LeastLoaded {
    fn name(&self) -> &'static str {
        StrategyKind::LeastLoaded.as_str()
    }

    fn assess(&self, _job: &Job, w: &Eligible<'_>) -> Assessment {
        let hb = &w.worker.heartbeat;
        Assessment::Score(
            f64::from(w.worker.effective_active())
                + hb.cpu_load / 100.0
                + hb.gpu_utilization / 100.0,
        )
    }
}

/// Credit-based (the oncue ThrottledScheduler): a worker may take at most
/// `max_parallel_jobs - active_jobs` jobs; the one with the most credit left wins, so work
/// spreads to whoever asked for the most. The score is the negated credit. A worker with no
/// limit (`max_parallel_jobs = 0`) has no credit to grant and is unfit: throttled pools need
/// workers that declare their limit.
#[derive(Debug, Clone, Copy)]
pub struct Throttled;

impl Strategy for Throttled {
    fn name(&self) -> &'static str {
        StrategyKind::Throttled.as_str()
    }

    fn assess(&self, _job: &Job, w: &Eligible<'_>) -> Assessment {
        let max = w.worker.heartbeat.max_parallel_jobs;
        if max <= 0 {
            return Assessment::Unfit(
                "throttled pools need max_parallel_jobs > 0 in the heartbeat".into(),
            );
        }
        let credit = max - w.worker.effective_active();
        if credit <= 0 {
            Assessment::Unfit(format!("no credit: {} of {max} in use", max - credit))
        } else {
            Assessment::Score(-f64::from(credit))
        }
    }
}

/// Best-fit bin-packing by memory (the oncue JVMCapacityScheduler, made deterministic): the
/// job's `memory` label against each worker's free memory minus what was dispatched to it
/// since its last heartbeat; the worker left with the least free memory wins. A job without
/// a `memory` label demands nothing and goes to the fullest worker that reports memory.
#[derive(Debug, Clone, Copy)]
pub struct Capacity;

impl Strategy for Capacity {
    fn name(&self) -> &'static str {
        StrategyKind::Capacity.as_str()
    }

    fn assess(&self, job: &Job, w: &Eligible<'_>) -> Assessment {
        let Some(free) = w.worker.free_memory() else {
            return Assessment::Unfit("reports no memory_free_bytes".into());
        };
        let demand = job.memory_demand().unwrap_or(0);
        if demand > free {
            Assessment::Unfit(format!("needs {demand} bytes, {free} free"))
        } else {
            Assessment::Score((free - demand) as f64)
        }
    }
}
