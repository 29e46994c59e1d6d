#!/usr/bin/env bash
# ksched in one command: installs build dependencies on a fresh machine, builds, and runs
# `ksched dev` (in-memory Kafka, the scheduler, demo workers and demo jobs). Arguments go to
# `ksched dev` (e.g. `bash scripts/dev.sh --duration 60`, `--bootstrap-servers 127.0.0.1:9092`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
exec cargo run --locked -p ksched -- dev "$@"
