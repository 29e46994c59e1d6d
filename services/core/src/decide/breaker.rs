//! The circuit breaker per pool (SPEC §5), in one place: which attempt ends count, when it
//! opens, half-opens and closes, what it holds back, and its reset on new rules.
//!
//! `decide` decides every count (a `BreakerCounted` event) and evaluates the breaker right
//! after it, whether the count came from a worker's result or from a Tick's timeout; `apply`
//! only keeps the window. Probes let through while half-open are tracked by job id and free
//! their slot however they end (state/index.rs, `update_job`).

use crate::decide::Decider;
use crate::events::*;
use crate::reason::AttemptError;
use crate::rules::Rules;
use crate::state::State;

impl Decider<'_, '_> {
    /// The pool whose breaker the end of `job_id`'s current attempt counts against, if any:
    /// only an attempt that was dispatched or running, and not an end that says nothing
    /// about the pool (worker lost, handed back). While the breaker is half-open, only its
    /// probes count: a job placed before it opened says nothing about whether the pool
    /// recovered. Read before the ending event is applied (which frees a probe's slot).
    pub(crate) fn breaker_pool(&self, job_id: &str, code: &str) -> Option<String> {
        let j = self.state().jobs.get(job_id)?;
        let executing = matches!(j.state, JobState::Dispatched | JobState::Running);
        let pool = j.pool.as_deref()?;
        let not_a_probe = self
            .state()
            .breakers
            .get(pool)
            .is_some_and(|b| b.state == CircuitState::HalfOpen && !b.probes.contains(job_id));
        (executing && AttemptError::is_pool_failure(code) && !not_a_probe).then(|| pool.to_owned())
    }

    /// Journals a count in `pool`'s window (if the end counts) and evaluates the breaker.
    pub(crate) fn count_for_breaker(&mut self, pool: Option<String>, job_id: &str, failure: bool) {
        let Some(pool) = pool else { return };
        self.emit(Event::BreakerCounted(BreakerCounted {
            pool: pool.clone(),
            job_id: job_id.to_owned(),
            failure,
        }));
        self.evaluate_breaker(&pool);
    }

    /// Opens, closes or keeps a pool's circuit after a count.
    fn evaluate_breaker(&mut self, pool: &str) {
        let config = self.rules();
        let rules = &config.rules.breaker;
        let Some(b) = self.state().breakers.get(pool) else {
            return;
        };
        let ratio = b.failure_ratio();
        let change = match b.state {
            CircuitState::Closed if b.consecutive_failures >= rules.consecutive_failures => Some((
                CircuitState::Open,
                format!("{} consecutive failures", b.consecutive_failures),
            )),
            CircuitState::Closed
                if b.window.len() >= rules.window as usize && ratio >= rules.failure_ratio =>
            {
                Some((
                    CircuitState::Open,
                    format!(
                        "failure ratio {:.0}% over the last {} results",
                        ratio * 100.0,
                        b.window.len()
                    ),
                ))
            }
            CircuitState::HalfOpen if b.consecutive_failures > 0 => {
                Some((CircuitState::Open, "a probe job failed".to_owned()))
            }
            CircuitState::HalfOpen if b.probe_successes >= rules.close_after_successes => Some((
                CircuitState::Closed,
                format!("{} probe jobs succeeded", b.probe_successes),
            )),
            _ => None,
        };
        if let Some((to, reason)) = change {
            let from = b.state;
            self.emit(Event::CircuitChanged(CircuitChanged {
                pool: pool.to_owned(),
                from,
                to,
                reason,
            }));
        }
    }

    /// Open -> half-open once the cool-down has passed.
    pub(crate) fn maybe_half_open(&mut self, pool: &str) {
        let cooldown = self.rules().rules.breaker.cooldown_ms;
        let due = self.state().breakers.get(pool).is_some_and(|b| {
            b.state == CircuitState::Open
                && b.opened_at
                    .is_some_and(|t| self.now().saturating_sub(t) >= cooldown)
        });
        if due {
            self.emit(Event::CircuitChanged(CircuitChanged {
                pool: pool.to_owned(),
                from: CircuitState::Open,
                to: CircuitState::HalfOpen,
                reason: format!("cool-down of {cooldown} ms passed; letting probes through"),
            }));
        }
    }

    /// Every breaker back to closed with an empty window (new rules: what they counted was
    /// judged under the old ones).
    pub(crate) fn reset_breakers(&mut self, why: &str) {
        let pools: Vec<(String, CircuitState)> = self
            .state()
            .breakers
            .iter()
            .filter(|(_, b)| **b != crate::state::Breaker::default())
            .map(|(p, b)| (p.clone(), b.state))
            .collect();
        for (pool, from) in pools {
            self.emit(Event::CircuitChanged(CircuitChanged {
                pool,
                from,
                to: CircuitState::Closed,
                reason: format!("reset: {why}"),
            }));
        }
    }
}

/// Why the pool's breaker holds jobs back, if it does.
pub(crate) fn breaker_blocks(state: &State, rules: &Rules, pool: &str) -> Option<String> {
    let b = state.breakers.get(pool)?;
    match b.state {
        CircuitState::Closed => None,
        CircuitState::Open => Some(format!("circuit of pool {pool} is open")),
        CircuitState::HalfOpen => {
            (b.probes.len() >= rules.breaker.half_open_probes.max(1) as usize).then(|| {
                format!(
                    "circuit of pool {pool} is half-open and its {} probes are out",
                    b.probes.len()
                )
            })
        }
    }
}
