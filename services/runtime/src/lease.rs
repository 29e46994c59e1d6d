//! Which instance owns the journal partition: Kafka's group protocol decides.
//!
//! Every `ksched run` with the same `processor.group_id` joins the consumer group
//! `<group_id>-owners` on the journal topic. The group coordinator assigns the journal
//! partition to one member: that instance owns it and runs the processor; the others stand
//! by. The lease consumer never reads the journal (its partitions are paused as soon as they
//! are assigned); its poll only keeps the membership alive.
//!
//! The lease is for liveness, not for safety: two processors never both commit, because
//! each new owner's `init_transactions` fences the previous owner's producer (same
//! transactional id), and its input consumer takes the static group membership over. A
//! lease that is lost (the owner stopped polling, lost the coordinator for
//! `lease_session_timeout_ms`, or left) cancels the owner's ownership token; its processor
//! stops at the next batch and the instance stands by.

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

/// The ownership of one journal partition, kept current by a thread.
#[derive(Debug)]
pub struct Lease {
    shared: Arc<Shared>,
    /// Stops the lease thread.
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    owned: AtomicBool,
    /// Cancelled when ownership ends; a new one each time it begins.
    ownership: Mutex<CancellationToken>,
    shutdown: CancellationToken,
    status: Arc<Status>,
}

impl Shared {
    fn set(&self, owns: bool) {
        if self.owned.swap(owns, Ordering::SeqCst) == owns {
            return;
        }
        let mut token = self.ownership.lock().unwrap_or_else(|p| p.into_inner());
        if owns {
            *token = self.shutdown.child_token();
        } else {
            token.cancel();
        }
        self.status.set_owner(owns);
    }
}

impl Lease {
    /// Joins the owners' group for `settings.processor.journal_partition` of the journal.
    pub fn start(
        settings: &Settings,
        topics: &Topics,
        status: Arc<Status>,
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
        let consumer: BaseConsumer = client_config(settings)
            .set("client.id", &client_id)
            .set("group.id", &group)
            // Static membership: this instance restarted (same host, same data directory)
            // takes its place back at once instead of waiting for its old session to expire.
            // The price: a static member does not leave the group when it closes; a
            // stopping owner hands over explicitly instead (see `hand_over`).
            .set("group.instance.id", instance_id(settings))
            // A new member does not move the partition from its owner.
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", session.to_string())
            // Members learn of a rebalance at their next heartbeat: frequent ones make a
            // handover take a round trip or two, not seconds.
            .set(
                "heartbeat.interval.ms",
                (session / 3).clamp(100, 500).to_string(),
            )
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "latest")
            .create()
            .map_err(kafka("creating the lease consumer"))?;
        consumer
            .subscribe(&[&topics.journal])
            .map_err(kafka("joining the owners' group"))?;
        status.set_owner(false);
        let shared = Arc::new(Shared {
            owned: AtomicBool::new(false),
            ownership: Mutex::new({
                let t = CancellationToken::new();
                t.cancel();
                t
            }),
            shutdown: shutdown.clone(),
            status,
        });
        let stop = shutdown.child_token();
        let thread = {
            let (shared, stop) = (shared.clone(), stop.clone());
            let (journal, partition) = (topics.journal.clone(), p.journal_partition);
            let elsewhere = topics.control.clone();
            let session = Duration::from_millis(session);
            let client_id = client_id.clone();
            std::thread::Builder::new()
                .name("ksched-lease".into())
                .spawn(move || {
                    hold(&consumer, &journal, partition, &shared, &stop, &group);
                    if shared.owned.load(Ordering::SeqCst) {
                        let ids = LeaseIds {
                            group: &group,
                            journal: &journal,
                            partition,
                            client_id: &client_id,
                        };
                        hand_over(&consumer, &ids, &elsewhere, session);
                    }
                    shared.set(false);
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

    /// Whether this instance owns the journal partition now.
    pub fn owned(&self) -> bool {
        self.shared.owned.load(Ordering::SeqCst)
    }

    /// A token cancelled when the current ownership ends (or at shutdown); already
    /// cancelled when this instance does not own the partition.
    pub fn ownership(&self) -> CancellationToken {
        self.shared
            .ownership
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.shared.set(false);
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

/// Polls the lease consumer until `stop`, keeping `shared` in step with the assignment,
/// then leaves the group.
fn hold(
    consumer: &BaseConsumer,
    journal: &str,
    partition: i32,
    shared: &Shared,
    stop: &CancellationToken,
    group: &str,
) {
    info!(
        group,
        journal, partition, "standing for the journal partition"
    );
    let mut paused = false;
    let mut last_warning: Option<Instant> = None;
    while !stop.is_cancelled() {
        if let Some(Err(e)) = consumer.poll(POLL)
            && last_warning.is_none_or(|t| t.elapsed() > Duration::from_secs(10))
        {
            warn!(error = %e, "lease consumer error");
            last_warning = Some(Instant::now());
        }
        let assignment = consumer.assignment().unwrap_or_default();
        let owns = assignment
            .elements()
            .iter()
            .any(|e| e.topic() == journal && e.partition() == partition);
        if owns && !paused {
            // The lease never reads the journal: only its membership counts.
            let mut tpl = TopicPartitionList::new();
            let _ = tpl.add_partition_offset(journal, partition, Offset::End);
            paused = consumer.pause(&tpl).is_ok();
        }
        if !owns {
            paused = false;
        }
        if owns != shared.owned.load(Ordering::SeqCst) {
            if owns {
                info!(
                    journal,
                    partition, "this instance owns the journal partition"
                );
            } else {
                warn!(
                    journal,
                    partition, "this instance no longer owns the journal partition; standing by"
                );
            }
            shared.set(owns);
        }
    }
}

/// Hands the partition over to a standby as this owner stops, instead of leaving the others
/// to wait for its session to expire: a static member sends no LeaveGroup (KIP-345), but a
/// member that rejoins with another subscription (here `elsewhere`, a topic the processor
/// may read) makes the coordinator rebalance at once, and the journal partition goes to a
/// member that still subscribes to the journal.
///
/// Only when another member is there to take it: alone, the owner keeps the partition, so
/// that it takes its place back at once when it starts again. And the subscription to the
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
            elapsed_ms = started.elapsed().as_millis() as u64,
            "handed the journal partition over"
        );
    } else {
        warn!(
            group = lease.group,
            "the journal partition was not handed over in time; the standbys take it after the session timeout"
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

/// Whether the group is stable with the journal partition assigned to a member whose client
/// id passes `whose`.
fn journal_held(
    consumer: &BaseConsumer,
    lease: &LeaseIds<'_>,
    whose: impl Fn(&str) -> bool,
) -> bool {
    describe(consumer, lease.group).is_some_and(|(state, members)| {
        state == "Stable"
            && members.iter().any(|m| {
                whose(&m.client_id) && assigned(&m.assignment, lease.journal, lease.partition)
            })
    })
}

/// The owners' group's coordinates, and this instance's client id in it.
struct LeaseIds<'a> {
    group: &'a str,
    journal: &'a str,
    partition: i32,
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
    use super::assigned;

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
}
