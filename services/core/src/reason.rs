//! Every machine-readable code the scheduler writes: why a job was dead-lettered (SPEC §4),
//! why it waits, why an input was refused, and the error codes the scheduler itself gives a
//! failed attempt. Each enum's `as_str` is the string in the journal, the DLQ and the SPEC;
//! events keep strings (a worker's own FAILED_FATAL code is a DLQ reason too), so these
//! enums are where the scheduler's own codes are spelled, once.

use std::fmt;

macro_rules! codes {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vdoc])* $variant,)*
        }

        impl $name {
            /// Every code, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The code as journaled and documented.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// The code named `s`, if it is one of these.
            pub fn parse(s: &str) -> Option<$name> {
                Self::ALL.iter().copied().find(|c| c.as_str() == s)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                self.as_str()
            }
        }
    };
}

codes! {
    /// Why a job (or an input record) went to the DLQ. A worker's FAILED_FATAL `error_code`
    /// is a DLQ reason as well; it is not one of these.
    DlqReason {
        /// The job's topic maps to no pool, or no mapped pool offers what it requires.
        NoPoolMapping = "no_pool_mapping",
        /// Unplaced for `placement_timeout`: no live worker in its pools.
        NoWorkers = "no_workers",
        /// Unplaced for `placement_timeout`: every suitable worker was at capacity, or the
        /// pool's circuit stayed open.
        PoolOverloaded = "pool_overloaded",
        /// Unplaced for `placement_timeout`: its tenant stayed at `max_concurrent_jobs`.
        TenantLimit = "tenant_limit",
        /// The input policy denied it.
        SafetyDenied = "safety_denied",
        /// Its last allowed attempt failed.
        MaxRetriesExceeded = "max_retries_exceeded",
        /// Not started, silent or running for too long (reconciler, max runtime).
        Timeout = "timeout",
        /// Its deadline passed.
        DeadlineExceeded = "deadline_exceeded",
        /// An approver rejected it.
        ApprovalRejected = "approval_rejected",
        /// The output policy quarantined its result.
        OutputQuarantined = "output_quarantined",
        /// The input record could not be decoded, or is not a valid request.
        MalformedRecord = "malformed_record",
        /// A job_id seen before, with different content.
        DuplicateJobId = "duplicate_job_id",
        /// The input record exceeds a configured size limit.
        RecordTooLarge = "record_too_large",
        /// Deciding on the input, or writing what it caused, failed deterministically; the
        /// input was set aside so that the scheduler could go on.
        ProcessingFailed = "processing_failed",
        /// The job's pool or tenant already holds as many pending jobs as allowed.
        QueueFull = "queue_full",
        /// The consumer could not read the record at all (e.g. a broken compressed batch).
        UnreadableRecord = "unreadable_record",
        /// The job names a tenant its topic may not carry, or a job id outside its tenant's
        /// namespace (`<tenant_id>:`) on a tenant-bound topic.
        TenantNotAllowed = "tenant_not_allowed",
        /// A secret env value (`$` key) that the producer did not seal: refused before it is
        /// journaled, and the value is kept nowhere (docs/security.md#secrets).
        SecretInClear = "secret_in_clear",
        /// The record is in the Confluent wire format and its schema id could not be looked
        /// up: the schema registry was down or slow (or lookups were rate-limited). Nothing is
        /// wrong with the record; produce it again once the registry answers.
        SchemaUnavailable = "schema_unavailable",
        /// Evaluating the input or output policy on the job took more steps or memory than
        /// `limits.policy_max_steps` / `limits.policy_max_memory_bytes` allow. The job is
        /// not run (fail closed); the policy, not the job, is usually what to fix.
        PolicyLimitExceeded = "policy_limit_exceeded",
        /// The policy requires approval, four eyes are on (`http.four_eyes`), and the job
        /// names no submitter: nobody could approve it, so it is refused at once. Bind its
        /// topic to its producer (pools.yaml `principal:`) or have producers name themselves.
        SubmitterUnknown = "submitter_unknown",
        /// Its `not_before` (or a schedule's next firing) lies further ahead than
        /// `limits.max_delay_ms`.
        DelayTooLong = "delay_too_long",
        /// The disk under the scheduler's store had less free space than
        /// `storage.min_free_disk_bytes`: the job was refused before it was journaled, and
        /// the jobs already accepted went on. Submit it again once space is freed.
        StorageFull = "storage_full",
        /// Its `depends_on` names its own id, an id twice, an empty or over-long id, or more
        /// ids than `limits.max_dependencies`; or its `dependency_timeout_ms` is not positive
        /// or exceeds `limits.max_dependency_wait_ms` (SPEC §11).
        InvalidDependencies = "invalid_dependencies",
        /// Its dependencies' condition can no longer hold, or its dependency timeout passed
        /// first (SPEC §11). The dead letter's `related_job_id` names the dependency.
        DependencyFailed = "dependency_failed",
        /// Its batch fields do not fit (SPEC §11): `batch_id` without `batch_size` or the
        /// reverse, a blank, over-long or control-character batch id (`batch_id`,
        /// `after_batch`), a size that is not positive or exceeds `limits.max_batch_size`, a
        /// size other than the batch's, a batch that has all its members already or has
        /// ended, a callback that is a member of its own batch or also names `depends_on`;
        /// or it sets `batch_outcome`, which only the scheduler sets.
        InvalidBatch = "invalid_batch",
    }
}

