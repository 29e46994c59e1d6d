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
    /// Tenant -> the turns its keys take within its share ([`Turns`]), while it has some.
    pub turns: BTreeMap<String, Turns>,
}

impl PoolShare {
    pub fn pass(&self, tenant: &str) -> u128 {
        self.passes.get(tenant).copied().unwrap_or(0)
    }

    /// A tenant's turn's pass (0 when it has none).
    pub fn turn_pass(&self, tenant: &str, turn: &str) -> u128 {
        (self.turns.get(tenant)).map_or(0, |t| t.passes.get(turn).copied().unwrap_or(0))
    }
}

/// Fair share between the keys of one tenant in a pool at a priority (SPEC §10): the same
/// stride scheduling as between tenants, one level down, every key of weight 1. A *turn*
/// is a fair concurrency key ([`crate::rules::ConcurrencyRule::fair`]), or `""` for the
/// tenant's jobs without one, which take their turns together, in queue order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Turns {
    /// Where a turn coming back starts, at the earliest.
    pub clock: u128,
    /// Turn -> where its next placement starts at the earliest.
    pub passes: BTreeMap<String, u128>,
}

/// The turn a lane's jobs take within their tenant's share: its key if the key is fair,
/// else `""`.
pub(crate) fn turn_of(lane: &Lane) -> &str {
    (lane.concurrency.as_ref())
        .filter(|c| c.fair)
        .map_or("", |c| c.key.as_str())
}

/// The order a pass tries a pool's lane groups in: priority rank, the tenant's pass, the
/// group's first head (ties between tenants go to the job its turns put first), the tenant.
pub type FairKey = (u8, u128, QueueKey, String);

/// A head a pass tries in a (tenant, rank) group: its turn's (pass, key) as it stood, and
/// the head.
pub type HeadAt = ((u128, String), (QueueKey, Lane));

/// How far a pass has walked a (tenant, rank) group: the turn it stands at (as it stood
/// then) and the last head it tried of each turn. Turns only move on during a pass (a
/// placement moves its turn's pass up), so what it tried stays tried.
#[derive(Debug, Clone, Default)]
pub struct Walk {
    at: Option<(u128, String)>,
    last: BTreeMap<String, (QueueKey, Lane)>,
}

impl Walk {
    /// The pass tried `head`.
    pub(crate) fn tried(&mut self, head: &HeadAt) {
        self.last.insert(head.0.1.clone(), head.1.clone());
        self.at = Some(head.0.clone());
    }
}

/// One tenant's heads at one priority in a pool, by turn.
#[derive(Debug, Clone, Default, PartialEq)]
struct Group {
    /// The tenant's pass the group stands in the order at.
    pass: u128,
    /// Turn -> its heads, in queue order.
    turns: BTreeMap<String, BTreeSet<(QueueKey, Lane)>>,
    /// The turns in the order they are tried: by pass, then key.
    order: BTreeSet<(u128, String)>,
    /// Turn -> its pass in `order`.
    passes: BTreeMap<String, u128>,
}

impl Group {
    /// The head the group's turns put first.
    fn first(&self) -> Option<&(QueueKey, Lane)> {
        let (_, turn) = self.order.first()?;
        self.turns.get(turn)?.first()
    }
}

/// A pool's lane heads a pass walks ([`State::lane_heads`]), grouped by (tenant, rank),
/// with the groups in fair share order, and the summed weights of the tenants with a
/// group at each rank. Within a group, heads stand by turn (the turn placed least lately
/// first), then in queue order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Heads {
    groups: BTreeMap<(String, u8), Group>,
    order: BTreeSet<FairKey>,
    weights: BTreeMap<u8, u64>,
}

