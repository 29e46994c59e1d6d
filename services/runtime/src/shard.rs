//! Shards: which input partitions each shard's processor reads, where workers answer it, and
//! which inputs it leaves to the other shards (docs/architecture.md, "Shards").
//!
//! A shard is one journal partition. It schedules a set of pools (pools.yaml `shard:`, or a
//! hash of the pool's name) and takes the jobs of the topics routed to them. Its processor
//! reads, with its own consumer group (assigned by hand, so every shard reads what it needs
//! whatever the others read):
//!
//! - every partition of the job topics routed to its pools;
//! - the results partitions `p` with `p % shards == shard`: a Dispatch names one of them
//!   (`reply_partition`), and workers write JobStarted, JobProgress and JobResult there;
//! - every partition of the heartbeats topic: a worker heartbeats before any Dispatch could
//!   tell it where, so every shard reads every heartbeat and takes those of its own pools;
//! - every partition of the control topic: an operator addresses a job by id alone, so every
//!   shard reads every command and takes those for the jobs it holds. Ticks reach them all.
//!
//! What a shard leaves to another is not journaled: its journal says what it decided, and a
//! replay of it sees the same.

use std::collections::BTreeMap;

use ksched_core::events::Input;
use ksched_core::records::ScheduleAction;
use ksched_core::rules::{Rules, shard_of_pool, shard_of_topic};

use crate::topics::{InputKind, Topics};

/// One shard among `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub id: u32,
    pub count: u32,
}

/// Whether a shard takes an input, or which job it depends on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Takes {
    Yes,
    /// Another shard's.
    No,
    /// Only if this shard holds the job.
    IfItHolds(String),
    /// Only if this shard holds the schedule (by [`ksched_core::schedule::schedule_key`]).
    IfItHoldsSchedule(String),
    /// Only if this shard holds the batch (tenant, batch id).
    IfItHoldsBatch(String, String),
}

impl Shard {
    pub fn new(id: i32, count: i32) -> Shard {
        Shard {
            id: u32::try_from(id).unwrap_or(0),
            count: u32::try_from(count).unwrap_or(1).max(1),
        }
    }

    /// The consumer group of this shard's input offsets. Shard 0 keeps the processor's
    /// group (the one a single-shard scheduler always used), so its committed offsets stay
    /// where they were.
    pub fn input_group(&self, group_id: &str) -> String {
        if self.id == 0 {
            group_id.to_owned()
        } else {
            format!("{group_id}-shard-{}", self.id)
        }
    }

    /// The input partitions this shard reads, given each topic's partition count.
    pub fn inputs(
        &self,
        topics: &Topics,
        rules: &Rules,
        partitions: &BTreeMap<String, i32>,
    ) -> Vec<(String, i32)> {
        let all = |topic: &str| -> Vec<(String, i32)> {
            (0..partitions.get(topic).copied().unwrap_or(0))
                .map(|p| (topic.to_owned(), p))
                .collect()
        };
        let mut out = Vec::new();
        for topic in &topics.jobs {
            if shard_of_topic(rules, topic, self.count).is_none_or(|s| s == self.id) {
                out.extend(all(topic));
            }
        }
        out.extend(
            all(&topics.results)
                .into_iter()
                .filter(|(_, p)| self.owns_results_partition(*p)),
        );
        out.extend(all(&topics.heartbeats));
        out.extend(all(&topics.control));
        out
    }

    fn owns_results_partition(&self, p: i32) -> bool {
        u32::try_from(p).is_ok_and(|p| p % self.count == self.id)
    }

    /// The results partition a Dispatch to `worker_id` asks it to answer on: one of this
    /// shard's, the same for every job the worker takes from this shard (spread over the
    /// shard's partitions by worker id), or None when the topic has too few partitions (the
    /// start refuses that, [`Shard::check_results_partitions`]).
    ///
    /// By worker, not by job: librdkafka writes each partition in a request of its own, so
    /// a worker whose reports went to every partition its jobs hash to would send that many
    /// requests a flush. A worker's reports on one job stay in order (one producer, one
    /// partition); reports of another attempt may come from another worker on another
    /// partition, in any order, and the scheduler fences attempts by number.
    pub fn reply_partition(&self, worker_id: &str, results_partitions: i32) -> Option<i32> {
        // This shard's partitions are id, id + count, id + 2 count, ... below the topic's.
        let (id, count) = (u64::from(self.id), u64::from(self.count.max(1)));
        let total = u64::try_from(results_partitions).ok()?;
        let own = total.checked_sub(id)?.div_ceil(count);
        if own == 0 {
            return None;
        }
        let i = mixed(ksched_core::hash::fnv1a64(&[worker_id.as_bytes()])) % own;
        i32::try_from(id + i * count).ok()
    }

