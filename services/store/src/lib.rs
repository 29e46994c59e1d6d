//! RocksDB projections of the journal (DESIGN "State").
//!
//! RocksDB is a cache of the journal: every write is one `WriteBatch` holding the changed
//! records and the last journal offset they reflect (the watermark), so after a crash the
//! processor reads the journal from the watermark + 1 and is whole again, whatever instant
//! the crash hit. Values are postcard-encoded; a format version in `meta` guards the encoding,
//! and a store written by an incompatible version is rebuilt from the journal, not read.
//!
//! Keys carry the journal partition they belong to (a 2-byte big-endian prefix), so more
//! journal partitions, each owned by one processor, can share a store layout later without a
//! migration (DESIGN invariant 7).
//!
//! Column families:
//! `meta` (watermark, clock, config, counters), `jobs` (job_id -> Job), `active` (job_id of
//! every non-terminal job), `workers`, `breakers`, `sagas`, `idempotency` ((tenant, key) ->
//! owner), `idempotency_by_time` (seen_at | tenant | key, for pruning), `dlq` (at | seq ->
//! DeadLetter), `delays` (due time | job id of every DELAYED job: the jobs themselves are
//! not in `active`, and the processor reads these keys as it needs them, not at start),
//! `rate_buckets` ((tenant, key, rate) -> the token bucket of a rate-limited key, while not
//! full), `fair_shares` ((pool, priority) -> its fair share between tenants), `debounces`,
//! `lanes` ((pool, lane) | rank | time queued | job id of every queued job: its queue
//! order), `waits` (kind | time it counts from | job id of every queued job's timers),
//! `dependents` ((tenant, dependency) | job id of every BLOCKED job, under each dependency it
//! still waits for), `settling` (ended jobs whose dependents are being told).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ksched_core::events::Reconfigure;
use ksched_core::records::{DeadLetter, Millis};
use ksched_core::rules::Rules;
use ksched_core::state::{
    ActiveConfig, Batch, BatchKey, Breaker, Bucket, BucketKey, ColdStore, Debounce, DebounceKey,
    DependentKey, Dirty, HistoryItem, HistoryLines, IdempotencyEntry, Job, Lane, PoolShare,
    QueueKey, QueuedCounts, Saga, Settling, ShareKey, State, TimerAt, TimerKind, Worker,
    dependent_keys_of, is_resident, lane_keys_of, wait_keys_of,
};
use rocksdb::{
    ColumnFamily, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options, WriteBatch,
};
use serde::{Serialize, de::DeserializeOwned};
use thiserror::Error;

/// How far a scan of jobs may go ([`Store::scan_jobs`]).
#[derive(Debug, Clone, Copy)]
pub struct ScanBound {
    /// Most jobs returned.
    pub jobs: usize,
    /// Most jobs looked at.
    pub scanned: usize,
    /// Most bytes of jobs returned (their text, roughly).
    pub bytes: usize,
}

impl ScanBound {
    /// Everything: for reads that must see every job (and run where that is affordable).
    pub const ALL: ScanBound = ScanBound {
        jobs: usize::MAX,
        scanned: usize::MAX,
        bytes: usize::MAX,
    };
}

/// Roughly what a job takes in memory: its record, and the text of its request.
fn weight(job: &Job) -> usize {
    let r = &job.request;
    let map =
        |m: &BTreeMap<String, String>| m.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    std::mem::size_of::<Job>()
        + r.job_id.len()
        + r.tenant_id.len()
        + map(&r.labels)
        + map(&r.env)
        + map(&job.constraints.labels)
        + job.last_error.as_ref().map_or(0, String::len)
}

/// Jobs a bounded scan found ([`Store::scan_jobs`]).
#[derive(Debug, Clone, Default)]
pub struct Scanned {
    /// In job_id order.
    pub jobs: Vec<(String, Job)>,
    /// The last id looked at, when the scan stopped at its bound before the end: a caller
    /// continues after it.
    pub stopped_after: Option<String>,
}

/// Bumped whenever a stored value's encoding changes. A store of another version is moved
/// aside and rebuilt from the journal ([`Store::open_or_rebuild`]).
/// 2: breakers track their probes by job id; watermark and liveness floor in `meta`; job
/// histories (`history`) and payloads (`payloads`) beside the jobs, not in them.
/// 3: a job's request keeps the submission's `traceparent`.
/// 4: a job names the job whose payload it runs (`payload_of`, redrive).
/// 5: a job's history lines are stored by run (consecutive lines written together, one
/// value: [`HistoryLines`]), not one value per line.
/// 6: sagas keyed by tenant and workflow, counting failed compensations; saga steps keep
/// their topic.
/// 7: DELAYED jobs: `delays` by due time, not in `active`; a job keeps when it waits until
/// and when it was released; schedules (`schedules`, a family a store of 7 without them
/// gains empty when it opens).
/// 8: a job keeps its concurrency key and limit, and when its placement timeout last
/// started again.
/// 9: a job's concurrency key carries its rate limit; rate limit buckets (`rate_buckets`).
/// 10: each pool's fair share between tenants at each priority (`fair_shares`).
/// 11: open debounce windows (`debounces`).
/// 12: a job keeps the priorities aging gave it while queued.
/// 13: queued jobs by (pool, lane, queue key) (`lanes`), so that a lane's jobs past the
/// first ones wait in storage only.
/// 14: queued jobs' timers by kind and the time each counts from (`waits`), so that their
/// timers past the first ones wait in storage only.
/// 15: the unfinished jobs that are not queued (`resident`), each lane's count of jobs
/// (`lane_counts`) and the queued jobs' other counts (meta `queued_counts`), so that a start
/// reads no queued job.
/// 16: BLOCKED jobs (SPEC §11): a job keeps how its dependencies stand and whether it is
/// waited for; blocked jobs by what they wait for (`dependents`), and the ended jobs whose
/// dependents are being told (`settling`).
/// 17: batches (SPEC §11): their counts and states (`batches`); a batch's unfinished
/// members are indexed in `dependents` under the batch.
pub const FORMAT_VERSION: u32 = 17;

/// Most idempotency keys one write deletes when their retention passed; the rest follow in
/// the next writes, so a prune never becomes one huge batch.
pub const PRUNE_CHUNK: usize = 10_000;

const CF_META: &str = "meta";
const CF_JOBS: &str = "jobs";
const CF_ACTIVE: &str = "active";
const CF_WORKERS: &str = "workers";
const CF_BREAKERS: &str = "breakers";
const CF_SAGAS: &str = "sagas";
const CF_IDEMPOTENCY: &str = "idempotency";
const CF_IDEMPOTENCY_BY_TIME: &str = "idempotency_by_time";
const CF_DLQ: &str = "dlq";
const CF_HISTORY: &str = "history";
const CF_PAYLOADS: &str = "payloads";
const CF_DELAYS: &str = "delays";
const CF_SCHEDULES: &str = "schedules";
const CF_BUCKETS: &str = "rate_buckets";
const CF_SHARES: &str = "fair_shares";
const CF_DEBOUNCES: &str = "debounces";
const CF_LANES: &str = "lanes";
const CF_WAITS: &str = "waits";
/// The unfinished jobs a start reads: those not queued ([`ksched_core::state::is_resident`]).
const CF_RESIDENT: &str = "resident";
/// Each lane's count of jobs, keyed as the lane's keys in `lanes` begin.
const CF_LANE_COUNTS: &str = "lane_counts";
/// BLOCKED jobs by what they wait for: (tenant, dependency) length-prefixed, then the
/// dependent's id.
const CF_DEPENDENTS: &str = "dependents";
/// Ended jobs whose dependents are being told (job id -> tenant and how it ended).
const CF_SETTLING: &str = "settling";
/// Batches open or within their retention: (tenant, batch id) -> counts and state.
const CF_BATCHES: &str = "batches";
/// Every column family, in a fixed order.
pub const CFS: &[&str] = &[
    CF_META,
    CF_JOBS,
    CF_ACTIVE,
    CF_WORKERS,
    CF_BREAKERS,
    CF_SAGAS,
    CF_IDEMPOTENCY,
    CF_IDEMPOTENCY_BY_TIME,
    CF_DLQ,
    CF_HISTORY,
    CF_PAYLOADS,
    CF_DELAYS,
    CF_SCHEDULES,
    CF_BUCKETS,
    CF_SHARES,
    CF_DEBOUNCES,
    CF_LANES,
    CF_WAITS,
    CF_RESIDENT,
    CF_LANE_COUNTS,
    CF_DEPENDENTS,
    CF_SETTLING,
    CF_BATCHES,
];

