//! ksched's pure decision core.
//!
//! Everything that decides lives here and nothing here does I/O, reads a clock or draws a
//! random number: [`decide::process`] turns an input into events, [`apply::apply`] is the only
//! way state changes. Recovery, audit replay and the live processor all use the same two
//! functions, which is what makes the journal a complete explanation of every decision.
//!
//! Where each part of SPEC.md is decided (the handler files under `decide/` take one input
//! family each; `apply.rs` folds every event into the state):
//!
//! | SPEC | rule | file |
//! |---|---|---|
//! | §1 | records, their bounds | `records.rs`, `decide/submit.rs` (`invalid_request`) |
//! | §2 | job states, allowed transitions | `events.rs` (`JobState::can_transition`), `apply.rs` |
//! | §3.1-3.3 | topic -> pools, `requires`, `preferred_pool` | `decide/submit.rs` (`route`) |
//! | §3.4-3.7 | preferred worker, placement labels, scoring, overload | `decide/placement.rs` |
//! | §3.8 | strategies: least-loaded, throttled, capacity | `strategy.rs` |
//! | §4 | queue order, waiting, placement timeout | `decide/placement.rs`, `state/index.rs` (queues), `decide/tick.rs` |
//! | §4 | retries and backoff | `decide/retry.rs`, `decide/reports.rs` (`result`) |
//! | §4 | worker loss, reconciler, deadlines | `decide/tick.rs` |
//! | §4 | DLQ reason codes | `reason.rs` |
//! | §5 | input and output policy | `policy.rs`, `decide/submit.rs`, `decide/reports.rs` |
//! | §5 | tenant limits | `decide/placement.rs` (`tenant_blocks`), `decide/submit.rs` (`queue_full`) |
//! | §5 | circuit breaker | `decide/breaker.rs` |
//! | §6 | approvals, four eyes, cancel | `decide/control.rs`, `hash.rs` (`job_hash`) |
//! | §6 | idempotency, duplicate job ids | `decide/submit.rs` |
//! | §7 | sagas | `decide/saga.rs` |
//! | §8 | what the journal records for audits | `events.rs`, `describe.rs` |
//! | §9 | run-at and delayed jobs | `decide/submit.rs` (`admit`), `decide/tick.rs` (`release_due`), `state/delays.rs` |
//! | §9 | schedules: times, overlap, catch-up | `schedule.rs`, `decide/schedules.rs` |

pub mod apply;
pub mod decide;
pub mod describe;
pub mod events;
pub mod hash;
pub mod outputs;
pub mod policy;
pub mod properties;
pub mod reason;
pub mod records;
pub mod rules;
pub mod schedule;
pub mod state;
pub mod strategy;

pub use apply::{apply, apply_entry};
pub use decide::{Ctx, Processed, process};
pub use state::State;
