//! Change tracking: which keys changed since the last checkpoint, for incremental writes.

use std::collections::{BTreeMap, BTreeSet};

use crate::records::{DeadLetter, Millis};

use super::{HistoryLine, State};

/// Keys changed since the runtime last persisted, so it writes only those.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Dirty {
    pub jobs: BTreeSet<String>,
    pub workers: BTreeSet<String>,
    pub breakers: BTreeSet<String>,
    pub sagas: BTreeSet<String>,
    pub idempotency: BTreeSet<(String, String)>,
    pub idempotency_pruned_before: Option<Millis>,
    pub dead_letters: Vec<DeadLetter>,
    pub config: bool,
    /// History lines written since the last persist, in order.
    pub history: Vec<HistoryLine>,
    /// Payloads of jobs accepted since the last persist (job_id -> payload).
    pub payloads: BTreeMap<String, Vec<u8>>,
}

impl State {
    pub fn take_dirty(&mut self) -> Dirty {
        self.dirty.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn mark_job(&mut self, id: &str) {
        // Looked up first: a job is marked several times per entry, and the key is copied
        // only the first time.
        if let Some(d) = self.dirty.as_mut()
            && !d.jobs.contains(id)
        {
            d.jobs.insert(id.to_owned());
        }
    }

    pub fn mark_worker(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.workers.insert(id.to_owned());
        }
    }

    pub(crate) fn mark_breaker(&mut self, pool: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.breakers.insert(pool.to_owned());
        }
    }

    pub(crate) fn mark_saga(&mut self, id: &str) {
        if let Some(d) = self.dirty.as_mut() {
            d.sagas.insert(id.to_owned());
        }
    }
}