const META_FORMAT: &[u8] = b"format";
const META_WATERMARK: &[u8] = b"watermark";
const META_CLOCK: &[u8] = b"clock";
const META_ENTRIES: &[u8] = b"entries";
const META_LAST_PRUNE: &[u8] = b"last_idempotency_prune";
const META_DLQ_COUNTS: &[u8] = b"dlq_by_reason";
const META_DLQ_SEQ: &[u8] = b"dlq_seq";
const META_CONFIG: &[u8] = b"config";
const META_JOB_COUNTS: &[u8] = b"jobs_by_state";
const META_TICK_WATERMARK: &[u8] = b"tick_watermark";
const META_LIVENESS_FLOOR: &[u8] = b"liveness_floor";
const META_QUEUED_COUNTS: &[u8] = b"queued_counts";
/// Idempotency keys first seen before this are still to be deleted (a prune in progress).
const META_PRUNE_BEFORE: &[u8] = b"prune_before";

#[derive(Debug, Error)]
pub enum Error {
    #[error("rocksdb at {path}: {source}")]
    Open {
        path: String,
        source: rocksdb::Error,
    },
    #[error("rocksdb: {0}")]
    Db(#[from] rocksdb::Error),
    #[error(
        "stored {what} does not decode ({detail}); the store is damaged or from another version: remove the data directory to rebuild it from the journal"
    )]
    Decode { what: String, detail: String },
    #[error(
        "store {path} has format version {found}, this ksched writes {FORMAT_VERSION}; remove the data directory to rebuild it from the journal"
    )]
    Format { path: String, found: u32 },
    #[error("moving the store {path} of another format aside: {source}")]
    MoveAside {
        path: String,
        source: std::io::Error,
    },
}

impl Error {
    /// The disk is full: writing may succeed again once space returns.
    pub fn is_out_of_space(&self) -> bool {
        let text = match self {
            Error::Open { source, .. } | Error::Db(source) => source.to_string(),
            _ => return false,
        };
        text.contains("No space left on device") || text.contains("ENOSPC")
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A projection's changes, waiting to be written ([`Store::prepare`]): the records read
/// from the state, encoded, and the history lines, encoded by [`Store::write`] (they are
/// already the batch's own, so the thread that writes encodes them, not the one that
/// prepares).
pub struct Prepared {
    batch: WriteBatch,
    history: HistoryLines,
}

impl Prepared {
    /// The writes in the batch so far (its history lines are added when it is written).
    pub fn records(&self) -> usize {
        self.batch.len()
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("records", &self.batch.len())
            .field("history_lines", &self.history.len())
            .field("history_runs", &self.history.run_count())
            .finish()
    }
}

/// The projection store for one journal partition.
#[derive(Clone)]
pub struct Store {
    db: Arc<DB>,
    partition: u16,
    /// Whether writes go through the write-ahead log (all but a rebuild's store:
    /// [`Store::open_for_rebuild`]).
    logged: bool,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.db.path())
            .field("partition", &self.partition)
            .finish()
    }
}

/// The most write-ahead log the store keeps before it flushes the memtables holding its
/// oldest part: what a start after a crash replays at most.
const MAX_TOTAL_WAL_BYTES: u64 = 128 * 1024 * 1024;

/// Block cache shared by the column families.
const BLOCK_CACHE_BYTES: usize = 128 * 1024 * 1024;

/// Column family options: lz4, and bloom filters, because most point lookups of a busy
/// scheduler miss (a new job id, a new idempotency key) and a miss without a filter reads
/// index and data blocks. The memtables get a whole-key bloom filter too (2 % of their
/// size): without it a miss searches the memtable's skip list, string comparisons that
/// were most of a replay's RocksDB lookups.
///
/// Column families only ever read in key order ([`SCANNED_ONLY`]) get no filters: a filter
/// answers point lookups only, and building one costs a hash per key written, at every
/// memtable insert, flush and compaction (the history takes a write per run of lines, about one per decision).
fn cf_options(cache: &rocksdb::Cache, point_lookups: bool) -> Options {
    let mut table = rocksdb::BlockBasedOptions::default();
    if point_lookups {
        table.set_bloom_filter(10.0, false);
    }
    table.set_block_cache(cache);
    table.set_cache_index_and_filter_blocks(true);
    let mut o = Options::default();
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    o.set_block_based_table_factory(&table);
    if point_lookups {
        o.set_memtable_prefix_bloom_ratio(0.02);
        o.set_memtable_whole_key_filtering(true);
    }
    o
}

/// Column families read only by iterating (a job's history, the active set loaded at start,
/// the dead letters and idempotency keys by time), never by key.
const SCANNED_ONLY: &[&str] = &[
    CF_ACTIVE,
    CF_IDEMPOTENCY_BY_TIME,
    CF_DLQ,
    CF_HISTORY,
    CF_DELAYS,
    CF_SCHEDULES,
    CF_BUCKETS,
    CF_SHARES,
    CF_DEBOUNCES,
    CF_LANES,
    CF_WAITS,
    CF_RESIDENT,
    CF_LANE_COUNTS,
];

/// A batch's key in `batches`: its tenant, a byte no id holds, its id.
fn batch_key(tenant: &str, batch_id: &str) -> Vec<u8> {
    let mut k = tenant.as_bytes().to_vec();
    k.push(1);
    k.extend_from_slice(batch_id.as_bytes());
    k
}

/// The first key after every key that starts with `prefix` (None: there is none).
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Descriptors for the families in `present` this build does not know.
fn unknown_families(present: &[String]) -> Vec<ColumnFamilyDescriptor> {
    (present.iter())
        .filter(|name| *name != "default" && !CFS.contains(&name.as_str()))
        .map(|name| ColumnFamilyDescriptor::new(name, Options::default()))
        .collect()
}

/// Every column family, sharing one block cache.
fn column_families() -> Vec<ColumnFamilyDescriptor> {
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES);
    CFS.iter()
        .map(|n| ColumnFamilyDescriptor::new(*n, cf_options(&cache, !SCANNED_ONLY.contains(n))))
        .collect()
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).unwrap_or_else(|e| unreachable!("postcard encodes plain data: {e}"))
}

/// [`encode`], written over `out` (whose allocation is kept).
fn encode_into<T: Serialize>(out: &mut Vec<u8>, v: &T) {
    out.clear();
    let buf = std::mem::take(out);
    *out = postcard::to_extend(v, buf)
        .unwrap_or_else(|e| unreachable!("postcard encodes plain data: {e}"));
}

fn decode<T: DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    postcard::from_bytes(bytes).map_err(|e| Error::Decode {
        what: what.to_owned(),
        detail: e.to_string(),
    })
}

impl Store {
    /// Opens (or creates) the store at `path` for journal partition `partition`.
    pub fn open(path: &Path, partition: u16) -> Result<Store> {
        Store::open_with(path, partition, true)
    }

    /// [`Store::open`] for a projection rebuilt from the journal into a new directory
    /// (`audit rebuild`, `audit at`, `audit verify`'s scratch store): its writes skip the
    /// write-ahead log, and its column families are flushed together (RocksDB's atomic
    /// flush), so what reaches the disk is always whole checkpoints, each with its
    /// watermark. A rebuild that dies leaves its last flushed checkpoint; one whose directory
    /// is kept calls [`Store::flush`] when it finishes. A live processor's store keeps the
    /// log.
    pub fn open_for_rebuild(path: &Path, partition: u16) -> Result<Store> {
        Store::open_with(path, partition, false)
    }

