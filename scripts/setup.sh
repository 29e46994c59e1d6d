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
#   toxiproxy (go install) the fault suite's network faults (ksched-chaos)
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
  # The Python example worker (and its test) needs confluent-kafka, fastavro and cryptography: a venv
  # outside the clone, reused between runs.
  local venv="$HOME/.cache/ksched/venv"
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import confluent_kafka.schema_registry.avro, fastavro, cryptography" 2>/dev/null; then
    echo "setup: installing the Python worker's packages into $venv" >&2
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q --require-hashes -r "$here/examples/python-worker/requirements.txt"
  fi
  export KSCHED_PYTHON="$venv/bin/python"
  # The fault suite's network faults go through toxiproxy (a Go program): built once with
  # `go install` into ~/.cache/ksched/bin. Without Go the suite skips those faults (and fails
  # under CI=true).
  local bin="$HOME/.cache/ksched/bin" tool
  if command -v go >/dev/null 2>&1; then
    # The server, and its CLI to look at or drive the proxies by hand (`bash scripts/chaos.sh --keep`).
    for tool in server cli; do
      [ -x "$bin/toxiproxy-$tool" ] && continue
      echo "setup: installing toxiproxy-$tool into $bin" >&2
      mkdir -p "$bin"
      GOBIN="$bin" go install "github.com/Shopify/toxiproxy/v2/cmd/$tool@v2.5.0" >&2
      mv "$bin/$tool" "$bin/toxiproxy-$tool"
    done
  fi
  # Builds of rocksdb and librdkafka take ~15 minutes cold; keep them outside the clone so
  # fresh clones and CI reruns reuse them.
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ksched/target}"
}

# The console's browser test (services/ksched/tests/console.rs) drives headless Chromium
# through chromedriver, both from Debian. Only the tests need them (scripts/test.sh).
ksched_setup_browser() {
  command -v chromedriver >/dev/null 2>&1 && [ -x /usr/bin/chromium ] && return 0
  echo "setup: installing chromium and chromium-driver (the console's browser test)" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium chromium-driver >/dev/null
}

ksched_setup
