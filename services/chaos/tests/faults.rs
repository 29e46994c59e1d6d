//! The fault suite's short run (docs/reliability.md): `ksched-chaos --short` injects faults
//! against brokers it starts itself and judges the run (no job lost, stuck, dispatched twice
//! or ended twice, no live worker declared lost, the expected dead letters written, workers
//! that stop when asked). This test requires that each fault it runs passed; under
//! `CI=true` a fault skipped for want of a tool (toxiproxy, root for the tmpfs) fails it too.
//! Every fault of the suite runs here, in its short version.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The faults CI runs: all of them.
const RUN: [&str; 7] = [
    "kill",
    "broker-restart",
    "broker-kill",
    "network",
    "two-instances",
    "disk-full",
    "poison",
];

#[test]
fn every_fault_of_the_short_suite_passes() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("chaos.json");
    // The product binary the suite runs: cargo builds it beside this package's binary when
    // the whole workspace is tested (scripts/test.sh).
    let chaos = Path::new(env!("CARGO_BIN_EXE_ksched-chaos"));
    let ksched = chaos.with_file_name("ksched");
    assert!(
        ksched.is_file(),
        "no {}: test the whole workspace (`cargo test --workspace`) or `cargo build -p ksched` first",
        ksched.display()
    );
    let run = Command::new(chaos)
        .args(["--short", "--faults", &RUN.join(","), "--repo"])
        .arg(&repo)
        .arg("--ksched")
        .arg(&ksched)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stdout}\n{stderr}");
    // The suite's table, for `cargo test --test faults -- --nocapture`.
    println!("{stdout}");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let verdicts = r["verdicts"].as_array().unwrap();
    let names: Vec<&str> = verdicts
        .iter()
        .map(|v| v["fault"].as_str().unwrap())
        .collect();
    assert_eq!(names, RUN);
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    for v in verdicts {
        let skipped = v["skipped"].as_bool().unwrap();
        assert!(
            v["passed"].as_bool().unwrap() || (skipped && !ci),
            "{v}\n{stdout}"
        );
        if !skipped {
            assert!(v["jobs"].as_u64().unwrap() > 0, "{v}");
            assert_eq!(v["lost"], 0, "{v}");
            assert_eq!(v["dispatched_twice"], 0, "{v}");
        }
    }
}
