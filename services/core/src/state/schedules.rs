//! Schedules in the state: every change goes through [`State::put_schedule`], which keeps the
//! indexes of due and buffered schedules in step with the records.

use super::{Schedule, State};

impl State {
    /// Stores `schedule` under `key` (None deletes it), and re-indexes it.
    pub(crate) fn put_schedule(&mut self, key: &str, schedule: Option<Schedule>) {
        if let Some(old) = self.schedules.remove(key) {
            self.unindex_schedule(key, &old);
        }
        if let Some(s) = schedule {
            self.index_schedule(key, &s);
            self.schedules.insert(key.to_owned(), s);
        }
        if let Some(d) = self.dirty.as_mut() {
            d.schedules.insert(key.to_owned());
        }
    }

    /// Changes the schedule under `key` in place, if there is one, and re-indexes it.
    pub(crate) fn update_schedule(&mut self, key: &str, change: impl FnOnce(&mut Schedule)) {
        if let Some(mut s) = self.schedules.get(key).cloned() {
            change(&mut s);
            self.put_schedule(key, Some(s));
        }
    }

    /// Rebuilds the schedule indexes from the records (after a load).
    pub(crate) fn index_schedules(&mut self) {
        self.schedules_due.clear();
        self.schedules_buffered.clear();
        let schedules = std::mem::take(&mut self.schedules);
        for (key, s) in &schedules {
            self.index_schedule(key, s);
        }
        self.schedules = schedules;
    }

    fn index_schedule(&mut self, key: &str, s: &Schedule) {
        if s.paused {
            return;
        }
        if let Some(slot) = s.next_slot {
            self.schedules_due.insert((slot, key.to_owned()));
        }
        if s.buffered.is_some() {
            self.schedules_buffered.insert(key.to_owned());
        }
    }

    fn unindex_schedule(&mut self, key: &str, s: &Schedule) {
        if let Some(slot) = s.next_slot {
            self.schedules_due.remove(&(slot, key.to_owned()));
        }
        self.schedules_buffered.remove(key);
    }

    /// Keys of active schedules with a firing due by `t`, earliest first, at most `limit`.
    pub fn schedules_due_by(&self, t: crate::records::Millis, limit: usize) -> Vec<String> {
        self.schedules_due
            .iter()
            .take_while(|(slot, _)| *slot <= t)
            .take(limit)
            .map(|(_, k)| k.clone())
            .collect()
    }

    /// What disagrees between the schedules and their indexes (the property tests' check).
    pub fn schedule_problems(&self) -> Vec<String> {
        let mut copy = State {
            schedules: self.schedules.clone(),
            ..State::default()
        };
        copy.index_schedules();
        let mut problems = Vec::new();
        if copy.schedules_due != self.schedules_due {
            problems.push("the index of due schedules disagrees with the schedules".to_owned());
        }
        if copy.schedules_buffered != self.schedules_buffered {
            problems.push("the index of buffered schedules disagrees with the schedules".into());
        }
        problems
    }
}
