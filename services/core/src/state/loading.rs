//! The partial state: what deciding on an input, or folding an entry, needs loaded from the
//! store first, and what may leave memory after a checkpoint.

use crate::events::{Event, Input};
use crate::records::Millis;
use crate::rules::Rules;

use super::{IdempotencyEntry, Job, Saga, State};

/// Where a partial state's cold records live (RocksDB in the processor).
pub trait ColdStore {
    type Error;
    fn job(&self, id: &str) -> Result<Option<Job>, Self::Error>;
    /// The keys of delayed jobs after `after` (from the first with None), in order, at most
    /// `limit` ([`crate::state::Delays`]).
    fn delays_after(
        &self,
        after: Option<&super::DelayKey>,
        limit: usize,
    ) -> Result<Vec<super::DelayKey>, Self::Error>;
    /// The keys of lane `lane` of `pool` after `after` (from its first with None), in queue
    /// order, at most `limit` ([`crate::state::LaneJobs`]).
    fn lane_after(
        &self,
        pool: &str,
        lane: &super::Lane,
        after: Option<&super::QueueKey>,
        limit: usize,
    ) -> Result<Vec<super::QueueKey>, Self::Error>;
    /// The keys of queued jobs' timers of `kind` after `after` (from the first with None),
    /// in order, at most `limit` ([`crate::state::Waits`]).
    fn waits_after(
        &self,
        kind: super::TimerKind,
        after: Option<&super::TimerAt>,
        limit: usize,
    ) -> Result<Vec<super::TimerAt>, Self::Error>;
    /// The BLOCKED jobs waiting for `dependency` of `tenant` after `after` (from the first
    /// with None), in id order, at most `limit` ([`crate::state::Dependents`]).
    fn dependents_after(
        &self,
        tenant: &str,
        dependency: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>, Self::Error>;
    /// The saga under `key` ([`crate::state::saga_key`]).
    fn saga(&self, key: &str) -> Result<Option<Saga>, Self::Error>;
    fn idempotency(&self, tenant: &str, key: &str)
    -> Result<Option<IdempotencyEntry>, Self::Error>;
}

/// Keys a decision on an input may read, which a partial state must hold first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Prerequisites {
    pub job_ids: Vec<String>,
    /// The idempotency keys it may read: the request's own, and the unique key its topic's
    /// rule gives it ([`crate::decide::unique_scope`]).
    pub idempotency: Vec<(String, String)>,
}

impl State {
    /// What must be loaded before deciding on `input`.
    pub fn prerequisites(&self, input: &Input) -> Prerequisites {
        let mut p = Prerequisites::default();
        if let Some(id) = input.job_id() {
            p.job_ids.push(id.to_owned());
        }
        // A redrive may not take an id a job already has, cold or not.
        if let Input::Redrive(r) = input {
            p.job_ids.push(r.new_job_id.clone());
        }
        // A record set aside names the job it concerned, whose history it is written into.
        if let Input::Malformed(m) = input
            && let Some(id) = &m.job_id
        {
            p.job_ids.push(id.clone());
        }
        if let Input::Submit(r) = input
            && let Some(key) = &r.meta.idempotency_key
        {
            p.idempotency.push((r.tenant_id.clone(), key.clone()));
        }
        // The topic a submission is decided under is the one it was read from, which the
        // processor writes into the request it journals.
        if let Input::Submit(r) = input
            && let Some(rules) = self.rules()
            && let Some(key) = crate::decide::unique_key_of(rules, r)
        {
            p.idempotency
                .push((crate::decide::unique_scope(&r.tenant_id, &r.topic), key));
        }
        p
    }

    /// The job waiting under the debounce key of the job `input` may admit, if one does
    /// (SPEC §10): the input's request, or the request of the job it names.
    fn debounced_by(&self, input: &Input) -> Option<String> {
        if !matches!(
            input,
            Input::Submit(_) | Input::Redrive(_) | Input::Approve(_)
        ) {
            return None;
        }
        let request = match input {
            Input::Submit(r) => r,
            other => &self.jobs.get(other.job_id()?)?.request,
        };
        let rule = self.rules()?.topic_debounce.get(&request.topic)?;
        if !crate::decide::debounceable(request) {
            return None;
        }
        let key = rule.key_of(&request.labels)?;
        let window_key = (request.tenant_id.clone(), request.topic.clone(), key);
        Some(self.debounces.get(&window_key)?.job_id.clone())
    }

