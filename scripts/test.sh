#!/usr/bin/env bash
# Runs every test of ksched against a real Apache Kafka broker, on a fresh machine too:
# installs build dependencies, starts the local broker (deploy/kafka.sh) unless
# KAFKA_BOOTSTRAP_SERVERS points at one, runs `cargo test --workspace`, and stops the broker
# it started. Extra arguments go to `cargo test` (e.g. `bash scripts/test.sh -p ksched-core`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

started_broker=""
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  if ! deploy/kafka.sh status 2>/dev/null; then
    deploy/kafka.sh start
    started_broker=yes
  fi
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:${KSCHED_KAFKA_PORT:-9092}"
fi
cleanup() {
  if [ -n "$started_broker" ]; then deploy/kafka.sh stop; fi
}
trap cleanup EXIT

echo "test: broker at $KAFKA_BOOTSTRAP_SERVERS" >&2
cargo test --workspace --locked "$@"
