//! One populated value of every record and every journal event, shared by the codec tests.

use std::collections::BTreeMap;

use ksched_core::events::*;
use ksched_core::records::*;

pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

pub(crate) fn template() -> JobTemplate {
    JobTemplate {
        topic: "job.default".into(),
        priority: Priority::Interactive,
        labels: map(&[("undo", "true")]),
        env: map(&[("$TOKEN", "s3cret")]),
        payload: b"rollback".to_vec(),
        budget: Budget {
            deadline_ms: Some(60_000),
            max_runtime_ms: None,
        },
        meta: JobMeta::default(),
    }
}

pub(crate) fn job_request() -> JobRequest {
    JobRequest {
        job_id: "job-1".into(),
        topic: "job.default".into(),
        tenant_id: "acme".into(),
        principal_id: Some("alice".into()),
        priority: Priority::Critical,
        labels: map(&[("preferred_pool", "default"), ("placement.zone", "eu")]),
        env: map(&[("MODE", "fast"), ("$API_KEY", "k")]),
        payload: vec![0, 1, 2, 255],
        budget: Budget {
            deadline_ms: Some(300_000),
            max_runtime_ms: Some(10_000),
        },
        meta: JobMeta {
            idempotency_key: Some("idem-1".into()),
            capability: Some("shell.exec".into()),
            risk_tags: vec!["prod".into()],
            requires: vec!["gpu".into()],
            actor_id: Some("svc".into()),
        },
        workflow_id: Some("wf-1".into()),
        step_index: Some(2),
        compensation: Some(Box::new(template())),
        submitted_at: 1_700_000_000_123,
        traceparent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into()),
        not_before: Some(1_764_000_000_000),
        depends_on: vec!["job-0".into(), "job-00".into()],
        dependency_condition: ksched_core::records::DependencyCondition::AllTerminal,
        dependency_timeout_ms: Some(3_600_000),
        batch_id: Some("nightly".into()),
        batch_size: Some(100_000),
        after_batch: Some("hourly".into()),
        batch_outcome: Some(ksched_core::records::BatchOutcome {
            batch_id: "hourly".into(),
            succeeded: 7,
            failed: 2,
        }),
    }
}

pub(crate) fn job_started() -> JobStarted {
    JobStarted {
        job_id: "job-1".into(),
        attempt: 1,
        worker_id: "w-1".into(),
        started_at: 1_700_000_000_500,
    }
}

pub(crate) fn job_progress() -> JobProgress {
    JobProgress {
        job_id: "job-1".into(),
        attempt: 1,
        worker_id: "w-1".into(),
        progress: 0.5,
        message: Some("half".into()),
        sent_at: 1_700_000_000_600,
    }
}

pub(crate) fn job_result() -> JobResult {
    JobResult {
        job_id: "job-1".into(),
        attempt: 1,
        worker_id: "w-1".into(),
        status: ResultStatus::FailedFatal,
        error_code: Some("bad_input".into()),
        error_message: Some("no".into()),
        result_ptr: Some("s3://bucket/out".into()),
        result_meta: ResultMeta {
            size_bytes: Some(42),
            content_type: Some("application/json".into()),
            labels: map(&[("contains_pii", "false")]),
        },
        execution_ms: 77,
        finished_at: 1_700_000_001_000,
    }
}

pub(crate) fn heartbeat() -> Heartbeat {
    Heartbeat {
        worker_id: "w-1".into(),
        pool: "default".into(),
        active_jobs: 1,
        max_parallel_jobs: 4,
        cpu_load: 12.5,
        gpu_utilization: 0.0,
        memory_load: 40.0,
        memory_free_bytes: Some(1 << 30),
        capabilities: vec!["gpu".into()],
        labels: map(&[("zone", "eu")]),
        owned_partitions: vec![0, 3],
        active_job_ids: vec!["job-1".into()],
        draining: false,
        sent_at: 1_700_000_000_700,
    }
}

pub(crate) fn cancel_job() -> CancelJob {
    CancelJob {
        job_id: "job-1".into(),
        tenant_id: Some("acme".into()),
        principal_id: "alice".into(),
        reason: Some("changed my mind".into()),
        requested_at: 1_700_000_000_800,
        batch_id: Some("nightly".into()),
    }
}