    /// The sagas a decision on `input` may read, once the input's job is loaded: its
    /// tenant's saga of its workflow (and one keyed by the workflow alone, begun before
    /// sagas were the tenant's).
    pub fn saga_prerequisites(&self, input: &Input) -> Vec<String> {
        let request = match input {
            Input::Submit(r) => r,
            other => match other.job_id().and_then(|id| self.jobs.get(id)) {
                Some(j) => &j.request,
                None => return Vec::new(),
            },
        };
        crate::decide::saga_keys_of(request)
    }

    /// Whether putting `new` rules in force re-derives the indexes from every queued
    /// record, so needs the whole backlog read back first: when they index queued jobs
    /// otherwise than the rules in force do ([`Rules::reindex_queued`]), or no rules are in
    /// force yet.
    pub fn reads_backlog_for(&self, new: &Rules) -> bool {
        self.rules().is_none_or(|old| old.reindex_queued(new))
    }

    /// Loads from `store` everything deciding on `input` may read: its job, the owner of its
    /// idempotency key, the sagas of its workflow, and the job id their next compensation
    /// would take (a compensation never takes an id a job has, cold or not).
    pub fn load_for_input<S: ColdStore>(
        &mut self,
        input: &Input,
        store: &S,
    ) -> Result<(), S::Error> {
        // What re-derives every index from the records needs every queued one; else the
        // lanes' windows, which any decision may place from.
        // (Rules that do not parse are refused: they read nothing.)
        if let Input::Reconfigure(r) = input
            && let Ok(new) = Rules::from_json(&r.rules_json)
            && self.reads_backlog_for(&new)
        {
            self.load_queued(store)?;
        }
        self.refill_windows(store)?;
        let pre = self.prerequisites(input);
        self.load_jobs(&pre.job_ids, store)?;
        // A job admitted (submitted, approved) may wait for its dependencies, which count
        // at once when they ended: their records (no more than a request may name). A job
        // submitted may be waited for already: the first job waiting for it.
        if matches!(input, Input::Submit(_) | Input::Approve(_)) {
            let request = match input {
                Input::Submit(r) => Some(r),
                other => (other.job_id().and_then(|id| self.jobs.get(id))).map(|j| &j.request),
            };
            // A submission naming more than it may is refused unread; an accepted job's
            // were bounded when it was submitted (whatever the limit is now).
            let max = match input {
                Input::Submit(_) => {
                    (self.rules()).map_or(0, |r| r.limits.max_dependencies as usize)
                }
                _ => usize::MAX,
            };
            let deps = (request.filter(|r| r.depends_on.len() <= max))
                .map(|r| r.depends_on.clone())
                .unwrap_or_default();
            self.load_jobs(&deps, store)?;
        }
        if let Input::Submit(r) = input {
            self.list_dependents(&r.tenant_id, &r.job_id, None, 1, store)?;
        }
        // A redrive's new job may be waited for already, as a submission may.
        if let Input::Redrive(r) = input
            && let Some(tenant) = self
                .jobs
                .get(&r.job_id)
                .map(|j| j.request.tenant_id.clone())
        {
            self.list_dependents(&tenant, &r.new_job_id, None, 1, store)?;
        }
        // A job admitted (submitted, redriven, approved) may replace the job waiting under
        // its debounce key.
        if let Some(waiting) = self.debounced_by(input) {
            self.load_jobs(&[waiting], store)?;
        }
        for (tenant, key) in &pre.idempotency {
            let k = (tenant.clone(), key.clone());
            if !self.idempotency.contains_key(&k)
                && let Some(e) = store.idempotency(tenant, key)?
            {
                self.idempotency.insert(k.clone(), e);
            }
            // A duplicate is recorded in the history of the job that owns the key.
            if let Some(owner) = self.idempotency.get(&k).map(|e| e.job_id.clone()) {
                self.load_jobs(&[owner], store)?;
            }
        }
        let mut sagas = self.saga_prerequisites(input);
        self.load_sagas(&sagas, store)?;
        if let Input::Schedule(c) = input {
            let key = crate::schedule::schedule_key(&c.tenant_id, &c.schedule_id);
            let ids = self.schedule_prerequisites(&key, &[c.requested_at.max(0)]);
            self.load_jobs(&ids, store)?;
        }
        if let Input::Tick(t) = input {
            // Every delayed job due by the watermark, as far as the entry's work reaches, and
            // their records.
            let through = t.watermark.unwrap_or(Millis::MIN).max(self.watermark);
            let reach = self.rules().map_or(100, |r| r.limits.max_work_per_entry) as usize;
            self.load_delays_through(through, reach, store)?;
            let due: Vec<String> = self
                .delays
                .due(through, reach)
                .into_iter()
                .map(|(_, id)| id)
                .collect();
            self.load_jobs(&due, store)?;
            // The first dependents of the jobs settling (SPEC §11).
            self.load_dependents(store, reach)?;
            // The jobs of the timers it may fire: as many as the entry's work, and aging
            // steps apart (see `fire_due_timers`).
            // (A Tick of an older format is judged at its log time, not known here.)
            let judged = t.watermark.map_or(Millis::MAX, |w| w.max(self.watermark));
            let gap_to = self.clock_gap_ahead(t);
            self.load_timer_records(false, judged, gap_to, reach + 1, store)?;
            self.load_timer_records(true, judged, gap_to, reach / 2 + 2, store)?;
            // The schedules due, and those buffered: their previous runs (the overlap
            // policy reads them) and the ids their firings would take (never one a job has).
            // A buffered firing's time is known; a due one's is its next firing or, caught
            // up, the latest by the watermark (its times are read for the first `reach` only).
            let mut firing: Vec<String> = Vec::new();
            for key in &self.schedules_buffered {
                if let Some(slot) = self.schedules.get(key).and_then(|s| s.buffered) {
                    firing.extend(self.schedule_prerequisites(key, &[slot]));
                }
            }
            for key in self.schedules_due_by(through, reach) {
                let Some(s) = self.schedules.get(&key) else {
                    continue;
                };
                let latest = crate::schedule::Times::of(&s.spec, s.created_at)
                    .ok()
                    .and_then(|t| t.latest_at_or_before(through));
                let slots: Vec<Millis> = [s.next_slot, latest].into_iter().flatten().collect();
                firing.extend(self.schedule_prerequisites(&key, &slots));
            }
            self.load_jobs(&firing, store)?;
            // A Tick goes on with rollbacks left for it (in memory: sagas rolling back stay).
            sagas.extend(
                self.sagas
                    .iter()
                    .filter(|(_, s)| s.rolling_back() && s.running.is_none())
                    .map(|(k, _)| k.clone()),
            );
        }
        // Every id the sagas' next compensations may take in this entry: one per step left,
        // as far as the entry's work bound reaches.
        let reach = self.rules().map_or(100, |r| r.limits.max_work_per_entry) as usize;
        let next: Vec<String> = sagas
            .iter()
            .filter_map(|k| Some((k, self.sagas.get(k)?)))
            .flat_map(|(k, s)| {
                let n = s.compensations_submitted;
                (1..=s.stack.len().clamp(1, reach)).map(move |i| {
                    crate::decide::compensation_id(k, n + i32::try_from(i).unwrap_or(0))
                })
            })
            .collect();
        self.load_jobs(&next, store)?;
        Ok(())
    }

