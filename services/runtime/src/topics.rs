//! Topic names and creating the topics ksched needs.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use tracing::info;

use crate::error::{Error, Result, kafka};
use crate::settings::Settings;

/// The names of ksched's topics for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    pub prefix: String,
    pub results: String,
    pub control: String,
    pub heartbeats: String,
    pub journal: String,
    pub dlq: String,
    /// Job topics from pools.yaml.
    pub jobs: Vec<String>,
    /// Pools from pools.yaml.
    pub pools: Vec<String>,
}

/// What an input topic carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InputKind {
    Jobs,
    Results,
    Control,
    Heartbeats,
}

impl Topics {
    pub fn new(prefix: &str, jobs: Vec<String>, pools: Vec<String>) -> Topics {
        Topics {
            prefix: prefix.to_owned(),
            results: format!("{prefix}results"),
            control: format!("{prefix}control"),
            heartbeats: format!("{prefix}heartbeats"),
            journal: format!("{prefix}journal"),
            dlq: format!("{prefix}dlq"),
            jobs,
            pools,
        }
    }

    pub fn dispatch(&self, pool: &str) -> String {
        format!("{}dispatch.{pool}", self.prefix)
    }

    /// Every topic the processor consumes.
    pub fn inputs(&self) -> Vec<String> {
        let mut v = self.jobs.clone();
        v.extend([
            self.results.clone(),
            self.control.clone(),
            self.heartbeats.clone(),
        ]);
        v
    }

    pub fn kind(&self, topic: &str) -> InputKind {
        if topic == self.results {
            InputKind::Results
        } else if topic == self.control {
            InputKind::Control
        } else if topic == self.heartbeats {
            InputKind::Heartbeats
        } else {
            InputKind::Jobs
        }
    }
}

/// Creates every missing topic: inputs with broker-assigned timestamps (LogAppendTime, so
/// decisions use one clock, not each producer's), the journal with unlimited retention.
pub async fn ensure_topics(settings: &Settings, topics: &Topics) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = client_config(settings)
        .create()
        .map_err(kafka("creating the admin client"))?;
    let t = &settings.topics;
    let log_append: BTreeMap<&str, &str> = [("message.timestamp.type", "LogAppendTime")].into();
    let forever: BTreeMap<&str, &str> = [("retention.ms", "-1"), ("retention.bytes", "-1")].into();
    let none = BTreeMap::new();
    let mut wanted: Vec<(String, i32, &BTreeMap<&str, &str>)> = Vec::new();
    for job_topic in &topics.jobs {
        wanted.push((job_topic.clone(), t.job_partitions, &log_append));
    }
    wanted.push((topics.results.clone(), t.results_partitions, &log_append));
    wanted.push((topics.control.clone(), t.control_partitions, &log_append));
    wanted.push((
        topics.heartbeats.clone(),
        t.heartbeats_partitions,
        &log_append,
    ));
    wanted.push((topics.journal.clone(), t.journal_partitions, &forever));
    wanted.push((topics.dlq.clone(), t.dlq_partitions, &none));
    for pool in &topics.pools {
        wanted.push((topics.dispatch(pool), t.dispatch_partitions, &none));
    }
    let new: Vec<NewTopic<'_>> = wanted
        .iter()
        .map(|(name, partitions, configs)| {
            let mut nt = NewTopic::new(
                name,
                *partitions,
                TopicReplication::Fixed(t.replication_factor),
            );
            for (k, v) in configs.iter() {
                nt = nt.set(k, v);
            }
            nt
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .create_topics(&new, &opts)
        .await
        .map_err(kafka("creating topics"))?;
    for r in results {
        match r {
            Ok(name) => info!(topic = %name, "topic created"),
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(Error::Other(format!("creating topic {name}: {code}")));
            }
        }
    }
    Ok(())
}

/// A client config with the bootstrap servers and extra properties.
pub fn client_config(settings: &Settings) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &settings.kafka.bootstrap_servers);
    for (k, v) in &settings.kafka.properties {
        cfg.set(k, v);
    }
    cfg
}