pub(crate) fn approve_job() -> ApproveJob {
    ApproveJob {
        job_id: "job-1".into(),
        job_hash: "ab".repeat(32),
        policy_snapshot: "snap".into(),
        approver: "bob".into(),
        comment: None,
        requested_at: 1_700_000_000_900,
    }
}

pub(crate) fn reject_job() -> RejectJob {
    RejectJob {
        job_id: "job-1".into(),
        approver: "bob".into(),
        reason: Some("too risky".into()),
        requested_at: 1_700_000_000_950,
    }
}

pub(crate) fn tick() -> Tick {
    Tick {
        source: "ticker-1".into(),
        issued_at: 1_700_000_001_000,
        watermark: Some(1_700_000_000_900),
    }
}

pub(crate) fn constraints() -> Constraints {
    Constraints {
        max_retries: Some(2),
        max_concurrent_jobs: Some(10),
        max_runtime_ms: Some(5_000),
        deadline_ms: None,
        labels: map(&[("policy", "strict")]),
    }
}

pub(crate) fn dispatch() -> Dispatch {
    Dispatch {
        job: job_request(),
        attempt: 2,
        worker_id: "w-1".into(),
        pool: "default".into(),
        constraints: constraints(),
        deadline_at: Some(1_700_000_300_123),
        dispatched_at: 1_700_000_000_400,
        reply_partition: Some(3),
    }
}

pub(crate) fn cancel_dispatch() -> CancelDispatch {
    CancelDispatch {
        job_id: "job-1".into(),
        attempt: 2,
        worker_id: "w-1".into(),
        pool: "default".into(),
        reason: "cancelled".into(),
        at: 1_700_000_000_999,
    }
}

pub(crate) fn dead_letter() -> DeadLetter {
    DeadLetter {
        job_id: "job-1".into(),
        topic: "job.default".into(),
        tenant_id: "acme".into(),
        reason_code: "max_retries_exceeded".into(),
        reason: "3 attempts failed".into(),
        last_state: "RUNNING".into(),
        attempts: 3,
        cause_topic: "ksched.results".into(),
        cause_partition: 0,
        cause_offset: 99,
        at: 1_700_000_002_000,
        related_job_id: Some("job-0".into()),
    }
}

fn candidate(score: Option<f64>) -> Candidate {
    Candidate {
        worker_id: "w-1".into(),
        pool: "default".into(),
        score,
        skipped: score
            .is_none()
            .then(|| "overloaded: cpu_load 95 >= 90".to_owned()),
    }
}

pub(crate) fn reconfigure() -> Reconfigure {
    Reconfigure {
        rules_json: "{\"pools\":{}}".into(),
        policy_modules: map(&[("input.rego", "package ksched.input\nallow := true\n")]),
        policy_data_json: "{}".into(),
        policy_snapshot: "snap".into(),
        rules_id: "rules".into(),
    }
}