    fn open_with(path: &Path, partition: u16, logged: bool) -> Result<Store> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.increase_parallelism(2);
        opts.set_atomic_flush(!logged);
        // The log a start replays after a crash is bounded: past this size the families whose
        // memtables hold its oldest part are flushed (a family written rarely, such as
        // `meta`, would otherwise keep every log since its last flush: gigabytes, and
        // seconds to replay, under a backlog being built).
        opts.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES);
        // Families this build does not know (a store of a later format) are opened too, so
        // that its format is what refuses it.
        let present = DB::list_cf(&opts, path).unwrap_or_default();
        let families = column_families()
            .into_iter()
            .chain(unknown_families(&present));
        let db = DB::open_cf_descriptors(&opts, path, families).map_err(|source| Error::Open {
            path: path.display().to_string(),
            source,
        })?;
        let store = Store {
            db: Arc::new(db),
            partition,
            logged,
        };
        match store.get_meta::<u32>(META_FORMAT)? {
            None => store.db.put_cf(
                store.cf(CF_META),
                store.key(META_FORMAT),
                encode(&FORMAT_VERSION),
            )?,
            Some(FORMAT_VERSION) => {}
            Some(found) => {
                return Err(Error::Format {
                    path: path.display().to_string(),
                    found,
                });
            }
        }
        Ok(store)
    }

    /// Opens the store at `path`; a store written in another format is moved aside (to
    /// `<path>.format-<version>`) and a new one is opened, to be rebuilt from the journal.
    /// Returns the store and where the old one went, if it was moved.
    pub fn open_or_rebuild(
        path: &Path,
        partition: u16,
    ) -> Result<(Store, Option<std::path::PathBuf>)> {
        match Store::open(path, partition) {
            Err(Error::Format { found, .. }) => {
                let mut aside = path.as_os_str().to_owned();
                aside.push(format!(".format-{found}"));
                let aside = std::path::PathBuf::from(aside);
                if aside.exists() {
                    std::fs::remove_dir_all(&aside).map_err(|source| Error::MoveAside {
                        path: aside.display().to_string(),
                        source,
                    })?;
                }
                std::fs::rename(path, &aside).map_err(|source| Error::MoveAside {
                    path: path.display().to_string(),
                    source,
                })?;
                Ok((Store::open(path, partition)?, Some(aside)))
            }
            other => other.map(|s| (s, None)),
        }
    }

    /// Opens an existing store read-only (a stopped scheduler's directory or a checkpoint);
    /// never writes, and works beside a running writer.
    pub fn open_read_only(path: &Path, partition: u16) -> Result<Store> {
        let opts = Options::default();
        // Only the families the directory has: one of another format may lack some of ours
        // (its format is then refused below) or have others.
        let present = DB::list_cf(&opts, path).unwrap_or_default();
        let families = (column_families().into_iter())
            .filter(|d| present.is_empty() || present.iter().any(|p| p == d.name()))
            .chain(unknown_families(&present));
        let db =
            DB::open_cf_descriptors_read_only(&opts, path, families, false).map_err(|source| {
                Error::Open {
                    path: path.display().to_string(),
                    source,
                }
            })?;
        // (A RocksDB directory that is no store has no `meta` to read a format from.)
        if !present.is_empty() && !present.iter().any(|p| p == CF_META) {
            return Err(Error::Format {
                path: path.display().to_string(),
                found: 0,
            });
        }
        let store = Store {
            db: Arc::new(db),
            partition,
            logged: true,
        };
        match store.get_meta::<u32>(META_FORMAT)? {
            Some(FORMAT_VERSION) => Ok(store),
            found => Err(Error::Format {
                path: path.display().to_string(),
                found: found.unwrap_or(0),
            }),
        }
    }

    /// A consistent copy of the store at `path` (hard links where possible), for audits of a
    /// running scheduler.
    pub fn checkpoint(&self, path: &Path) -> Result<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(path)?;
        Ok(())
    }

    /// Every (key, value) of a column family in this partition, as stored, in key order
    /// (the partition prefix stripped from keys).
    pub fn raw(&self, cf: &str) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let prefix = self.partition.to_be_bytes();
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(cf), IteratorMode::From(&prefix, Direction::Forward))
        {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push((k[2..].to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    pub fn partition(&self) -> u16 {
        self.partition
    }

    /// The same database, for another journal partition (shard): keys of each shard carry
    /// its partition, so shards share one RocksDB and never see each other's records.
    pub fn for_partition(&self, partition: u16) -> Store {
        Store {
            db: self.db.clone(),
            partition,
            logged: self.logged,
        }
    }

    pub fn path(&self) -> &Path {
        self.db.path()
    }

    fn cf(&self, name: &str) -> &ColumnFamily {
        self.db
            .cf_handle(name)
            .unwrap_or_else(|| unreachable!("column family {name} is created at open"))
    }

    fn key(&self, k: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(k.len() + 2);
        self.key_into(&mut out, &[k]);
        out
    }

    /// [`Store::key`] of the concatenated `parts`, written over `out`.
    fn key_into(&self, out: &mut Vec<u8>, parts: &[&[u8]]) {
        out.clear();
        out.extend_from_slice(&self.partition.to_be_bytes());
        for p in parts {
            out.extend_from_slice(p);
        }
    }

    /// The `delays` key of a job waiting until `due`: the time order-preserving (the sign
    /// bit flipped, big-endian), then the id.
    fn delay_key(&self, due: Millis, id: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(2 + 8 + id.len());
        self.key_into(&mut k, &[&order_preserving(due), id.as_bytes()]);
        k
    }

    /// The delayed jobs' keys after `after` (from the first with None), in order, at most
    /// `limit`.
    pub fn delays_after(
        &self,
        after: Option<&(Millis, String)>,
        limit: usize,
    ) -> Result<Vec<(Millis, String)>> {
        let prefix = self.partition.to_be_bytes();
        let start = after.map(|(due, id)| self.delay_key(*due, id));
        let mut out = Vec::new();
        self.each_key_after(CF_DELAYS, &prefix, start.as_deref(), limit, |rest| {
            let Some(due) = rest.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
                return false;
            };
            out.push((from_order_preserving(due), utf8(rest[8..].to_vec())));
            true
        })?;
        Ok(out)
    }

    /// The prefix of a dependency's entries in `dependents`: its tenant and id,
    /// length-prefixed (no dependency's prefix begins another's).
    fn dependents_prefix(&self, tenant: &str, dependency: &str) -> Vec<u8> {
        let mut k = Vec::new();
        self.key_into(&mut k, &[&encode(&(tenant, dependency))]);
        k
    }

    /// A blocked job's entry in `dependents`: its dependency's prefix, then its id.
    fn dependent_key(&self, (tenant, dependency, id): &DependentKey) -> Vec<u8> {
        let mut k = self.dependents_prefix(tenant, dependency);
        k.extend_from_slice(id.as_bytes());
        k
    }

    /// The blocked jobs waiting for `dependency` of `tenant` after `after` (from the first
    /// with None), in id order, at most `limit`.
    pub fn dependents_after(
        &self,
        tenant: &str,
        dependency: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        let prefix = self.dependents_prefix(tenant, dependency);
        let start = after.map(|id| {
            let mut k = prefix.clone();
            k.extend_from_slice(id.as_bytes());
            k
        });
        let mut out = Vec::new();
        self.each_key_after(CF_DEPENDENTS, &prefix, start.as_deref(), limit, |rest| {
            out.push(utf8(rest.to_vec()));
            true
        })?;
        Ok(out)
    }

    /// The prefix of a lane's keys in `lanes`: the pool and the lane, length-prefixed (no
    /// lane's prefix begins another's).
    fn lane_prefix(&self, pool: &str, lane: &Lane) -> Vec<u8> {
        let mut k = Vec::new();
        self.key_into(&mut k, &[&encode(&(pool, lane))]);
        k
    }

    /// A job's key in `lanes`: its lane's prefix, then its place in the lane's order (rank,
    /// time order-preserving, id).
    fn lane_key(prefix: &[u8], key: &QueueKey) -> Vec<u8> {
        let mut k = Vec::with_capacity(prefix.len() + 9 + key.job_id.len());
        k.extend_from_slice(prefix);
        k.push(key.rank);
        k.extend_from_slice(&order_preserving(key.queued_at));
        k.extend_from_slice(key.job_id.as_bytes());
        k
    }

    /// The keys of lane `lane` of `pool` after `after` (from its first with None), in queue
    /// order, at most `limit`.
    pub fn lane_after(
        &self,
        pool: &str,
        lane: &Lane,
        after: Option<&QueueKey>,
        limit: usize,
    ) -> Result<Vec<QueueKey>> {
        let prefix = self.lane_prefix(pool, lane);
        let start = after.map(|a| Store::lane_key(&prefix, a));
        let mut out = Vec::new();
        self.each_key_after(CF_LANES, &prefix, start.as_deref(), limit, |rest| {
            let (Some(&rank), Some(at)) = (
                rest.first(),
                rest.get(1..9).and_then(|b| <[u8; 8]>::try_from(b).ok()),
            ) else {
                return false;
            };
            out.push(QueueKey {
                rank,
                queued_at: from_order_preserving(at),
                job_id: utf8(rest[9..].to_vec()),
            });
            true
        })?;
        Ok(out)
    }

    /// The prefix of the `waits` keys of queued timers of `kind`.
    fn waits_prefix(&self, kind: TimerKind) -> Vec<u8> {
        let code: u8 = match kind {
            TimerKind::Deadline => 0,
            TimerKind::PlacementTimeout => 1,
            TimerKind::Aging => 2,
            // Only these kinds are queued jobs' ([`ksched_core::state::WAIT_KINDS`]).
            _ => u8::MAX,
        };
        let mut k = Vec::with_capacity(3);
        self.key_into(&mut k, &[&[code]]);
        k
    }

    /// A queued timer's key in `waits`: its kind's prefix, the time it counts from
    /// (order-preserving), then the job id.
    fn wait_key(prefix: &[u8], key: &TimerAt) -> Vec<u8> {
        let mut k = Vec::with_capacity(prefix.len() + 8 + key.job_id.len());
        k.extend_from_slice(prefix);
        k.extend_from_slice(&order_preserving(key.at));
        k.extend_from_slice(key.job_id.as_bytes());
        k
    }

    /// The keys of queued timers of `kind` after `after` (from the first with None), in
    /// order, at most `limit`.
    pub fn waits_after(
        &self,
        kind: TimerKind,
        after: Option<&TimerAt>,
        limit: usize,
    ) -> Result<Vec<TimerAt>> {
        let prefix = self.waits_prefix(kind);
        let start = after.map(|a| Store::wait_key(&prefix, a));
        let mut out = Vec::new();
        self.each_key_after(CF_WAITS, &prefix, start.as_deref(), limit, |rest| {
            let Some(at) = rest.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok()) else {
                return false;
            };
            out.push(TimerAt {
                at: from_order_preserving(at),
                job_id: utf8(rest[8..].to_vec()),
            });
            true
        })?;
        Ok(out)
    }

    /// Calls `each` with what follows `prefix` in the keys of `cf` that begin with it, in
    /// order, after `after` (a whole key; from the first with None), until `limit` of them
    /// were taken (`each` returns whether it took one: a key it cannot read is passed over).
    /// The walk is bounded at the prefix's end: deleted entries past it are never read.
    fn each_key_after(
        &self,
        cf: &str,
        prefix: &[u8],
        after: Option<&[u8]>,
        limit: usize,
        mut each: impl FnMut(&[u8]) -> bool,
    ) -> Result<()> {
        let mut read = rocksdb::ReadOptions::default();
        if let Some(end) = successor(prefix) {
            read.set_iterate_upper_bound(end);
        }
        let start = after.unwrap_or(prefix);
        let iter = self.db.iterator_cf_opt(
            self.cf(cf),
            read,
            IteratorMode::From(start, Direction::Forward),
        );
        let mut taken = 0;
        for item in iter {
            let (k, _) = item?;
            if !k.starts_with(prefix) || taken >= limit {
                break;
            }
            if after.is_some_and(|a| *k == *a) {
                continue;
            }
            if each(&k[prefix.len()..]) {
                taken += 1;
            }
        }
        Ok(())
    }

    fn get<T: DeserializeOwned>(&self, cf: &str, k: &[u8]) -> Result<Option<T>> {
        match self.db.get_pinned_cf(self.cf(cf), self.key(k))? {
            Some(v) => decode(cf, &v).map(Some),
            None => Ok(None),
        }
    }

    fn get_meta<T: DeserializeOwned>(&self, k: &[u8]) -> Result<Option<T>> {
        self.get(CF_META, k)
    }

    /// Every value of a column family in this partition, in key order.
    fn scan<T: DeserializeOwned>(&self, cf: &str) -> Result<Vec<(Vec<u8>, T)>> {
        let prefix = self.partition.to_be_bytes();
        let mut out = Vec::new();
        let iter = self
            .db
            .iterator_cf(self.cf(cf), IteratorMode::From(&prefix, Direction::Forward));
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            out.push((k[2..].to_vec(), decode(cf, &v)?));
        }
        Ok(out)
    }

    /// The last journal offset the store reflects, if any.
    pub fn watermark(&self) -> Result<Option<i64>> {
        self.get_meta(META_WATERMARK)
    }

    /// The in-memory working set: config, workers, breakers, sagas mid-rollback, active jobs,
    /// counters. Terminal and delayed jobs, idempotency keys and idle sagas stay on disk and
    /// are loaded on demand (the delays window is filled by the first Tick that needs it).
    pub fn load_state(&self) -> Result<State> {
        let mut state = State::tracking_changes();
        state.delays = ksched_core::state::Delays::unknown(ksched_core::state::DEFAULT_WINDOW);
        state.backlog = ksched_core::state::Backlog::evicting();
        // Nothing known of the timer indexes before their counts are restored below: what
        // tells the rebuild there is nothing to compare with (a start writes no timer again;
        // the store holds them all).
        state.waits = ksched_core::state::Waits::unknown();
        // Blocked jobs are read by what they wait for as their dependencies end.
        state.dependents = ksched_core::state::Dependents::stored();
        for (_, (id, s)) in self.scan::<(String, Settling)>(CF_SETTLING)? {
            state.settling.insert(id, s);
        }
        for (_, (key, b)) in self.scan::<(BatchKey, Batch)>(CF_BATCHES)? {
            state.batches.insert(key, b);
        }
        state.index_batches();
        state.clock = self.get_meta(META_CLOCK)?.unwrap_or(0);
        state.entries = self.get_meta(META_ENTRIES)?.unwrap_or(0);
        state.last_idempotency_prune = self.get_meta(META_LAST_PRUNE)?.unwrap_or(0);
        state.dead_letters_by_reason = self.get_meta(META_DLQ_COUNTS)?.unwrap_or_default();
        state.jobs_by_state = self.get_meta(META_JOB_COUNTS)?.unwrap_or_default();
        state.watermark = self.get_meta(META_TICK_WATERMARK)?.unwrap_or(0);
        state.liveness_floor = self.get_meta(META_LIVENESS_FLOOR)?.unwrap_or(0);
        if let Some(raw) = self.get_meta::<Reconfigure>(META_CONFIG)? {
            let rules = Rules::from_json(&raw.rules_json).map_err(|e| Error::Decode {
                what: "config rules".into(),
                detail: e.to_string(),
            })?;
            state.config = Some(Arc::new(ActiveConfig { raw, rules }));
        }
        for (k, w) in self.scan::<Worker>(CF_WORKERS)? {
            state.workers.insert(utf8(k), w);
        }
        for (k, b) in self.scan::<Breaker>(CF_BREAKERS)? {
            state.breakers.insert(utf8(k), b);
        }
        for (k, s) in self.scan::<ksched_core::state::Schedule>(CF_SCHEDULES)? {
            state.schedules.insert(utf8(k), s);
        }
        for (_, (k, bucket)) in self.scan::<(BucketKey, Bucket)>(CF_BUCKETS)? {
            state.buckets.insert(k, bucket);
        }
        for (_, (k, share)) in self.scan::<(ShareKey, PoolShare)>(CF_SHARES)? {
            state.shares.insert(k, share);
        }
        for (_, (k, window)) in self.scan::<(DebounceKey, Debounce)>(CF_DEBOUNCES)? {
            state.debounces.insert(k, window);
        }
        for (k, s) in self.scan::<Saga>(CF_SAGAS)? {
            if s.rolling_back() {
                state.sagas.insert(utf8(k), s);
            }
        }
        // The unfinished jobs that are not queued stream into the indexes; the queued ones
        // are their lanes' counts until the first decision reads each lane's first keys and
        // records back: a start reads no backlog.
        let resident = self.scan::<()>(CF_RESIDENT)?;
        let records = resident.into_iter().filter_map(|(k, ())| {
            let id = utf8(k);
            match self.job(&id) {
                Ok(Some(job)) if is_resident(&job) => Some(Ok((id, job))),
                // (A marker a fault left behind names a job its lanes count: not read twice.)
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            }
        });
        state.rebuild_indexes_with(records)?;
        let lanes = self.scan::<(String, Lane, u64)>(CF_LANE_COUNTS)?;
        let counts: QueuedCounts = self.get_meta(META_QUEUED_COUNTS)?.unwrap_or_default();
        state.restore_queued(lanes.into_iter().map(|(_, lane)| lane), &counts);
        Ok(state)
    }

    pub fn job(&self, id: &str) -> Result<Option<Job>> {
        self.get(CF_JOBS, id.as_bytes())
    }

    /// The rules in force as of the last checkpoint, if the shard was ever configured.
    pub fn rules(&self) -> Result<Option<Rules>> {
        let Some(raw) = self.get_meta::<Reconfigure>(META_CONFIG)? else {
            return Ok(None);
        };
        Rules::from_json(&raw.rules_json)
            .map(Some)
            .map_err(|e| Error::Decode {
                what: "config rules".into(),
                detail: e.to_string(),
            })
    }

    /// Every schedule, by key (`<tenant>:<schedule id>`), in key order.
    pub fn schedules(&self) -> Result<Vec<(String, ksched_core::state::Schedule)>> {
        Ok(self
            .scan(CF_SCHEDULES)?
            .into_iter()
            .map(|(k, s)| (utf8(k), s))
            .collect())
    }

    /// Batch `batch_id` of `tenant`, while it is open or within its retention.
    pub fn batch(&self, tenant: &str, batch_id: &str) -> Result<Option<Batch>> {
        let got: Option<(BatchKey, Batch)> = self.get(CF_BATCHES, &batch_key(tenant, batch_id))?;
        Ok(got.map(|(_, b)| b))
    }

    /// The batches held (of `tenant`, or of all), in (tenant, id) order, those `keep`
    /// takes, at most `limit`: a tenant's are read from where its keys begin.
    pub fn batches(
        &self,
        tenant: Option<&str>,
        keep: impl Fn(&BatchKey) -> bool,
        limit: usize,
    ) -> Result<Vec<(BatchKey, Batch)>> {
        let prefix = match tenant {
            Some(t) => {
                let mut k = t.as_bytes().to_vec();
                k.push(1);
                self.key(&k)
            }
            None => self.partition.to_be_bytes().to_vec(),
        };
        let mut out = Vec::new();
        let iter = (self.db).iterator_cf(
            self.cf(CF_BATCHES),
            IteratorMode::From(&prefix, Direction::Forward),
        );
        for item in iter {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            if !k.starts_with(&prefix) {
                break;
            }
            let (key, b): (BatchKey, Batch) = decode(CF_BATCHES, &v)?;
            if keep(&key) {
                out.push((key, b));
            }
        }
        Ok(out)
    }

    pub fn schedule(&self, key: &str) -> Result<Option<ksched_core::state::Schedule>> {
        self.get(CF_SCHEDULES, key.as_bytes())
    }

    pub fn saga(&self, workflow_id: &str) -> Result<Option<Saga>> {
        self.get(CF_SAGAS, workflow_id.as_bytes())
    }

    pub fn idempotency(&self, tenant: &str, key: &str) -> Result<Option<IdempotencyEntry>> {
        self.get(CF_IDEMPOTENCY, &idem_key(tenant, key))
    }

    /// Writes every changed record and the watermark in one batch (not synced: [`Store::write`]).
    pub fn persist(&self, state: &State, mut dirty: Dirty, watermark: Option<i64>) -> Result<()> {
        let batch = self.prepare(state, &mut dirty)?;
        self.write(batch, watermark)
    }

    /// The batch that [`Store::persist`] writes, without the watermark: every record
    /// `dirty` names, as `state` holds it now, and `dirty`'s history lines (taken from it).
    /// It reads counters and pruning progress from the store, so a batch must be written
    /// before the next one is prepared.
    pub fn prepare(&self, state: &State, dirty: &mut Dirty) -> Result<Prepared> {
        let mut b = WriteBatch::default();
        // The batch copies what it is given, so one key and one value buffer serve every
        // record of the two busiest kinds (a replay's checkpoint holds tens of thousands).
        let mut key = Vec::new();
        let mut value = Vec::new();
        let rules = state.rules();
        let wait_prefixes: Vec<(TimerKind, Vec<u8>)> = (ksched_core::state::WAIT_KINDS.iter())
            .map(|k| (*k, self.waits_prefix(*k)))
            .collect();
        let wait_prefix = |kind: TimerKind| {
            (wait_prefixes.iter())
                .find(|(k, _)| *k == kind)
                .map_or(&[][..], |(_, p)| p.as_slice())
        };
        for id in &dirty.jobs {
            self.key_into(&mut key, &[id.as_bytes()]);
            match state.jobs.get(id) {
                Some(job) => {
                    encode_into(&mut value, job);
                    b.put_cf(self.cf(CF_JOBS), &key, &value);
                    // A queued job's entries in its lanes, written with its record.
                    for (pool, lane, k) in lane_keys_of(id, job) {
                        let prefix = self.lane_prefix(&pool, &lane);
                        b.put_cf(self.cf(CF_LANES), Store::lane_key(&prefix, &k), []);
                    }
                    // Its timers while queued, likewise.
                    for (kind, k) in wait_keys_of(id, job, rules) {
                        b.put_cf(
                            self.cf(CF_WAITS),
                            Store::wait_key(wait_prefix(kind), &k),
                            [],
                        );
                    }
                    if let Some(due) = job.delayed_until.filter(|_| job.state.is_parked()) {
                        b.put_cf(self.cf(CF_DELAYS), self.delay_key(due, id), encode(&()));
                    }
                    // A blocked job's entries under what it waits for, likewise.
                    for k in dependent_keys_of(id, job) {
                        b.put_cf(self.cf(CF_DEPENDENTS), self.dependent_key(&k), []);
                    }
                    if job.state.is_cold() {
                        // A job accepted since the last set was taken was in no earlier
                        // batch: it has no marker to delete (a replay's jobs mostly start
                        // and end between two checkpoints; a delete is a tombstone to
                        // write, flush and compact away).
                        if dirty.since_clock.is_none_or(|c| job.accepted_at <= c) {
                            b.delete_cf(self.cf(CF_ACTIVE), &key);
                        }
                    } else {
                        b.put_cf(self.cf(CF_ACTIVE), &key, encode(&()));
                    }
                    // What a start reads: not a queued job (its lanes count it). Its marker
                    // goes when it stops being one (`resident_left`, below), not with every
                    // write of a queued job.
                    if is_resident(job) {
                        b.put_cf(self.cf(CF_RESIDENT), &key, encode(&()));
                    }
                }
                None => {
                    b.delete_cf(self.cf(CF_ACTIVE), &key);
                    b.delete_cf(self.cf(CF_RESIDENT), &key);
                }
            }
        }
        // The entries queued jobs left in their lanes go, but those a job waits under again
        // and those of jobs no batch wrote before. (One lane's entries mostly come in a
        // row: its prefix is encoded once for them.)
        let mut prefix: Option<(&str, &Lane, Vec<u8>)> = None;
        for (pool, lane, k) in &dirty.lanes_removed {
            let job = state.jobs.get(&k.job_id);
            let unwritten =
                job.is_some_and(|j| dirty.since_clock.is_some_and(|c| j.accepted_at > c));
            if unwritten {
                continue;
            }
            let waits_again = job.filter(|j| j.queued_at.is_some()).is_some_and(|j| {
                lane_keys_of(&k.job_id, j)
                    .iter()
                    .any(|(p, l, q)| p == pool && l == lane && q == k)
            });
            if waits_again {
                continue;
            }
            if !prefix
                .as_ref()
                .is_some_and(|(p, l, _)| p == pool && *l == lane)
            {
                prefix = Some((pool, lane, self.lane_prefix(pool, lane)));
            }
            if let Some((_, _, bytes)) = &prefix {
                b.delete_cf(self.cf(CF_LANES), Store::lane_key(bytes, k));
            }
        }
        // Queued timers taken out go, but those a job has again and those of jobs no batch
        // wrote before.
        for (kind, k) in &dirty.waits_removed {
            let job = state.jobs.get(&k.job_id);
            let unwritten =
                job.is_some_and(|j| dirty.since_clock.is_some_and(|c| j.accepted_at > c));
            let again = job.is_some_and(|j| {
                (wait_keys_of(&k.job_id, j, rules).iter()).any(|(kd, w)| kd == kind && w == k)
            });
            if !unwritten && !again {
                b.delete_cf(self.cf(CF_WAITS), Store::wait_key(wait_prefix(*kind), k));
            }
        }
        for id in &dirty.resident_left {
            if !state.jobs.get(id).is_some_and(is_resident) {
                self.key_into(&mut key, &[id.as_bytes()]);
                b.delete_cf(self.cf(CF_RESIDENT), &key);
            }
        }
        // The counts of lanes that gained or lost jobs (a lane gone counts none).
        for (pool, lanes) in &dirty.lanes_counted {
            for lane in lanes {
                let len = (state.lanes.get(pool).and_then(|l| l.get(lane))).map_or(0, |k| k.len());
                let k = self.lane_prefix(pool, lane);
                if len == 0 {
                    b.delete_cf(self.cf(CF_LANE_COUNTS), k);
                } else {
                    b.put_cf(self.cf(CF_LANE_COUNTS), k, encode(&(pool, lane, len)));
                }
            }
        }
        for k in &dirty.dependents_removed {
            let again =
                (state.jobs.get(&k.2)).is_some_and(|j| dependent_keys_of(&k.2, j).contains(k));
            if !again {
                b.delete_cf(self.cf(CF_DEPENDENTS), self.dependent_key(k));
            }
        }
        for key in &dirty.batches {
            let k = self.key(&batch_key(&key.0, &key.1));
            match state.batches.get(key) {
                Some(x) => b.put_cf(self.cf(CF_BATCHES), k, encode(&(key, x))),
                None => b.delete_cf(self.cf(CF_BATCHES), k),
            }
        }
        for id in &dirty.settling {
            let k = self.key(id.as_bytes());
            match state.settling.get(id) {
                Some(x) => b.put_cf(self.cf(CF_SETTLING), k, encode(&(id, x))),
                None => b.delete_cf(self.cf(CF_SETTLING), k),
            }
        }
        for (due, id) in &dirty.delays_removed {
            let waits_again = state
                .jobs
                .get(id)
                .is_some_and(|j| j.state.is_parked() && j.delayed_until == Some(*due));
            if !waits_again {
                b.delete_cf(self.cf(CF_DELAYS), self.delay_key(*due, id));
            }
        }
        for id in &dirty.workers {
            match state.workers.get(id) {
                Some(w) => b.put_cf(self.cf(CF_WORKERS), self.key(id.as_bytes()), encode(w)),
                // Forgotten (retention passed).
                None => b.delete_cf(self.cf(CF_WORKERS), self.key(id.as_bytes())),
            }
        }
        for pool in &dirty.breakers {
            if let Some(x) = state.breakers.get(pool) {
                b.put_cf(self.cf(CF_BREAKERS), self.key(pool.as_bytes()), encode(x));
            }
        }
        for bk in &dirty.buckets {
            // Length-prefixed parts: no two buckets share a key, whatever bytes keys hold.
            let k = self.key(&encode(bk));
            match state.buckets.get(bk) {
                Some(x) => b.put_cf(self.cf(CF_BUCKETS), k, encode(&(bk, x))),
                None => b.delete_cf(self.cf(CF_BUCKETS), k),
            }
        }
        for sk in &dirty.shares {
            // Length-prefixed parts, as the buckets'.
            let k = self.key(&encode(sk));
            match state.shares.get(sk) {
                Some(x) => b.put_cf(self.cf(CF_SHARES), k, encode(&(sk, x))),
                None => b.delete_cf(self.cf(CF_SHARES), k),
            }
        }
        for dk in &dirty.debounces {
            // Length-prefixed parts, as the buckets'.
            let k = self.key(&encode(dk));
            match state.debounces.get(dk) {
                Some(x) => b.put_cf(self.cf(CF_DEBOUNCES), k, encode(&(dk, x))),
                None => b.delete_cf(self.cf(CF_DEBOUNCES), k),
            }
        }
        for wf in &dirty.sagas {
            if let Some(s) = state.sagas.get(wf) {
                b.put_cf(self.cf(CF_SAGAS), self.key(wf.as_bytes()), encode(s));
            }
        }
        for key in &dirty.schedules {
            match state.schedules.get(key) {
                Some(s) => b.put_cf(self.cf(CF_SCHEDULES), self.key(key.as_bytes()), encode(s)),
                None => b.delete_cf(self.cf(CF_SCHEDULES), self.key(key.as_bytes())),
            }
        }
        for (tenant, key) in &dirty.idempotency {
            if let Some(e) = state.idempotency.get(&(tenant.clone(), key.clone())) {
                let ik = idem_key(tenant, key);
                b.put_cf(self.cf(CF_IDEMPOTENCY), self.key(&ik), encode(e));
                let mut tk = e.seen_at.to_be_bytes().to_vec();
                tk.extend_from_slice(&ik);
                b.put_cf(self.cf(CF_IDEMPOTENCY_BY_TIME), self.key(&tk), encode(&()));
            }
        }
        let pending: Option<Millis> = self.get_meta(META_PRUNE_BEFORE)?;
        let prune_before = pending.max(dirty.idempotency_pruned_before);
        if let Some(before) = prune_before {
            let done = self.prune_idempotency(&mut b, before, state)?;
            if done {
                b.delete_cf(self.cf(CF_META), self.key(META_PRUNE_BEFORE));
            } else {
                b.put_cf(
                    self.cf(CF_META),
                    self.key(META_PRUNE_BEFORE),
                    encode(&before),
                );
            }
        }
        for (id, payload) in &dirty.payloads {
            b.put_cf(self.cf(CF_PAYLOADS), self.key(id.as_bytes()), payload);
        }
        if !dirty.dead_letters.is_empty() {
            let mut seq: u64 = self.get_meta(META_DLQ_SEQ)?.unwrap_or(0);
            for dl in &dirty.dead_letters {
                seq += 1;
                let mut k = dl.at.to_be_bytes().to_vec();
                k.extend_from_slice(&seq.to_be_bytes());
                b.put_cf(self.cf(CF_DLQ), self.key(&k), encode(dl));
            }
            b.put_cf(self.cf(CF_META), self.key(META_DLQ_SEQ), encode(&seq));
        }
        if dirty.config
            && let Some(c) = &state.config
        {
            b.put_cf(self.cf(CF_META), self.key(META_CONFIG), encode(&c.raw));
        }
        let meta = self.cf(CF_META);
        b.put_cf(meta, self.key(META_CLOCK), encode(&state.clock));
        b.put_cf(meta, self.key(META_ENTRIES), encode(&state.entries));
        b.put_cf(
            meta,
            self.key(META_LAST_PRUNE),
            encode(&state.last_idempotency_prune),
        );
        b.put_cf(
            meta,
            self.key(META_DLQ_COUNTS),
            encode(&state.dead_letters_by_reason),
        );
        b.put_cf(
            meta,
            self.key(META_JOB_COUNTS),
            encode(&state.jobs_by_state),
        );
        b.put_cf(
            meta,
            self.key(META_TICK_WATERMARK),
            encode(&state.watermark),
        );
        b.put_cf(
            meta,
            self.key(META_LIVENESS_FLOOR),
            encode(&state.liveness_floor),
        );
        b.put_cf(
            meta,
            self.key(META_QUEUED_COUNTS),
            encode(&state.queued_counts()),
        );
        Ok(Prepared {
            batch: b,
            history: std::mem::take(&mut dirty.history),
        })
    }

    /// Writes a prepared batch with `watermark` (the last journal offset it reflects), in one
    /// atomic write to the write-ahead log, which is not synced.
    ///
    /// The store is a cache of the journal: a write the operating system loses (a power cut,
    /// a kernel crash; a killed process loses nothing, the log is in the page cache) takes
    /// the watermark back with the records, atomically, and the next start applies the
    /// journal from that watermark on, as after a crash between a commit and its write
    /// (docs/architecture.md, "Exactly once"). A synced write waited for the disk once per
    /// batch, on the deciding thread.
    pub fn write(&self, batch: Prepared, watermark: Option<i64>) -> Result<()> {
        let Prepared {
            batch: mut b,
            history,
        } = batch;
        // In order: a run may replace an earlier one with the same first line (which held
        // only that line, the job's last then: `HistoryLines`).
        let mut key = Vec::new();
        let mut value = Vec::new();
        for (job_id, first, lines) in history.runs() {
            let first = first.to_be_bytes();
            self.key_into(&mut key, &history_key(job_id, &first));
            encode_into(&mut value, &lines);
            b.put_cf(self.cf(CF_HISTORY), &key, &value);
        }
        if let Some(w) = watermark {
            b.put_cf(self.cf(CF_META), self.key(META_WATERMARK), encode(&w));
        }
        if self.logged {
            self.db.write(b)?;
        } else {
            let mut unlogged = rocksdb::WriteOptions::default();
            unlogged.disable_wal(true);
            self.db.write_opt(b, &unlogged)?;
        }
        Ok(())
    }

    /// Deletes up to [`PRUNE_CHUNK`] idempotency keys first seen before `before`; true when
    /// none is left. A key renewed since (a later `seen_at`, in the store or in this very
    /// write) keeps its owner.
    fn prune_idempotency(&self, b: &mut WriteBatch, before: Millis, state: &State) -> Result<bool> {
        let start = self.key(&0i64.to_be_bytes());
        let cf = self.cf(CF_IDEMPOTENCY_BY_TIME);
        let iter = self
            .db
            .iterator_cf(cf, IteratorMode::From(&start, Direction::Forward));
        for (deleted, item) in iter.enumerate() {
            let (k, _) = item?;
            if !k.starts_with(&self.partition.to_be_bytes()) || k.len() < 10 {
                break;
            }
            let seen = i64::from_be_bytes(k[2..10].try_into().unwrap_or([0; 8]));
            if seen >= before {
                break;
            }
            if deleted >= PRUNE_CHUNK {
                return Ok(false);
            }
            let ik = &k[10..];
            let renewed_now = split_idem_key(ik)
                .and_then(|key| state.idempotency.get(&key))
                .is_some_and(|e| e.seen_at >= before);
            let current: Option<IdempotencyEntry> = self.get(CF_IDEMPOTENCY, ik)?;
            if !renewed_now && current.is_some_and(|c| c.seen_at < before) {
                b.delete_cf(self.cf(CF_IDEMPOTENCY), self.key(ik));
            }
            b.delete_cf(cf, &k);
        }
        Ok(true)
    }

    /// A job's history, in order (its lines are written beside the job, not in it, by run:
    /// a run's first line replaces the line with its number read before, if any).
    pub fn history(&self, job_id: &str) -> Result<Vec<HistoryItem>> {
        let (mut start, mut end) = (Vec::new(), Vec::new());
        self.key_into(&mut start, &history_key(job_id, &0u32.to_be_bytes()));
        self.key_into(&mut end, &history_key(job_id, &u32::MAX.to_be_bytes()));
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            self.cf(CF_HISTORY),
            IteratorMode::From(&start, Direction::Forward),
        ) {
            let (k, v) = item?;
            if k.as_ref() > end.as_slice() {
                break;
            }
            let first = k
                .len()
                .checked_sub(4)
                .and_then(|at| k[at..].try_into().ok())
                .map(u32::from_be_bytes)
                .ok_or_else(|| Error::Decode {
                    what: CF_HISTORY.to_owned(),
                    detail: "a key too short for a line number".to_owned(),
                })?;
            let lines: Vec<HistoryItem> = decode(CF_HISTORY, &v)?;
            out.truncate(first as usize);
            out.extend(lines);
        }
        Ok(out)
    }

    /// A job's payload, as it was submitted (None for a job without one).
    pub fn payload(&self, job_id: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .db
            .get_cf(self.cf(CF_PAYLOADS), self.key(job_id.as_bytes()))?)
    }

    /// Every stored job (for queries and audits), in job_id order.
    pub fn jobs(&self) -> Result<Vec<(String, Job)>> {
        Ok(self
            .scan::<Job>(CF_JOBS)?
            .into_iter()
            .map(|(k, j)| (utf8(k), j))
            .collect())
    }

    /// Every stored worker.
    /// Each pool's fair share between tenants at each priority, as last written.
    pub fn fair_shares(&self) -> Result<Vec<(ShareKey, PoolShare)>> {
        Ok(self
            .scan::<(ShareKey, PoolShare)>(CF_SHARES)?
            .into_iter()
            .map(|(_, share)| share)
            .collect())
    }

    pub fn workers(&self) -> Result<Vec<(String, Worker)>> {
        Ok(self
            .scan::<Worker>(CF_WORKERS)?
            .into_iter()
            .map(|(k, w)| (utf8(k), w))
            .collect())
    }

    /// Every pool's circuit breaker.
    pub fn breakers(&self) -> Result<Vec<(String, Breaker)>> {
        Ok(self
            .scan::<Breaker>(CF_BREAKERS)?
            .into_iter()
            .map(|(k, b)| (utf8(k), b))
            .collect())
    }

    /// Dead letters, oldest first.
    pub fn dead_letters(&self) -> Result<Vec<DeadLetter>> {
        Ok(self
            .scan::<DeadLetter>(CF_DLQ)?
            .into_iter()
            .map(|(_, d)| d)
            .collect())
    }

    /// Dead letters newest first, those `keep` passes, at most `limit` of them, looking at
    /// no more than `max_scanned` (so that a filter matching few costs a bounded read, not
    /// one of the whole history).
    pub fn dead_letters_newest(
        &self,
        limit: usize,
        max_scanned: usize,
        mut keep: impl FnMut(&DeadLetter) -> bool,
    ) -> Result<Vec<DeadLetter>> {
        let prefix = self.partition.to_be_bytes();
        let mut start = prefix.to_vec();
        start.extend_from_slice(&[0xff; 17]);
        let iter = self.db.iterator_cf(
            self.cf(CF_DLQ),
            IteratorMode::From(&start, Direction::Reverse),
        );
        let mut out = Vec::new();
        for item in iter.take(max_scanned) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) || out.len() >= limit {
                break;
            }
            let d: DeadLetter = decode(CF_DLQ, &v)?;
            if keep(&d) {
                out.push(d);
            }
        }
        Ok(out)
    }

    /// Dead letters by reason code, as counted by the projection.
    pub fn dead_letter_counts(&self) -> Result<BTreeMap<String, u64>> {
        Ok(self.get_meta(META_DLQ_COUNTS)?.unwrap_or_default())
    }

    /// Jobs per state, as counted by the projection.
    pub fn job_counts(&self) -> Result<BTreeMap<ksched_core::events::JobState, u64>> {
        Ok(self.get_meta(META_JOB_COUNTS)?.unwrap_or_default())
    }

    /// Non-terminal jobs (the `active` index), in job_id order.
    pub fn active_jobs(&self) -> Result<Vec<(String, Job)>> {
        let mut out = Vec::new();
        for (k, ()) in self.scan::<()>(CF_ACTIVE)? {
            let id = utf8(k);
            if let Some(job) = self.job(&id)? {
                out.push((id, job));
            }
        }
        Ok(out)
    }

    /// Jobs in job_id order from `after` (exclusive), passing `keep`, at most `bound.jobs`
    /// of them and of `bound.bytes` in all, looking at no more than `bound.scanned` jobs.
    /// Also returns the last id looked at when a bound stopped the scan (continue after
    /// it), so that a filter matching few jobs, or jobs with large labels, cost a bounded
    /// read per call, not one of the whole history.
    pub fn scan_jobs(
        &self,
        after: Option<&str>,
        bound: ScanBound,
        keep: impl FnMut(&str, &Job) -> bool,
    ) -> Result<Scanned> {
        self.scan_ids(CF_JOBS, after, bound, keep, |_, v| {
            decode(CF_JOBS, v).map(Some)
        })
    }

    /// How many unfinished jobs of job topic `topic` storage holds that `in_memory` does not
    /// name: queued and active ones (the `active` index) and delayed ones (`delays`). A walk
    /// of every unfinished job, for the rare checks that must count them all.
    pub fn unfinished_of_topic(
        &self,
        topic: &str,
        in_memory: impl Fn(&str) -> bool,
    ) -> Result<u64> {
        let mut n = 0;
        self.scan_active_jobs(None, ScanBound::ALL, |id, job| {
            if !in_memory(id) && job.request.topic == topic {
                n += 1;
            }
            false
        })?;
        let mut after = None;
        loop {
            let keys = self.delays_after(after.as_ref(), 4096)?;
            for (_, id) in &keys {
                if !in_memory(id)
                    && let Some(job) = self.job(id)?
                    && job.request.topic == topic
                {
                    n += 1;
                }
            }
            match keys.last() {
                Some(last) if keys.len() >= 4096 => after = Some(last.clone()),
                _ => break,
            }
        }
        Ok(n)
    }

    /// [`Store::scan_jobs`] over the non-terminal jobs (the `active` index).
    pub fn scan_active_jobs(
        &self,
        after: Option<&str>,
        bound: ScanBound,
        keep: impl FnMut(&str, &Job) -> bool,
    ) -> Result<Scanned> {
        self.scan_ids(CF_ACTIVE, after, bound, keep, |id, _| self.job(id))
    }

    /// Walks `cf`, keyed by job id, from `after`; `load` gives the job of a key.
    fn scan_ids(
        &self,
        cf: &str,
        after: Option<&str>,
        bound: ScanBound,
        mut keep: impl FnMut(&str, &Job) -> bool,
        load: impl Fn(&str, &[u8]) -> Result<Option<Job>>,
    ) -> Result<Scanned> {
        let ScanBound {
            jobs: limit,
            scanned: max_scanned,
            bytes: max_bytes,
        } = bound;
        let mut bytes = 0usize;
        let prefix = self.partition.to_be_bytes();
        let start = self.key(after.unwrap_or("").as_bytes());
        let mut out = Scanned::default();
        let iter = self
            .db
            .iterator_cf(self.cf(cf), IteratorMode::From(&start, Direction::Forward));
        let mut scanned = 0usize;
        let mut last: Option<String> = None;
        for item in iter {
            let (k, v) = item?;
            if !k.starts_with(&prefix) || out.jobs.len() >= limit {
                break;
            }
            let id = String::from_utf8_lossy(&k[2..]).into_owned();
            if after.is_some_and(|a| a == id) {
                continue;
            }
            if scanned >= max_scanned {
                out.stopped_after = last;
                break;
            }
            scanned += 1;
            if let Some(job) = load(&id, &v)?
                && keep(&id, &job)
            {
                bytes = bytes.saturating_add(weight(&job));
                out.jobs.push((id.clone(), job));
                if bytes >= max_bytes {
                    out.stopped_after = Some(id);
                    break;
                }
            }
            last = Some(id);
        }
        Ok(out)
    }

    /// Flushes memtables to disk (shutdown).
    pub fn flush(&self) -> Result<()> {
        if self.logged {
            for cf in CFS {
                self.db.flush_cf(self.cf(cf))?;
            }
        } else {
            // Together: a store without the log has only what its flushes wrote.
            let cfs: Vec<_> = CFS.iter().map(|cf| self.cf(cf)).collect();
            self.db
                .flush_cfs_opt(&cfs, &rocksdb::FlushOptions::default())?;
        }
        Ok(())
    }

    /// Approximate size of the store on disk, in bytes.
    pub fn size_bytes(&self) -> u64 {
        CFS.iter()
            .filter_map(|cf| {
                self.db
                    .property_int_value_cf(self.cf(cf), "rocksdb.total-sst-files-size")
                    .ok()
                    .flatten()
            })
            .sum()
    }
}