codes! {
    /// Why a queued job is not placed now (`JobWaiting.reason_code`).
    WaitReason {
        NoWorkers = "no_workers",
        PoolOverloaded = "pool_overloaded",
        TenantLimit = "tenant_limit",
        CircuitOpen = "circuit_open",
        /// Its concurrency key has as many jobs active as its limit allows (SPEC §10). A job
        /// held so is never dead-lettered for it: its placement timeout starts again.
        ConcurrencyLimited = "concurrency_limited",
        /// Its concurrency key's rate limit is spent until its bucket frees (SPEC §10).
        /// Never dead-lettered for it either.
        RateLimited = "rate_limited",
    }
}

impl WaitReason {
    /// The DLQ reason of a job that waited too long for this reason (SPEC §4). A circuit
    /// that stayed open counts as an overloaded pool.
    pub const fn dlq_reason(self) -> DlqReason {
        match self {
            WaitReason::NoWorkers => DlqReason::NoWorkers,
            WaitReason::PoolOverloaded | WaitReason::CircuitOpen => DlqReason::PoolOverloaded,
            WaitReason::TenantLimit => DlqReason::TenantLimit,
            // Never dead-lettered for it: a job held by its key while a worker could take it
            // starts its timeout again, and one no worker could take is dead-lettered for
            // its pools' reason (tick.rs). The closest code, should a caller ever need one.
            WaitReason::ConcurrencyLimited | WaitReason::RateLimited => DlqReason::PoolOverloaded,
        }
    }

    /// A key's limit (concurrency or rate), which a job waits out however long it takes.
    pub const fn is_flow_limit(self) -> bool {
        matches!(
            self,
            WaitReason::ConcurrencyLimited | WaitReason::RateLimited
        )
    }
}

