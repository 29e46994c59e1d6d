//! Reading the journal and folding it into a projection: what recovery, `audit rebuild`,
//! `audit at` and `audit verify` share.

use std::time::Duration;

use ksched_core::events::JournalEntry;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;

use crate::engine::Engine;
use crate::error::{Error, Result, kafka};
use crate::tail::PartitionTail;

/// One journal record.
#[derive(Debug, Clone)]
pub struct JournalRecord {
    pub partition: i32,
    pub offset: i64,
    /// The record value as stored (single-object encoded).
    pub raw: Vec<u8>,
    pub entry: JournalEntry,
}

/// Whether to keep reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flow {
    Continue,
    Stop,
}

/// The group a journal reader names when its caller's client names none: the auditors'
/// tools' (docs/security.md). Readers are assigned by hand: they join no group and commit
/// nothing, but librdkafka still looks the group's coordinator up, which needs `DESCRIBE`
/// on it.
pub const READER_GROUP: &str = "ksched-journal-reader";

/// `client` for a journal reader: its own `group.id` if it has one (the processor's readers
/// name the processor's group, which its principal may read: [`reader_client`]), else
/// [`READER_GROUP`].
pub(crate) fn with_reader_group(client: &ClientConfig) -> ClientConfig {
    let mut client = client.clone();
    if client.get("group.id").is_none() {
        client.set("group.id", READER_GROUP);
    }
    client
}

/// The client the processor's own journal readers use (its catch-up, its positions read-back,
/// a standby's tail): the processor's group, which the processor's principal may read
/// whatever else the ACLs grant (deploy/ksched-acls.py). `purpose` ends the client id.
pub fn reader_client(settings: &crate::settings::Settings, purpose: &str) -> ClientConfig {
    let mut client = crate::topics::client_config(settings);
    client
        .set(
            "client.id",
            format!("{}-{purpose}", settings.kafka.client_id),
        )
        .set("group.id", &settings.processor.group_id);
    client
}

/// The (low, high) watermarks of a journal partition.
pub fn journal_watermarks(
    client: &ClientConfig,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64)> {
    let consumer: BaseConsumer = with_reader_group(client)
        .create()
        .map_err(kafka("creating a journal reader"))?;
    consumer
        .fetch_watermarks(topic, partition, Duration::from_secs(30))
        .map_err(kafka(format!("reading the offsets of {topic}/{partition}")))
}

/// Records the reading thread hands over at once, at most.
const CHUNK_RECORDS: usize = 512;
/// Bytes of record values the reading thread hands over at once, at most (one record more).
const CHUNK_BYTES: usize = 4 << 20;
/// Chunks read and decoded ahead of the caller, at most: with [`CHUNK_BYTES`], a bound on
/// the memory a fast reader can fill while the caller folds.
const CHUNKS_AHEAD: usize = 4;

/// Reads journal partition `partition` of `topic` from offset `from` to the end it has when
/// called (read_committed), calling `f` for each entry in order. Stops early when `f` says so.
/// Returns the journal's (low, high) watermarks at the start.
///
/// A thread of its own polls the journal and decodes the entries, a few chunks ahead of `f`
/// (replays spend a fifth of their time decoding); `f` runs on the calling thread, in order,
/// and only borrows each record: the chunks go back to the reading thread, which frees them
/// (memory freed by the thread that allocated it is freed cheaply; freeing the records on
/// the calling thread was 7 % of a replay's folding thread) and refills them.
pub fn read_journal(
    client: &ClientConfig,
    topic: &str,
    partition: i32,
    from: i64,
    mut f: impl FnMut(&JournalRecord) -> Result<Flow>,
) -> Result<(i64, i64)> {
    // read_committed: the high end is the last stable offset, past which nothing is read.
    let (low, high) = journal_watermarks(
        client.clone().set("isolation.level", "read_committed"),
        topic,
        partition,
    )?;
    let start = from.max(low);
    if start >= high {
        return Ok((low, high));
    }
    let mut reader = with_reader_group(client);
    reader
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "10485760");
    std::thread::scope(|s| -> Result<()> {
        let (chunks, received) = std::sync::mpsc::sync_channel(CHUNKS_AHEAD);
        let (spent, returned) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("ksched-journal-read".into())
            .spawn_scoped(s, || {
                let chunks = Chunks {
                    ready: chunks,
                    returned,
                };
                if let Err(e) = read_chunks(&reader, topic, partition, start, high, &chunks) {
                    // The caller may have stopped already; then nobody wants the error.
                    let _ = chunks.ready.send(Err(e));
                }
            })
            .map_err(crate::error::io("starting the journal reading thread"))?;
        // Ends when the reading thread is done (it drops its sender); returning early drops
        // the receiver, and the reading thread stops at its next hand-over.
        for chunk in received {
            let chunk = chunk?;
            for rec in &chunk {
                if f(rec)? == Flow::Stop {
                    return Ok(());
                }
            }
            // Gone only if the reading thread is done.
            let _ = spent.send(chunk);
        }
        Ok(())
    })?;
    Ok((low, high))
}