impl ColdStore for Store {
    type Error = Error;

    fn job(&self, id: &str) -> Result<Option<Job>> {
        Store::job(self, id)
    }

    fn saga(&self, workflow_id: &str) -> Result<Option<Saga>> {
        Store::saga(self, workflow_id)
    }

    fn idempotency(&self, tenant: &str, key: &str) -> Result<Option<IdempotencyEntry>> {
        Store::idempotency(self, tenant, key)
    }

    fn delays_after(
        &self,
        after: Option<&(Millis, String)>,
        limit: usize,
    ) -> Result<Vec<(Millis, String)>> {
        Store::delays_after(self, after, limit)
    }

    fn lane_after(
        &self,
        pool: &str,
        lane: &Lane,
        after: Option<&QueueKey>,
        limit: usize,
    ) -> Result<Vec<QueueKey>> {
        Store::lane_after(self, pool, lane, after, limit)
    }

    fn dependents_after(
        &self,
        tenant: &str,
        dependency: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<String>> {
        Store::dependents_after(self, tenant, dependency, after, limit)
    }

    fn waits_after(
        &self,
        kind: TimerKind,
        after: Option<&TimerAt>,
        limit: usize,
    ) -> Result<Vec<TimerAt>> {
        Store::waits_after(self, kind, after, limit)
    }
}

/// A time as 8 bytes that sort as the times do (big-endian, the sign bit flipped).
fn order_preserving(t: Millis) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

fn from_order_preserving(b: [u8; 8]) -> Millis {
    (u64::from_be_bytes(b) ^ (1 << 63)) as Millis
}

fn idem_key(tenant: &str, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(tenant.len() + key.len() + 1);
    k.extend_from_slice(tenant.as_bytes());
    k.push(0);
    k.extend_from_slice(key.as_bytes());
    k
}

/// The parts of a history run's key, before the shard prefix ([`Store::key_into`]): the job
/// id, a zero byte, the number of the run's first line (big-endian). A job's runs in order,
/// and no job's runs inside another's.
fn history_key<'a>(job_id: &'a str, seq: &'a [u8; 4]) -> [&'a [u8]; 3] {
    [job_id.as_bytes(), &[0], seq]
}

fn split_idem_key(k: &[u8]) -> Option<(String, String)> {
    let i = k.iter().position(|b| *b == 0)?;
    Some((
        String::from_utf8(k[..i].to_vec()).ok()?,
        String::from_utf8(k[i + 1..].to_vec()).ok()?,
    ))
}

fn utf8(k: Vec<u8>) -> String {
    String::from_utf8(k).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::successor;

    #[test]
    fn a_prefix_successor_is_the_first_key_past_every_key_it_begins() {
        assert_eq!(successor(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(successor(&[1, 0xFF, 0xFF]), Some(vec![2]));
        assert_eq!(successor(&[0xFF, 0xFF]), None);
        let end = successor(&[7, 0xFE]).unwrap();
        assert!([7u8, 0xFE, 0xFF, 0xFF].as_slice() < end.as_slice());
    }
}
