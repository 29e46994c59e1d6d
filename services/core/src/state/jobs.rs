//! The jobs in memory, by id: a hash map whose order nothing reads.

use std::collections::HashMap;

use super::Job;

/// The jobs in memory, by id.
///
/// A hash map, not an ordered one: a replay or a busy processor looks a job up several times
/// per event, and an ordered map's walk compared the id, whose bytes ids often share for
/// most of their length, a few dozen times per lookup. The hash is keyed with a random seed per process (the standard library's
/// SipHash), so ids a hostile producer chose cannot pile into one bucket. Its order differs
/// from run to run, so nothing may read it: the only ways to walk the map are
/// [`JobMap::ids_sorted`] and [`JobMap::iter_any_order`], whose callers fold what they see
/// into something that does not depend on the order (a set, a count, a sorted list).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobMap(HashMap<String, Box<Job>>);

impl JobMap {
    pub fn get(&self, id: &str) -> Option<&Job> {
        self.0.get(id).map(|j| &**j)
    }

    pub fn get_mut(&mut self, id: &str) -> Option<&mut Job> {
        self.0.get_mut(id).map(|j| &mut **j)
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.0.contains_key(id)
    }

    /// Adds or replaces job `id`, returning the record it replaced.
    pub fn insert(&mut self, id: String, job: Box<Job>) -> Option<Box<Job>> {
        self.0.insert(id, job)
    }

    pub fn remove(&mut self, id: &str) -> Option<Box<Job>> {
        self.0.remove(id)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Room for `more` jobs without growing the table (a load of a known count).
    pub fn reserve(&mut self, more: usize) {
        self.0.reserve(more);
    }

    /// Every job id, sorted.
    pub fn ids_sorted(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.0.keys().cloned().collect();
        ids.sort_unstable();
        ids
    }

    /// Every job, in an order that differs from run to run: for folds whose result does not
    /// depend on it.
    pub fn iter_any_order(&self) -> impl Iterator<Item = (&str, &Job)> {
        self.0.iter().map(|(id, j)| (id.as_str(), &**j))
    }

    /// [`JobMap::iter_any_order`], to change jobs in place (no index follows: the caller
    /// rebuilds them).
    pub(crate) fn iter_any_order_mut(&mut self) -> impl Iterator<Item = (&str, &mut Job)> {
        self.0.iter_mut().map(|(id, j)| (id.as_str(), &mut **j))
    }
}

impl std::ops::Index<&str> for JobMap {
    type Output = Job;

    fn index(&self, id: &str) -> &Job {
        self.get(id)
            .unwrap_or_else(|| panic!("job {id} is not in memory"))
    }
}
