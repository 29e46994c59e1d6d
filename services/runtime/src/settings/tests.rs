use ksched_core::rules::Rules;

use super::*;

#[test]
fn a_topic_binds_tenants_in_pools_yaml() {
    let pools = parse_pools(
        "topics:\n  job.default: default\n  job.multi: [a, default]\n  job.acme:\n    pools: [a, default]\n    tenants: [acme]\n\
         pools:\n  default: {}\n  a:\n    workers: [\"a-*\"]\n\
         tenants:\n  \"*\":\n    max_concurrent_jobs: 5\n",
    )
    .unwrap();
    let mut rules = Rules::default();
    pools.apply_to(&mut rules);
    rules.validate().unwrap();
    assert_eq!(rules.topics["job.acme"], ["a", "default"]);
    assert_eq!(rules.topics["job.multi"], ["a", "default"]);
    assert_eq!(
        rules.topic_tenants.keys().collect::<Vec<_>>(),
        ["job.acme"],
        "only the bound topic lists tenants"
    );
    assert_eq!(rules.topic_tenants["job.acme"], ["acme"]);
    assert_eq!(rules.pools["a"].workers, ["a-*"]);
    assert_eq!(rules.max_concurrent_for_tenant("anyone"), Some(5));
}

#[test]
fn a_topic_limits_concurrency_per_key_in_pools_yaml() {
    let pools = parse_pools(
        "topics:\n  job.default: default\n  job.pay:\n    pools: default\n    concurrency: {key: \"label:customer\", limit: 1}\n  job.bulk:\n    pools: default\n    concurrency: {limit: 3}\n\
         pools:\n  default: {}\n",
    )
    .unwrap();
    let mut rules = Rules::default();
    pools.apply_to(&mut rules);
    rules.validate().unwrap();
    assert_eq!(rules.topic_concurrency.len(), 2);
    assert_eq!(rules.topic_concurrency["job.pay"].label(), Some("customer"));
    assert_eq!(rules.topic_concurrency["job.pay"].limit, Some(1));
    assert_eq!(
        rules.topic_concurrency["job.bulk"].label(),
        Some("concurrency_key"),
        "the default label"
    );
    // Rules without any keep the id they had before concurrency limits existed.
    let mut plain = Rules::default();
    parse_pools("topics:\n  job.default: default\npools:\n  default: {}\n")
        .unwrap()
        .apply_to(&mut plain);
    assert!(!plain.to_canonical_json().contains("topic_concurrency"));
    let mut bad = Rules::default();
    parse_pools(
        "topics:\n  job.pay:\n    pools: default\n    concurrency: {key: customer, limit: 1}\npools:\n  default: {}\n",
    )
    .unwrap()
    .apply_to(&mut bad);
    assert!(
        bad.validate()
            .unwrap_err()
            .to_string()
            .contains("label:NAME")
    );
}

#[test]
fn a_topic_limits_the_rate_per_key_in_pools_yaml() {
    let pools = parse_pools(
        "topics:\n  job.calls:\n    pools: default\n    concurrency: {key: tenant, rate: 100/1m, burst: 10}\n\
         pools:\n  default: {}\n",
    )
    .unwrap();
    let mut rules = Rules::default();
    pools.apply_to(&mut rules);
    rules.validate().unwrap();
    let rule = &rules.topic_concurrency["job.calls"];
    assert_eq!(rule.limit, None);
    let rate = rule.rate_limit().unwrap();
    assert_eq!((rate.count, rate.per_ms, rate.burst), (100, 60_000, 10));
    for bad in ["rate: fast", "rate: 0/s", "burst: 3", "{}"] {
        let yaml = format!(
            "topics:\n  job.calls:\n    pools: default\n    concurrency: {{key: tenant, {}}}\npools:\n  default: {{}}\n",
            bad.trim_matches(['{', '}'])
        );
        let mut r = Rules::default();
        parse_pools(&yaml).unwrap().apply_to(&mut r);
        assert!(r.validate().is_err(), "{bad} was taken");
    }
}

#[test]
fn a_misspelt_topic_binding_is_refused() {
    let e = parse_pools("topics:\n  job.acme:\n    pools: [default]\n    tenant: [acme]\n")
        .unwrap_err();
    assert!(e.to_string().contains("tenants: [...]"), "{e}");
}

#[test]
fn fewer_results_partitions_than_shards_are_refused_before_any_topic_is_made() {
    let mut s = Settings::default();
    s.topics.journal_partitions = 6;
    s.topics.results_partitions = 4;
    let e = s.validate().unwrap_err().to_string();
    assert!(e.contains("results_partitions (4)"), "{e}");
    s.topics.results_partitions = 6;
    s.validate().unwrap();
}

#[test]
fn transactional_producers_are_one_or_two() {
    let mut s = Settings::default();
    assert_eq!(s.processor.transactional_producers, 2);
    for n in [0, 3] {
        s.processor.transactional_producers = n;
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("must be 1 or 2"), "{e}");
    }
    s.processor.transactional_producers = 1;
    s.validate().unwrap();
}

#[test]
fn a_topic_has_unique_and_debounced_jobs_in_pools_yaml() {
    let pools = parse_pools(
        "topics:\n  job.reports:\n    pools: default\n    unique: {key: \"label:report\", for: 1h}\n\
         \x20 job.reindex:\n    pools: default\n    debounce: {key: \"label:document\", wait: 5s, max_wait: 1m}\n\
         \x20 job.plain: default\npools:\n  default: {}\n",
    )
    .unwrap();
    let mut rules = Rules::default();
    pools.apply_to(&mut rules);
    rules.validate().unwrap();
    assert_eq!(rules.topic_unique["job.reports"].window_ms(), 3_600_000);
    let d = &rules.topic_debounce["job.reindex"];
    assert_eq!((d.wait_ms(), d.max_wait_ms()), (5_000, 60_000));
    assert_eq!(rules.topic_unique.len() + rules.topic_debounce.len(), 2);
    // Rules without any keep the id they had before these rules existed.
    let json = {
        let mut plain = Rules::default();
        parse_pools("topics:\n  job.default: default\npools:\n  default: {}\n")
            .unwrap()
            .apply_to(&mut plain);
        plain.to_canonical_json()
    };
    assert!(!json.contains("topic_unique") && !json.contains("topic_debounce"));
    for bad in [
        "unique: {key: report, for: 1h}",
        "unique: {for: forever}",
        "unique: {key: payload}",
        "debounce: {wait: 5s, max_wait: 1s}",
        "debounce: {wait: 5s, extra: 1}",
    ] {
        let text =
            format!("topics:\n  job.x:\n    pools: default\n    {bad}\npools:\n  default: {{}}\n");
        let refused = match parse_pools(&text) {
            Err(_) => true,
            Ok(p) => {
                let mut r = Rules::default();
                p.apply_to(&mut r);
                r.validate().is_err()
            }
        };
        assert!(refused, "{bad}");
    }
}
