//! Retries with deterministic backoff, and the ways a job ends (SPEC §4).

use crate::decide::Decider;
use crate::events::*;
use crate::hash::fnv1a64;
use crate::rules::RetryRules;

/// Backoff before retrying after `attempt` failed:
/// `min(initial * 2^(attempt-1), max) + jitter`, where the jitter is up to `jitter_ratio` of
/// that and derived from (job_id, attempt), so every replay computes the same value.
pub fn backoff_ms(rules: &RetryRules, job_id: &str, attempt: i32) -> i64 {
    let exp = u32::try_from(attempt.saturating_sub(1).clamp(0, 62)).unwrap_or(0);
    let base = rules
        .initial_backoff_ms
        .saturating_mul(1i64.checked_shl(exp).unwrap_or(i64::MAX))
        .min(rules.max_backoff_ms);
    let unit = (fnv1a64(&[job_id.as_bytes(), &attempt.to_le_bytes()]) % 1_000_000) as f64 / 1e6;
    base + (base as f64 * rules.jitter_ratio * unit) as i64
}

impl Decider<'_, '_> {
    /// A failed attempt: back to PENDING after a backoff if retries remain, else FAILED with
    /// `max_retries_exceeded`.
    pub(crate) fn retry_or_fail(&mut self, job_id: &str, code: &str, message: Option<String>) {
        let config = self.rules();
        let job = &self.state().jobs[job_id];
        let attempt = job.attempt;
        let max_retries = job.max_retries(&config.rules);
        let worker = job.worker_id.clone();
        if attempt < max_retries + 1 {
            let backoff = backoff_ms(&config.rules.retry, job_id, attempt);
            self.emit(Event::JobRetrying(JobRetrying {
                job_id: job_id.to_owned(),
                attempt,
                error_code: code.to_owned(),
                error_message: message,
                backoff_ms: backoff,
                retry_at: self.now.saturating_add(backoff),
            }));
        } else {
            let reason = format!(
                "{attempt} attempts failed (max_retries {max_retries}); last error {code}{}{}",
                message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default(),
                worker.map(|w| format!(" on {w}")).unwrap_or_default()
            );
            self.fail(job_id, attempt, "max_retries_exceeded", message);
            self.dead_letter(job_id, "max_retries_exceeded", reason);
            self.saga_on_terminal(job_id);
        }
    }

    pub(crate) fn fail(
        &mut self,
        job_id: &str,
        attempt: i32,
        reason_code: &str,
        message: Option<String>,
    ) {
        self.emit(Event::JobFailed(JobFailed {
            job_id: job_id.to_owned(),
            attempt,
            reason_code: reason_code.to_owned(),
            error_message: message,
        }));
    }

    /// TIMEOUT: stops the attempt on its worker, dead-letters, and settles a saga.
    pub(crate) fn time_out(&mut self, job_id: &str, reason_code: &str, detail: String) {
        let job = &self.state().jobs[job_id];
        let running = matches!(
            job.state,
            JobState::Scheduled | JobState::Dispatched | JobState::Running
        );
        let (attempt, worker, pool, partition) = (
            job.attempt,
            job.worker_id.clone(),
            job.pool.clone(),
            job.partition,
        );
        self.emit(Event::JobTimedOut(JobTimedOut {
            job_id: job_id.to_owned(),
            attempt,
            reason_code: reason_code.to_owned(),
            detail: detail.clone(),
        }));
        if running && let (Some(worker_id), Some(pool)) = (worker, pool) {
            self.emit(Event::DispatchCancelled(DispatchCancelled {
                job_id: job_id.to_owned(),
                attempt,
                pool,
                worker_id,
                partition: partition.unwrap_or(-1),
                reason: reason_code.to_owned(),
            }));
        }
        self.dead_letter(job_id, reason_code, detail);
        self.saga_on_terminal(job_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_jitters_deterministically() {
        let r = RetryRules {
            max_retries: 5,
            initial_backoff_ms: 1_000,
            max_backoff_ms: 30_000,
            jitter_ratio: 0.2,
        };
        let b1 = backoff_ms(&r, "job-1", 1);
        let b2 = backoff_ms(&r, "job-1", 2);
        let b3 = backoff_ms(&r, "job-1", 3);
        let b9 = backoff_ms(&r, "job-1", 9);
        assert!((1_000..1_200).contains(&b1), "{b1}");
        assert!((2_000..2_400).contains(&b2), "{b2}");
        assert!((4_000..4_800).contains(&b3), "{b3}");
        assert!((30_000..36_000).contains(&b9), "capped: {b9}");
        assert_eq!(b2, backoff_ms(&r, "job-1", 2), "same inputs, same backoff");
        assert_ne!(
            backoff_ms(&r, "job-1", 2),
            backoff_ms(&r, "job-2", 2),
            "jitter spreads jobs apart"
        );
        let none = RetryRules {
            jitter_ratio: 0.0,
            ..r
        };
        assert_eq!(backoff_ms(&none, "job-1", 4), 8_000);
        assert_eq!(backoff_ms(&none, "job-1", 100), 30_000);
    }
}
