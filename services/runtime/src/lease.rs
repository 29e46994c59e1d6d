//! Which instance owns which shard: Kafka's group protocol decides.
//!
//! Every `ksched run` with the same `processor.group_id` joins the consumer group
//! `<group_id>-owners` on the journal topic, whose partitions are the shards. The group
//! coordinator spreads them over the members (cooperative-sticky: a member joining or
//! leaving moves only the partitions it must): an instance owns the shards whose journal
//! partitions it is assigned and runs their processors; for the others it stands by. The
//! lease consumer never reads the journal (its partitions are paused as soon as they are
//! assigned); its poll only keeps the membership alive.
//!
//! The lease is for liveness, not for safety: two processors of one shard never both commit,
//! because each new owner's `init_transactions` fences the previous owner's producer (same
//! transactional id per shard). A shard's lease that is lost (its partition moved to another
//! member, the instance stopped polling or lost the coordinator for
//! `lease_session_timeout_ms`) cancels that shard's ownership token; its processor stops at
//! the next batch and the instance stands by for it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Topics;
use crate::error::{Result, io, kafka};
use crate::settings::Settings;
use crate::status::Status;
use crate::topics::client_config;

/// How often the lease thread polls its consumer (group heartbeats run in librdkafka's
/// background thread; the poll serves rebalances).
const POLL: Duration = Duration::from_millis(100);
/// How often the lease thread reads the group's members from the coordinator: to choose
/// each shard's standbys, and to check its consumer against the coordinator's view.
const DESCRIBE_EVERY: Duration = Duration::from_secs(2);

/// The ownership of every shard (journal partition), kept current by a thread.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    /// Stops the lease thread.
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    /// Per journal partition.
    parts: BTreeMap<i32, Part>,
    shutdown: CancellationToken,
}

/// One shard's ownership.
#[derive(Debug)]
struct Part {
    owned: AtomicBool,
    /// This instance is one of the shard's standbys (`processor.standby_replicas`).
    standby: AtomicBool,
    /// Cancelled when ownership ends; a new one each time it begins.
    ownership: Mutex<CancellationToken>,
    status: Arc<Status>,
}

impl Shared {
    fn set(&self, partition: i32, owns: bool) {
        let Some(part) = self.parts.get(&partition) else {
            return;
        };
        if part.owned.swap(owns, Ordering::SeqCst) == owns {
            return;
        }
        let mut token = part.ownership.lock().unwrap_or_else(|p| p.into_inner());
        if owns {
            *token = self.shutdown.child_token();
        } else {
            token.cancel();
        }
        part.status.set_owner(owns);
    }

    fn set_standby(&self, partition: i32, standby: bool) {
        if let Some(part) = self.parts.get(&partition)
            && part.standby.swap(standby, Ordering::SeqCst) != standby
        {
            part.status.set_standby(standby);
        }
    }

    fn owned(&self) -> Vec<i32> {
        self.parts
            .iter()
            .filter(|(_, p)| p.owned.load(Ordering::SeqCst))
            .map(|(n, _)| *n)
            .collect()
    }

    fn release_all(&self) {
        for n in self.parts.keys() {
            self.set(*n, false);
        }
    }
}

