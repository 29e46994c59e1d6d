//! Fair share between tenants (SPEC §10): within a priority, a pool's pass tries first the
//! tenant that has had the least of the pool for its weight.
//!
//! Each (pool, priority) keeps a virtual clock and, per tenant, the virtual time its next
//! job's share starts at the earliest (its *pass*), as stride scheduling does. A tenant
//! whose first job enters the queue is given the clock as its pass. A placement starts its
//! share at the later of the tenant's pass and the clock and moves the pass on by
//! `SHARE_UNIT / weight`; the clock moves on by `SHARE_UNIT / W` (W: the weights of the
//! tenants with jobs waiting there, the placed one's included), and never stays behind the
//! placement's start. So tenants with jobs waiting are served in proportion to their
//! weights whatever their backlogs; a tenant that was idle or held comes back at the clock,
//! so it cannot bank a share while it had nothing it could run; and the clock advances with
//! every placement, so no stream of new tenants can hold an old one back for ever. Every
//! number is an integer changed by events (a job queued, a placement) and pruned by a Tick,
//! so replay decides the same.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound::{Excluded, Unbounded};

use serde::{Deserialize, Serialize};

use super::{Lane, QueueKey, State};

/// The virtual time one placement of a tenant of weight 1 costs; a tenant of weight `w`
/// pays `SHARE_UNIT / w`. Divisible by every weight up to 16, so shares between small
/// weights are exact.
pub const SHARE_UNIT: u128 = 720_720_000;

/// A fair share's place: (pool, priority rank).
pub type ShareKey = (String, u8);

/// The fair share bookkeeping of one pool and priority: projected, stored (`fair_shares`),
/// rebuilt by replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolShare {
    /// Where a tenant coming back starts, at the earliest.
    pub clock: u128,
    /// Tenant -> where its next share starts at the earliest. Every tenant with a job in
    /// the pass at this priority is listed; the others only while ahead of the clock.
    pub passes: BTreeMap<String, u128>,
}

impl PoolShare {
    pub fn pass(&self, tenant: &str) -> u128 {
        self.passes.get(tenant).copied().unwrap_or(0)
    }
}

/// The order a pass tries a pool's lane groups in: priority rank, the tenant's pass, the
/// group's first head (the oldest: ties between tenants go to the older job), the tenant.
pub type FairKey = (u8, u128, QueueKey, String);

/// A pool's lane heads a pass walks ([`State::lane_heads`]), grouped by (tenant, rank),
/// with the groups in fair share order, and the summed weights of the tenants with a
/// group at each rank.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Heads {
    groups: BTreeMap<(String, u8), BTreeSet<(QueueKey, Lane)>>,
    order: BTreeSet<FairKey>,
    weights: BTreeMap<u8, u64>,
}

impl Heads {
    /// Adds a head, its tenant's pass at its rank being `pass` and its weight `weight`.
    pub(crate) fn insert(&mut self, head: (QueueKey, Lane), pass: u128, weight: u32) {
        let group = (head.1.tenant.clone(), head.0.rank);
        let set = self.groups.entry(group.clone()).or_default();
        let first = set.first().map(|f| f.0.clone());
        if first.as_ref().is_some_and(|f| *f <= head.0) {
            set.insert(head);
            return;
        }
        let key = head.0.clone();
        set.insert(head);
        match first {
            Some(f) => {
                self.order.remove(&(group.1, pass, f, group.0.clone()));
            }
            None => *self.weights.entry(group.1).or_default() += u64::from(weight),
        }
        self.order.insert((group.1, pass, key, group.0));
    }

    /// Removes a head; false when it was not there.
    pub(crate) fn remove(&mut self, head: &(QueueKey, Lane), pass: u128, weight: u32) -> bool {
        let group = (head.1.tenant.clone(), head.0.rank);
        let Some(set) = self.groups.get_mut(&group) else {
            return false;
        };
        let was_first = set.first() == Some(head);
        if !set.remove(head) {
            return false;
        }
        if was_first {
            let next = set.first().map(|f| f.0.clone());
            self.order
                .remove(&(group.1, pass, head.0.clone(), group.0.clone()));
            match next {
                Some(n) => {
                    self.order.insert((group.1, pass, n, group.0));
                }
                None => {
                    self.groups.remove(&group);
                    if let Some(w) = self.weights.get_mut(&group.1) {
                        *w = w.saturating_sub(u64::from(weight));
                        if *w == 0 {
                            self.weights.remove(&group.1);
                        }
                    }
                }
            }
        }
        true
    }

