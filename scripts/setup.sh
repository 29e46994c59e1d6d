#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test ksched. Idempotent and quiet
# when everything is there. Sourced by scripts/test.sh, scripts/dev.sh and .ci/run.
#
#   libclang-dev          bindgen, for the rocksdb bindings
#   libcurl4-openssl-dev  librdkafka's OAUTHBEARER/OIDC token retrieval
#   libssl-dev            librdkafka's TLS and SASL SCRAM
#   libsasl2-dev          librdkafka's SASL GSSAPI (Kerberos) and PLAIN
#   libzstd-dev zlib1g-dev  gzip and zstd compressed records (lz4 and snappy are built in)
#   cmake, g++            librdkafka and rocksdb are built from source
#   java 17 + maven       the real Apache Kafka broker for tests (deploy/kafka.sh)
#   python3 venv          confluent-kafka + fastavro for the Python example worker
set -euo pipefail

ksched_setup() {
  local missing=()
  local pkg
  for pkg in libclang-dev libcurl4-openssl-dev libssl-dev libsasl2-dev libzstd-dev zlib1g-dev cmake g++ pkg-config; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null 2>&1 || missing+=(maven)
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  command -v cargo >/dev/null 2>&1 || {
    echo "setup: cargo not found; install Rust from https://rustup.rs (1.88 or newer)" >&2
    return 1
  }
  # The Python example worker (and its test) needs confluent-kafka and fastavro: a venv
  # outside the clone, reused between runs.
  local venv="$HOME/.cache/ksched/venv"
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import confluent_kafka, fastavro" 2>/dev/null; then
    echo "setup: installing the Python worker's packages into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q -r "$here/examples/python-worker/requirements.txt"
  fi
  export KSCHED_PYTHON="$venv/bin/python"
  # Builds of rocksdb and librdkafka take ~15 minutes cold; keep them outside the clone so
  # fresh clones and CI reruns reuse them.
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ksched/target}"
}

ksched_setup
