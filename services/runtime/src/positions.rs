//! Input positions carried by the journal.
//!
//! A shard's processor reads its inputs from positions that must move exactly with its
//! transactions: what a committed transaction decided is never read again, and nothing is
//! skipped. Kafka's way is `send_offsets_to_transaction`: two more requests to the group
//! coordinator per transaction (AddOffsetsToTxn, TxnOffsetCommit) and one more partition
//! (`__consumer_offsets`) for its markers. The journal partition is in every transaction
//! that decides something anyway, so the processor writes the positions there instead: the
//! first journal record of each batch carries a [`HEADER`] with the position of every input
//! partition the shard has read, after the batch. The header commits or aborts with the
//! batch's decisions.
//!
//! Offsets go to the consumer group instead, in the transaction, for a batch that journals
//! nothing (it has no journal record to carry them), for a small batch (fewer inputs than
//! `processor.journal_positions_min_batch`, 8 by default: at low load the header would
//! cost more journal bytes than the offsets cost time; an idle fleet's heartbeats are such
//! batches), and at least every `processor.group_offsets_interval_ms` (so that
//! consumer-lag tools see the group move).
//! Any batch may take either way: what a start needs is only that each committed batch's
//! positions are in the group or in the journal.
//!
//! At start, each input partition is read from the larger of the group's committed offset
//! and the position in the last header in the journal ([`last_in_journal`]). Both are
//! written only by committed transactions of the shard, and both only move forward, so the
//! larger is the position after the last committed transaction that read the partition.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::message::{Headers, Message};
use tracing::{debug, warn};

use crate::error::Result;
use crate::tail::PartitionTail;

/// The header of a journal record that carries the shard's input positions.
pub const HEADER: &str = "ksched-positions";

/// Journal records a start reads back from the end at most, looking for a [`HEADER`]. Every
/// batch that journals something writes one, so the last is normally among the last few
/// records; a longer run without one only comes from a build that committed every batch's
/// offsets to the group, whose offsets then stand.
pub const MAX_SCAN: i64 = 65_536;

/// The next offset to read of each input partition: `(topic, partition) -> offset`.
pub type Positions = BTreeMap<(String, i32), i64>;

/// The header's value: each topic once, with its partitions' positions,
/// `topic:partition=offset;partition=offset,topic:...`. Kafka topic names hold only
/// `[a-zA-Z0-9._-]`, so no separator can occur in one.
pub fn encode(positions: &Positions) -> String {
    let mut out = String::with_capacity(positions.len() * 16);
    let mut last: Option<&str> = None;
    for ((topic, partition), offset) in positions {
        if last == Some(topic.as_str()) {
            out.push(';');
        } else {
            if last.is_some() {
                out.push(',');
            }
            out.push_str(topic);
            out.push(':');
            last = Some(topic);
        }
        out.push_str(&partition.to_string());
        out.push('=');
        out.push_str(&offset.to_string());
    }
    out
}

/// Reads a header's value back; `Err` says what is wrong with it.
pub fn decode(value: &[u8]) -> std::result::Result<Positions, String> {
    let text = std::str::from_utf8(value).map_err(|_| "not UTF-8".to_owned())?;
    let mut positions = Positions::new();
    if text.is_empty() {
        return Ok(positions);
    }
    for item in text.split(',') {
        let (topic, partitions) = item
            .split_once(':')
            .ok_or_else(|| format!("`{item}` has no `:`"))?;
        if topic.is_empty() {
            return Err(format!("`{item}` names no topic"));
        }
        for one in partitions.split(';') {
            let (partition, offset) = one
                .split_once('=')
                .ok_or_else(|| format!("`{item}`: `{one}` has no `=`"))?;
            let partition: i32 = partition
                .parse()
                .map_err(|_| format!("`{item}`: the partition is not a number"))?;
            let offset: i64 = offset
                .parse()
                .map_err(|_| format!("`{item}`: the offset is not a number"))?;
            if partition < 0 || offset < 0 {
                return Err(format!("`{item}` is negative"));
            }
            positions.insert((topic.to_owned(), partition), offset);
        }
    }
    Ok(positions)
}

/// Each partition at the larger of its positions in `a` and `b`.
pub fn furthest(mut a: Positions, b: &Positions) -> Positions {
    for (tp, offset) in b {
        let e = a.entry(tp.clone()).or_insert(*offset);
        *e = (*e).max(*offset);
    }
    a
}