    /// A tenant's pass at `rank` moved from `old` to `new`: its group moves in the order.
    fn repass(&mut self, tenant: &str, rank: u8, old: u128, new: u128) {
        if let Some(first) = self
            .groups
            .get(&(tenant.to_owned(), rank))
            .and_then(|s| s.first())
        {
            self.order
                .remove(&(rank, old, first.0.clone(), tenant.to_owned()));
            self.order
                .insert((rank, new, first.0.clone(), tenant.to_owned()));
        }
    }

    /// Whether the tenant has a head here at `rank`.
    pub(crate) fn has(&self, tenant: &str, rank: u8) -> bool {
        self.groups.contains_key(&(tenant.to_owned(), rank))
    }

    /// The summed weights of the tenants with a head at `rank`.
    pub fn weight_at(&self, rank: u8) -> u64 {
        self.weights.get(&rank).copied().unwrap_or(0)
    }

    /// How many tenants have a head at `rank`.
    pub fn tenants_at(&self, rank: u8) -> usize {
        let from = QueueKey {
            rank: 0,
            queued_at: i64::MIN,
            job_id: String::new(),
        };
        (self.order.range((rank, 0, from, String::new())..))
            .take_while(|k| k.0 == rank)
            .count()
    }

    /// The first group in fair share order after `after` (from the start when None).
    pub(crate) fn next_group(&self, after: Option<&FairKey>) -> Option<&FairKey> {
        match after {
            None => self.order.first(),
            Some(k) => self.order.range((Excluded(k), Unbounded)).next(),
        }
    }

    /// The group that stands just before `key` in fair share order (None: none does).
    pub(crate) fn group_before(&self, key: &FairKey) -> Option<FairKey> {
        self.order.range(..key).next_back().cloned()
    }

    /// The first head of a (tenant, rank) group after `after` (from its start when None).
    pub(crate) fn next_head(
        &self,
        tenant: &str,
        rank: u8,
        after: Option<&(QueueKey, Lane)>,
    ) -> Option<&(QueueKey, Lane)> {
        let set = self.groups.get(&(tenant.to_owned(), rank))?;
        match after {
            None => set.first(),
            Some(k) => set.range((Excluded(k), Unbounded)).next(),
        }
    }

