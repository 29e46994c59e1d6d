//! BLOCKED jobs by the jobs they wait for (SPEC §11), kept so that a million of them cost
//! storage, not memory.
//!
//! A blocked job's record leaves memory once it is written, like a delayed one's, and the
//! store indexes it under every dependency it still waits for: (tenant, dependency,
//! dependent). Memory holds the entries of the blocked jobs whose records are in memory,
//! written or not ([`Dependents`]).
//!
//! A job that is waited for ([`Job::awaited`]) and ends is *settling* ([`State::settling`])
//! until every job waiting for it has been told. A Tick tells them, at most as many as its
//! work bound a entry, in id order: it reads their records from the store first
//! ([`State::load_dependents`]), as many as the entry's work reaches, so that a decision
//! sees the first dependents by id whatever memory held, and knows when it has seen them
//! all. A key read from the store whose job is in memory counts only if the job in memory
//! still waits under it (the store is written behind the decisions).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::events::JobState;

use super::{ColdStore, Job, State};

/// A blocked job's entry under one dependency: (tenant, dependency, dependent).
pub type DependentKey = (String, String, String);

/// The entries of job `id` ([`DependentKey`]): one per dependency it still waits for, while
/// it is BLOCKED, and one under its batch's members while it has not ended.
pub fn dependent_keys_of(id: &str, job: &Job) -> Vec<DependentKey> {
    let tenant = &job.request.tenant_id;
    let mut keys: Vec<DependentKey> = match (&job.awaiting, job.state) {
        (Some(a), JobState::Blocked) => (a.open.iter())
            .map(|d| (tenant.clone(), d.clone(), id.to_owned()))
            .collect(),
        _ => Vec::new(),
    };
    // An unfinished batch member, under its batch's members (a cancel reads them).
    if let Some(batch) = &job.request.batch_id
        && !job.state.is_terminal()
    {
        let members = super::batch_members(tenant, batch);
        keys.push((tenant.clone(), members, id.to_owned()));
    }
    keys
}

/// An ended job whose dependents are being told of its end: its tenant, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Settling {
    pub tenant_id: String,
    pub state: JobState,
    /// The last dependent told, in id order: the store is read after it (the entries of
    /// those told before are deleted, and a read from the first would step over them all).
    #[serde(default)]
    pub told_through: Option<String>,
}

/// The entries of the blocked jobs a state holds in memory ([`State::dependents`]).
#[derive(Debug, Clone, Default)]
pub struct Dependents {
    keys: BTreeSet<DependentKey>,
    /// Storage may hold entries memory lacks: a state loaded from a store.
    stored: bool,
    /// (tenant, dependency) whose every dependent memory holds, as the last load found.
    listed: BTreeSet<(String, String)>,
}

impl Dependents {
    /// Entries for a state loaded from a store, which may hold more of them.
    pub fn stored() -> Dependents {
        Dependents {
            stored: true,
            ..Dependents::default()
        }
    }

    /// A blocked job's record left memory: storage holds entries memory lacks from here.
    pub(super) fn left_memory(&mut self) {
        self.stored = true;
    }

    /// Entries held in memory.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The dependents of `dependency` of `tenant` in memory, in id order.
    pub fn of<'a>(&'a self, tenant: &str, dependency: &str) -> impl Iterator<Item = &'a str> {
        let from = (tenant.to_owned(), dependency.to_owned(), String::new());
        let (tenant, dependency) = (tenant.to_owned(), dependency.to_owned());
        self.keys
            .range(from..)
            .take_while(move |(t, d, _)| *t == tenant && *d == dependency)
            .map(|(_, _, id)| id.as_str())
    }

    /// [`Dependents::of`] past `after` (the last told, when some were).
    pub fn after<'a>(
        &'a self,
        tenant: &str,
        dependency: &str,
        after: Option<&str>,
    ) -> impl Iterator<Item = &'a str> {
        use std::ops::Bound;
        let from = (
            tenant.to_owned(),
            dependency.to_owned(),
            after.unwrap_or("").to_owned(),
        );
        let lower = match after {
            Some(_) => Bound::Excluded(from),
            None => Bound::Included(from),
        };
        let (tenant, dependency) = (tenant.to_owned(), dependency.to_owned());
        self.keys
            .range((lower, Bound::Unbounded))
            .take_while(move |(t, d, _)| *t == tenant && *d == dependency)
            .map(|(_, _, id)| id.as_str())
    }

    /// Whether memory holds every dependent of `dependency` of `tenant`.
    pub fn complete(&self, tenant: &str, dependency: &str) -> bool {
        !self.stored
            || self
                .listed
                .contains(&(tenant.to_owned(), dependency.to_owned()))
    }

    /// The entries of the records in memory, anew ([`State::rebuild_indexes`]).
    pub(super) fn reset(&mut self, keys: impl IntoIterator<Item = DependentKey>) {
        self.keys = keys.into_iter().collect();
        self.listed.clear();
    }

    /// The entries held, for checks.
    pub fn keys(&self) -> &BTreeSet<DependentKey> {
        &self.keys
    }

    pub(super) fn insert(&mut self, key: DependentKey) {
        self.keys.insert(key);
    }

    pub(super) fn remove(&mut self, key: &DependentKey) {
        self.keys.remove(key);
    }
}

