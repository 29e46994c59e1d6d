//! `audit rebuild`: the projection from offset 0, and a key-by-key comparison with a live
//! store.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use ksched_store::{CFS, Store};

use crate::engine::Engine;
use crate::error::{Error, Result};
use crate::replay::{Flow, Replayer};

use super::{Progress, Reporting, Source, partition_u16};

/// What a rebuild did.
#[derive(Debug, Clone)]
pub struct RebuildReport {
    pub entries: u64,
    pub events: u64,
    pub last_offset: Option<i64>,
    pub elapsed: Duration,
}

impl RebuildReport {
    pub fn events_per_sec(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Replays the journal from offset 0 (up to and including `until`, if given) into a new
/// store at `into`, with the processor's `apply`.
pub fn rebuild(
    src: &Source,
    into: &Path,
    until: Option<i64>,
    progress: impl FnMut(&Progress),
) -> Result<RebuildReport> {
    let store = Store::open_for_rebuild(into, partition_u16(src.partition)?)?;
    if store.watermark()?.is_some() {
        return Err(Error::Audit(format!(
            "{} already holds a projection; rebuild needs an empty directory",
            into.display()
        )));
    }
    let mut reporting = Reporting::start(src, progress)?;
    let mut engine = Engine::open(store)?;
    let mut r = Replayer::new(&mut engine);
    src.read(0, |rec| {
        if until.is_some_and(|u| rec.offset > u) {
            return Ok(Flow::Stop);
        }
        r.apply(rec.offset, &rec.entry)?;
        reporting.done(r.applied, r.events, rec.offset);
        Ok(Flow::Continue)
    })?;
    r.persist()?;
    // Counted in the time: the store keeps no write-ahead log, so the rebuild is on disk
    // only once flushed.
    r.engine.store().flush()?;
    Ok(RebuildReport {
        entries: r.applied,
        events: r.events,
        last_offset: r.last_offset,
        elapsed: reporting.elapsed(),
    })
}

/// One key on which two projections disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Difference {
    pub column_family: String,
    pub key: String,
    /// `only in rebuilt`, `only in live`, or `values differ`.
    pub kind: &'static str,
}

fn printable(key: &[u8]) -> String {
    if key
        .iter()
        .all(|b| b.is_ascii_graphic() || *b == b' ' || *b == 0)
    {
        String::from_utf8_lossy(key).replace('\0', "|")
    } else {
        key.iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// Compares every column family of two projections, key by key and byte by byte.
pub fn compare(rebuilt: &Store, live: &Store) -> Result<Vec<Difference>> {
    let mut out = Vec::new();
    for cf in CFS {
        let a: BTreeMap<Vec<u8>, Vec<u8>> = rebuilt.raw(cf)?.into_iter().collect();
        let b: BTreeMap<Vec<u8>, Vec<u8>> = live.raw(cf)?.into_iter().collect();
        let keys: BTreeSet<&Vec<u8>> = a.keys().chain(b.keys()).collect();
        for k in keys {
            let kind = match (a.get(k), b.get(k)) {
                (Some(x), Some(y)) if x == y => continue,
                (Some(_), Some(_)) => "values differ",
                (Some(_), None) => "only in rebuilt",
                (None, _) => "only in live",
            };
            out.push(Difference {
                column_family: (*cf).to_owned(),
                key: printable(k),
                kind,
            });
        }
    }
    Ok(out)
}