/// One of every event, in union order.
pub(crate) fn every_event() -> Vec<Event> {
    vec![
        Event::JobAccepted(JobAccepted {
            job_id: "job-1".into(),
            request: Some(Box::new(job_request())),
            job_hash: "ab".repeat(32),
            pools: vec!["default".into()],
            routing_notes: vec!["pool gpu lacks gpu".into()],
            unique_key: Some("label:daily-sales".into()),
        }),
        Event::JobDuplicate(JobDuplicate {
            job_id: "job-2".into(),
            existing_job_id: "job-1".into(),
            kind: DuplicateKind::IdempotencyKey,
            idempotency_key: Some("idem-1".into()),
        }),
        Event::PolicyEvaluated(PolicyEvaluated {
            job_id: "job-1".into(),
            snapshot_id: "snap".into(),
            verdict: Verdict::RequireApproval,
            reasons: vec!["prod".into()],
            constraints: constraints(),
        }),
        Event::JobQueued(JobQueued {
            job_id: "job-1".into(),
            pools: vec!["default".into()],
            priority: Priority::Batch,
        }),
        Event::JobWaiting(JobWaiting {
            job_id: "job-1".into(),
            reason_code: "no_workers".into(),
            detail: "no alive worker in default".into(),
            candidates: vec![candidate(None)],
            candidates_omitted: 3,
        }),
        Event::JobScheduled(JobScheduled {
            job_id: "job-1".into(),
            attempt: 1,
            pool: "default".into(),
            worker_id: "w-1".into(),
            strategy: "least_loaded".into(),
            candidates: vec![candidate(Some(1.25)), candidate(None)],
            notes: vec!["preferred_worker_id w-9 is not alive".into()],
            candidates_omitted: 0,
        }),
        Event::JobDispatched(JobDispatched {
            job_id: "job-1".into(),
            attempt: 1,
            pool: "default".into(),
            worker_id: "w-1".into(),
            partition: 3,
            deadline_at: Some(1_700_000_300_123),
        }),
        Event::JobRunning(JobRunning {
            job_id: "job-1".into(),
            attempt: 1,
            worker_id: "w-2".into(),
            reassigned_from: Some("w-1".into()),
        }),
        Event::JobProgressed(JobProgressed {
            job_id: "job-1".into(),
            attempt: 1,
            progress: 0.25,
            message: None,
        }),
        Event::JobSucceeded(JobSucceeded {
            job_id: "job-1".into(),
            attempt: 1,
            worker_id: "w-1".into(),
            result_ptr: None,
            result_meta: ResultMeta::default(),
            execution_ms: 10,
        }),
        Event::JobQuarantined(JobQuarantined {
            job_id: "job-1".into(),
            snapshot_id: "snap".into(),
            reasons: vec!["pii".into()],
        }),
        Event::JobRetrying(JobRetrying {
            job_id: "job-1".into(),
            attempt: 1,
            error_code: "worker_lost".into(),
            error_message: None,
            backoff_ms: 1_100,
            retry_at: 1_700_000_010_000,
        }),
        Event::JobFailed(JobFailed {
            job_id: "job-1".into(),
            attempt: 3,
            reason_code: "max_retries_exceeded".into(),
            error_message: Some("boom".into()),
        }),
        Event::JobCancelled(JobCancelled {
            job_id: "job-1".into(),
            principal_id: "alice".into(),
            reason: None,
        }),
        Event::JobTimedOut(JobTimedOut {
            job_id: "job-1".into(),
            attempt: 1,
            reason_code: "deadline_exceeded".into(),
            detail: "deadline 300000 ms passed".into(),
        }),
        Event::JobDenied(JobDenied {
            job_id: "job-1".into(),
            reason_code: "safety_denied".into(),
            reasons: vec!["no prod on fridays".into()],
            by: None,
        }),
        Event::ApprovalRequested(ApprovalRequested {
            job_id: "job-1".into(),
            job_hash: "ab".repeat(32),
            snapshot_id: "snap".into(),
            reasons: vec!["prod".into()],
        }),
        Event::JobApproved(JobApproved {
            job_id: "job-1".into(),
            approver: "bob".into(),
            comment: Some("ok".into()),
        }),
        Event::DispatchCancelled(DispatchCancelled {
            job_id: "job-1".into(),
            attempt: 1,
            pool: "default".into(),
            worker_id: "w-1".into(),
            partition: -1,
            reason: "cancelled".into(),
        }),
        Event::DeadLettered(DeadLettered {
            dead_letter: Box::new(dead_letter()),
        }),
        Event::CommandRejected(CommandRejected {
            job_id: "job-1".into(),
            input_kind: "JobResult".into(),
            reason_code: "stale_attempt".into(),
            reason: "attempt 1 < current 2".into(),
            state: Some(JobState::Running),
        }),
        Event::WorkerUpdated(WorkerUpdated {
            worker_id: "w-1".into(),
            heartbeat: Box::new(heartbeat()),
            joined: true,
        }),
        Event::WorkerLost(WorkerLost {
            worker_id: "w-1".into(),
            pool: "default".into(),
            last_seen: 1_700_000_000_700,
            job_ids: vec!["job-1".into()],
        }),
        Event::CircuitChanged(CircuitChanged {
            pool: "default".into(),
            from: CircuitState::Closed,
            to: CircuitState::Open,
            reason: "5 consecutive failures".into(),
        }),
        Event::SagaStepRecorded(SagaStepRecorded {
            workflow_id: "wf-1".into(),
            job_id: "job-1".into(),
            tenant_id: "acme".into(),
            principal_id: Some("alice".into()),
            compensation: Box::new(template()),
            topic: Some("job.default".into()),
        }),
        Event::SagaRollbackStarted(SagaRollbackStarted {
            workflow_id: "wf-1".into(),
            failed_job_id: "job-3".into(),
            steps: 2,
            tenant_id: Some("acme".into()),
        }),
        Event::SagaCompensationSubmitted(SagaCompensationSubmitted {
            workflow_id: "wf-1".into(),
            job_id: "wf-1~comp~1".into(),
            for_job_id: "job-1".into(),
            tenant_id: None,
        }),
        Event::SagaFinished(SagaFinished {
            workflow_id: "wf-1".into(),
            outcome: SagaOutcome::Compensated,
            detail: "2 compensations succeeded".into(),
            tenant_id: Some("acme".into()),
        }),
        Event::IdempotencyPruned(IdempotencyPruned {
            before: 1_699_000_000_000,
        }),
        Event::ConfigApplied(ConfigApplied {
            config: reconfigure(),
        }),
        Event::BreakerCounted(BreakerCounted {
            pool: "default".into(),
            job_id: "job-1".into(),
            failure: true,
        }),
        Event::ClockGap(ClockGap {
            from: 1_700_000_000_000,
            to: 1_700_000_045_000,
        }),
        Event::WorkerForgotten(WorkerForgotten {
            worker_id: "w-2".into(),
            pool: "default".into(),
            last_seen: 1_700_000_000_000,
        }),
        Event::JobRedriven(JobRedriven {
            job_id: "job-1".into(),
            new_job_id: "job-1.redrive".into(),
            principal_id: "op".into(),
            reason: Some("fixed".into()),
        }),
        Event::SagaCompensationEnded(SagaCompensationEnded {
            workflow_id: "wf-1".into(),
            tenant_id: Some("acme".into()),
            job_id: "acme:wf-1~compensation~1".into(),
            succeeded: false,
            detail: "refused: a compensation runs on its step's topic".into(),
        }),
        Event::JobDelayed(JobDelayed {
            job_id: "job-1".into(),
            not_before: 1_700_000_060_000,
        }),
        Event::JobReleased(JobReleased {
            job_id: "job-1".into(),
            not_before: 1_700_000_060_000,
            released_at: 1_700_000_060_400,
        }),
        Event::JobRescheduled(JobRescheduled {
            job_id: "job-1".into(),
            not_before: 1_700_000_120_000,
            previous: 1_700_000_060_000,
            principal_id: "op".into(),
            reason: Some("later".into()),
        }),
        Event::ScheduleChanged(ScheduleChanged {
            schedule_id: "nightly".into(),
            tenant_id: "acme".into(),
            action: ScheduleAction::Create,
            spec: Some(Box::new(schedule_spec())),
            principal_id: "alice".into(),
            reason: Some("reports".into()),
            next_slot: Some(1_700_006_400_000),
        }),
        Event::ScheduleFired(ScheduleFired {
            schedule_id: "nightly".into(),
            tenant_id: "acme".into(),
            slot: 1_700_006_400_000,
            outcome: ScheduleOutcome::Submitted,
            job_id: Some("acme:nightly@2023-11-15T00:00:00Z".into()),
            detail: "submitted".into(),
            triggered: false,
            next_slot: Some(1_700_092_800_000),
        }),
        Event::JobDebounced(JobDebounced {
            job_id: "job-3".into(),
            key: "readme".into(),
            first_at: 1_700_000_000_000,
            due: 1_700_000_005_000,
            replaces: Some("job-2".into()),
        }),
        Event::DebouncesClosed(DebouncesClosed {
            through: 1_700_000_006_000,
        }),
        Event::JobAged(JobAged {
            job_id: "job-5".into(),
            priority: Priority::Interactive,
            queued_at: 1_700_000_000_000,
        }),
        Event::JobDuplicate(JobDuplicate {
            job_id: "job-4".into(),
            existing_job_id: "job-3".into(),
            kind: DuplicateKind::UniqueKey,
            idempotency_key: Some("payload:00ff".into()),
        }),
        Event::JobBlocked(JobBlocked {
            job_id: "job-6".into(),
            waiting_on: vec!["job-4".into(), "job-5".into()],
            succeeded: 1,
            failed: 0,
            until: 1_700_604_800_000,
        }),
        Event::JobAwaited(JobAwaited {
            job_id: "job-4".into(),
            dependent: "job-6".into(),
        }),
        Event::DependencyResolved(DependencyResolved {
            job_id: "job-6".into(),
            dependency: "job-4".into(),
            state: JobState::Cancelled,
        }),
        Event::JobUnblocked(JobUnblocked {
            job_id: "job-6".into(),
            succeeded: 1,
            failed: 1,
        }),
        Event::DependentsSettled(DependentsSettled {
            job_id: "job-4".into(),
        }),
        Event::BatchOpened(BatchOpened {
            tenant_id: "acme".into(),
            batch_id: "nightly".into(),
            expected: 100_000,
            until: 1_700_604_800_000,
        }),
        Event::BatchClosed(BatchClosed {
            tenant_id: "acme".into(),
            batch_id: "nightly".into(),
            state: BatchState::Cancelled,
            principal_id: "op".into(),
            reason: "wrong input".into(),
        }),
        Event::BatchMembersCancelled(BatchMembersCancelled {
            tenant_id: "acme".into(),
            batch_id: "nightly".into(),
            through: "job-9".into(),
        }),
        Event::BatchForgotten(BatchForgotten {
            tenant_id: "acme".into(),
            batch_id: "nightly".into(),
        }),
    ]
}

