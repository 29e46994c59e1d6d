//! The disk reserve: while the filesystem under the store has less free space than
//! `storage.min_free_disk_bytes`, new jobs are refused `storage_full` before they are
//! journaled, so the jobs already accepted (their results, retries and dead letters, which
//! the store must still record) keep the space that is left.
//!
//! The refusal is an input like any other (journaled, dead-lettered with the job's id): a
//! replay decides it the same way without looking at any disk.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use tracing::{info, warn};

/// How often free space is read (one `statvfs` call).
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The free space under a directory, read at most once a second.
#[derive(Debug)]
pub struct DiskReserve {
    dir: PathBuf,
    /// Bytes that must stay free; 0: no reserve (never read).
    min_free: u64,
    checked: Option<Instant>,
    /// Free bytes as last read, when under the reserve.
    short: Option<u64>,
}

impl DiskReserve {
    pub fn new(dir: PathBuf, min_free: u64) -> DiskReserve {
        DiskReserve {
            dir,
            min_free,
            checked: None,
            short: None,
        }
    }

    /// The reserve, in bytes.
    pub fn min_free(&self) -> u64 {
        self.min_free
    }

    /// The free bytes, when they are under the reserve. A filesystem that cannot be read
    /// counts as not short: a write that then fails stops the processor, nothing lost.
    pub fn short(&mut self) -> Option<u64> {
        if self.min_free == 0 {
            return None;
        }
        if self.checked.is_none_or(|t| t.elapsed() >= CHECK_EVERY) {
            let first = self.checked.is_none();
            self.checked = Some(Instant::now());
            let free = match free_bytes(&self.dir) {
                Ok(free) => free,
                Err(e) => {
                    // Said once, at the first read; then as it was.
                    if first {
                        warn!(dir = %self.dir.display(), error = %e, "free disk space under the store cannot be read: no reserve is kept");
                    }
                    return self.short;
                }
            };
            let short = (free < self.min_free).then_some(free);
            match (self.short, short) {
                (None, Some(free)) => warn!(
                    dir = %self.dir.display(),
                    free,
                    reserve = self.min_free,
                    "free disk under the store is below storage.min_free_disk_bytes: new jobs are refused (storage_full)"
                ),
                (Some(_), None) => info!(
                    dir = %self.dir.display(),
                    reserve = self.min_free,
                    "free disk under the store is back above the reserve: new jobs are accepted again"
                ),
                _ => {}
            }
            self.short = short;
        }
        self.short
    }
}

/// Bytes an unprivileged writer may still use on the filesystem holding `dir`.
fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    let s = rustix::fs::statvfs(dir)?;
    Ok(s.f_bavail.saturating_mul(s.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_larger_than_the_disk_is_short_and_none_never_is() {
        let dir = std::env::temp_dir();
        let free = free_bytes(&dir).unwrap();
        assert!(free > 0);
        let mut all = DiskReserve::new(dir.clone(), u64::MAX);
        assert!(all.short().is_some_and(|f| f <= free.saturating_mul(2)));
        let mut none = DiskReserve::new(dir.clone(), 0);
        assert_eq!(none.short(), None);
        let mut some = DiskReserve::new(dir, 1);
        assert_eq!(some.short(), None, "{free} bytes free");
    }

    #[test]
    fn a_directory_that_cannot_be_read_is_not_short() {
        let mut r = DiskReserve::new(PathBuf::from("/nonexistent/ksched/store"), u64::MAX);
        assert_eq!(r.short(), None);
    }
}
