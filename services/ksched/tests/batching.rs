//! Adaptive batching (`processor.adaptive_batching`, on by default): a batch commits as soon
//! as the input consumer has nothing more at hand, not when `commit_interval_ms` runs out.
//! With a 20 s interval, a job needs two batches (its submission, its JobResult; a job
//! longer than the worker's start report delay a third, for JobStarted): it can succeed
//! within 10 s only if batches close early. The interval is the upper bound
//! under load, which other tests exercise.

mod common;

use std::time::Duration;

use common::*;
use ksched_worker::{Outcome, Worker};
use rdkafka::ClientConfig;
use rdkafka::producer::{BaseProducer, Producer};
use tokio_util::sync::CancellationToken;

#[test]
fn a_lone_input_is_committed_without_waiting_out_the_commit_interval() {
    let c = RunningScheduler::start_with_processor(
        "  commit_interval_ms: 20000\n  transaction_timeout_ms: 600000\n  input_stall_ms: 120000\n",
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let stop = CancellationToken::new();
    {
        let _guard = rt.enter();
        let worker = Worker::new(c.worker_config("w-1")).unwrap();
        let stop = stop.clone();
        rt.spawn(async move { worker.run(|_| async { Outcome::succeeded() }, stop).await });
    }
    wait_until("the worker to be known", 30, || {
        http(&format!("{}/api/v1/workers", c.api), "GET", None)
            .is_ok_and(|(_, body)| body.contains("w-1"))
    });
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &c.bootstrap)
        .create()
        .unwrap();
    submit(&producer, &c.job_topic, "acme:lone-1");
    producer.flush(Duration::from_secs(10)).unwrap();
    // Two batches of 20 s each would take 40 s.
    wait_until(
        "the job to succeed long before one commit interval",
        10,
        || job_state(&c.api, "acme:lone-1").as_deref() == Some("SUCCEEDED"),
    );
    stop.cancel();
}
