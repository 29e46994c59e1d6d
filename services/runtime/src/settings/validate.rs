//! Cross-field rules of the settings, with messages that say what to change.

use crate::error::{Error, Result};

use super::{OutputFormat, Settings};

impl Settings {
    /// Cross-field rules, with messages that say what to change.
    pub fn validate(&self) -> Result<()> {
        let bad = |detail: String| {
            Err(Error::Config {
                source_name: "settings".into(),
                detail,
            })
        };
        if self.kafka.bootstrap_servers.trim().is_empty() {
            return bad("kafka.bootstrap_servers is empty".into());
        }
        if !self
            .topics
            .prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
        {
            return bad(format!(
                "topics.prefix {:?} may use only letters, digits, '.', '_' and '-'",
                self.topics.prefix
            ));
        }
        let t = &self.topics;
        for (name, n) in [
            ("topics.job_partitions", t.job_partitions),
            ("topics.results_partitions", t.results_partitions),
            ("topics.control_partitions", t.control_partitions),
            ("topics.heartbeats_partitions", t.heartbeats_partitions),
            ("topics.journal_partitions", t.journal_partitions),
            ("topics.dlq_partitions", t.dlq_partitions),
            ("topics.dispatch_partitions", t.dispatch_partitions),
            ("topics.replication_factor", t.replication_factor),
        ] {
            if n < 1 {
                return bad(format!("{name} must be at least 1, got {n}"));
            }
        }
        let sr = &self.schema_registry;
        if sr.output_format == OutputFormat::Confluent && sr.url.is_none() {
            return bad(
                "schema_registry.output_format confluent needs schema_registry.url: the Confluent wire format names schemas by registry id".into(),
            );
        }
        if let Some(url) = &sr.url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return bad(format!(
                "schema_registry.url {url:?} must start with http:// or https://"
            ));
        }
        if t.results_partitions < t.journal_partitions {
            return bad(format!(
                "topics.results_partitions ({}) must be at least topics.journal_partitions ({}): each shard answers on its own results partitions",
                t.results_partitions, t.journal_partitions
            ));
        }
        let p = &self.processor;
        if p.journal_partition < 0 || p.journal_partition >= t.journal_partitions {
            return bad(format!(
                "processor.journal_partition {} is not a partition of a journal with {} partitions",
                p.journal_partition, t.journal_partitions
            ));
        }
        if !(1..=2).contains(&p.transactional_producers) {
            return bad(format!(
                "processor.transactional_producers must be 1 or 2, not {}",
                p.transactional_producers
            ));
        }
        if p.max_batch == 0 {
            return bad("processor.max_batch must be at least 1".into());
        }
        if p.lease && p.lease_session_timeout_ms < 1_000 {
            return bad("processor.lease_session_timeout_ms must be at least 1000".into());
        }
        if p.commit_interval_ms == 0 || p.tick_interval_ms == 0 {
            return bad(
                "processor.commit_interval_ms and processor.tick_interval_ms must be positive"
                    .into(),
            );
        }
        if p.transaction_timeout_ms < 1_000 || p.transaction_timeout_ms <= p.commit_interval_ms * 10
        {
            return bad(format!(
                "processor.transaction_timeout_ms ({}) must be at least 1000 and well above commit_interval_ms ({})",
                p.transaction_timeout_ms, p.commit_interval_ms
            ));
        }
        if p.input_stall_ms < p.tick_interval_ms.saturating_mul(10) {
            return bad(format!(
                "processor.input_stall_ms ({}) must be at least ten times processor.tick_interval_ms ({})",
                p.input_stall_ms, p.tick_interval_ms
            ));
        }
        let gap = self.scheduler.timing.clock_gap_ms;
        if gap < i64::try_from(p.tick_interval_ms.saturating_mul(2)).unwrap_or(i64::MAX) {
            return bad(format!(
                "scheduler.timing.clock_gap_ms ({gap}) must be at least twice processor.tick_interval_ms ({}): ordinary ticks would look like gaps",
                p.tick_interval_ms
            ));
        }
        if !matches!(self.log.format.as_str(), "text" | "json") {
            return bad(format!(
                "log.format must be text or json, got {:?}",
                self.log.format
            ));
        }
        if self.http.enabled {
            let Ok(addr) = self.http.listen.parse::<std::net::SocketAddr>() else {
                return bad(format!(
                    "http.listen {:?} is not an address like 127.0.0.1:8080",
                    self.http.listen
                ));
            };
            if !addr.ip().is_loopback() && !self.http.authenticates() {
                return bad(format!(
                    "http.listen {} is reachable beyond this machine, but the API has no authentication: set http.tokens_file or http.jwt (docs/security.md), or listen on 127.0.0.1",
                    self.http.listen
                ));
            }
            if let Some(j) = &self.http.jwt
                && (j.issuer.trim().is_empty()
                    || j.audience.trim().is_empty()
                    || j.jwks_file.as_os_str().is_empty())
            {
                return bad("http.jwt needs issuer, audience and jwks_file".into());
            }
            if let Some(t) = &self.http.tls
                && (t.cert_file.as_os_str().is_empty() || t.key_file.as_os_str().is_empty())
            {
                return bad("http.tls needs cert_file and key_file".into());
            }
            if self.http.max_body_bytes == 0 {
                return bad("http.max_body_bytes must be positive".into());
            }
            if self.http.max_connections == 0 || self.http.request_read_timeout_ms == 0 {
                return bad(
                    "http.max_connections and http.request_read_timeout_ms must be positive".into(),
                );
            }
            if self.http.replay_timeout_ms == 0 || self.http.replay_memory_limit_bytes < 256 << 20 {
                return bad(
                    "http.replay_timeout_ms must be positive and http.replay_memory_limit_bytes at least 268435456 (256 MiB)"
                        .into(),
                );
            }
        }
        Ok(())
    }
}
