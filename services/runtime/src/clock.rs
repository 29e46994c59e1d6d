//! The host's clock, for what is not a decision: liveness, health and operators' requests.
//! Decisions use log time (the broker's timestamps), never this.

/// Milliseconds since the Unix epoch on this host's clock.
pub fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