codes! {
    /// Why an input was refused (`CommandRejected.reason_code`); the job is unchanged.
    Rejection {
        UnknownJob = "unknown_job",
        InvalidTransition = "invalid_transition",
        /// A report for an attempt older than the job's current one (attempt fencing).
        StaleAttempt = "stale_attempt",
        /// A report for an attempt that was never dispatched.
        UnknownAttempt = "unknown_attempt",
        /// A JobStarted for an attempt that already started.
        Duplicate = "duplicate",
        TenantMismatch = "tenant_mismatch",
        StaleJobHash = "stale_job_hash",
        StalePolicySnapshot = "stale_policy_snapshot",
        NotAwaitingApproval = "not_awaiting_approval",
        /// An approval or rejection by the job's own submitter (four eyes).
        FourEyes = "four_eyes",
        InvalidHeartbeat = "invalid_heartbeat",
        /// A report from a worker the attempt was not dispatched to (nor taken over by, after
        /// a rebalance of the pool's dispatch partitions).
        NotAssignedWorker = "not_assigned_worker",
        InvalidConfig = "invalid_config",
        /// A redrive of a job that did not end dead-lettered (FAILED, TIMEOUT, DENIED).
        NotDeadLettered = "not_dead_lettered",
        /// A redrive whose new job id a job already has.
        JobIdTaken = "job_id_taken",
        /// A redrive whose new job id is empty, too long or padded with spaces.
        InvalidJobId = "invalid_job_id",
        /// A redrive into a pool or tenant already at its pending-jobs limit.
        QueueFull = "queue_full",
        /// A reschedule of a job that is not DELAYED.
        NotDelayed = "not_delayed",
        /// A reschedule to a time before 0 or further ahead than `limits.max_delay_ms`.
        InvalidTime = "invalid_time",
        /// A schedule command naming no schedule of its tenant.
        UnknownSchedule = "unknown_schedule",
        /// A CREATE of a schedule id its tenant has already.
        ScheduleExists = "schedule_exists",
        /// A schedule whose id, times or template are not valid (the reason says which).
        InvalidSchedule = "invalid_schedule",
        /// A CREATE on a shard that holds `limits.max_schedules` schedules.
        TooManySchedules = "too_many_schedules",
    }
}

codes! {
    /// Error codes the scheduler gives a failed attempt itself (a worker's codes are free).
    AttemptError {
        /// The worker stopped heartbeating while it had the attempt.
        WorkerLost = "worker_lost",
        /// A draining worker gave the job back (result CANCELLED without a cancel request).
        HandedBack = "handed_back",
        /// FAILED_RETRYABLE without an error code.
        FailedRetryable = "failed_retryable",
        /// FAILED_FATAL without an error code.
        FailedFatal = "failed_fatal",
    }
}

impl AttemptError {
    /// Whether a failure with this code says something about the pool's health (SPEC §5:
    /// the circuit breaker counts it). A lost worker or a job handed back does not.
    pub fn is_pool_failure(code: &str) -> bool {
        !matches!(
            AttemptError::parse(code),
            Some(AttemptError::WorkerLost | AttemptError::HandedBack)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_are_unique() {
        for c in DlqReason::ALL {
            assert_eq!(DlqReason::parse(c.as_str()), Some(*c));
        }
        let mut all: Vec<&str> = DlqReason::ALL.iter().map(|c| c.as_str()).collect();
        all.sort_unstable();
        let n = all.len();
        all.dedup();
        assert_eq!(all.len(), n, "duplicate DLQ reason strings");
        for c in Rejection::ALL {
            assert_eq!(Rejection::parse(c.as_str()), Some(*c));
        }
    }

    #[test]
    fn waiting_maps_to_the_spec_dlq_reasons() {
        assert_eq!(
            WaitReason::CircuitOpen.dlq_reason(),
            DlqReason::PoolOverloaded
        );
        assert_eq!(WaitReason::TenantLimit.dlq_reason(), DlqReason::TenantLimit);
        assert_eq!(WaitReason::NoWorkers.dlq_reason(), DlqReason::NoWorkers);
    }

    #[test]
    fn lost_workers_and_hand_backs_are_not_pool_failures() {
        assert!(!AttemptError::is_pool_failure("worker_lost"));
        assert!(!AttemptError::is_pool_failure("handed_back"));
        assert!(AttemptError::is_pool_failure("timeout"));
        assert!(AttemptError::is_pool_failure("oom"));
    }
}
