//! Records an event sends: dispatches and cancels to workers, dead letters to operators.
//!
//! They are pure functions of the event and the state right after it was applied, so the
//! processor can produce them in the same transaction as the journal entry, and an audit can
//! recompute exactly what was sent.

use crate::events::Event;
use crate::records::{CancelDispatch, DeadLetter, Dispatch, Millis};
use crate::state::State;

/// A record to produce besides the journal entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// To `ksched.dispatch.<pool>`, key worker_id, on `partition`. The record's job carries
    /// no payload (jobs do not hold theirs): the processor adds the `payload_len` bytes stored
    /// for job `payload_of` (the job itself, or the job a redrive copied) before it sends
    /// the record.
    Dispatch {
        pool: String,
        partition: i32,
        record: Box<Dispatch>,
        payload_len: u64,
        payload_of: String,
    },
    /// To `ksched.dispatch.<pool>`, key worker_id; `partition` -1 lets the key choose.
    CancelDispatch {
        pool: String,
        partition: i32,
        record: CancelDispatch,
    },
    /// To `ksched.dlq`, key job_id.
    DeadLetter(DeadLetter),
}

/// The record `event` sends, computed from the state it left behind.
pub fn output_of(state: &State, event: &Event, now: Millis) -> Option<Output> {
    match event {
        Event::JobDispatched(e) => {
            let job = state.jobs.get(&e.job_id)?;
            let mut constraints = job.constraints.clone();
            constraints.max_runtime_ms = job.max_runtime_ms();
            Some(Output::Dispatch {
                pool: e.pool.clone(),
                partition: e.partition,
                payload_len: job.payload_len,
                payload_of: job.payload_of.clone().unwrap_or_else(|| e.job_id.clone()),
                record: Box::new(Dispatch {
                    job: job.request.clone(),
                    attempt: e.attempt,
                    worker_id: e.worker_id.clone(),
                    pool: e.pool.clone(),
                    constraints,
                    deadline_at: e.deadline_at,
                    dispatched_at: now,
                    // The runtime names its shard's results partition.
                    reply_partition: None,
                }),
            })
        }
        Event::DispatchCancelled(e) => Some(Output::CancelDispatch {
            pool: e.pool.clone(),
            partition: e.partition,
            record: CancelDispatch {
                job_id: e.job_id.clone(),
                attempt: e.attempt,
                worker_id: e.worker_id.clone(),
                pool: e.pool.clone(),
                reason: e.reason.clone(),
                at: now,
            },
        }),
        Event::DeadLettered(e) => Some(Output::DeadLetter((*e.dead_letter).clone())),
        _ => None,
    }
}
