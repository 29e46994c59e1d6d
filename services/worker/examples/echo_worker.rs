//! An example worker: runs every job of its pool by sleeping for the job's `sleep_ms` label
//! (default 100 ms) while reporting progress, then succeeds with the payload echoed as the
//! result pointer. A label `fail=retryable` or `fail=fatal` makes it fail instead.
//!
//! cargo run -p ksched-worker --example echo_worker -- <bootstrap> <pool> <worker-id> [prefix]
//!     [-X key=value]... [--command-config client.properties] [--keyring FILE]
//!
//! `--keyring FILE` (or `KSCHED_KEYRING`) opens jobs' sealed secrets and payloads
//! (docs/security.md#secrets); a sealed payload is echoed opened.
//!
//! `-X` and `--command-config` set librdkafka properties as Kafka's own tools take them, e.g.
//! `-X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512 ...` (docs/security.md).

use std::time::Duration;

use ksched_core::properties::{parse_properties, parse_property};
use ksched_worker::{Outcome, Worker, WorkerConfig};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> Result<(), ksched_worker::Error> {
    let (args, properties, keyring) = match split_args(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("echo_worker: {e}");
            std::process::exit(2);
        }
    };
    let bootstrap = args.first().map_or("127.0.0.1:9092", String::as_str);
    let pool = args.get(1).map_or("default", String::as_str);
    let id = args.get(2).map_or("echo-1", String::as_str);
    let mut config = WorkerConfig::new(bootstrap, id, pool).with_properties(properties);
    if let Some(prefix) = args.get(3) {
        config.topic_prefix = prefix.clone();
    }
    if let Some(path) = keyring.or_else(|| std::env::var_os("KSCHED_KEYRING").map(Into::into)) {
        config = config.with_keyring(&path)?;
    }
    let shutdown = CancellationToken::new();
    let on_signal = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        eprintln!("draining: running jobs finish, nothing new starts");
        on_signal.cancel();
    });
    eprintln!("{id}: serving pool {pool} at {bootstrap} (Ctrl-C to drain and stop)");
    Worker::new(config)?
        .run(
            |job| async move {
                let labels = &job.dispatch.job.labels;
                let sleep_ms: u64 = labels
                    .get("sleep_ms")
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(100);
                for step in 1..=4u32 {
                    tokio::select! {
                        _ = job.cancel.cancelled() => return Outcome::Cancelled,
                        _ = tokio::time::sleep(Duration::from_millis(sleep_ms / 4)) => {}
                    }
                    job.progress(f64::from(step) / 4.0, "").await;
                }
                match labels.get("fail").map(String::as_str) {
                    Some("retryable") => Outcome::retryable("echo_retryable", "asked to fail"),
                    Some("fatal") => Outcome::fatal("echo_fatal", "asked to fail for good"),
                    _ => Outcome::Succeeded {
                        result_ptr: Some(format!(
                            "inline:{}",
                            String::from_utf8_lossy(job.payload())
                        )),
                        meta: Default::default(),
                    },
                }
            },
            shutdown,
        )
        .await
}

/// Librdkafka properties, in the order they apply.
type Properties = Vec<(String, String)>;

/// Positional arguments, the properties of `--command-config FILE` then `-X key=value`, and
/// `--keyring FILE`.
fn split_args(
    args: impl Iterator<Item = String>,
) -> Result<(Vec<String>, Properties, Option<std::path::PathBuf>), String> {
    let mut positional = Vec::new();
    let mut keyring = None;
    let (mut file, mut flags) = (Vec::new(), Vec::new());
    let mut args = args.peekable();
    while let Some(a) = args.next() {
        match a.as_str() {
            "-X" | "--property" => {
                let kv = args.next().ok_or("-X needs key=value")?;
                flags.push(parse_property(&kv)?);
            }
            "--command-config" => {
                let path = args.next().ok_or("--command-config needs a file")?;
                let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
                file = parse_properties(&text).map_err(|e| format!("{path}: {e}"))?;
            }
            "--keyring" => keyring = Some(args.next().ok_or("--keyring needs a file")?.into()),
            _ => positional.push(a),
        }
    }
    file.extend(flags);
    Ok((positional, file, keyring))
}