impl Lease {
    /// Joins the owners' group, standing for every shard in `statuses` (journal partition ->
    /// that shard's status, which learns whether this instance owns it).
    pub fn start(
        settings: &Settings,
        topics: &Topics,
        statuses: BTreeMap<i32, Arc<Status>>,
        shutdown: CancellationToken,
    ) -> Result<Lease> {
        let p = &settings.processor;
        let session = p.lease_session_timeout_ms;
        let group = format!("{}-owners", p.group_id);
        // Names this instance among the group's members (a handover looks for the others).
        let client_id = format!(
            "{}-lease-{}",
            settings.kafka.client_id,
            instance_id(settings)
        );
        let mut config = client_config(settings);
        config
            .set("client.id", &client_id)
            .set("group.id", &group)
            // A new member takes only its share of the shards, from the others' surplus.
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", session.to_string())
            // Members learn of a rebalance at their next heartbeat: frequent ones make a
            // handover take a round trip or two, not seconds.
            .set(
                "heartbeat.interval.ms",
                (session / 3).clamp(100, 500).to_string(),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "latest");
        let journal = topics.journal.clone();
        // Static membership: this instance restarted (same host, same data directory) takes
        // its place back at once instead of waiting for its old session to expire. The
        // price: a static member does not leave the group when it closes; a stopping owner
        // hands over explicitly instead (see `hand_over`).
        let connect = move |instance: &str| -> Result<BaseConsumer> {
            let consumer: BaseConsumer = config
                .clone()
                .set("group.instance.id", instance)
                .create()
                .map_err(kafka("creating the lease consumer"))?;
            consumer
                .subscribe(&[&journal])
                .map_err(kafka("joining the owners' group"))?;
            Ok(consumer)
        };
        let instance = instance_id(settings);
        let consumer = connect(&instance)?;
        // Until the group's members are known, every instance that may stand by does.
        let standby = p.standby_replicas != Some(0);
        let parts = statuses
            .into_iter()
            .map(|(n, status)| {
                status.set_owner(false);
                status.set_standby(standby);
                let t = CancellationToken::new();
                t.cancel();
                (
                    n,
                    Part {
                        owned: AtomicBool::new(false),
                        standby: AtomicBool::new(standby),
                        ownership: Mutex::new(t),
                        status,
                    },
                )
            })
            .collect();
        let shared = Arc::new(Shared {
            parts,
            shutdown: shutdown.clone(),
        });
        let stop = shutdown.child_token();
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            let journal = topics.journal.clone();
            let elsewhere = topics.control.clone();
            let session = Duration::from_millis(session);
            let client_id = client_id.clone();
            let standbys = p
                .standby_replicas
                .map_or(usize::MAX, |k| usize::try_from(k).unwrap_or(usize::MAX));
            std::thread::Builder::new()
                .name("ksched-lease".into())
                .spawn(move || {
                    let ids = LeaseIds {
                        group: &group,
                        journal: &journal,
                        partitions: &[],
                        client_id: &client_id,
                    };
                    let membership = Membership {
                        consumer,
                        connect: Box::new(connect),
                        instance,
                        rejoins: 0,
                    };
                    let consumer = hold(membership, &ids, &shared, &stop, standbys, session);
                    let owned = shared.owned();
                    if !owned.is_empty() {
                        let ids = LeaseIds {
                            group: &group,
                            journal: &journal,
                            partitions: &owned,
                            client_id: &client_id,
                        };
                        hand_over(&consumer, &ids, &elsewhere, session);
                    }
                    shared.release_all();
                    consumer.unsubscribe();
                    info!(group, "left the owners' group");
                })
                .map_err(io("starting the lease thread"))?
        };
        Ok(Lease {
            shared,
            stop,
            thread: Some(thread),
        })
    }

    /// Whether this instance owns shard `partition` now.
    pub fn owned(&self, partition: i32) -> bool {
        self.shared
            .parts
            .get(&partition)
            .is_some_and(|p| p.owned.load(Ordering::SeqCst))
    }

    /// Whether this instance stands by for shard `partition` while another owns it.
    pub fn stands_by(&self, partition: i32) -> bool {
        self.shared
            .parts
            .get(&partition)
            .is_some_and(|p| p.standby.load(Ordering::SeqCst))
    }

    /// A token cancelled when the current ownership of shard `partition` ends (or at
    /// shutdown); already cancelled when this instance does not own it.
    pub fn ownership(&self, partition: i32) -> CancellationToken {
        match self.shared.parts.get(&partition) {
            Some(p) => p
                .ownership
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            None => {
                let t = CancellationToken::new();
                t.cancel();
                t
            }
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.release_all();
    }
}

/// This instance's identity in the owners' group: its host and data directory, stable
/// across restarts (a StatefulSet pod keeps its name), different for two instances.
fn instance_id(settings: &Settings) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let dir = std::fs::canonicalize(&settings.storage.data_dir)
        .unwrap_or_else(|_| settings.storage.data_dir.clone());
    let digest =
        ksched_core::hash::sha256_hex(format!("{}\0{}", host.trim(), dir.display()).as_bytes());
    format!("ksched-{}", &digest[..16])
}

/// Creates a consumer of the owners' group with a static member id, subscribed.
type Connect = dyn Fn(&str) -> Result<BaseConsumer> + Send;