    /// Why a results topic of `results_partitions` partitions cannot serve the shards, if it
    /// cannot.
    pub fn check_results_partitions(count: u32, results_partitions: i32) -> Option<String> {
        (i64::from(results_partitions) < i64::from(count)).then(|| {
            format!(
                "the results topic has {results_partitions} partitions, fewer than the {count} shards (topics.journal_partitions): each shard answers on its own; add partitions to it (kafka-topics --alter --partitions {count})"
            )
        })
    }

    /// Whether this shard takes `input`, read from a topic of `kind` it reads. Job topics
    /// and results partitions are its own already; heartbeats and control records are every
    /// shard's to read and one shard's to take.
    pub fn takes(&self, rules: &Rules, kind: InputKind, input: &Input) -> Takes {
        if self.count == 1 || matches!(kind, InputKind::Jobs | InputKind::Results) {
            return Takes::Yes;
        }
        match input {
            Input::Heartbeat(hb) => {
                if shard_of_pool(rules, &hb.pool, self.count) == self.id {
                    Takes::Yes
                } else {
                    Takes::No
                }
            }
            // A batch lives on the shard of its members: that shard holds its record. A cancel
            // naming no tenant is refused by one shard.
            Input::Cancel(c) => match (&c.batch_id, &c.tenant_id) {
                (Some(b), Some(t)) => Takes::IfItHoldsBatch(t.clone(), b.clone()),
                (Some(_), None) if self.id == 0 => Takes::Yes,
                (Some(_), None) => Takes::No,
                (None, _) => Takes::IfItHolds(c.job_id.clone()),
            },
            Input::Approve(a) => Takes::IfItHolds(a.job_id.clone()),
            Input::Reject(r) => Takes::IfItHolds(r.job_id.clone()),
            Input::Redrive(r) => Takes::IfItHolds(r.job_id.clone()),
            Input::Reschedule(r) => Takes::IfItHolds(r.job_id.clone()),
            // A schedule lives on the shard of its template's topic (which an update may not
            // change): that shard takes its creation, and the holder every later command.
            Input::Schedule(c) => match (c.action, &c.spec) {
                (ScheduleAction::Create, Some(spec)) => {
                    match shard_of_topic(rules, &spec.template.topic, self.count) {
                        Some(shard) if shard == self.id => Takes::Yes,
                        // Refused (unmapped topic) by one shard.
                        None if self.id == 0 => Takes::Yes,
                        _ => Takes::No,
                    }
                }
                (ScheduleAction::Create, None) if self.id == 0 => Takes::Yes,
                (ScheduleAction::Create, None) => Takes::No,
                _ => Takes::IfItHoldsSchedule(ksched_core::schedule::schedule_key(
                    &c.tenant_id,
                    &c.schedule_id,
                )),
            },
            // A heartbeat or command that does not decode: one shard dead-letters it.
            Input::Malformed(_) => {
                if self.id == 0 {
                    Takes::Yes
                } else {
                    Takes::No
                }
            }
            Input::Submit(_)
            | Input::Started(_)
            | Input::Progress(_)
            | Input::Result(_)
            | Input::Tick(_)
            | Input::Reconfigure(_) => Takes::Yes,
        }
    }
}

/// A job topic that another shard takes under new rules than under the rules in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    pub topic: String,
    pub pools: Vec<String>,
    pub from: u32,
    pub to: u32,
}

/// The job topics whose shard differs between `old` (the rules in force, as journaled) and
/// `new` (with `count` shards), among those `shard` took or takes; none when `old` does not
/// say how many shards it was put in force with.
pub fn moves(old: &Rules, new: &Rules, count: u32, shard: u32) -> Vec<Move> {
    let Some(old_count) = old.shards else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for topic in old.topics.keys() {
        let (Some(from), Some(to)) = (
            shard_of_topic(old, topic, old_count),
            shard_of_topic(new, topic, count),
        ) else {
            continue;
        };
        if from != to && (from == shard || to == shard) {
            out.push(Move {
                topic: topic.clone(),
                pools: new.topics.get(topic).cloned().unwrap_or_default(),
                from,
                to,
            });
        }
    }
    out
}