/// The reading thread's ends of its channels: chunks to the caller, and the chunks the
/// caller is done with, back.
struct Chunks {
    ready: std::sync::mpsc::SyncSender<Result<Vec<JournalRecord>>>,
    returned: std::sync::mpsc::Receiver<Vec<JournalRecord>>,
}

impl Chunks {
    /// An empty chunk: one the caller gave back (its records freed here), or a new one.
    fn empty(&self) -> Vec<JournalRecord> {
        match self.returned.try_recv() {
            Ok(mut chunk) => {
                chunk.clear();
                chunk
            }
            Err(_) => Vec::with_capacity(CHUNK_RECORDS),
        }
    }
}

/// The reading thread: polls `partition` from `start` up to `high` (exclusive), decodes each
/// entry and hands them over in chunks, until done or until the receiver is gone.
fn read_chunks(
    reader: &ClientConfig,
    topic: &str,
    partition: i32,
    start: i64,
    high: i64,
    chunks: &Chunks,
) -> Result<()> {
    let mut tail = PartitionTail::new(reader, topic, partition, start)?;
    let mut chunk = chunks.empty();
    let mut bytes = 0;
    loop {
        // Short polls: at the end, only a transaction marker may be left, never delivered;
        // the tail's position passes it within a fetch, and a long poll would only wait.
        let (done, idle) = match tail.poll(Duration::from_millis(50))? {
            Some(m) if m.offset() >= high => (true, false),
            Some(m) => {
                let raw = m.payload().unwrap_or_default().to_vec();
                let entry: JournalEntry =
                    ksched_codec::decode(&raw).map_err(|source| Error::Journal {
                        topic: topic.to_owned(),
                        partition,
                        offset: m.offset(),
                        source,
                    })?;
                bytes += raw.len();
                chunk.push(JournalRecord {
                    partition,
                    offset: m.offset(),
                    raw,
                    entry,
                });
                (m.offset() >= high - 1, false)
            }
            // The last offset may be a transaction marker, never delivered.
            None => (tail.next_offset() >= high - 1, true),
        };
        // A chunk goes when full, when the journal has nothing more at hand, or at the end.
        let full = chunk.len() >= CHUNK_RECORDS || bytes >= CHUNK_BYTES;
        if !chunk.is_empty() && (done || idle || full) {
            bytes = 0;
            let ready = std::mem::replace(&mut chunk, chunks.empty());
            if chunks.ready.send(Ok(ready)).is_err() {
                return Ok(());
            }
        }
        if done {
            return Ok(());
        }
    }
}

/// Folds journal entries into a projection through an [`Engine`], checkpointing as it goes:
/// the processor's recovery and the audit tools' rebuilds.
#[derive(Debug)]
pub struct Replayer<'e> {
    pub engine: &'e mut Engine,
    pub applied: u64,
    pub events: u64,
    pub last_offset: Option<i64>,
}

impl<'e> Replayer<'e> {
    pub fn new(engine: &'e mut Engine) -> Replayer<'e> {
        Replayer {
            engine,
            applied: 0,
            events: 0,
            last_offset: None,
        }
    }

    /// Folds one entry (at journal `offset`), checkpointing when one is due.
    pub fn apply(&mut self, offset: i64, entry: &JournalEntry) -> Result<()> {
        self.engine.fold(entry)?;
        self.applied += 1;
        self.events += entry.events.len() as u64;
        self.last_offset = Some(offset);
        if self.engine.checkpoint_due() {
            // Written while the next entries fold.
            self.engine.checkpoint_behind(self.last_offset)?;
        }
        Ok(())
    }

    /// Checkpoints what was folded, with the last offset folded as the watermark, and waits
    /// until it is written.
    pub fn persist(&mut self) -> Result<()> {
        self.engine.checkpoint(self.last_offset)?;
        Ok(())
    }
}
