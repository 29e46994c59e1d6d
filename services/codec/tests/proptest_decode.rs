//! Arbitrary bytes never panic the decoder: they decode or yield an error. The fast path
//! (for records of the current schema) and the general path agree on every input.

#[allow(dead_code)]
mod samples;

use ksched_codec::{Record, TOP_LEVEL, decode_any, encode, registry};
use ksched_core::events::{Cause, DECISION_FORMAT, JournalEntry};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// `bytes` decode to the same record on the fast and the general path, or fail on both.
/// Compared by encoding, so that a NaN read from corrupt bytes equals itself.
fn same_both_ways<T: Record>(bytes: &[u8]) -> Result<(), TestCaseError> {
    match (
        registry().decode::<T>(bytes),
        registry().decode_general::<T>(bytes),
    ) {
        (Ok(fast), Ok(general)) => {
            prop_assert_eq!(
                encode(&fast).unwrap(),
                encode(&general).unwrap(),
                "{}",
                T::NAME
            );
        }
        (Err(_), Err(_)) => {}
        (fast, general) => prop_assert!(
            false,
            "{}: the fast path gave {:?}, the general path {:?}",
            T::NAME,
            fast.err(),
            general.err()
        ),
    }
    Ok(())
}

/// A journal entry with every event, and the producer records with the most field types.
fn encoded_samples() -> Vec<(&'static str, Vec<u8>)> {
    let entry = JournalEntry {
        cause: Cause {
            topic: "job.default".into(),
            partition: 1,
            offset: 42,
        },
        log_time: 1_700_000_000_000,
        input: ksched_core::events::Input::Submit(samples::job_request()),
        events: samples::every_event(),
        format: DECISION_FORMAT,
    };
    vec![
        (JournalEntry::NAME, encode(&entry).unwrap()),
        ("request", encode(&samples::job_request()).unwrap()),
        ("result", encode(&samples::job_result()).unwrap()),
        ("heartbeat", encode(&samples::heartbeat()).unwrap()),
        ("dispatch", encode(&samples::dispatch()).unwrap()),
    ]
}

fn check(which: &str, bytes: &[u8]) -> Result<(), TestCaseError> {
    use ksched_core::records::{Dispatch, Heartbeat, JobRequest, JobResult};
    match which {
        "request" => same_both_ways::<JobRequest>(bytes),
        "result" => same_both_ways::<JobResult>(bytes),
        "heartbeat" => same_both_ways::<Heartbeat>(bytes),
        "dispatch" => same_both_ways::<Dispatch>(bytes),
        _ => same_both_ways::<JournalEntry>(bytes),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_any(&bytes);
    }

    #[test]
    fn arbitrary_bodies_behind_a_valid_header_never_panic(
        which in 0..TOP_LEVEL.len(),
        body in proptest::collection::vec(any::<u8>(), 0..512),
    ) {
        let entry = registry().current(TOP_LEVEL[which]).unwrap();
        let mut bytes = entry.header().to_vec();
        bytes.extend_from_slice(&body);
        let _ = decode_any(&bytes);
    }

    #[test]
    fn corrupted_valid_records_never_panic(
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut bytes = ksched_codec::encode(&ksched_core::records::Heartbeat {
            worker_id: "w".into(),
            pool: "p".into(),
            capabilities: vec!["a".into(), "b".into()],
            owned_partitions: vec![1, 2, 3],
            ..Default::default()
        }).unwrap();
        for (i, b) in flips {
            let i = 10 + i.index(bytes.len() - 10);
            bytes[i] ^= b;
        }
        let _ = decode_any(&bytes);
    }

    #[test]
    fn corrupted_or_cut_records_decode_the_same_on_both_paths(
        which in 0..5usize,
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let (name, mut bytes) = encoded_samples().swap_remove(which);
        for (i, b) in flips {
            let i = 10 + i.index(bytes.len() - 10);
            bytes[i] ^= b;
        }
        if let Some(cut) = cut {
            bytes.truncate(10 + cut.index(bytes.len() - 10));
        }
        check(name, &bytes)?;
    }
}