/// The lease consumer and how to make a new one (a fresh member of the owners' group) when
/// the old one is wedged.
struct Membership {
    consumer: BaseConsumer,
    connect: Box<Connect>,
    /// This instance's static member id.
    instance: String,
    /// How many times the consumer was replaced.
    rejoins: u32,
}

impl Membership {
    /// Replaces the consumer with a new member of the group. The first time under the same
    /// static id (the coordinator hands it what it holds for that id); after that under a
    /// new one, so that the group rebalances even when the coordinator holds nothing for the
    /// old id. The old consumer is closed on a thread of its own: a wedged client may take
    /// its time to close, and the lease must keep polling meanwhile.
    fn rejoin(&mut self, why: &str) {
        self.rejoins += 1;
        let id = if self.rejoins == 1 {
            self.instance.clone()
        } else {
            format!("{}-{}", self.instance, self.rejoins)
        };
        warn!(
            why,
            member = %id,
            "the lease consumer and the group coordinator disagree; joining the owners' group again with a new consumer"
        );
        match (self.connect)(&id) {
            Ok(fresh) => {
                let old = std::mem::replace(&mut self.consumer, fresh);
                let _ = std::thread::Builder::new()
                    .name("ksched-lease-close".into())
                    .spawn(move || {
                        old.unsubscribe();
                        drop(old);
                    });
            }
            Err(e) => warn!(error = %e, "cannot create a new lease consumer; keeping the old one"),
        }
    }
}

/// Polls the lease consumer until `stop`, keeping `shared` in step with the assignment, and
/// every [`DESCRIBE_EVERY`] with the group's choice of `standbys` standbys per shard. Returns
/// the consumer (a new one if the old one was replaced), for the handover.
///
/// librdkafka's view of the assignment and the coordinator's are compared at the same pace:
/// after a broker restart longer than the session, a lone static member was seen to stay
/// without its shard for minutes (its session timed out on the client's side, it rejoined,
/// and the coordinator's group stayed Stable with the shard owned by nobody, or by this
/// member while its client held nothing). A disagreement that outlasts three sessions (at
/// least 10 s; a rebalance settles well within that) replaces the consumer.
fn hold(
    mut membership: Membership,
    lease: &LeaseIds<'_>,
    shared: &Shared,
    stop: &CancellationToken,
    standbys: usize,
    session: Duration,
) -> BaseConsumer {
    let (group, journal) = (lease.group, lease.journal);
    info!(
        group,
        journal,
        shards = shared.parts.len(),
        "standing for the shards"
    );
    let stuck_after = (session * 3).max(Duration::from_secs(10));
    let shards: Vec<i32> = shared.parts.keys().copied().collect();
    let mut paused: Vec<i32> = Vec::new();
    let mut last_warning: Option<Instant> = None;
    let mut described_at: Option<Instant> = None;
    let mut disagreeing: Option<Instant> = None;
    let mut blind = Blind::new(stuck_after * 2);
    while !stop.is_cancelled() {
        let consumer = &membership.consumer;
        if let Some(Err(e)) = consumer.poll(POLL)
            && last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
        {
            warn!(error = %e, "lease consumer error");
            last_warning = Some(Instant::now());
        }
        let assignment = consumer.assignment().unwrap_or_default();
        let mut owns: Vec<i32> = assignment
            .elements()
            .iter()
            .filter(|e| e.topic() == journal)
            .map(|e| e.partition())
            .collect();
        owns.sort_unstable();
        if owns != paused {
            // The lease never reads the journal: only its membership counts.
            let mut tpl = TopicPartitionList::new();
            for p in &owns {
                let _ = tpl.add_partition_offset(journal, *p, Offset::End);
            }
            if consumer.pause(&tpl).is_ok() {
                paused = owns.clone();
            }
        }
        for (partition, part) in &shared.parts {
            let now = owns.contains(partition);
            if now != part.owned.load(Ordering::SeqCst) {
                if now {
                    info!(journal, shard = partition, "this instance owns the shard");
                } else {
                    warn!(
                        journal,
                        shard = partition,
                        "this instance no longer owns the shard; standing by for it"
                    );
                }
                shared.set(*partition, now);
            }
        }
        if described_at.is_some_and(|t| t.elapsed() < DESCRIBE_EVERY) {
            continue;
        }
        described_at = Some(Instant::now());
        let described = describe(consumer, group);
        let settled = described
            .as_ref()
            .is_some_and(|(state, _)| state == "Stable" || state == "Empty");
        if let Some(why) = blind.judge(settled, owns.is_empty(), Instant::now()) {
            membership.rejoin(&why);
            paused.clear();
            disagreeing = None;
            continue;
        }
        // Unreachable coordinator: nothing to compare with (for a while, see `Blind`).
        let Some((state, members)) = described else {
            disagreeing = None;
            continue;
        };
        choose_standbys(&state, &members, lease, shared, standbys);
        match disagreement(&state, &members, lease, &shards, &owns) {
            None => disagreeing = None,
            Some(why) => {
                let since = *disagreeing.get_or_insert_with(Instant::now);
                if since.elapsed() >= stuck_after {
                    membership.rejoin(&why);
                    paused.clear();
                    disagreeing = None;
                }
            }
        }
    }
    membership.consumer
}