impl Heads {
    /// Adds a head, its tenant's pass at its rank being `pass`, its weight `weight` and
    /// its turn's pass `turn_pass` (both passes are taken only from the group's, or the
    /// turn's, first head).
    pub(crate) fn insert(
        &mut self,
        head: (QueueKey, Lane),
        pass: u128,
        weight: u32,
        turn_pass: u128,
    ) {
        let (tenant, rank) = (head.1.tenant.clone(), head.0.rank);
        let turn = turn_of(&head.1).to_owned();
        let group = self.groups.entry((tenant.clone(), rank)).or_default();
        let fresh = group.turns.is_empty();
        if fresh {
            group.pass = pass;
            *self.weights.entry(rank).or_default() += u64::from(weight);
        }
        let before = group.first().map(|f| f.0.clone());
        if !group.passes.contains_key(&turn) {
            group.passes.insert(turn.clone(), turn_pass);
            group.order.insert((turn_pass, turn.clone()));
        }
        group.turns.entry(turn).or_default().insert(head);
        let after = group.first().map(|f| f.0.clone());
        let pass = group.pass;
        self.reorder(rank, pass, &tenant, before, after);
    }

    /// Moves a group's entry in the order from its first head `before` to `after`.
    fn reorder(
        &mut self,
        rank: u8,
        pass: u128,
        tenant: &str,
        before: Option<QueueKey>,
        after: Option<QueueKey>,
    ) {
        if before == after {
            return;
        }
        if let Some(b) = before {
            self.order.remove(&(rank, pass, b, tenant.to_owned()));
        }
        if let Some(a) = after {
            self.order.insert((rank, pass, a, tenant.to_owned()));
        }
    }

    /// Removes a head; false when it was not there.
    pub(crate) fn remove(&mut self, head: &(QueueKey, Lane), weight: u32) -> bool {
        let (tenant, rank) = (head.1.tenant.clone(), head.0.rank);
        let turn = turn_of(&head.1);
        let Some(group) = self.groups.get_mut(&(tenant.clone(), rank)) else {
            return false;
        };
        let before = group.first().map(|f| f.0.clone());
        let Some(set) = group.turns.get_mut(turn) else {
            return false;
        };
        if !set.remove(head) {
            return false;
        }
        if set.is_empty() {
            group.turns.remove(turn);
            if let Some(p) = group.passes.remove(turn) {
                group.order.remove(&(p, turn.to_owned()));
            }
        }
        let after = group.first().map(|f| f.0.clone());
        let (pass, empty) = (group.pass, group.turns.is_empty());
        self.reorder(rank, pass, &tenant, before, after);
        if empty {
            self.groups.remove(&(tenant, rank));
            if let Some(w) = self.weights.get_mut(&rank) {
                *w = w.saturating_sub(u64::from(weight));
                if *w == 0 {
                    self.weights.remove(&rank);
                }
            }
        }
        true
    }

    /// Sums the weights of the tenants with a group at each rank again, each tenant
    /// weighing `weight` (new rules).
    pub(crate) fn reweigh(&mut self, weight: impl Fn(&str) -> u32) {
        self.weights.clear();
        for (tenant, rank) in self.groups.keys() {
            *self.weights.entry(*rank).or_default() += u64::from(weight(tenant));
        }
    }

    /// A tenant's pass at `rank` moved to `new`: its group moves in the order.
    fn repass(&mut self, tenant: &str, rank: u8, new: u128) {
        let Some(group) = self.groups.get_mut(&(tenant.to_owned(), rank)) else {
            return;
        };
        let old = std::mem::replace(&mut group.pass, new);
        if let Some(first) = group.first().map(|f| f.0.clone()) {
            self.order
                .remove(&(rank, old, first.clone(), tenant.to_owned()));
            self.order.insert((rank, new, first, tenant.to_owned()));
        }
    }

    /// A turn's pass moved to `new`: it moves among its tenant's turns.
    fn repass_turn(&mut self, tenant: &str, rank: u8, turn: &str, new: u128) {
        let Some(group) = self.groups.get_mut(&(tenant.to_owned(), rank)) else {
            return;
        };
        let Some(old) = group.passes.get_mut(turn) else {
            return;
        };
        let old = std::mem::replace(old, new);
        let before = group.first().map(|f| f.0.clone());
        group.order.remove(&(old, turn.to_owned()));
        group.order.insert((new, turn.to_owned()));
        let after = group.first().map(|f| f.0.clone());
        let pass = group.pass;
        self.reorder(rank, pass, tenant, before, after);
    }

