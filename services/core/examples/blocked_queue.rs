//! The work one input costs when a pool's queue holds many jobs that cannot be placed while
//! workers are free: a scheduling pass per heartbeat and Tick over that queue. Two queues:
//! jobs held by their tenant's limit (one lane: one look per pass), and jobs each asking for
//! a label no worker has (a lane each), with the bound on the lanes a pass holds
//! (`limits.max_scan_per_entry`, default 100) and without it. A figure to compare before and
//! after a change, not a test.
//!
//! ```text
//! cargo run --release -p ksched-core --example blocked_queue [blocked_jobs] [inputs]
//! ```

use std::time::Instant;

use ksched_core::decide::{Ctx, process};
use ksched_core::events::{Cause, Input, Reconfigure};
use ksched_core::policy::AllowAll;
use ksched_core::records::{Heartbeat, JobRequest, Tick};
use ksched_core::rules::{PoolRules, Rules, TenantRules};
use ksched_core::state::State;

fn input(state: &mut State, offset: &mut i64, now: i64, input: Input) {
    let cause = Cause {
        topic: "job.default".into(),
        partition: 0,
        offset: *offset,
    };
    *offset += 1;
    let ctx = Ctx { policy: &AllowAll };
    let mut p = process(state, &ctx, cause.clone(), now, input);
    while p.more {
        p = process(
            state,
            &ctx,
            cause.clone(),
            now,
            ksched_core::decide::continuation(state),
        );
    }
}

/// Microseconds per input (a heartbeat or a Tick, each a pass over the queue).
fn run(blocked: usize, inputs: usize, max_scan: u32, distinct_labels: bool) -> f64 {
    let mut rules = Rules::default();
    rules
        .topics
        .insert("job.default".into(), vec!["default".into()]);
    rules.pools.insert("default".into(), PoolRules::default());
    rules.tenants.insert(
        "acme".into(),
        TenantRules {
            max_concurrent_jobs: Some(1),
            max_pending_jobs: None,
            weight: None,
        },
    );
    rules.limits.max_pending_per_pool = i64::MAX;
    // The backlog builds under the default bound (unbounded, each submission walks it).
    let json = rules.to_canonical_json();
    rules.limits.max_scan_per_entry = max_scan;
    let measured = rules.to_canonical_json();
    let mut state = State::new();
    let mut offset = 0;
    let now = 1_700_000_000_000;
    input(
        &mut state,
        &mut offset,
        now,
        Input::Reconfigure(Reconfigure {
            rules_json: json,
            rules_id: "r".into(),
            ..Default::default()
        }),
    );
    let beat = |id: &str| Heartbeat {
        worker_id: id.into(),
        pool: "default".into(),
        max_parallel_jobs: 1_000,
        owned_partitions: vec![0],
        ..Default::default()
    };
    input(&mut state, &mut offset, now, Input::Heartbeat(beat("w1")));
    for i in 0..=blocked {
        let mut job = JobRequest {
            job_id: format!("acme-{i:07}"),
            topic: "job.default".into(),
            tenant_id: "acme".into(),
            ..Default::default()
        };
        if distinct_labels {
            job.labels
                .insert("placement.zone".into(), format!("nowhere-{i}"));
        }
        input(&mut state, &mut offset, now, Input::Submit(job));
    }
    input(
        &mut state,
        &mut offset,
        now,
        Input::Reconfigure(Reconfigure {
            rules_json: measured,
            rules_id: "measured".into(),
            ..Default::default()
        }),
    );
    let queued = state.queued.get("default").map_or(0, |n| *n as usize);
    assert!(queued >= blocked, "only {queued} jobs queued");
    let started = Instant::now();
    for i in 0..inputs {
        let t = now + i as i64;
        let next = if i % 2 == 0 {
            Input::Heartbeat(beat("w1"))
        } else {
            Input::Tick(Tick {
                source: "bench".into(),
                issued_at: t,
                watermark: Some(t),
            })
        };
        input(&mut state, &mut offset, t, next);
    }
    started.elapsed().as_secs_f64() * 1e6 / inputs as f64
}

fn main() {
    let mut args = std::env::args().skip(1);
    let blocked: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(100_000);
    let inputs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(200);
    println!("{blocked} queued jobs none can place, {inputs} heartbeats and Ticks:");
    for (queue, distinct) in [
        ("held by their tenant's limit", false),
        ("each asking for a label no worker has", true),
    ] {
        for (name, bound) in [("bounded (default 100)", 100), ("unbounded", u32::MAX)] {
            let us = run(blocked, inputs, bound, distinct);
            println!("  {queue:>38}, {name:>21}: {us:>10.1} us per input");
        }
    }
}
