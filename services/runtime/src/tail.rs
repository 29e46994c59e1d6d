//! Reading one partition in order (read_committed, assigned by hand, no group), robust to a
//! consumer that stops fetching.
//!
//! librdkafka has an open bug where a consumer with a manual assignment occasionally fetches
//! nothing more after a broker restart, forever, while the client reports no error
//! (librdkafka#5153, rust-rdkafka#597). The chaos suite's journal reader hit it after a broker
//! restart: ksched had journaled 6 900 records, the reader had stopped at 617. Every reader of
//! the journal that follows it (recovery, the standby, `audit`, `journal tail --follow`) reads
//! through a [`PartitionTail`], which notices the stall and replaces its consumer.
//!
//! A stall is: nothing delivered for [`PartitionTail::stall_after`] while the partition's last
//! stable offset (what read_committed may read up to) is more than one offset past the next one
//! to read. One offset is allowed for a transaction marker, which is never delivered. A gap
//! made only of an aborted transaction also looks like a stall; replacing the consumer then
//! costs one reconnect per `stall_after` and reads nothing new, which is harmless.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tracing::{debug, warn};

use crate::error::{Result, kafka};

/// How long a tail waits, with records committed past its position, before it replaces its
/// consumer.
pub const STALL_AFTER: Duration = Duration::from_secs(10);

/// An in-order, read_committed reader of one partition that replaces its consumer when the
/// consumer stops fetching (see the module docs).
pub struct PartitionTail {
    client: ClientConfig,
    topic: String,
    partition: i32,
    next: i64,
    consumer: BaseConsumer,
    quiet_since: Instant,
    stall_after: Duration,
    replaced: u64,
}

impl std::fmt::Debug for PartitionTail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionTail")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("next", &self.next)
            .field("replaced", &self.replaced)
            .finish_non_exhaustive()
    }
}

impl PartitionTail {
    /// A tail of `topic`/`partition` from offset `from`. `client` carries the connection
    /// settings (and a `group.id`, which librdkafka wants even though no group is joined);
    /// the tail sets read_committed and turns auto-commit off.
    ///
    /// It also asks librdkafka to fetch again 10 ms after its local queue was over its
    /// bounds (`fetch.queue.backoff.ms`, 1 s by default). A replay reads faster than one fetch
    /// a second can feed: with the default, every second or so the queue ran dry and the
    /// replay stood idle until the next fetch.
    pub fn new(client: &ClientConfig, topic: &str, partition: i32, from: i64) -> Result<Self> {
        let mut client = client.clone();
        client
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.queue.backoff.ms", "10");
        let consumer = assign(&client, topic, partition, from)?;
        Ok(PartitionTail {
            client,
            topic: topic.to_owned(),
            partition,
            next: from,
            consumer,
            quiet_since: Instant::now(),
            stall_after: STALL_AFTER,
            replaced: 0,
        })
    }

    /// Replaces the consumer after `stall_after` without a record (default [`STALL_AFTER`]).
    pub fn stall_after(mut self, stall_after: Duration) -> Self {
        self.stall_after = stall_after;
        self
    }

    /// The next record, or `None` when none came within `timeout`. Transport errors (the
    /// broker is away) are not errors here: librdkafka reconnects, and the tail waits.
    pub fn poll(&mut self, timeout: Duration) -> Result<Option<OwnedMessage>> {
        match self.consumer.poll(timeout) {
            Some(Ok(m)) => {
                self.next = m.offset() + 1;
                self.quiet_since = Instant::now();
                Ok(Some(m.detach()))
            }
            Some(Err(KafkaError::PartitionEOF(_))) => Ok(None),
            Some(Err(e)) if passing(&e) => {
                debug!(topic = %self.topic, partition = self.partition, error = %e, "tail: waiting for the broker");
                Ok(None)
            }
            Some(Err(e)) => Err(kafka(format!("reading {}/{}", self.topic, self.partition))(
                e,
            )),
            None => {
                self.catch_position();
                if self.quiet_since.elapsed() >= self.stall_after {
                    self.check_stall()?;
                }
                Ok(None)
            }
        }
    }