    /// Whether the tenant has a head here at `rank`.
    pub(crate) fn has(&self, tenant: &str, rank: u8) -> bool {
        self.groups.contains_key(&(tenant.to_owned(), rank))
    }

    /// How many turns the tenant has heads of at `rank`.
    pub fn turns_at(&self, tenant: &str, rank: u8) -> usize {
        (self.groups.get(&(tenant.to_owned(), rank))).map_or(0, |g| g.turns.len())
    }

    /// Whether the tenant has a head of `turn` at `rank`.
    pub(crate) fn has_turn(&self, tenant: &str, rank: u8, turn: &str) -> bool {
        (self.groups.get(&(tenant.to_owned(), rank))).is_some_and(|g| g.turns.contains_key(turn))
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

    /// Where a (tenant, rank) group stands in fair share order now, if it has heads.
    pub(crate) fn fair_key(&self, tenant: &str, rank: u8) -> Option<FairKey> {
        let group = self.groups.get(&(tenant.to_owned(), rank))?;
        let first = group.first()?;
        Some((rank, group.pass, first.0.clone(), tenant.to_owned()))
    }

    /// The group that stands just before `key` in fair share order (None: none does).
    pub(crate) fn group_before(&self, key: &FairKey) -> Option<FairKey> {
        self.order.range(..key).next_back().cloned()
    }

    /// The next head of a (tenant, rank) group a pass tries, after what `walk` tried: the
    /// next of the turn it stands at, else the first untried head of a turn after it. A
    /// turn that moved on since (its head was placed) is found where it stands now, and
    /// its heads tried before are not tried again.
    pub(crate) fn next_head(&self, tenant: &str, rank: u8, walk: &Walk) -> Option<HeadAt> {
        let group = self.groups.get(&(tenant.to_owned(), rank))?;
        let untried = |turn: &(u128, String)| {
            let set = group.turns.get(&turn.1)?;
            let head = match walk.last.get(&turn.1) {
                Some(last) => set.range((Excluded(last), Unbounded)).next(),
                None => set.first(),
            }?;
            Some((turn.clone(), head.clone()))
        };
        let Some(at) = &walk.at else {
            return group.order.iter().find_map(untried);
        };
        if group.order.contains(at)
            && let Some(next) = untried(at)
        {
            return Some(next);
        }
        (group.order.range((Excluded(at), Unbounded))).find_map(untried)
    }

    pub fn len(&self) -> usize {
        (self.groups.values())
            .flat_map(|g| g.turns.values())
            .map(BTreeSet::len)
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

impl State {
    /// A job of `tenant` at priority `rank` was placed in `pool`, taking its `turn`: its
    /// share starts at the later of the tenant's pass and the clock, its pass moves on by
    /// its weight's stride, the clock by the stride of the weights waiting there; and the
    /// same one level down, between the tenant's turns, each of weight 1.
    pub(crate) fn charge_share(&mut self, pool: &str, rank: u8, tenant: &str, turn: &str) {
        let weight = self.share_weight(tenant);
        let heads = self.lane_heads.get(pool);
        let waiting = heads.map_or(0, |h| h.weight_at(rank));
        let others = if heads.is_some_and(|h| h.has(tenant, rank)) {
            waiting
        } else {
            waiting + u64::from(weight)
        };
        let turns = heads.map_or(0, |h| h.turns_at(tenant, rank));
        let turns = if heads.is_some_and(|h| h.has_turn(tenant, rank, turn)) {
            turns
        } else {
            turns + 1
        };
        let key = (pool.to_owned(), rank);
        let share = self.shares.entry(key.clone()).or_default();
        let old = share.pass(tenant);
        let start = old.max(share.clock);
        let new = start + SHARE_UNIT / u128::from(weight);
        share.clock = (share.clock + SHARE_UNIT / u128::from(others.max(1))).max(start);
        share.passes.insert(tenant.to_owned(), new);
        // A tenant with no turns bookkeeping has only its `""` turn: nothing to charge.
        let keeps_turns = !turn.is_empty() || share.turns.contains_key(tenant);
        let turn_new = keeps_turns.then(|| {
            let t = share.turns.entry(tenant.to_owned()).or_default();
            let turn_start = (t.passes.get(turn).copied().unwrap_or(0)).max(t.clock);
            let turn_new = turn_start + SHARE_UNIT;
            t.clock = (t.clock + SHARE_UNIT / turns as u128).max(turn_start);
            t.passes.insert(turn.to_owned(), turn_new);
            turn_new
        });
        if let Some(heads) = self.lane_heads.get_mut(pool) {
            if let Some(turn_new) = turn_new {
                heads.repass_turn(tenant, rank, turn, turn_new);
            }
            heads.repass(tenant, rank, new);
        }
        self.mark_share(&key);
    }

    /// After a rebuild of the indexes: a tenant (or a turn of one) in a pass without a
    /// pass of its own there (forgotten while its jobs were parked, and freed by new rules)
    /// starts at the clock, as it would have had its job entered the pass by an event.
    pub(crate) fn seed_missing_passes(&mut self) {
        let mut missing = Vec::new();
        let mut missing_turns = Vec::new();
        for (pool, heads) in &self.lane_heads {
            for ((tenant, rank), group) in &heads.groups {
                let key = (pool.clone(), *rank);
                let share = self.shares.get(&key);
                if !share.is_some_and(|s| s.passes.contains_key(tenant)) {
                    missing.push((key.clone(), tenant.clone()));
                }
                let turns = share.and_then(|s| s.turns.get(tenant));
                for turn in group.turns.keys() {
                    // The `""` turn may stand without a pass (at 0): it gets one when
                    // charged, or when it comes while the tenant keeps turns.
                    let needs = !turn.is_empty();
                    let known = turns.is_some_and(|t| t.passes.contains_key(turn));
                    if needs && !known {
                        missing_turns.push((key.clone(), tenant.clone(), turn.clone()));
                    }
                }
            }
        }
        for (key, tenant) in missing {
            let share = self.shares.entry(key.clone()).or_default();
            let clock = share.clock;
            share.passes.insert(tenant.clone(), clock);
            if let Some(heads) = self.lane_heads.get_mut(&key.0) {
                heads.repass(&tenant, key.1, clock);
            }
            self.mark_share(&key);
        }
        for (key, tenant, turn) in missing_turns {
            let share = self.shares.entry(key.clone()).or_default();
            let turns = share.turns.entry(tenant.clone()).or_default();
            let clock = turns.clock;
            turns.passes.insert(turn.clone(), clock);
            if let Some(heads) = self.lane_heads.get_mut(&key.0) {
                heads.repass_turn(&tenant, key.1, &turn, clock);
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
    /// bookkeeping to the tenants that are ahead or waiting (run at each Tick). The same
    /// for each tenant's turns, and a tenant's turns altogether once it has none left.
    pub(crate) fn prune_shares(&mut self) {
        let mut changed = Vec::new();
        for ((pool, rank), share) in &mut self.shares {
            let heads = self.lane_heads.get(pool);
            let count = |s: &PoolShare| {
                let turns: usize = s.turns.values().map(|t| t.passes.len()).sum();
                (s.passes.len(), s.turns.len(), turns)
            };
            let before = count(share);
            let clock = share.clock;
            share
                .passes
                .retain(|t, pass| *pass > clock || heads.is_some_and(|h| h.has(t, *rank)));
            share.turns.retain(|tenant, turns| {
                let clock = turns.clock;
                turns.passes.retain(|turn, pass| {
                    *pass > clock || heads.is_some_and(|h| h.has_turn(tenant, *rank, turn))
                });
                !turns.passes.is_empty()
            });
            if count(share) != before {
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
        h.insert(head("a", 1, 10, "a2"), 5, 3, 0);
        h.insert(head("a", 1, 5, "a1"), 5, 3, 0);
        h.insert(head("b", 1, 20, "b1"), 0, 1, 0);
        h.insert(head("c", 0, 30, "c1"), 9, 1, 0);
        assert_eq!((h.weight_at(0), h.weight_at(1)), (1, 4));
        assert_eq!((h.tenants_at(0), h.tenants_at(1)), (1, 2));
        let order: Vec<_> = h.order.iter().map(|k| (k.0, k.1, k.3.as_str())).collect();
        assert_eq!(order, [(0, 9, "c"), (1, 0, "b"), (1, 5, "a")]);
        assert_eq!(h.order.iter().nth(2).unwrap().2.job_id, "a1");
        h.repass("a", 1, 0);
        assert_eq!(
            h.order.iter().nth(1).unwrap().3,
            "a",
            "older first at equal passes"
        );
        assert!(h.remove(&head("a", 1, 5, "a1"), 3));
        assert!(!h.remove(&head("a", 1, 5, "a1"), 3));
        assert_eq!(h.order.iter().nth(1).unwrap().2.job_id, "a2");
        assert!(h.remove(&head("a", 1, 10, "a2"), 3));
        assert!(!h.has("a", 1));
        assert_eq!(h.weight_at(1), 1);
        assert_eq!(h.order.len(), 2);
        assert_eq!(h.len(), 2);
    }

    fn keyed(tenant: &str, at: i64, id: &str, key: &str) -> (QueueKey, Lane) {
        let mut h = head(tenant, 1, at, id);
        h.1.concurrency = Some(crate::state::KeyLimit {
            key: key.into(),
            limit: u32::MAX,
            rate: None,
            fair: true,
        });
        h
    }

    #[test]
    fn a_groups_heads_stand_by_turn_then_age() {
        let mut h = Heads::default();
        h.insert(keyed("a", 1, "k1", "k1"), 0, 1, 10);
        h.insert(keyed("a", 5, "k2", "k2"), 0, 1, 0);
        h.insert(head("a", 1, 3, "u1"), 0, 1, 5);
        h.insert(head("a", 1, 4, "u2"), 0, 1, 99);
        assert_eq!(h.turns_at("a", 1), 3);
        // The group stands by the head its turns put first (k2's, at turn pass 0).
        assert_eq!(h.order.first().unwrap().2.job_id, "k2");
        let mut tried = Vec::new();
        let mut walk = Walk::default();
        while let Some(next) = h.next_head("a", 1, &walk) {
            tried.push(next.1.0.job_id.clone());
            walk.tried(&next);
        }
        // The unkeyed lanes share the "" turn (the second's turn pass is ignored).
        assert_eq!(tried, ["k2", "u1", "u2", "k1"]);
        // A walk that tried u1 (held) then k2 (placed: its turn moves on, behind k1) goes
        // on with u2, then k1, then k2's next head where k2 stands now; u1 is not tried
        // again.
        h.insert(keyed("a", 6, "k2b", "k2"), 0, 1, 0);
        let mut walk = Walk::default();
        walk.tried(&((5, String::new()), head("a", 1, 3, "u1")));
        walk.tried(&((0, "k2".to_owned()), keyed("a", 5, "k2", "k2")));
        assert!(h.remove(&keyed("a", 5, "k2", "k2"), 1));
        h.repass_turn("a", 1, "k2", 20);
        assert_eq!(h.order.first().unwrap().2.job_id, "u1");
        let mut tried = Vec::new();
        while let Some(next) = h.next_head("a", 1, &walk) {
            tried.push(next.1.0.job_id.clone());
            walk.tried(&next);
        }
        assert_eq!(tried, ["u2", "k1", "k2b"]);
        h.insert(keyed("a", 5, "k2", "k2"), 0, 1, 0);
        assert!(h.remove(&keyed("a", 6, "k2b", "k2"), 1));
        assert!(h.remove(&head("a", 1, 3, "u1"), 1));
        assert!(h.remove(&head("a", 1, 4, "u2"), 1));
        assert!(!h.has_turn("a", 1, ""));
        assert_eq!(h.order.first().unwrap().2.job_id, "k1");
        assert!(h.remove(&keyed("a", 1, "k1", "k1"), 1));
        assert!(h.remove(&keyed("a", 5, "k2", "k2"), 1));
        assert!(h.is_empty() && h.order.is_empty() && h.weight_at(1) == 0);
    }
}