pub(crate) fn schedule_spec() -> ScheduleSpec {
    ScheduleSpec {
        cron: Some("0 2 * * *".into()),
        interval_ms: None,
        time_zone: "Europe/Berlin".into(),
        template: template(),
        overlap: ScheduleOverlap::BufferOne,
        catch_up: ScheduleCatchUp::All,
        catch_up_window_ms: 3_600_000,
        jitter_ms: 5_000,
        start_at: Some(1_700_000_000_000),
        end_at: Some(1_800_000_000_000),
        paused: true,
    }
}

pub(crate) fn schedule_command() -> ScheduleCommand {
    ScheduleCommand {
        schedule_id: "nightly".into(),
        tenant_id: "acme".into(),
        action: ScheduleAction::Update,
        spec: Some(schedule_spec()),
        principal_id: "alice".into(),
        reason: Some("an hour later".into()),
        requested_at: 1_700_000_000_000,
    }
}

pub(crate) fn reschedule_job() -> RescheduleJob {
    RescheduleJob {
        job_id: "job-1".into(),
        not_before: 1_700_000_120_000,
        tenant_id: Some("acme".into()),
        principal_id: "op".into(),
        reason: Some("later".into()),
        requested_at: 1_700_000_000_000,
    }
}

pub(crate) fn redrive_job() -> RedriveJob {
    RedriveJob {
        job_id: "job-1".into(),
        new_job_id: "job-1.redrive".into(),
        tenant_id: None,
        principal_id: "op".into(),
        reason: Some("fixed".into()),
        requested_at: 1_700_000_000_000,
    }
}

/// One of every input, in union order.
pub(crate) fn every_input() -> Vec<Input> {
    vec![
        Input::Submit(job_request()),
        Input::Started(job_started()),
        Input::Progress(job_progress()),
        Input::Result(job_result()),
        Input::Heartbeat(heartbeat()),
        Input::Cancel(cancel_job()),
        Input::Approve(approve_job()),
        Input::Reject(reject_job()),
        Input::Tick(tick()),
        Input::Malformed(MalformedRecord {
            key: Some("job-9".into()),
            size_bytes: 3,
            error: "record is 3 bytes".into(),
            reason_code: "record_too_large".into(),
            job_id: Some("job-9".into()),
            tenant_id: None,
        }),
        Input::Reconfigure(reconfigure()),
        Input::Redrive(redrive_job()),
        Input::Reschedule(reschedule_job()),
        Input::Schedule(schedule_command()),
    ]
}
