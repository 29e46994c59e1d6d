use std::time::Duration;

use prometheus::Counter;

use super::assignment::input_consumer_config;
use super::transaction::{Acks, Caller, PROCESSOR_LINGER_MS, transactional_producer_config};
use super::*;
use crate::clock::wall_clock_ms;
use crate::settings::Settings;

/// A Reconfigure is decided at scheduler time, never at the host's: a host clock ahead
/// of the broker would move every timer judged after it.
#[test]
fn a_reconfigure_is_decided_at_the_schedulers_time_not_the_hosts() {
    let mut state = State::new();
    state.clock = 1_000;
    assert_eq!(reconfigure_time(&state), 1_000);
    assert!(
        wall_clock_ms() > 1_000_000,
        "the host's clock is not what decides"
    );
}

/// The transaction's end waits until the reports catch up with the sends: not before
/// (a record sent and not reported keeps it waiting until its deadline), and it is woken
/// by the report that catches up, from the thread that serves them.
#[test]
fn waiting_for_acknowledgements_ends_with_the_last_report() {
    let acks = Arc::new(Acks::default());
    assert!(
        acks.wait(Instant::now()),
        "nothing sent: nothing to wait for"
    );
    acks.sent();
    acks.sent();
    acks.reported();
    assert!(
        !acks.wait(Instant::now() + Duration::from_millis(50)),
        "one of two records is not reported on"
    );
    let reporter = {
        let acks = acks.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            acks.reported();
        })
    };
    assert!(
        acks.wait(Instant::now() + Duration::from_secs(30)),
        "the last report ends the wait"
    );
    reporter.join().unwrap();
    // Reports of records sent later (the next transaction) are waited for in turn.
    acks.sent();
    assert!(!acks.wait(Instant::now() + Duration::from_millis(20)));
    acks.reported();
    assert!(acks.wait(Instant::now()));
}

/// A call that librdkafka does not return from is given up on after its limit, and the
/// processor thread is free again (before, it waited forever in
/// send_offsets_to_transaction after a broker holding a coordinator was killed).
#[test]
fn a_transactional_call_that_hangs_is_given_up_on() {
    let caller = Caller::start(cpu_counter()).unwrap();
    let seven = caller.run(|| 7).unwrap();
    assert_eq!(seven.recv_timeout(Duration::from_secs(5)).ok(), Some(7));
    let started = Instant::now();
    let hung = caller
        .run(|| std::thread::sleep(Duration::from_secs(3)))
        .unwrap();
    assert!(hung.recv_timeout(Duration::from_millis(200)).is_err());
    assert!(started.elapsed() < Duration::from_secs(2));
}

/// Settings whose `kafka.properties` are `props`.
fn settings_with(props: &[(&str, &str)]) -> Settings {
    let mut settings = Settings::default();
    for (k, v) in props {
        settings
            .kafka
            .properties
            .insert((*k).to_owned(), (*v).to_owned());
    }
    settings
}

/// An idle input fetch waits 500 ms at the broker unless the client properties say
/// otherwise (before, 10 ms, and the processor set it after the properties).
#[test]
fn an_idle_input_fetch_waits_half_a_second_unless_the_properties_say() {
    let wait = |props: &[(&str, &str)]| {
        let cfg = input_consumer_config(&settings_with(props), "g");
        assert_eq!(cfg.get("isolation.level"), Some("read_committed"));
        assert_eq!(cfg.get("group.id"), Some("g"));
        cfg.get("fetch.wait.max.ms").map(str::to_owned)
    };
    assert_eq!(wait(&[]), Some("500".to_owned()));
    assert_eq!(wait(&[("fetch.wait.max.ms", "50")]), Some("50".to_owned()));
}

/// The processor's producer lingers 2 ms unless the client properties say otherwise
/// (before, its `linger.ms` could not be changed: the processor set it after the
/// properties).
#[test]
fn the_transactional_producer_lingers_as_the_properties_say() {
    let linger = |props: &[(&str, &str)]| {
        let settings = settings_with(props);
        let cfg = transactional_producer_config(&settings, "ksched-journal-0", "c");
        (
            cfg.get("linger.ms").map(str::to_owned),
            cfg.get("transactional.id").map(str::to_owned),
        )
    };
    let id = Some("ksched-journal-0".to_owned());
    assert_eq!(
        linger(&[]),
        (Some(PROCESSOR_LINGER_MS.to_owned()), id.clone())
    );
    assert_eq!(
        linger(&[("linger.ms", "0.5")]),
        (Some("0.5".to_owned()), id.clone())
    );
    assert_eq!(
        linger(&[("queue.buffering.max.ms", "5")]),
        (None, id.clone())
    );
    // What the processor needs is not the properties' to change.
    assert_eq!(linger(&[("transactional.id", "other")]).1, id);
}

fn cpu_counter() -> Counter {
    Counter::new("cpu", "test").unwrap()
}

/// The transaction thread's CPU is the processor's: it serves the delivery reports and
/// the commit calls that the deciding thread once made itself (before, it went
/// uncounted, and processor CPU per job looked smaller than it was).
#[test]
fn the_transaction_threads_cpu_is_counted_as_the_processors() {
    let cpu = cpu_counter();
    let caller = Caller::start(cpu.clone()).unwrap();
    let worked = caller
        .run(|| {
            let clock0 = crate::metrics::thread_cpu_seconds().unwrap();
            let mut x = 0u64;
            while crate::metrics::thread_cpu_seconds().unwrap() - clock0 < 0.03 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            x
        })
        .unwrap();
    assert!(worked.recv_timeout(Duration::from_secs(10)).is_ok());
    // The count is added after the call has sent its result: wait for it briefly.
    let until = Instant::now() + Duration::from_secs(5);
    while cpu.get() < 0.03 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        cpu.get() >= 0.03,
        "{} s counted for 30 ms of work",
        cpu.get()
    );
}