/// Keys read from the store at a time while listing a dependency's dependents.
const LIST_CHUNK: usize = 1024;

impl State {
    /// Moves job `id`'s entries from `before` to `after` (its entries before and after a
    /// change); entries it left are dropped from the store's index too.
    pub(super) fn move_dependents(&mut self, before: Vec<DependentKey>, after: Vec<DependentKey>) {
        for key in before.iter().filter(|k| !after.contains(k)) {
            self.dependents.remove(key);
            if let Some(d) = self.dirty.as_mut() {
                d.dependents_removed.push(key.clone());
            }
        }
        for key in after {
            self.dependents.insert(key);
        }
    }

    /// A job `id` that is waited for ended (in `state`, or ended otherwise than it first
    /// did before they were told): it is settling until its dependents are told.
    pub(super) fn begin_settling(&mut self, id: &str, tenant: &str, state: JobState) {
        self.settling.insert(
            id.to_owned(),
            Settling {
                tenant_id: tenant.to_owned(),
                state,
                told_through: None,
            },
        );
        self.fresh_settling.insert(id.to_owned());
        if let Some(d) = self.dirty.as_mut() {
            d.settling.insert(id.to_owned());
        }
    }

    /// `dependent` was told of `id`'s end (they are told in id order).
    pub(crate) fn told(&mut self, id: &str, dependent: &str) {
        if let Some(s) = self.settling.get_mut(id) {
            s.told_through = Some(dependent.to_owned());
            if let Some(d) = self.dirty.as_mut() {
                d.settling.insert(id.to_owned());
            }
        }
    }

    /// Every job waiting for `id` was told of its end.
    pub(crate) fn end_settling(&mut self, id: &str) {
        if self.settling.remove(id).is_some()
            && let Some(d) = self.dirty.as_mut()
        {
            d.settling.insert(id.to_owned());
        }
    }

    /// The settling jobs a decision on this entry may tell the dependents of: those that
    /// were settling before it (one that ended in it waits for the next, whose load reads
    /// its dependents first).
    /// At most `limit` of them: each costs a unit of work at least.
    pub fn settling_now(&self, limit: usize) -> Vec<(String, Settling)> {
        (self.settling.iter())
            .filter(|(id, _)| !self.fresh_settling.contains(*id))
            .take(limit)
            .map(|(id, s)| (id.clone(), s.clone()))
            .collect()
    }

    /// Whether a job ended in this entry is waited for (a continuation tells its dependents
    /// at once).
    pub fn settling_began(&self) -> bool {
        !self.fresh_settling.is_empty()
    }

    /// Loads from `store` the dependents a Tick may tell, in settling order: for each
    /// settling job, its dependents in id order, until `reach` of them are in memory in all;
    /// records which dependencies memory then holds every dependent of.
    pub(super) fn load_dependents<S: ColdStore>(
        &mut self,
        store: &S,
        reach: usize,
    ) -> Result<(), S::Error> {
        self.dependents.listed.clear();
        if !self.dependents.stored {
            return Ok(());
        }
        // Each settling job costs a unit at least: no entry reaches past `reach` of them.
        let settling: Vec<(String, String, Option<String>)> = (self.settling.iter())
            .take(reach.saturating_add(1))
            .map(|(id, s)| (s.tenant_id.clone(), id.clone(), s.told_through.clone()))
            .collect();
        let mut counted = 0;
        for (tenant, dependency, after) in settling {
            if counted > reach {
                break;
            }
            let want = reach - counted;
            let all = self.list_dependents(&tenant, &dependency, after.clone(), want, store)?;
            if all {
                self.dependents
                    .listed
                    .insert((tenant.clone(), dependency.clone()));
            }
            let held = (self.dependents)
                .after(&tenant, &dependency, after.as_deref())
                .take(want.max(1))
                .count();
            counted += held.max(1);
        }
        Ok(())
    }

    /// Loads the first dependents of `dependency` of `tenant` after `after` from `store`
    /// until memory holds `want` of them; returns whether it holds them all.
    pub(super) fn list_dependents<S: ColdStore>(
        &mut self,
        tenant: &str,
        dependency: &str,
        mut after: Option<String>,
        want: usize,
        store: &S,
    ) -> Result<bool, S::Error> {
        let mut found = 0;
        // A few past `want`: keys a job in memory left (written behind) are skipped.
        let chunk = want.saturating_add(8).min(LIST_CHUNK);
        loop {
            let ids = store.dependents_after(tenant, dependency, after.as_deref(), chunk)?;
            for id in &ids {
                if found >= want {
                    return Ok(false);
                }
                self.load_jobs(&[id], store)?;
                let key = (tenant.to_owned(), dependency.to_owned(), id.clone());
                if (self.jobs.get(id)).is_some_and(|j| dependent_keys_of(id, j).contains(&key)) {
                    found += 1;
                }
            }
            if ids.len() < chunk {
                return Ok(true);
            }
            after = ids.last().cloned();
        }
    }
}