/// Refuses to put `new` in force on `shard` when that would run jobs twice or lose their
/// results: a job topic moving away while this shard still holds unfinished jobs of it (its
/// pools are no longer here to run them, their results would reach a shard that does not
/// hold them); a job topic moving here while this shard's consumer group has no position on
/// it as far as the other shard's (it would read the topic from the beginning and run every
/// retained job again); a change of the shard count while jobs are out on workers (their
/// results are answered on partitions another shard may read). The error names the topics,
/// the pools and what to do.
pub fn check_moves(
    settings: &crate::settings::Settings,
    journal: &str,
    state: &ksched_core::state::State,
    store: &ksched_store::Store,
    new: &Rules,
    shard: Shard,
) -> crate::error::Result<()> {
    let refuse = |detail: String| {
        Err(crate::error::Error::Config {
            source_name: "pools.yaml (shards)".into(),
            detail,
        })
    };
    let Some(current) = state.config.as_ref() else {
        return Ok(());
    };
    let old = &current.rules;
    for m in moves(old, new, shard.count, shard.id) {
        if m.from == shard.id {
            // Queued and delayed records wait in storage as well as in memory.
            let in_memory = state
                .jobs
                .iter_any_order()
                .filter(|(_, j)| !j.state.is_terminal() && j.request.topic == m.topic)
                .count() as u64;
            let stored = store
                .unfinished_of_topic(&m.topic, |id| state.jobs.contains_key(id))
                .map_err(crate::error::Error::from)?;
            let unfinished = in_memory + stored;
            if unfinished > 0 {
                return refuse(format!(
                    "job topic {} (pools {}) would move from shard {} to shard {}, but shard {} still holds {unfinished} unfinished jobs of it, which only it can run and hear from; keep its pools on shard {} (pools.yaml `shard: {}`) until they end (`ksched jobs list --topic {} --state PENDING`, and RUNNING), stop producing to it, then move it",
                    m.topic,
                    m.pools.join(", "),
                    m.from,
                    m.to,
                    m.from,
                    m.from,
                    m.from,
                    m.topic
                ));
            }
        } else if let Some(missing) = positions_behind(settings, journal, &m)? {
            let group = Shard::new(i32::try_from(m.to).unwrap_or(0), 1)
                .input_group(&settings.processor.group_id);
            return refuse(format!(
                "job topic {} (pools {}) would move from shard {} to shard {}, whose consumer group {group} has no position on it as far as shard {}'s: it would read the topic from the beginning and run its retained jobs again. Once shard {} has no unfinished job of it and nothing is produced to it, hand the position over: {}",
                m.topic,
                m.pools.join(", "),
                m.from,
                m.to,
                m.from,
                m.from,
                missing
                    .iter()
                    .map(|(p, o)| format!(
                        "kafka-consumer-groups.sh --bootstrap-server {} --group {group} --topic {}:{p} --reset-offsets --to-offset {o} --execute",
                        settings.kafka.bootstrap_servers, m.topic
                    ))
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
        }
    }
    if let Some(before) = old.shards
        && before != shard.count
    {
        let out = state
            .jobs
            .iter_any_order()
            .filter(|(_, j)| j.state.is_active())
            .count();
        if out > 0 {
            return refuse(format!(
                "the shard count would change from {before} to {} (topics.journal_partitions) while shard {} has {out} jobs out on workers, whose results are answered on partitions another shard would read; let them end first (stop producing, wait for `ksched jobs list --state RUNNING` to be empty)",
                shard.count, shard.id
            ));
        }
    }
    Ok(())
}

/// The partitions of a moving topic on which the joining shard's group has no committed
/// position as far as the leaving shard's (the further of its group's and the last one its
/// journal carries), with the offsets to hand over; None when it has them all.
fn positions_behind(
    settings: &crate::settings::Settings,
    journal: &str,
    m: &Move,
) -> crate::error::Result<Option<Vec<(i32, i64)>>> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let group_of = |id: u32| {
        Shard::new(i32::try_from(id).unwrap_or(0), 1).input_group(&settings.processor.group_id)
    };
    let timeout = std::time::Duration::from_secs(10);
    let committed = |group: String| -> crate::error::Result<BTreeMap<i32, i64>> {
        let consumer: BaseConsumer = crate::topics::client_config(settings)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            .create()
            .map_err(crate::error::kafka(
                "creating a consumer to read group positions",
            ))?;
        let meta = consumer
            .fetch_metadata(Some(&m.topic), timeout)
            .map_err(crate::error::kafka("reading a job topic's partitions"))?;
        let mut tpl = rdkafka::TopicPartitionList::new();
        for t in meta.topics() {
            for p in t.partitions() {
                tpl.add_partition(&m.topic, p.id());
            }
        }
        let offsets = consumer
            .committed_offsets(tpl, timeout)
            .map_err(crate::error::kafka("reading a consumer group's positions"))?;
        Ok(offsets
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                rdkafka::Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect())
    };
    let mut leaving = committed(group_of(m.from))?;
    let mut reader = crate::replay::reader_client(settings, "positions");
    reader.set("isolation.level", "read_committed");
    let from = i32::try_from(m.from).unwrap_or(0);
    let (low, high) = crate::replay::journal_watermarks(&reader, journal, from)?;
    let journaled = crate::positions::last_in_journal(&reader, journal, from, low, high)?;
    for ((topic, p), o) in journaled.unwrap_or_default() {
        if topic == m.topic {
            let at = leaving.entry(p).or_insert(o);
            *at = (*at).max(o);
        }
    }
    let joining = committed(group_of(m.to))?;
    let missing: Vec<(i32, i64)> = leaving
        .iter()
        .filter(|(p, o)| joining.get(p).is_none_or(|j| j < o))
        .map(|(p, o)| (*p, *o))
        .collect();
    Ok((!missing.is_empty()).then_some(missing))
}

/// A 64-bit hash with every input bit spread over every output bit (the finaliser of
/// MurmurHash3): FNV-1a's low bits follow only the low bits of the last bytes, so ids such as
/// `node-a`, `node-e` and `node-i` would share a partition of four.
fn mixed(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use ksched_core::records::{ApproveJob, Heartbeat, Tick};
    use ksched_core::rules::PoolRules;

    fn rules() -> Rules {
        let mut r = Rules::default();
        for (pool, shard) in [("a", 0), ("b", 1)] {
            r.pools.insert(
                pool.into(),
                PoolRules {
                    shard: Some(shard),
                    ..Default::default()
                },
            );
        }
        r.topics.insert("jobs-a".into(), vec!["a".into()]);
        r.topics.insert("jobs-b".into(), vec!["b".into()]);
        r
    }

    fn topics() -> Topics {
        Topics::new(
            "x.",
            vec!["jobs-a".into(), "jobs-b".into()],
            vec!["a".into(), "b".into()],
        )
    }

    fn counts(t: &Topics) -> BTreeMap<String, i32> {
        [
            ("jobs-a".to_owned(), 2),
            ("jobs-b".to_owned(), 2),
            (t.results.clone(), 4),
            (t.heartbeats.clone(), 1),
            (t.control.clone(), 1),
        ]
        .into()
    }

    #[test]
    fn each_shard_reads_its_job_topics_its_results_partitions_and_every_heartbeat_and_command() {
        let t = topics();
        let shard1 = Shard::new(1, 2).inputs(&t, &rules(), &counts(&t));
        assert_eq!(
            shard1,
            vec![
                ("jobs-b".into(), 0),
                ("jobs-b".into(), 1),
                (t.results.clone(), 1),
                (t.results.clone(), 3),
                (t.heartbeats.clone(), 0),
                (t.control.clone(), 0),
            ]
        );
        let shard0 = Shard::new(0, 2).inputs(&t, &rules(), &counts(&t));
        assert!(shard0.contains(&("jobs-a".into(), 1)));
        assert!(!shard0.iter().any(|(topic, _)| topic == "jobs-b"));
        assert!(shard0.contains(&(t.results.clone(), 2)));
        // No results partition is read by two shards, none by no shard.
        let results: Vec<i32> = shard0
            .iter()
            .chain(&shard1)
            .filter(|(topic, _)| *topic == t.results)
            .map(|(_, p)| *p)
            .collect();
        let mut sorted = results.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_topic_whose_pool_moves_to_another_shard_is_found_by_both_shards() {
        let mut old = rules();
        old.shards = Some(2);
        let mut new = rules();
        new.pools.get_mut("b").unwrap().shard = Some(0);
        let expect = vec![Move {
            topic: "jobs-b".into(),
            pools: vec!["b".into()],
            from: 1,
            to: 0,
        }];
        assert_eq!(moves(&old, &new, 2, 1), expect, "the shard it leaves");
        assert_eq!(moves(&old, &new, 2, 0), expect, "the shard it joins");
        assert!(moves(&old, &old, 2, 0).is_empty());
        // Rules journaled before the shard count was recorded are not judged.
        let mut unknown = old.clone();
        unknown.shards = None;
        assert!(moves(&unknown, &new, 2, 1).is_empty());
        // A change of the shard count moves the topics of hashed pools.
        let mut hashed = Rules::default();
        for p in ["p0", "p1", "p2", "p3", "p4", "p5"] {
            hashed.pools.insert(p.into(), PoolRules::default());
            hashed.topics.insert(format!("t-{p}"), vec![p.into()]);
        }
        hashed.shards = Some(1);
        let moved: usize = (0..3).map(|s| moves(&hashed, &hashed, 3, s).len()).sum();
        assert!(moved > 0, "going from 1 to 3 shards moves some topics");
    }

    #[test]
    fn one_shard_reads_everything_with_the_processor_group() {
        let t = topics();
        let only = Shard::new(0, 1);
        assert_eq!(
            only.inputs(&t, &rules(), &counts(&t)).len(),
            2 + 2 + 4 + 1 + 1
        );
        assert_eq!(only.input_group("g"), "g");
        assert_eq!(Shard::new(2, 3).input_group("g"), "g-shard-2");
    }

    #[test]
    fn a_dispatch_asks_for_answers_on_a_results_partition_of_its_shard() {
        for id in 0..3 {
            let s = Shard::new(id, 3);
            for worker in ["w-1", "w-2", "w-3", "w-4"] {
                let p = s.reply_partition(worker, 7).unwrap();
                assert_eq!(p as u32 % 3, s.id, "{worker}");
                assert_eq!(s.reply_partition(worker, 7), Some(p), "stable");
            }
        }
        assert_eq!(Shard::new(2, 3).reply_partition("w", 2), None);
        assert!(Shard::check_results_partitions(3, 2).is_some());
        assert!(Shard::check_results_partitions(3, 3).is_none());
    }

    #[test]
    fn a_fleet_answers_on_every_partition_of_a_shard_each_worker_on_one() {
        let only = Shard::new(0, 1);
        let used: BTreeSet<i32> = (0..64)
            .map(|w| only.reply_partition(&format!("worker-{w}"), 4).unwrap())
            .collect();
        assert_eq!(
            used,
            (0..4).collect(),
            "64 workers spread over the 4 partitions"
        );
        let s = Shard::new(1, 2);
        let used: BTreeSet<i32> = (0..64)
            .map(|w| s.reply_partition(&format!("worker-{w}"), 8).unwrap())
            .collect();
        assert_eq!(used, [1, 3, 5, 7].into(), "the shard's partitions only");
        // Ids that differ only in a last byte of the same low bits spread too.
        let used: BTreeSet<i32> = ["node-a", "node-e", "node-i", "node-m"]
            .iter()
            .map(|w| only.reply_partition(w, 4).unwrap())
            .collect();
        assert!(used.len() > 1, "{used:?}");
    }

    #[test]
    fn heartbeats_go_to_their_pools_shard_and_commands_to_the_shard_holding_the_job() {
        let r = rules();
        let hb = |pool: &str| {
            Input::Heartbeat(Heartbeat {
                pool: pool.into(),
                ..Default::default()
            })
        };
        let (s0, s1) = (Shard::new(0, 2), Shard::new(1, 2));
        let (beat, control) = (InputKind::Heartbeats, InputKind::Control);
        assert_eq!(s0.takes(&r, beat, &hb("a")), Takes::Yes);
        assert_eq!(s1.takes(&r, beat, &hb("a")), Takes::No);
        assert_eq!(s1.takes(&r, beat, &hb("b")), Takes::Yes);
        let approve = Input::Approve(ApproveJob {
            job_id: "j-9".into(),
            ..Default::default()
        });
        assert_eq!(
            s1.takes(&r, control, &approve),
            Takes::IfItHolds("j-9".into())
        );
        assert_eq!(
            s0.takes(&r, control, &Input::Tick(Tick::default())),
            Takes::Yes,
            "every shard judges time"
        );
        let garbage = Input::Malformed(Default::default());
        assert_eq!(s0.takes(&r, control, &garbage), Takes::Yes);
        assert_eq!(
            s1.takes(&r, control, &garbage),
            Takes::No,
            "one shard dead-letters it"
        );
        assert_eq!(s1.takes(&r, InputKind::Jobs, &garbage), Takes::Yes);
        // One shard: everything, as before shards.
        assert_eq!(Shard::new(0, 1).takes(&r, beat, &hb("b")), Takes::Yes);
        assert_eq!(Shard::new(0, 1).takes(&r, control, &approve), Takes::Yes);
    }
}