/// How long the lease has gone without a settled view of the owners' group while this
/// instance owns no shard. The comparison with the coordinator ([`disagreement`]) needs the
/// group described as Stable or Empty; after a broker restart a lone member was seen to own
/// nothing for minutes while no such view came (the coordinator unreachable from the lease's
/// describe, or the group never settling), so it never judged and never joined again. Past
/// `limit` of that, the consumer is replaced too. An instance that owns a shard keeps it.
struct Blind {
    limit: Duration,
    since: Option<Instant>,
}

impl Blind {
    fn new(limit: Duration) -> Blind {
        Blind { limit, since: None }
    }

    /// Why to join the group again, if the lease has been blind and idle for `limit`.
    fn judge(&mut self, settled: bool, owns_nothing: bool, now: Instant) -> Option<String> {
        if settled || !owns_nothing {
            self.since = None;
            return None;
        }
        let since = *self.since.get_or_insert(now);
        if now.duration_since(since) < self.limit {
            return None;
        }
        self.since = None;
        Some(format!(
            "this instance has owned no shard for {} s and the owners' group was not described as settled meanwhile",
            self.limit.as_secs()
        ))
    }
}

/// How the coordinator's view of the owners' group (settled: Stable or Empty) contradicts
/// this member's, which owns `owns` of `shards`: this member is not in the group, a shard
/// is owned by nobody, or the coordinator gives this member a shard it does not hold or
/// the other way round. None while the group rebalances.
fn disagreement(
    state: &str,
    members: &[Member],
    lease: &LeaseIds<'_>,
    shards: &[i32],
    owns: &[i32],
) -> Option<String> {
    if state != "Stable" && state != "Empty" {
        return None;
    }
    if !members.iter().any(|m| m.client_id == lease.client_id) {
        return Some(format!(
            "the group is {state} and this instance is not among its {} members",
            members.len()
        ));
    }
    for p in shards {
        let holders: Vec<&str> = members
            .iter()
            .filter(|m| assigned(&m.assignment, lease.journal, *p))
            .map(|m| m.client_id.as_str())
            .collect();
        if holders.is_empty() {
            return Some(format!(
                "shard {p} is owned by no member of the Stable group"
            ));
        }
        let ours = holders.contains(&lease.client_id);
        if ours != owns.contains(p) {
            return Some(format!(
                "the coordinator says this instance {} shard {p}, its consumer that it {}",
                if ours { "owns" } else { "does not own" },
                if ours { "does not" } else { "does" },
            ));
        }
    }
    None
}

/// Marks the shards this instance stands by for, from the group's members as the coordinator
/// describes them once the group is stable (mid-rebalance, the previous choice stands).
fn choose_standbys(
    state: &str,
    members: &[Member],
    lease: &LeaseIds<'_>,
    shared: &Shared,
    k: usize,
) {
    // None, or every other instance: nothing to choose.
    if k == 0 || k == usize::MAX {
        return;
    }
    if state != "Stable" || !members.iter().any(|m| m.client_id == lease.client_id) {
        return;
    }
    for partition in shared.parts.keys() {
        let chosen = standbys_of(members, lease.journal, *partition, k);
        shared.set_standby(*partition, chosen.contains(&lease.client_id));
    }
}

