#!/usr/bin/env bash
# ksched in one command: installs build dependencies on a fresh machine, builds, and runs
# `ksched dev` (in-memory Kafka, the scheduler, demo workers and demo jobs). Arguments go to
# `ksched dev` (e.g. `bash scripts/dev.sh --duration 60`, `--bootstrap-servers 127.0.0.1:9092`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
# Built as `cargo test --workspace` (scripts/test.sh) builds: the whole workspace resolves
# dependency features one way, so the second command reuses this build (rocksdb and
# librdkafka compile once). `cargo run -p ksched` resolved them differently and the tests
# compiled rocksdb a second time.
cargo build --locked --workspace --bins
exec "$CARGO_TARGET_DIR/debug/ksched" dev "$@"
