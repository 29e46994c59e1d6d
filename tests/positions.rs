//! The input positions a processor's start reads back from its journal
//! (`ksched_runtime::positions`), against the broker: the last committed header wins,
//! wherever the read-back windows fall, and an aborted one does not count.

use std::time::Duration;

use ksched_runtime::positions::{HEADER, Positions, encode, last_in_journal};
use ksched_testkit::{bootstrap_servers, client_config, create_topic, unique};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const TIMEOUT: Duration = Duration::from_secs(10);

fn at(offset: i64) -> Positions {
    [(("jobs".to_owned(), 0), offset)].into()
}

/// One transaction of `n` records; record `i` carries the header `headers[i]` when given.
fn transaction(
    producer: &ThreadedProducer<DefaultProducerContext>,
    topic: &str,
    n: usize,
    headers: &[(usize, Positions)],
    commit: bool,
) {
    producer.begin_transaction().unwrap();
    for i in 0..n {
        let mut record = BaseRecord::<(), [u8]>::to(topic).payload(b"entry".as_slice());
        if let Some((_, p)) = headers.iter().find(|(at, _)| *at == i) {
            let value = encode(p);
            record = record.headers(OwnedHeaders::new().insert(Header {
                key: HEADER,
                value: Some(&value),
            }));
        }
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    if commit {
        producer.commit_transaction(TIMEOUT).unwrap();
    } else {
        producer.abort_transaction(TIMEOUT).unwrap();
    }
}

fn last(bootstrap: &str, topic: &str) -> Option<Positions> {
    let mut client = client_config(bootstrap);
    client.set("isolation.level", "read_committed");
    let probe: BaseConsumer = client
        .clone()
        .set("group.id", unique("probe"))
        .create()
        .unwrap();
    let (low, high) = probe.fetch_watermarks(topic, 0, TIMEOUT).unwrap();
    last_in_journal(&client, topic, 0, low, high).unwrap()
}

#[tokio::test]
async fn the_last_committed_positions_header_is_found_wherever_the_windows_fall() {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let topic = unique("positions-journal");
    create_topic(&bootstrap, &topic, 1).await.unwrap();
    // Threaded: its own thread serves the delivery reports the commit waits for.
    let producer: ThreadedProducer<DefaultProducerContext> = client_config(&bootstrap)
        .set("transactional.id", unique("positions"))
        .create()
        .unwrap();
    producer.init_transactions(TIMEOUT).unwrap();

    // Nothing carries a header yet.
    transaction(&producer, &topic, 3, &[], true);
    assert_eq!(last(&bootstrap, &topic), None);

    // Offsets 0-2 and the marker at 3 so far. Now 4..=203, the marker at 204: the first
    // window read back is [141, 205), which has no header; the next one ends at 141 and
    // must read the record at 140 (the 137th of this transaction), the last header.
    transaction(&producer, &topic, 200, &[(10, at(1)), (136, at(2))], true);
    assert_eq!(last(&bootstrap, &topic), Some(at(2)));

    // A later header in the last window wins; one in an aborted transaction (the journal
    // then ends with aborted records and an abort marker, as after a crash) does not count.
    transaction(&producer, &topic, 5, &[(2, at(3))], true);
    transaction(&producer, &topic, 2, &[(0, at(4))], false);
    assert_eq!(last(&bootstrap, &topic), Some(at(3)));
}
