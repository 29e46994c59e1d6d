#!/usr/bin/env bash
# Runs every test of ksched against a real Apache Kafka broker, on a fresh machine too:
# installs build dependencies, starts the local broker (deploy/kafka.sh) unless
# KAFKA_BOOTSTRAP_SERVERS points at one and the Schema Registry (deploy/registry.sh) unless
# KSCHED_SCHEMA_REGISTRY_URL points at one, runs `cargo test --workspace`, and stops what it
# started. Extra arguments go to `cargo test` (e.g. `bash scripts/test.sh -p ksched-core`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
ksched_setup_browser

started_broker=""
if [ -z "${KAFKA_BOOTSTRAP_SERVERS:-}" ]; then
  if ! deploy/kafka.sh status 2>/dev/null; then
    deploy/kafka.sh start
    started_broker=yes
  fi
  export KAFKA_BOOTSTRAP_SERVERS="127.0.0.1:${KSCHED_KAFKA_PORT:-9092}"
fi
# The Schema Registry tests (services/ksched/tests/registry.rs) need a real registry:
# Apicurio (deploy/registry.sh), unless KSCHED_SCHEMA_REGISTRY_URL points at one.
started_registry=""
if [ -z "${KSCHED_SCHEMA_REGISTRY_URL:-}" ]; then
  if ! deploy/registry.sh status >/dev/null 2>&1; then
    deploy/registry.sh start
    started_registry=yes
  fi
  KSCHED_SCHEMA_REGISTRY_URL=$(deploy/registry.sh url)
  export KSCHED_SCHEMA_REGISTRY_URL
fi
cleanup() {
  if [ -n "$started_registry" ]; then deploy/registry.sh stop; fi
  if [ -n "$started_broker" ]; then deploy/kafka.sh stop; fi
}
trap cleanup EXIT

echo "test: broker at $KAFKA_BOOTSTRAP_SERVERS, schema registry at $KSCHED_SCHEMA_REGISTRY_URL" >&2
cargo test --workspace --locked "$@"
