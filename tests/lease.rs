//! The owners' group (`runtime/src/lease.rs`) against the real broker: a shard that the
//! group left unowned is claimed by a member standing for it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ksched_runtime::lease::Lease;
use ksched_runtime::{Settings, Status, Topics};
use ksched_testkit::{bootstrap_servers, client_config, unique};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use tokio_util::sync::CancellationToken;

/// The group forms while the journal topic does not exist yet, so its leader assigns
/// nothing and the group is Stable with the shard unowned (what a lone member was left with
/// after a broker restart in the fault suite); then the topic appears. librdkafka notices a
/// subscribed topic that appears by itself (this passed before the lease compared its view
/// with the coordinator's too); the lease's own check (`disagreement`, unit-tested) is the
/// backstop when it does not.
#[tokio::test(flavor = "multi_thread")]
async fn a_shard_the_group_left_unowned_is_claimed() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let prefix = format!("{}.", unique("lease"));
    let dir = tempfile::tempdir().unwrap();
    let mut settings = Settings::default();
    settings.kafka.bootstrap_servers = bootstrap.clone();
    settings.storage.data_dir = dir.path().to_owned();
    settings.processor.group_id = format!("{prefix}processor");
    settings.processor.lease_session_timeout_ms = 2_000;
    let topics = Topics::new(&prefix, vec![], vec![]);
    let status = Arc::new(Status::for_shard(Some(0)));
    let lease = Lease::start(
        &settings,
        &topics,
        BTreeMap::from([(0, status)]),
        CancellationToken::new(),
    )
    .unwrap();
    // Long enough for the group to form around a subscription with nothing to assign.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!lease.owned(0), "no journal yet, nothing to own");

    let admin: AdminClient<DefaultClientContext> = client_config(&bootstrap).create().unwrap();
    let created = admin
        .create_topics(
            &[NewTopic::new(
                &topics.journal,
                1,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(created.iter().all(Result::is_ok), "{created:?}");

    let started = Instant::now();
    while !lease.owned(0) {
        assert!(
            started.elapsed() < Duration::from_secs(45),
            "shard 0 still unowned {} s after its journal appeared",
            started.elapsed().as_secs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "shard 0 owned {:.1} s after its journal appeared",
        started.elapsed().as_secs_f64()
    );
    drop(lease);
}
