#!/usr/bin/env bash
# The fault suite (docs/reliability.md): installs what it needs (toxiproxy, the Python worker's
# venv), builds, and runs `ksched-chaos` (its own binary, not part of the product) against brokers it starts on ports 29092 and up.
# Arguments go to `ksched-chaos`: `--short` (what CI runs), `--faults kill,poison`,
# `--update-docs` (writes the results table into docs/reliability.md), `--keep`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
# Built like the tests (the whole workspace: `-p ksched` alone resolves features differently
# and rebuilds RocksDB and librdkafka).
cargo build --workspace --locked
exec "${CARGO_TARGET_DIR:-target}/debug/ksched-chaos" --repo . "$@"
