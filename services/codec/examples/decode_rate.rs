//! Decoding rate of journal entries and job requests, fast path against general path:
//! `cargo run --release -p ksched-codec --example decode_rate [rounds] [fast|general] [entry|request]`.
//! Under `valgrind --tool=callgrind` (one path at a time, rounds against 0 rounds) it counts
//! instructions per record, which the load on the machine does not change.
//!
//! The entries are the codec tests' samples: every input kind, each with the events a job's
//! life adds most often. Prints nanoseconds per record for each path.

#[allow(dead_code)]
#[path = "../tests/samples/mod.rs"]
mod samples;

use std::hint::black_box;
use std::time::Instant;

use ksched_codec::{Record, encode, registry};
use ksched_core::events::{Cause, DECISION_FORMAT, Event, JournalEntry};

fn rate<T: Record>(label: &str, records: &[Vec<u8>], rounds: usize, only: Option<&str>) {
    for (path, general) in [("fast", false), ("general", true)] {
        if only.is_some_and(|o| o != path) {
            continue;
        }
        let start = Instant::now();
        for _ in 0..rounds {
            for bytes in records {
                let v: T = if general {
                    registry().decode_general(bytes).unwrap()
                } else {
                    registry().decode(bytes).unwrap()
                };
                black_box(v);
            }
        }
        let per = start.elapsed().as_nanos() as f64 / (rounds * records.len()).max(1) as f64;
        println!("{label:<14} {path:<8} {per:>8.0} ns/record");
    }
}

fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000);
    let only = std::env::args().nth(2);
    let only = only.as_deref();
    let kind = std::env::args().nth(3);
    let kind = kind.as_deref();
    let common: Vec<Event> = samples::every_event()
        .into_iter()
        .filter(|e| {
            matches!(
                e,
                Event::JobAccepted(_) | Event::PolicyEvaluated(_) | Event::JobQueued(_)
            )
        })
        .collect();
    let entries: Vec<Vec<u8>> = samples::every_input()
        .into_iter()
        .enumerate()
        .map(|(i, input)| {
            encode(&JournalEntry {
                cause: Cause {
                    topic: "job.default".into(),
                    partition: 0,
                    offset: i as i64,
                },
                log_time: 1_700_000_000_000 + i as i64,
                input,
                events: common.clone(),
                format: DECISION_FORMAT,
            })
            .unwrap()
        })
        .collect();
    let requests = vec![encode(&samples::job_request()).unwrap()];
    let sizes: Vec<usize> = entries.iter().map(Vec::len).collect();
    println!(
        "journal entries of {sizes:?} bytes, a job request of {} bytes",
        requests[0].len()
    );
    if kind != Some("request") {
        rate::<JournalEntry>("journal entry", &entries, rounds, only);
    }
    if kind != Some("entry") {
        rate::<ksched_core::records::JobRequest>("job request", &requests, rounds * 10, only);
    }
}