    /// Where the clock gap `tick` journals first ends, if it journals one (the condition
    /// `Decider::tick` judges by): the liveness floor it raises timeouts to.
    fn clock_gap_ahead(&self, t: &crate::records::Tick) -> Option<Millis> {
        let watermark = t.watermark?;
        let gap = (self.rules()).map_or_else(
            || crate::rules::Timing::default().clock_gap_ms,
            |r| r.timing.clock_gap_ms,
        );
        let judged = watermark.max(self.watermark);
        (self.watermark > 0 && judged - self.watermark > gap).then_some(judged)
    }

    /// The jobs a decision on the schedule under `key` may read: its previous run, and the
    /// ids of its firings at `slots` (and of a trigger at the first of them).
    fn schedule_prerequisites(&self, key: &str, slots: &[Millis]) -> Vec<String> {
        let Some(s) = self.schedules.get(key) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = s.last_job.iter().cloned().collect();
        for (i, slot) in slots.iter().enumerate() {
            let id = |triggered| {
                crate::schedule::firing_job_id(&s.tenant_id, &s.schedule_id, *slot, triggered)
            };
            ids.push(id(false));
            if i == 0 {
                ids.push(id(true));
            }
        }
        ids
    }

    /// Loads from `store` everything applying `entry` reads or changes.
    pub fn load_for_entry<S: ColdStore>(
        &mut self,
        entry: &crate::events::JournalEntry,
        store: &S,
    ) -> Result<(), S::Error> {
        let rebuilds = (entry.events.iter()).any(|e| match e {
            // As `apply` reads them.
            Event::ConfigApplied(c) => {
                self.reads_backlog_for(&Rules::from_json(&c.config.rules_json).unwrap_or_default())
            }
            _ => false,
        });
        if rebuilds {
            self.load_queued(store)?;
        }
        // A standby keeps its windows as the owner does, ready to decide.
        self.refill_windows(store)?;
        let (jobs, sagas) = entry.touched();
        self.load_jobs(&jobs, store)?;
        self.load_sagas(&sagas, store)
    }