/// The positions in the last [`HEADER`] of journal partition `partition` of `topic` below
/// `high` (its last stable offset), read back from the end in windows of growing size, at
/// most [`MAX_SCAN`] records; `None` when there is none that far back.
///
/// For a processor's start only: its producers fenced every older one and it has no
/// transaction open, so every transaction in the journal is complete and the record at
/// `high - 1` is a transaction marker, which a reader is never given.
pub fn last_in_journal(
    client: &ClientConfig,
    topic: &str,
    partition: i32,
    low: i64,
    high: i64,
) -> Result<Option<Positions>> {
    let reader = crate::replay::with_reader_group(client);
    let mut end = high;
    let mut step = 64;
    while end > low && high - end < MAX_SCAN {
        let start = (end - step).max(low).max(high - MAX_SCAN);
        // The last window ends at `high`, whose record before it is a marker; an earlier
        // one at a record of the window after it, and must read the record before that.
        let through = if end == high { end - 1 } else { end };
        if let Some(found) = last_between(&reader, topic, partition, start, end, through)? {
            return Ok(Some(found));
        }
        end = start;
        step *= 4;
    }
    if high > low {
        debug!(
            topic,
            partition,
            scanned = high - end,
            "no input positions in the journal's last records; the group's offsets stand"
        );
    }
    Ok(None)
}

/// The positions in the last header of records `[start, end)`, read until the next offset
/// is `through` (`end`, or `end - 1` when that is a marker never delivered).
fn last_between(
    client: &ClientConfig,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
    through: i64,
) -> Result<Option<Positions>> {
    let mut tail = PartitionTail::new(client, topic, partition, start)?;
    let mut found = None;
    while tail.next_offset() < through {
        let Some(m) = tail.poll(Duration::from_millis(50))? else {
            continue;
        };
        if m.offset() >= end {
            break;
        }
        let value = m
            .headers()
            .and_then(|h| h.iter().find(|h| h.key == HEADER).and_then(|h| h.value));
        if let Some(value) = value {
            match decode(value) {
                Ok(p) => found = Some(p),
                Err(detail) => {
                    warn!(
                        topic,
                        partition,
                        offset = m.offset(),
                        detail,
                        "a journal record's input positions cannot be read; looking further back"
                    );
                }
            }
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn positions(items: &[(&str, i32, i64)]) -> Positions {
        items
            .iter()
            .map(|(t, p, o)| (((*t).to_owned(), *p), *o))
            .collect()
    }

    #[test]
    fn positions_read_back_as_written() {
        let p = positions(&[
            ("ksched.jobs.default", 0, 17),
            ("ksched.jobs.default", 11, 0),
            ("ksched.results", 3, 9_223_372_036_854_775_000),
            ("a-b_c.d", 2, 5),
        ]);
        assert_eq!(
            encode(&p),
            "a-b_c.d:2=5,ksched.jobs.default:0=17;11=0,ksched.results:3=9223372036854775000"
        );
        assert_eq!(decode(encode(&p).as_bytes()), Ok(p));
        assert_eq!(
            decode(encode(&Positions::new()).as_bytes()),
            Ok(Positions::new())
        );
    }

    #[test]
    fn a_damaged_header_is_refused_not_half_read() {
        for bad in [
            &b"jobs:0"[..],
            b"jobs=4",
            b":0=4",
            b"jobs:x=4",
            b"jobs:0=y",
            b"jobs:-1=4",
            b"jobs:0=-4",
            b"jobs:0=4,",
            b"jobs:0=4;",
            b"jobs:0=4;1",
            b"jobs:0=4;x=1",
            b"\xff\xfe",
        ] {
            assert!(decode(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn the_furthest_position_of_each_partition_wins() {
        let group = positions(&[("jobs", 0, 10), ("jobs", 1, 40), ("results", 0, 7)]);
        let journal = positions(&[("jobs", 0, 25), ("jobs", 1, 30), ("ticks", 0, 3)]);
        assert_eq!(
            furthest(group, &journal),
            positions(&[
                ("jobs", 0, 25),
                ("jobs", 1, 40),
                ("results", 0, 7),
                ("ticks", 0, 3)
            ])
        );
    }
}