    pub fn len(&self) -> usize {
        self.groups.values().map(BTreeSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

impl State {
    /// A job of `tenant` at priority `rank` was placed in `pool`: its share starts at the
    /// later of the tenant's pass and the clock, its pass moves on by its weight's stride,
    /// the clock by the stride of the weights waiting there.
    pub(crate) fn charge_share(&mut self, pool: &str, rank: u8, tenant: &str) {
        let weight = self.share_weight(tenant);
        let heads = self.lane_heads.get(pool);
        let waiting = heads.map_or(0, |h| h.weight_at(rank));
        let others = if heads.is_some_and(|h| h.has(tenant, rank)) {
            waiting
        } else {
            waiting + u64::from(weight)
        };
        let key = (pool.to_owned(), rank);
        let share = self.shares.entry(key.clone()).or_default();
        let old = share.pass(tenant);
        let start = old.max(share.clock);
        let new = start + SHARE_UNIT / u128::from(weight);
        share.clock = (share.clock + SHARE_UNIT / u128::from(others.max(1))).max(start);
        share.passes.insert(tenant.to_owned(), new);
        if let Some(heads) = self.lane_heads.get_mut(pool) {
            heads.repass(tenant, rank, old, new);
        }
        self.mark_share(&key);
    }

    /// After a rebuild of the indexes: a tenant in a pass without a pass of its own there
    /// (forgotten while its jobs were parked, and freed by new rules) starts at the clock,
    /// as it would have had its job entered the pass by an event.
    pub(crate) fn seed_missing_passes(&mut self) {
        let mut missing = Vec::new();
        for (pool, heads) in &self.lane_heads {
            for (tenant, rank) in heads.groups.keys() {
                let key = (pool.clone(), *rank);
                if !(self.shares.get(&key)).is_some_and(|s| s.passes.contains_key(tenant)) {
                    missing.push((key, tenant.clone()));
                }
            }
        }
        for (key, tenant) in missing {
            let share = self.shares.entry(key.clone()).or_default();
            let clock = share.clock;
            share.passes.insert(tenant.clone(), clock);
            if let Some(heads) = self.lane_heads.get_mut(&key.0) {
                heads.repass(&tenant, key.1, 0, clock);
            }
            self.mark_share(&key);
        }
    }

    /// A tenant's weight in fair share under the rules in force (1 without rules).
    pub(crate) fn share_weight(&self, tenant: &str) -> u32 {
        self.rules().map_or(1, |r| r.share_weight(tenant))
    }

    /// Forgets the passes at or behind their clock of tenants with no job in the pass at
    /// that pool and priority: they would start at the clock either way. Keeps the
    /// bookkeeping to the tenants that are ahead or waiting (run at each Tick).
    pub(crate) fn prune_shares(&mut self) {
        let mut changed = Vec::new();
        for ((pool, rank), share) in &mut self.shares {
            let heads = self.lane_heads.get(pool);
            let before = share.passes.len();
            let clock = share.clock;
            share
                .passes
                .retain(|t, pass| *pass > clock || heads.is_some_and(|h| h.has(t, *rank)));
            if share.passes.len() != before {
                changed.push((pool.clone(), *rank));
            }
        }
        for key in changed {
            self.mark_share(&key);
        }
    }

    /// A tenant's pass in a pool at a priority (0 when it has none).
    pub fn share_pass(&self, pool: &str, rank: u8, tenant: &str) -> u128 {
        (self.shares.get(&(pool.to_owned(), rank))).map_or(0, |s| s.pass(tenant))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(tenant: &str, rank: u8, at: i64, id: &str) -> (QueueKey, Lane) {
        (
            QueueKey {
                rank,
                queued_at: at,
                job_id: id.into(),
            },
            Lane {
                tenant: tenant.into(),
                limit: None,
                pools: vec!["p".into()],
                placement: vec![],
                preferred_worker: None,
                memory: None,
                concurrency: None,
            },
        )
    }

    #[test]
    fn groups_stand_in_the_order_by_their_first_head_and_pass() {
        let mut h = Heads::default();
        h.insert(head("a", 1, 10, "a2"), 5, 3);
        h.insert(head("a", 1, 5, "a1"), 5, 3);
        h.insert(head("b", 1, 20, "b1"), 0, 1);
        h.insert(head("c", 0, 30, "c1"), 9, 1);
        assert_eq!((h.weight_at(0), h.weight_at(1)), (1, 4));
        assert_eq!((h.tenants_at(0), h.tenants_at(1)), (1, 2));
        let order: Vec<_> = h.order.iter().map(|k| (k.0, k.1, k.3.as_str())).collect();
        assert_eq!(order, [(0, 9, "c"), (1, 0, "b"), (1, 5, "a")]);
        assert_eq!(h.order.iter().nth(2).unwrap().2.job_id, "a1");
        h.repass("a", 1, 5, 0);
        assert_eq!(
            h.order.iter().nth(1).unwrap().3,
            "a",
            "older first at equal passes"
        );
        assert!(h.remove(&head("a", 1, 5, "a1"), 0, 3));
        assert!(!h.remove(&head("a", 1, 5, "a1"), 0, 3));
        assert_eq!(h.order.iter().nth(1).unwrap().2.job_id, "a2");
        assert!(h.remove(&head("a", 1, 10, "a2"), 0, 3));
        assert!(!h.has("a", 1));
        assert_eq!(h.weight_at(1), 1);
        assert_eq!(h.order.len(), 2);
        assert_eq!(h.len(), 2);
    }
}
