//! Arbitrary bytes never panic the decoder: they decode or yield an error.

use ksched_codec::{TOP_LEVEL, decode_any, registry};
use proptest::prelude::*;

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
}
