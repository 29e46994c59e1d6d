//! Shards: which shard schedules a pool and takes a topic's jobs, and the rules that keep a
//! job's decisions in one shard.

use ksched_core::rules::{PoolRules, Rules, check_shards, shard_of_pool, shard_of_topic};

fn rules(pools: &[(&str, Option<u32>)], topics: &[(&str, &[&str])]) -> Rules {
    let mut r = Rules::default();
    for (name, shard) in pools {
        r.pools.insert(
            (*name).into(),
            PoolRules {
                shard: *shard,
                ..Default::default()
            },
        );
    }
    for (topic, pools) in topics {
        r.topics
            .insert((*topic).into(), pools.iter().map(|p| (*p).into()).collect());
    }
    r
}

#[test]
fn an_explicit_shard_wins_and_a_hashed_one_is_stable_and_in_range() {
    let r = rules(&[("gpu", Some(3)), ("cpu", None)], &[]);
    assert_eq!(shard_of_pool(&r, "gpu", 4), 3);
    for shards in 1..=8 {
        let s = shard_of_pool(&r, "cpu", shards);
        assert!(s < shards);
        assert_eq!(s, shard_of_pool(&r, "cpu", shards), "the hash is stable");
    }
    // One shard: everything is shard 0.
    assert_eq!(shard_of_pool(&r, "cpu", 1), 0);
    // The hash is the documented one: SHA-256 of the name, first 4 bytes big-endian.
    let digest = ksched_core::hash::sha256_hex(b"cpu");
    let head = u32::from_str_radix(&digest[..8], 16).unwrap();
    assert_eq!(shard_of_pool(&r, "cpu", 6), head % 6);
}

#[test]
fn names_spread_over_the_shards() {
    let r = Rules::default();
    let mut seen = [0u32; 4];
    for i in 0..400 {
        seen[shard_of_pool(&r, &format!("pool-{i}"), 4) as usize] += 1;
    }
    assert!(seen.iter().all(|n| *n > 60), "uneven spread: {seen:?}");
}

#[test]
fn a_topic_goes_to_the_shard_of_its_pools() {
    let r = rules(
        &[("a", Some(1)), ("b", Some(1)), ("c", Some(0))],
        &[("t1", &["a", "b"]), ("t2", &["c"])],
    );
    assert_eq!(check_shards(&r, 2), Ok(()));
    assert_eq!(shard_of_topic(&r, "t1", 2), Some(1));
    assert_eq!(shard_of_topic(&r, "t2", 2), Some(0));
    assert_eq!(shard_of_topic(&r, "unrouted", 2), None);
}

#[test]
fn a_topic_whose_pools_span_shards_is_refused_with_what_to_change() {
    let r = rules(&[("a", Some(0)), ("b", Some(1))], &[("t", &["a", "b"])]);
    let e = check_shards(&r, 2).unwrap_err().0;
    assert!(
        e.contains("topic t") && e.contains("shard 0: a") && e.contains("shard 1: b"),
        "{e}"
    );
    // The same rules on one shard are fine once the explicit shards agree.
    let r = rules(&[("a", Some(0)), ("b", Some(0))], &[("t", &["a", "b"])]);
    assert_eq!(check_shards(&r, 1), Ok(()));
}

#[test]
fn an_explicit_shard_out_of_range_is_refused() {
    let r = rules(&[("a", Some(2))], &[]);
    let e = check_shards(&r, 2).unwrap_err().0;
    assert!(e.contains("pool a") && e.contains("shard 2"), "{e}");
    // With one shard too: the explicit shard would be ignored, which the operator must know.
    assert!(check_shards(&rules(&[("a", Some(1))], &[]), 1).is_err());
}

#[test]
fn rules_without_shards_journal_as_before() {
    // A pool without an explicit shard serializes as it did before shards existed, so the
    // rules id of an existing deployment does not change.
    let r = rules(&[("a", None)], &[]);
    assert!(!r.to_canonical_json().contains("shard"));
    let r = rules(&[("a", Some(1))], &[]);
    assert!(r.to_canonical_json().contains("\"shard\":1"));
    assert_eq!(Rules::from_json(&r.to_canonical_json()).unwrap(), r);
}