/// The members that stand by for shard `partition`: of those that do not own it, the `k`
/// that rank highest for it by rendezvous hashing (SHA-256 of the member's client id and the
/// shard). Each shard's standbys spread over the members, and a member joining or leaving
/// changes only the choices it ranks in.
fn standbys_of<'a>(members: &'a [Member], journal: &str, partition: i32, k: usize) -> Vec<&'a str> {
    let mut ranked: Vec<(String, &str)> = members
        .iter()
        .filter(|m| !assigned(&m.assignment, journal, partition))
        .map(|m| {
            let score =
                ksched_core::hash::sha256_hex(format!("{}\0{partition}", m.client_id).as_bytes());
            (score, m.client_id.as_str())
        })
        .collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    ranked.dedup_by(|a, b| a.1 == b.1);
    ranked.into_iter().take(k).map(|(_, id)| id).collect()
}

/// Hands the shards this instance owns over to the standbys as it stops, instead of leaving
/// the others to wait for its session to expire: a static member sends no LeaveGroup
/// (KIP-345), but a member that rejoins with another subscription (here `elsewhere`, a topic
/// the processor may read) makes the coordinator rebalance at once, and its journal
/// partitions go to members that still subscribe to the journal.
///
/// Only when another member is there to take them: alone, the owner keeps them, so that it
/// takes its place back at once when it starts again. And the subscription to the
/// journal is restored before the member closes, whether or not the handover was seen to
/// complete: a static member that comes back with another subscription than the one it left
/// with was seen to be given its stale assignment and no rebalance (the journal unowned for
/// minutes), so it must leave as a plain member of the journal's group. Each step waits at
/// most `session`, after which the others would have taken over anyway.
fn hand_over(consumer: &BaseConsumer, lease: &LeaseIds<'_>, elsewhere: &str, session: Duration) {
    let others =
        |members: &[Member]| -> bool { members.iter().any(|m| m.client_id != lease.client_id) };
    if !describe(consumer, lease.group).is_some_and(|(_, members)| others(&members)) {
        return;
    }
    if let Err(e) = consumer.subscribe(&[elsewhere]) {
        warn!(error = %e, "cannot hand the journal partition over; the standbys take it after the session timeout");
        return;
    }
    let started = Instant::now();
    let handed = wait_for(consumer, session, || {
        journal_held(consumer, lease, |client_id| client_id != lease.client_id)
    });
    if handed {
        info!(
            group = lease.group,
            shards = ?lease.partitions,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "handed the shards over"
        );
    } else {
        warn!(
            group = lease.group,
            "the shards were not handed over in time; the standbys take them after the session timeout"
        );
    }
    if let Err(e) = consumer.subscribe(&[lease.journal]) {
        warn!(error = %e, "cannot subscribe to the journal again before leaving");
        return;
    }
    // Back to a plain member of the journal's group: the partition stays where it is (the
    // assignor is sticky), or comes back here when nobody took it.
    wait_for(consumer, session, || {
        journal_held(consumer, lease, |_| true)
    });
}

/// Whether the group is stable with each of the handed-over journal partitions assigned to
/// a member whose client id passes `whose`.
fn journal_held(
    consumer: &BaseConsumer,
    lease: &LeaseIds<'_>,
    whose: impl Fn(&str) -> bool,
) -> bool {
    describe(consumer, lease.group).is_some_and(|(state, members)| {
        state == "Stable"
            && lease.partitions.iter().all(|p| {
                members
                    .iter()
                    .any(|m| whose(&m.client_id) && assigned(&m.assignment, lease.journal, *p))
            })
    })
}

/// The owners' group's coordinates, the shards handed over, and this instance's client id.
struct LeaseIds<'a> {
    group: &'a str,
    journal: &'a str,
    partitions: &'a [i32],
    client_id: &'a str,
}

/// Polls `consumer` until `done` (checked every few polls) or `limit`.
fn wait_for(consumer: &BaseConsumer, limit: Duration, mut done: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        let _ = consumer.poll(POLL);
        if done() {
            return true;
        }
    }
    false
}

/// A member of the owners' group: its client id and its assignment (consumer protocol).
struct Member {
    client_id: String,
    assignment: Vec<u8>,
}