    /// The next offset this tail reads: one past the last record delivered, or past the
    /// transaction markers and aborted records the consumer skipped.
    pub fn next_offset(&self) -> i64 {
        self.next
    }

    /// The partition this tail reads.
    pub fn partition(&self) -> i32 {
        self.partition
    }

    /// How many times the consumer was replaced because it stalled.
    pub fn replaced(&self) -> u64 {
        self.replaced
    }

    /// The consumer's own position moves past what it skips (markers, aborted records).
    fn catch_position(&mut self) {
        let position = self.consumer.position().ok().and_then(|p| {
            p.find_partition(&self.topic, self.partition)
                .map(|e| e.offset())
        });
        if let Some(Offset::Offset(p)) = position
            && p > self.next
        {
            self.next = p;
        }
    }

    /// The partition's last stable offset: what read_committed readers may read up to (a
    /// read_committed consumer's high watermark).
    pub fn stable_end(&self) -> Result<i64> {
        self.consumer
            .fetch_watermarks(&self.topic, self.partition, Duration::from_secs(5))
            .map(|(_, stable)| stable)
            .map_err(kafka(format!(
                "reading the offsets of {}/{}",
                self.topic, self.partition
            )))
    }

    fn check_stall(&mut self) -> Result<()> {
        self.quiet_since = Instant::now();
        let stable = match self.stable_end() {
            Ok(stable) => stable,
            Err(e) => {
                debug!(topic = %self.topic, partition = self.partition, error = %e, "tail: cannot read the last stable offset yet");
                return Ok(());
            }
        };
        if stable <= self.next + 1 {
            return Ok(());
        }
        warn!(
            topic = %self.topic,
            partition = self.partition,
            next = self.next,
            stable,
            quiet_ms = self.stall_after.as_millis() as u64,
            "nothing fetched while records are committed past this reader's position; replacing its consumer (librdkafka#5153)"
        );
        let fresh = assign(&self.client, &self.topic, self.partition, self.next)?;
        let stalled = std::mem::replace(&mut self.consumer, fresh);
        self.replaced += 1;
        // Closing a consumer waits for its broker threads, and a stalled one has been seen
        // to wait for ever: it is closed on a thread of its own, so the reader never waits.
        let mut all = TopicPartitionList::new();
        let _ = all.add_partition(&self.topic, self.partition);
        let _ = stalled.resume(&all);
        let closing = std::thread::Builder::new()
            .name("ksched-tail-close".into())
            .spawn(move || drop(stalled));
        if let Err(e) = closing {
            warn!(error = %e, "cannot start a thread to close the stalled consumer; it was closed here");
        }
        Ok(())
    }

    /// The consumer, for tests that make it stall on purpose.
    #[doc(hidden)]
    pub fn consumer(&self) -> &BaseConsumer {
        &self.consumer
    }
}

fn assign(client: &ClientConfig, topic: &str, partition: i32, from: i64) -> Result<BaseConsumer> {
    let consumer: BaseConsumer = client
        .create()
        .map_err(kafka(format!("creating a reader of {topic}/{partition}")))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(from))
        .map_err(kafka(format!("assigning {topic}/{partition}")))?;
    consumer
        .assign(&tpl)
        .map_err(kafka(format!("assigning {topic}/{partition}")))?;
    Ok(consumer)
}

/// Errors a reader waits out: the broker or the network is away for a while.
fn passing(e: &KafkaError) -> bool {
    use RDKafkaErrorCode::*;
    let code = match e {
        KafkaError::MessageConsumption(code) | KafkaError::Global(code) => *code,
        _ => return false,
    };
    matches!(
        code,
        BrokerTransportFailure
            | AllBrokersDown
            | Resolve
            | OperationTimedOut
            | RequestTimedOut
            | NotLeaderForPartition
            | LeaderNotAvailable
            | UnknownTopicOrPartition
            | NetworkException
            | NotCoordinator
            | CoordinatorNotAvailable
    )
}
