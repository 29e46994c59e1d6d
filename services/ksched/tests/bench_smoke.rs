//! The benchmark cannot rot: `ksched bench --smoke` runs every phase with tiny sizes against
//! the real broker and writes its report. No performance figure is asserted here (those are
//! printed by the full run and recorded in docs/performance.md); only that each was measured.

use std::process::Command;

use ksched_testkit::bootstrap_servers;
use serde_json::Value;

/// Runs `ksched bench` with `args` against the test broker; its table and its JSON report.
fn bench(args: &[&std::ffi::OsStr]) -> (String, Value) {
    let bootstrap = bootstrap_servers().unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bench.json");
    let run = Command::new(env!("CARGO_BIN_EXE_ksched"))
        .arg("bench")
        .args(args)
        .args(["--bootstrap-servers", &bootstrap, "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    let report = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    (stdout, report)
}

#[test]
fn the_smoke_benchmark_measures_every_phase() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let (stdout, r) = bench(&["--smoke".as_ref(), "--work-dir".as_ref(), work.as_os_str()]);
    assert!(
        stdout.contains("| ratio (jobs/s x records/job) / baseline |"),
        "{stdout}"
    );
    let positive = |path: &[&str]| {
        let v = path.iter().fold(&r, |v, k| match k.parse::<usize>() {
            Ok(i) => &v[i],
            Err(_) => &v[*k],
        });
        assert!(v.as_f64().is_some_and(|x| x > 0.0), "{path:?} = {v}");
    };
    positive(&["baseline", "records_per_sec"]);
    positive(&["saturation_small_history", "jobs_per_sec"]);
    positive(&["saturation_small_history", "kafka_records_per_job"]);
    positive(&["saturation_small_history", "processor_cpu_us_per_job"]);
    positive(&["saturation_small_history", "process_cpu_us_per_job"]);
    positive(&["large", "saturation_large_history", "jobs_per_sec"]);
    positive(&["large", "history_large", "rebuild_events_per_sec"]);
    positive(&["large", "recovery", "recovery_seconds"]);
    positive(&["large", "recovery", "first_decision_seconds"]);
    positive(&["ratio"]);
    positive(&["of_physical_limit"]);
    positive(&["turns", "0", "physical_limit_jobs_per_sec"]);
    // The machine's share is read from Linux's /proc: busy cores, the scheduler's own
    // threads (by name) and its deciding threads' wait for a core.
    if cfg!(target_os = "linux") {
        positive(&["saturation_small_history", "machine", "busy_cores"]);
        positive(&["saturation_small_history", "machine", "scheduler_cores"]);
        positive(&["saturation_small_history", "machine", "deciding_cores"]);
        positive(&["turns", "0", "pipe_busy_cores"]);
        assert!(
            stdout.contains("| the machine at saturation: busy cores;"),
            "{stdout}"
        );
        assert!(stdout.contains("| the machine at 50 % load |"), "{stdout}");
    }
    let levels = r["levels"].as_array().unwrap();
    assert_eq!(levels.len(), 3);
    // And at fixed rates, as users size a system: every job timed to its handler's start.
    let rates = r["rate_levels"].as_array().unwrap();
    let offered: Vec<f64> = (rates.iter())
        .map(|l| l["offered_jobs_per_sec"].as_f64().unwrap())
        .collect();
    assert_eq!(offered, [250.0, 1_000.0, 2_500.0]);
    assert!(stdout.contains("| at 1000 jobs/s ("), "{stdout}");
    for l in levels.iter().chain(rates) {
        let jobs = l["jobs"].as_u64().unwrap();
        assert_eq!(
            l["submit_to_handler_ms"]["samples"].as_u64(),
            Some(jobs),
            "{l}"
        );
        assert!(l["submit_to_dispatch_ms"]["samples"].as_u64().unwrap() > 0);
        assert!(
            l["submit_to_completed_ms"]["p99"].as_f64().unwrap()
                >= l["submit_to_completed_ms"]["p50"].as_f64().unwrap()
        );
    }
}

/// `ksched bench --shards 1,2 --smoke`: one instance holding 1, then 2 shards, each measured
/// with its jobs spread over the shards; every count reports throughput and CPU per job.
#[test]
fn the_shards_benchmark_measures_every_shard_count() {
    let (stdout, r) = bench(&["--smoke", "--shards", "1,2"].map(std::ffi::OsStr::new));
    assert!(
        stdout.contains("| shards | jobs/s at saturation"),
        "{stdout}"
    );
    let runs = r.as_array().unwrap();
    let shards: Vec<u64> = runs.iter().map(|x| x["shards"].as_u64().unwrap()).collect();
    assert_eq!(shards, [1, 2]);
    for x in runs {
        for k in [
            "jobs_per_sec",
            "processor_cpu_us_per_job",
            "process_cpu_us_per_job",
        ] {
            let v = &x["saturation"][k];
            assert!(v.as_f64().is_some_and(|v| v > 0.0), "{k} = {v}");
        }
    }
}

#[test]
fn the_timers_benchmark_releases_and_fires_everything() {
    let (_, r) = bench(&[
        "--timers".as_ref(),
        "3000".as_ref(),
        "--timers-window-secs".as_ref(),
        "3".as_ref(),
        "--timers-schedules".as_ref(),
        "300".as_ref(),
    ]);
    // The bench itself fails unless every job was released and every schedule fired.
    assert_eq!(r["delayed_jobs"], 3000);
    assert_eq!(r["firings"], 300);
    assert!(
        r["release_late_ms_max"].as_i64().is_some_and(|ms| ms < 100),
        "{r}"
    );
    assert!(
        r["rss_waiting_mib"].as_f64().is_some_and(|m| m > 0.0),
        "{r}"
    );
}

#[test]
fn the_rates_benchmark_times_every_job_of_every_rate_to_its_handler() {
    let args = [
        "--smoke",
        "--rates",
        "40,120",
        "--submit-linger-ms",
        "0",
        "--journal-positions-min-batch",
        "3",
    ];
    let (stdout, r) = bench(&args.map(std::ffi::OsStr::new));
    // The settings it ran with are in the report.
    assert_eq!(r["fleet"]["submit_linger_ms"], 0, "{r}");
    assert_eq!(r["journal_positions_min_batch"], 3, "{r}");
    let levels = r["levels"].as_array().unwrap_or_else(|| panic!("{r}"));
    assert_eq!(levels.len(), 2, "{r}");
    for (level, rate) in levels.iter().zip([40.0, 120.0]) {
        assert_eq!(level["offered_jobs_per_sec"], rate, "{level}");
        // 1.5 s at the rate, rounded up: every job reached a handler and was timed there.
        let jobs = level["jobs"].as_u64().unwrap();
        assert_eq!(jobs, (rate * 1.5f64).ceil() as u64, "{level}");
        assert_eq!(level["submit_to_handler_ms"]["samples"], jobs, "{level}");
        assert_eq!(level["submit_to_dispatch_ms"]["samples"], jobs, "{level}");
        assert!(
            level["phase_ms_per_batch"]["deliveries"]
                .as_f64()
                .is_some_and(|ms| ms > 0.0),
            "{level}"
        );
        assert!(
            stdout.contains(&format!("{rate:.0} jobs/s offered")),
            "{stdout}"
        );
        // The slowest jobs, slowest first, none faster than the p999; each one's steps add
        // up to its total.
        let slowest = level["slowest_to_handler"].as_array().unwrap();
        assert_eq!(slowest.len(), 3, "{level}");
        let totals: Vec<f64> = slowest
            .iter()
            .map(|j| j["total_ms"].as_f64().unwrap())
            .collect();
        assert!(totals.windows(2).all(|w| w[0] >= w[1]), "{totals:?}");
        let p999 = level["submit_to_handler_ms"]["p999"].as_f64().unwrap();
        assert!(totals[0] >= p999, "{totals:?} against p999 {p999}");
        for j in slowest {
            let steps: f64 = ["to_log_ms", "deciding_ms", "committing_ms", "to_handler_ms"]
                .iter()
                .map(|k| j[*k].as_f64().unwrap_or_else(|| panic!("{k}: {j}")))
                .sum();
            let total = j["total_ms"].as_f64().unwrap();
            assert!((steps - total).abs() < 1e-6, "{steps} against {total}: {j}");
        }
    }
}

#[test]
fn the_rates_benchmark_refuses_rates_it_cannot_offer() {
    for bad in ["nan", "0.5", "0", "50001", "-3"] {
        let run = Command::new(env!("CARGO_BIN_EXE_ksched"))
            .args([
                "bench",
                "--bootstrap-servers",
                "127.0.0.1:1",
                "--rates",
                bad,
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{bad}: {stderr}");
        assert!(
            stderr.contains("--rates") || stderr.contains("unexpected argument"),
            "{bad}: {stderr}"
        );
    }
}

#[test]
fn the_fan_out_benchmark_releases_every_dependent_in_bounded_entries() {
    let (_, r) = bench(&["--fan-out".as_ref(), "1500".as_ref()]);
    // The bench itself fails unless every dependent was released.
    assert_eq!(r["released"], 1500);
    // 100 dependents told an entry at most: the release is cut into continuations.
    assert!(r["entries"].as_u64().is_some_and(|n| n >= 15), "{r}");
}

#[test]
fn the_fan_in_benchmark_runs_the_callback_once_with_every_members_count() {
    let (_, r) = bench(&["--fan-in".as_ref(), "2500".as_ref()]);
    // The bench itself fails unless the callback was dispatched with the right counts.
    assert_eq!(r["members"], 2500, "{r}");
    assert_eq!(r["succeeded"], 2500, "{r}");
    assert!(
        r["callback_entries"].as_u64().is_some_and(|n| n >= 2),
        "{r}"
    );
}

#[test]
fn the_timers_dispatch_benchmark_runs_every_delayed_job_and_none_early() {
    let (_, r) = bench(&[
        "--timers-dispatch".as_ref(),
        "300".as_ref(),
        "--timers-window-secs".as_ref(),
        "2".as_ref(),
        "--tick-interval-ms".as_ref(),
        "200".as_ref(),
    ]);
    // The bench fails unless every job ran; each was timed, and none dispatched early.
    assert_eq!(r["jobs"], 300, "{r}");
    assert_eq!(r["early"], 0, "{r}");
    assert_eq!(r["due_to_dispatch_visible_ms"]["samples"], 300, "{r}");
    assert_eq!(r["due_to_decided_ms"]["samples"], 300, "{r}");
}

#[test]
fn the_flow_benchmark_runs_the_same_jobs_with_and_without_key_limits() {
    let (_, r) = bench(&["--smoke", "--flow-keys", "50"].map(std::ffi::OsStr::new));
    // The bench fails unless every job of both runs completed.
    assert_eq!(r["keys"], 50, "{r}");
    assert_eq!(r["limit"], 1, "{r}");
    assert_eq!(r["unlimited"]["jobs"], r["limited"]["jobs"], "{r}");
    assert!(r["ratio"].as_f64().is_some_and(|x| x > 0.0), "{r}");
}

#[test]
fn the_saturation_beside_benchmark_queues_the_whole_backlog_first() {
    // Past the lanes' windows (10 tenants x 101): records in RocksDB.
    let (_, r) = bench(&["--smoke", "--saturation-beside", "3000"].map(std::ffi::OsStr::new));
    // The bench fails unless the backlog was queued and every measured job completed.
    assert_eq!(r["backlog"], 3000, "{r}");
    assert_eq!(r["empty"]["jobs"], r["beside"]["jobs"], "{r}");
    assert!(r["ratio"].as_f64().is_some_and(|x| x > 0.0), "{r}");
}

#[test]
fn the_fair_share_benchmark_places_a_small_tenant_ahead_of_a_large_backlog() {
    let args = [
        "--smoke",
        "--fair-share",
        "1000",
        "--workers",
        "2",
        "--worker-slots",
        "4",
        "--fair-share-work-ms",
        "10",
    ];
    let (_, r) = bench(&args.map(std::ffi::OsStr::new));
    let behind = &r["behind"];
    // The bench fails unless every job completed. Fair share places the small tenant's
    // jobs while most of the large backlog still waits (queue order would place them
    // after all of it).
    assert_eq!(behind["small_jobs"], 100, "{r}");
    assert!(
        behind["large_waiting_then"].as_u64().is_some_and(|n| n > 0),
        "{r}"
    );
    let w = &r["weighted"];
    let (h, l) = (
        w["heavy_dispatched"].as_u64(),
        w["light_dispatched"].as_u64(),
    );
    assert!(h.is_some_and(|h| h > 0) && l.is_some_and(|l| l > 0), "{r}");
}