    pub(super) fn load_jobs<S: ColdStore>(
        &mut self,
        ids: &[impl AsRef<str>],
        store: &S,
    ) -> Result<(), S::Error> {
        for id in ids.iter().map(AsRef::as_ref) {
            if !self.jobs.contains_key(id)
                && let Some(job) = store.job(id)?
            {
                self.hydrate_job(id.to_owned(), job);
            }
        }
        Ok(())
    }

    fn load_sagas<S: ColdStore>(
        &mut self,
        ids: &[impl AsRef<str>],
        store: &S,
    ) -> Result<(), S::Error> {
        for id in ids.iter().map(AsRef::as_ref) {
            if !self.sagas.contains_key(id)
                && let Some(s) = store.saga(id)?
            {
                self.sagas.insert(id.to_owned(), s);
            }
        }
        Ok(())
    }

    /// Adds a job loaded from storage (not a state change: the job was already there).
    pub fn hydrate_job(&mut self, job_id: String, job: Job) {
        if self.jobs.contains_key(&job_id) {
            return;
        }
        // A queued job's index entries stayed when its record left memory.
        if self.indexed_while_stored(&job) {
            self.backlog.spare(&job_id);
            // Its batch entry left memory with it.
            for key in super::dependent_keys_of(&job_id, &job) {
                self.dependents.insert(key);
            }
            self.jobs.insert(job_id, Box::new(job));
            return;
        }
        if job.state.is_cold() {
            self.cold.insert(job_id.clone());
        }
        // A delayed job past the window, in memory now: filed with the others in memory (the
        // store has its key as well; a refill counts it once).
        if let Some(key) = super::delay_key_of(&job_id, &job)
            && !self.delays.coverage().covers(&key)
        {
            self.delays.file_beyond(key);
        }
        self.jobs.insert(job_id.clone(), Box::new(job));
        self.index_job(&job_id);
    }

    /// Drops job `id` from memory if it is terminal or delayed (it is in storage).
    fn evict_job(&mut self, id: &str) {
        let Some(job) = self.jobs.get(id).filter(|j| j.state.is_cold()) else {
            return;
        };
        let indexed = !super::dependent_keys_of(id, job).is_empty();
        if let Some(key) = super::delay_key_of(id, job) {
            self.delay_left_memory(&key);
        }
        // A blocked job's (or unfinished batch member's) entries are in storage only from
        // here.
        if indexed {
            self.dependents.left_memory();
        }
        self.unindex_job(id);
        self.jobs.remove(id);
    }

    /// Drops terminal jobs, idempotency keys and idle sagas from memory (they stay in
    /// storage). Only called by an owner that has persisted every dirty key.
    pub fn evict_cold(&mut self) {
        for id in std::mem::take(&mut self.cold) {
            self.evict_job(&id);
        }
        self.evict_spare(None);
        self.idempotency.clear();
        // Sagas mid-rollback stay: a tick may end their running compensation.
        self.sagas.retain(|_, s| s.rolling_back());
    }

    /// [`State::evict_cold`] for an owner that writes its checkpoints behind: once the last
    /// batch it prepared is written, the records changed since (still marked dirty, in no
    /// written batch) must stay, since loading them back would read an older version. Every
    /// other cold record goes, as `evict_cold` drops it. Without change tracking, the same
    /// as `evict_cold`.
    pub fn evict_written(&mut self) {
        let Some(dirty) = self.dirty.take() else {
            return self.evict_cold();
        };
        // The ids come out in order, so the kept ones make a set without a search each
        // (collected from a sorted list), and the changed ids, in order too, are walked
        // alongside rather than searched: a replay's checkpoint evicts thousands.
        let mut kept = Vec::new();
        let mut changed = dirty.jobs.iter().peekable();
        for id in std::mem::take(&mut self.cold) {
            while changed.next_if(|c| **c < id).is_some() {}
            if changed.next_if_eq(&&id).is_some() {
                kept.push(id);
            } else {
                self.evict_job(&id);
            }
        }
        self.cold = kept.into_iter().collect();
        self.evict_spare(Some(&dirty.jobs));
        self.idempotency
            .retain(|k, _| dirty.idempotency.contains(k));
        self.sagas
            .retain(|id, s| s.rolling_back() || dirty.sagas.contains(id));
        self.dirty = Some(dirty);
    }
}