/// The group's state and members, as the coordinator describes them.
fn describe(consumer: &BaseConsumer, group: &str) -> Option<(String, Vec<Member>)> {
    let list = consumer
        .fetch_group_list(Some(group), Duration::from_secs(1))
        .ok()?;
    let g = list.groups().iter().find(|g| g.name() == group)?;
    let members = g
        .members()
        .iter()
        .map(|m| Member {
            client_id: m.client_id().to_owned(),
            assignment: m.assignment().unwrap_or_default().to_vec(),
        })
        .collect();
    Some((g.state().to_owned(), members))
}

/// Whether a consumer-protocol assignment (version, then topics with their partitions, then
/// user data) holds `topic`/`partition`.
fn assigned(bytes: &[u8], topic: &str, partition: i32) -> bool {
    let mut r = bytes;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, rest) = (r.get(..n)?, r.get(n..)?);
        r = rest;
        Some(head)
    };
    let mut parse = || -> Option<bool> {
        let _version = take(2)?;
        let topics = i32::from_be_bytes(take(4)?.try_into().ok()?);
        for _ in 0..topics.max(0) {
            let len = i16::from_be_bytes(take(2)?.try_into().ok()?);
            let name = take(usize::try_from(len).ok()?)?.to_vec();
            let partitions = i32::from_be_bytes(take(4)?.try_into().ok()?);
            for _ in 0..partitions.max(0) {
                let p = i32::from_be_bytes(take(4)?.try_into().ok()?);
                if name == topic.as_bytes() && p == partition {
                    return Some(true);
                }
            }
        }
        Some(false)
    };
    parse().unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::{Blind, LeaseIds, Member, assigned, disagreement, standbys_of};
    use std::time::{Duration, Instant};

    /// Version 0, one topic with partitions 0 and 3, no user data.
    fn assignment(topic: &str, partitions: &[i32]) -> Vec<u8> {
        let mut b = vec![0, 0];
        b.extend(1i32.to_be_bytes());
        b.extend((topic.len() as i16).to_be_bytes());
        b.extend(topic.as_bytes());
        b.extend((partitions.len() as i32).to_be_bytes());
        for p in partitions {
            b.extend(p.to_be_bytes());
        }
        b.extend((-1i32).to_be_bytes());
        b
    }

    #[test]
    fn an_assignment_is_read_topic_by_topic_and_partition_by_partition() {
        let a = assignment("x.journal", &[0, 3]);
        assert!(assigned(&a, "x.journal", 0));
        assert!(assigned(&a, "x.journal", 3));
        assert!(!assigned(&a, "x.journal", 1));
        assert!(!assigned(&a, "x.control", 0));
        assert!(!assigned(&assignment("x.control", &[0]), "x.journal", 0));
    }

    #[test]
    fn a_truncated_or_empty_assignment_holds_nothing() {
        let a = assignment("x.journal", &[0]);
        assert!(!assigned(&a[..a.len() - 8], "x.journal", 0));
        assert!(!assigned(&[], "x.journal", 0));
        assert!(!assigned(&[0, 0, 0x7f, 0xff, 0xff, 0xff], "x.journal", 0));
    }

    fn member(id: &str, owns: &[i32]) -> Member {
        Member {
            client_id: id.to_owned(),
            assignment: assignment("x.journal", owns),
        }
    }

    #[test]
    fn a_shard_has_k_standbys_none_of_them_its_owner() {
        let members = [
            member("a", &[0, 1]),
            member("b", &[2, 3]),
            member("c", &[4, 5]),
        ];
        for shard in 0..6 {
            let owner = members
                .iter()
                .find(|m| assigned(&m.assignment, "x.journal", shard))
                .unwrap();
            let one = standbys_of(&members, "x.journal", shard, 1);
            assert_eq!(one.len(), 1);
            assert_ne!(one[0], owner.client_id);
            let all = standbys_of(&members, "x.journal", shard, 5);
            assert_eq!(all.len(), 2, "more than the other members: all of them");
            assert!(!all.contains(&owner.client_id.as_str()));
            assert!(standbys_of(&members, "x.journal", shard, 0).is_empty());
        }
    }

    #[test]
    fn standbys_are_spread_and_stay_put_when_an_unrelated_member_joins() {
        let ids: Vec<String> = (0..8).map(|i| format!("ksched-lease-{i}")).collect();
        let members: Vec<Member> = ids.iter().map(|id| member(id, &[])).collect();
        let chosen: Vec<String> = (0..64)
            .map(|s| standbys_of(&members, "x.journal", s, 1)[0].to_owned())
            .collect();
        let distinct: std::collections::BTreeSet<&String> = chosen.iter().collect();
        assert!(distinct.len() >= 6, "64 shards' standbys on {distinct:?}");
        // A ninth member takes only the shards it ranks first for; the others keep theirs.
        let mut more = members;
        more.push(member("ksched-lease-new", &[]));
        for (s, before) in chosen.iter().enumerate() {
            let now = standbys_of(&more, "x.journal", s as i32, 1)[0];
            assert!(now == before || now == "ksched-lease-new");
        }
    }

    fn ids(client_id: &str) -> LeaseIds<'_> {
        LeaseIds {
            group: "x-owners",
            journal: "x.journal",
            partitions: &[],
            client_id,
        }
    }

    /// An instance that owns nothing and never sees the group settled joins again after
    /// the limit, and not before; a settled view or an owned shard resets the count (before,
    /// a lone member stayed without its shard for minutes after a broker restart).
    #[test]
    fn a_lease_blind_and_idle_for_too_long_joins_again() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut b = Blind::new(Duration::from_secs(36));
        assert!(b.judge(false, true, t0).is_none());
        assert!(b.judge(false, true, t0 + 35 * s).is_none());
        assert!(b.judge(false, true, t0 + 36 * s).is_some());
        // The count starts again after a rejoin.
        assert!(b.judge(false, true, t0 + 37 * s).is_none());
        assert!(b.judge(false, true, t0 + 72 * s).is_none());
        assert!(b.judge(false, true, t0 + 73 * s).is_some());
        // A settled view, or a shard owned, resets it.
        let mut b = Blind::new(Duration::from_secs(36));
        assert!(b.judge(false, true, t0).is_none());
        assert!(b.judge(true, true, t0 + 30 * s).is_none());
        assert!(b.judge(false, true, t0 + 40 * s).is_none());
        assert!(b.judge(false, false, t0 + 60 * s).is_none());
        assert!(b.judge(false, true, t0 + 90 * s).is_none());
        assert!(b.judge(false, true, t0 + 126 * s).is_some());
    }

    #[test]
    fn a_settled_group_that_agrees_with_the_consumer_is_left_alone() {
        let members = [member("a", &[0, 2]), member("b", &[1])];
        assert_eq!(
            disagreement("Stable", &members, &ids("a"), &[0, 1, 2], &[0, 2]),
            None
        );
        assert_eq!(
            disagreement("Stable", &members, &ids("b"), &[0, 1, 2], &[1]),
            None
        );
    }

    #[test]
    fn a_group_that_rebalances_is_not_judged() {
        // Mid-rebalance anything goes: nobody owns shard 1, "a" holds what it was not given.
        let members = [member("a", &[0])];
        for state in ["PreparingRebalance", "CompletingRebalance", "Dead", ""] {
            assert_eq!(
                disagreement(state, &members, &ids("a"), &[0, 1], &[2]),
                None,
                "{state}"
            );
        }
    }

    #[test]
    fn a_member_the_coordinator_forgot_disagrees() {
        let why = disagreement("Empty", &[], &ids("a"), &[0], &[]).unwrap();
        assert!(why.contains("not among its 0 members"), "{why}");
        let why = disagreement("Stable", &[member("b", &[0])], &ids("a"), &[0], &[]).unwrap();
        assert!(why.contains("not among"), "{why}");
    }

    #[test]
    fn a_shard_owned_by_nobody_disagrees() {
        // The broker-restart case: the lone member is back, the group Stable, shard 0 unowned.
        let why = disagreement("Stable", &[member("a", &[])], &ids("a"), &[0], &[]).unwrap();
        assert!(why.contains("shard 0 is owned by no member"), "{why}");
    }

    #[test]
    fn an_assignment_the_client_and_the_coordinator_see_differently_disagrees() {
        let members = [member("a", &[0]), member("b", &[1])];
        let why = disagreement("Stable", &members, &ids("a"), &[0, 1], &[]).unwrap();
        assert!(
            why.contains("owns shard 0, its consumer that it does not"),
            "{why}"
        );
        let why = disagreement("Stable", &members, &ids("a"), &[0, 1], &[0, 1]).unwrap();
        assert!(
            why.contains("does not own shard 1, its consumer that it does"),
            "{why}"
        );
    }
}
