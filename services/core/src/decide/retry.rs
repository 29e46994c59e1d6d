//! Retries with deterministic backoff, and the ways a job ends (SPEC §4).

use crate::decide::Decider;
use crate::events::*;
use crate::hash::fnv1a64;
use crate::reason::DlqReason;
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
            let counted = self.breaker_pool(job_id, code);
            let backoff = backoff_ms(&config.rules.retry, job_id, attempt);
            self.emit(Event::JobRetrying(JobRetrying {
                job_id: job_id.to_owned(),
                attempt,
                error_code: code.to_owned(),
                error_message: message,
                backoff_ms: backoff,
                retry_at: self.now().saturating_add(backoff),
            }));
            self.count_for_breaker(counted, job_id, true);
        } else {
            let reason = format!(
                "{attempt} attempts failed (max_retries {max_retries}); last error {code}{}{}",
                message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default(),
                worker.map(|w| format!(" on {w}")).unwrap_or_default()
            );
            let counted = self.breaker_pool(job_id, code);
            self.end_failed(
                job_id,
                DlqReason::MaxRetriesExceeded.as_str(),
                message,
                reason,
                counted,
            );
            self.saga_on_terminal(job_id);
        }
    }

    /// FAILED for good, by the scheduler's decision (no pool, placement timeout, retries
    /// exhausted): the job fails, is dead-lettered with `code`, and a saga it ran for as a
    /// compensation learns it failed.
    pub(crate) fn fail_for_good(
        &mut self,
        job_id: &str,
        code: &str,
        message: Option<String>,
        reason: String,
    ) {
        self.end_failed(job_id, code, message, reason, None);
        self.saga_on_terminal(job_id);
    }

    /// FAILED_FATAL from the worker: the job fails, counts against its pool, is
    /// dead-lettered with the worker's code, and its workflow rolls back (SPEC §7).
    pub(crate) fn fail_fatal(&mut self, job_id: &str, code: &str, message: Option<String>) {
        let reason = message
            .clone()
            .unwrap_or_else(|| "the worker reported FAILED_FATAL".to_owned());
        let counted = self.breaker_pool(job_id, code);
        self.end_failed(job_id, code, message, reason, counted);
        self.saga_on_fatal(job_id);
    }

    /// The one way a job becomes FAILED: JobFailed, the breaker count its attempt decided,
    /// the dead letter.
    fn end_failed(
        &mut self,
        job_id: &str,
        code: &str,
        message: Option<String>,
        reason: String,
        counted: Option<String>,
    ) {
        let attempt = self.state().jobs[job_id].attempt;
        self.emit(Event::JobFailed(JobFailed {
            job_id: job_id.to_owned(),
            attempt,
            reason_code: code.to_owned(),
            error_message: message,
        }));
        self.count_for_breaker(counted, job_id, true);
        self.dead_letter(job_id, code, reason);
    }

    /// DENIED (policy or approver): dead-lettered with `code`, a saga learns of it.
    pub(crate) fn deny(
        &mut self,
        job_id: &str,
        code: DlqReason,
        reasons: Vec<String>,
        by: Option<String>,
    ) {
        let reason = match (&by, reasons.first()) {
            (Some(by), Some(why)) => format!("rejected by {by}: {why}"),
            (Some(by), None) => format!("rejected by {by}"),
            (None, _) if reasons.is_empty() => "denied by policy".to_owned(),
            (None, _) => reasons.join("; "),
        };
        self.emit(Event::JobDenied(JobDenied {
            job_id: job_id.to_owned(),
            reason_code: code.as_str().to_owned(),
            reasons,
            by,
        }));
        self.dead_letter(job_id, code.as_str(), reason);
        self.saga_on_terminal(job_id);
    }

    /// TIMEOUT: stops the attempt on its worker, counts a reconciler timeout against the
    /// pool, dead-letters, and settles a saga.
    pub(crate) fn time_out(&mut self, job_id: &str, code: DlqReason, detail: String) {
        let job = &self.state().jobs[job_id];
        let running = job.state.is_active();
        let (attempt, worker, pool, partition) = (
            job.attempt,
            job.worker_id.clone(),
            job.pool.clone(),
            job.partition,
        );
        let counted = (code == DlqReason::Timeout)
            .then(|| self.breaker_pool(job_id, code.as_str()))
            .flatten();
        self.emit(Event::JobTimedOut(JobTimedOut {
            job_id: job_id.to_owned(),
            attempt,
            reason_code: code.as_str().to_owned(),
            detail: detail.clone(),
        }));
        self.count_for_breaker(counted, job_id, true);
        if running && let (Some(worker_id), Some(pool)) = (worker, pool) {
            self.emit(Event::DispatchCancelled(DispatchCancelled {
                job_id: job_id.to_owned(),
                attempt,
                pool,
                worker_id,
                partition: partition.unwrap_or(-1),
                reason: code.as_str().to_owned(),
            }));
        }
        self.dead_letter(job_id, code.as_str(), detail);
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
