#!/usr/bin/env bash
# A real Apache Kafka 4.x broker (or a cluster of them) for development and tests, from Maven
# Central jars.
#
#   deploy/kafka.sh start [--brokers N]   provision (first time), format KRaft storage, start,
#                                         wait until every node answers
#   deploy/kafka.sh stop                  stop cleanly (SIGTERM, then SIGKILL after 30 s)
#   deploy/kafka.sh status                print whether it runs and where
#   deploy/kafka.sh provision             only download the jars ($KSCHED_KAFKA_HOME/jars)
#   deploy/kafka.sh reset                 stop and delete the data (jars stay)
#   deploy/kafka.sh logs [NODE]           follow a node's log
#   deploy/kafka.sh kill-node NODE        SIGKILL one node (fault tests)
#   deploy/kafka.sh stop-node NODE        stop one node cleanly
#   deploy/kafka.sh start-node NODE       start one node again and wait until it answers
#   deploy/kafka.sh start --secure        one node with TLS, SASL/SCRAM-SHA-512 and ACLs (below)
#   deploy/kafka.sh credentials           print where the secure node's CA and users' client
#                                         properties files are
#
# Secure mode (single node): the client listener is SASL_SSL with SCRAM-SHA-512, its
# certificate signed by a CA the script generates (openssl); the controller listener is
# SASL_PLAINTEXT with PLAIN; authorization is on (KRaft StandardAuthorizer, no ACL means
# no access) and only `admin` is a super user. One SCRAM user per role, with a random
# password, is created when the storage is formatted: admin, ksched (the processor),
# worker-default (a pool's workers), tenant-acme and tenant-globex (job producers), auditor.
# `credentials` names a librdkafka properties file per user (`-X`/`--command-config` for
# ksched and its workers); deploy/ksched-acls.py grants each role its ACLs
# (docs/security.md).
#
# Every node is both broker and controller (KRaft), listening on 127.0.0.1 only. One node
# (the default) has replication factor 1 for internal topics; with --brokers 3 the nodes form
# one controller quorum, internal topics have replication factor 3 and min.insync.replicas 2,
# so losing any one node loses nothing. Node i (1-based) listens on port + 10*(i-1), its
# controller on that + 1. Every command is idempotent: `start` on a running cluster only
# checks that it answers.
#
# Environment (defaults in brackets):
#   KSCHED_KAFKA_HOME        where jars, data and logs live [~/.cache/ksched/kafka]
#   KSCHED_KAFKA_PORT        first node's client port [9092]
#   KSCHED_KAFKA_BROKERS     nodes, as --brokers [1]
#   KSCHED_KAFKA_PROXY_PORT  single node only: also listen on port + 2 and advertise that
#                            listener as 127.0.0.1:<this port>, where a fault proxy
#                            (toxiproxy) forwards to port + 2. Clients that bootstrap there
#                            talk to the broker through the proxy; clients on the plain port
#                            do not. [none]
#   KAFKA_VERSION            Apache Kafka version from Maven Central [4.1.1]
#   KAFKA_HEAP_OPTS          JVM heap per node [-Xms256m -Xmx1g]; every node logs its
#                            garbage collections (pauses and their lengths) to
#                            <logs>/gc.log, so that a latency spike can be matched to
#                            a pause
#   KAFKA_GC_OPTS            JVM garbage collector per node
#                            [-XX:+UseG1GC -XX:MaxGCPauseMillis=20]
#   KSCHED_KAFKA_PROPERTIES  extra server.properties lines, appended to each node's
#                            (e.g. thread counts to compare) [none]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
home=${KSCHED_KAFKA_HOME:-$HOME/.cache/ksched/kafka}
base_port=${KSCHED_KAFKA_PORT:-9092}
brokers=${KSCHED_KAFKA_BROKERS:-1}
proxy_port=${KSCHED_KAFKA_PROXY_PORT:-}
secure=${KSCHED_KAFKA_SECURE:-}
version=${KAFKA_VERSION:-4.1.1}
jars="$home/jars/$version"
cluster_file="$home/cluster-$base_port.id"
nodes_file="$home/nodes-$base_port"
secure_dir="$home/secure-$base_port"
secure_users="admin ksched worker-default tenant-acme tenant-globex auditor"

say() { printf 'kafka.sh: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

cmd=${1:-}
[ $# -gt 0 ] && shift
node_arg=""
while [ $# -gt 0 ]; do
  case "$1" in
    --brokers) brokers=${2:?--brokers needs a number}; shift 2 ;;
    --brokers=*) brokers=${1#--brokers=}; shift ;;
    --secure) secure=1; shift ;;
    *) node_arg=$1; shift ;;
  esac
done
case "$brokers" in 1 | 3) ;; *) die "--brokers must be 1 or 3 (a controller quorum), got $brokers" ;; esac
if [ "$cmd" != start ] && [ -f "$nodes_file" ]; then
  # Other commands act on the cluster that was started on this port.
  brokers=$(cat "$nodes_file")
fi
[ -z "$proxy_port" ] || [ "$brokers" = 1 ] || die "KSCHED_KAFKA_PROXY_PORT works with one node only"
if [ "$cmd" != start ] && [ -f "$secure_dir/enabled" ]; then
  secure=1
fi
[ -z "$secure" ] || [ "$brokers" = 1 ] || die "--secure works with one node only"
[ -z "$secure" ] || [ -z "$proxy_port" ] || die "--secure and KSCHED_KAFKA_PROXY_PORT do not combine"

# Per-node names; `node N` sets them for node N.
node() {
  local i=$1
  port=$((base_port + 10 * (i - 1)))
  controller_port=$((port + 1))
  if [ "$brokers" = 1 ]; then
    data="$home/data-$port"
    logs="$home/logs-$port"
    pidfile="$home/broker-$port.pid"
    props="$home/server-$port.properties"
  else
    data="$home/data-$base_port-node$i"
    logs="$home/logs-$base_port-node$i"
    pidfile="$home/broker-$base_port-node$i.pid"
    props="$home/server-$base_port-node$i.properties"
  fi
  node_id=$i
}

all_nodes() { seq 1 "$brokers"; }

bootstrap() {
  local out="" i
  for i in $(all_nodes); do
    out="${out:+$out,}127.0.0.1:$((base_port + 10 * (i - 1)))"
  done
  printf '%s' "$out"
}

need_java() {
  command -v java >/dev/null 2>&1 ||
    die "java not found. Kafka ${version} needs Java 17 or newer (Debian: apt-get install -y openjdk-17-jre-headless)."
  local major
  major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n 1)
  [ -n "$major" ] && [ "$major" -ge 17 ] ||
    die "java ${major:-?} found, but Kafka ${version} needs Java 17 or newer."
}

provision() {
  if [ -f "$jars/.complete" ]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 ||
    die "mvn not found: it fetches the Kafka jars from Maven Central (Debian: apt-get install -y maven)."
  say "fetching Apache Kafka ${version} and its runtime dependencies from Maven Central into $jars"
  mkdir -p "$jars"
  mvn -q -B -f "$here/kafka/pom.xml" \
    -Dkafka.version="$version" \
    dependency:copy-dependencies \
    -DincludeScope=runtime \
    -DoutputDirectory="$jars" ||
    die "maven could not resolve org.apache.kafka:kafka_2.13:${version}; see the output above."
  touch "$jars/.complete"
}

pid_alive() {
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

port_open() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

write_properties() {
  mkdir -p "$data" "$logs"
  local voters="" i rf=1 min_isr=1
  for i in $(all_nodes); do
    voters="${voters:+$voters,}$i@127.0.0.1:$((base_port + 10 * (i - 1) + 1))"
  done
  if [ "$brokers" -ge 3 ]; then
    rf=3
    min_isr=2
  fi
  local listeners="PLAINTEXT://127.0.0.1:${port},CONTROLLER://127.0.0.1:${controller_port}"
  local advertised="PLAINTEXT://127.0.0.1:${port}"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [ -n "$proxy_port" ]; then
    listeners="$listeners,PROXIED://127.0.0.1:$((port + 2))"
    advertised="$advertised,PROXIED://127.0.0.1:${proxy_port}"
    protocols="$protocols,PROXIED:PLAINTEXT"
  fi
  local security=""
  if [ -n "$secure" ]; then
    listeners="SASL_SSL://127.0.0.1:${port},CONTROLLER://127.0.0.1:${controller_port}"
    advertised="SASL_SSL://127.0.0.1:${port}"
    protocols="SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
    local admin_pw
    admin_pw=$(cat "$secure_dir/admin.password")
    security="inter.broker.listener.name=SASL_SSL
sasl.mechanism.inter.broker.protocol=SCRAM-SHA-512
listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"${admin_pw}\";
sasl.mechanism.controller.protocol=PLAIN
listener.name.controller.sasl.enabled.mechanisms=PLAIN
listener.name.controller.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username=\"admin\" password=\"${admin_pw}\" user_admin=\"${admin_pw}\";
ssl.keystore.type=PEM
ssl.keystore.location=${secure_dir}/broker.pem
ssl.truststore.type=PEM
ssl.truststore.location=${secure_dir}/ca.pem
ssl.client.auth=none
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:admin
allow.everyone.if.no.acl.found=false"
  else
    security="inter.broker.listener.name=PLAINTEXT"
  fi
  cat >"$props" <<EOF
# Generated by deploy/kafka.sh; edits are overwritten on the next start.
process.roles=broker,controller
node.id=${node_id}
controller.quorum.voters=${voters}
listeners=${listeners}
advertised.listeners=${advertised}
controller.listener.names=CONTROLLER
listener.security.protocol.map=${protocols}
${security}
log.dirs=${data}
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=false
offsets.topic.replication.factor=${rf}
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=${rf}
transaction.state.log.min.isr=${min_isr}
transaction.state.log.num.partitions=8
share.coordinator.state.topic.replication.factor=${rf}
share.coordinator.state.topic.min.isr=${min_isr}
group.initial.rebalance.delay.ms=0
# Lets processor.lease_session_timeout_ms go below Kafka's 6 s floor (a standby notices a dead
# owner sooner: ksched bench --lease-session-ms); each client still chooses its own timeout.
group.min.session.timeout.ms=1000
# A dead node is noticed within seconds (fault tests kill them).
broker.session.timeout.ms=6000
broker.heartbeat.interval.ms=1000
# Tests create and drop many small topics; keep segments small so disk use stays bounded.
log.segment.bytes=67108864
log.retention.check.interval.ms=60000
EOF
  append_extra_properties
}

# KSCHED_KAFKA_PROPERTIES: `key=value` lines (blank lines and `#` comments skipped) appended to
# the node's properties. A key this script sets itself (listeners, node id, data directory,
# security) is refused, so the extras can only tune, never move or open the node.
append_extra_properties() {
  local line key
  [ -n "${KSCHED_KAFKA_PROPERTIES:-}" ] || return 0
  while IFS= read -r line; do
    case "$line" in '' | '#'*) continue ;; esac
    [[ "$line" =~ ^([A-Za-z0-9._-]+)=.*$ ]] ||
      die "KSCHED_KAFKA_PROPERTIES: '$line' is not a key=value line"
    key=${BASH_REMATCH[1]}
    if grep -q "^${key//./\\.}=" "$props"; then
      die "KSCHED_KAFKA_PROPERTIES: $key is set by deploy/kafka.sh itself"
    fi
    printf '%s\n' "$line" >>"$props"
    say "node ${node_id}: extra property $line"
  done <<<"$KSCHED_KAFKA_PROPERTIES"
}

cluster_id() {
  if [ ! -f "$cluster_file" ]; then
    java -cp "$jars/*" kafka.tools.StorageTool random-uuid >"$cluster_file"
  fi
  cat "$cluster_file"
}

format_storage() {
  if [ -f "$data/meta.properties" ]; then
    return 0
  fi
  local id user
  id=$(cluster_id)
  # Secure mode: the users' SCRAM credentials go into the cluster's first metadata.
  local scram=()
  if [ -n "$secure" ]; then
    for user in $secure_users; do
      scram+=(--add-scram "SCRAM-SHA-512=[name=${user},password=$(cat "$secure_dir/$user.password")]")
    done
  fi
  say "formatting KRaft storage in $data (cluster id $id)"
  java -cp "$jars/*" -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$logs" \
    kafka.tools.StorageTool format -t "$id" -c "$props" "${scram[@]}" >"$logs/format.log" 2>&1 ||
    { cat "$logs/format.log" >&2; die "formatting KRaft storage failed"; }
}

# Secure mode's CA, broker certificate, passwords and client properties, made once.
make_credentials() {
  [ -f "$secure_dir/enabled" ] && return 0
  command -v openssl >/dev/null 2>&1 || die "openssl not found: secure mode makes its CA with it"
  mkdir -p "$secure_dir"
  chmod 700 "$secure_dir"
  local d=$secure_dir user
  say "making a CA, the broker's certificate and SCRAM users in $d"
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=ksched test CA" \
    -keyout "$d/ca.key" -out "$d/ca.pem" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" \
    -keyout "$d/broker.key" -out "$d/broker.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >"$d/san.ext"
  openssl x509 -req -in "$d/broker.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial \
    -days 3650 -extfile "$d/san.ext" -out "$d/broker.crt" 2>/dev/null
  # Kafka's PEM key store: the PKCS#8 key, then the certificate chain.
  openssl pkcs8 -topk8 -nocrypt -in "$d/broker.key" >"$d/broker.pem"
  cat "$d/broker.crt" "$d/ca.pem" >>"$d/broker.pem"
  for user in $secure_users; do
    openssl rand -hex 16 >"$d/$user.password"
    # librdkafka (ksched, its workers, the Python worker): -X / --command-config.
    cat >"$d/$user.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=$user
sasl.password=$(cat "$d/$user.password")
ssl.ca.location=$d/ca.pem
EOF
  done
  # The Java tools' form, for the admin (kafka-acls.sh and friends: --command-config).
  cat >"$d/admin-java.properties" <<EOF
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="$(cat "$d/admin.password")";
ssl.truststore.type=PEM
ssl.truststore.location=$d/ca.pem
EOF
  chmod 600 "$d"/*.password "$d"/*.properties "$d"/*.key "$d/broker.pem"
  touch "$d/enabled"
}

credentials() {
  [ -f "$secure_dir/enabled" ] || die "no secure node on port $base_port (deploy/kafka.sh start --secure)"
  printf 'bootstrap 127.0.0.1:%s\n' "$base_port"
  printf 'ca %s/ca.pem\n' "$secure_dir"
  local user
  for user in $secure_users; do
    printf 'user %s %s/%s.properties\n' "$user" "$secure_dir" "$user"
  done
}

wait_ready() {
  local deadline=$((SECONDS + ${KSCHED_KAFKA_START_TIMEOUT:-90}))
  while [ $SECONDS -lt $deadline ]; do
    if ! pid_alive; then
      tail -n 40 "$logs/server.log" "$logs/console.log" 2>/dev/null >&2 || true
      die "node ${node_id} exited during start-up; logs are in $logs"
    fi
    if port_open "$port" && grep -q 'Kafka Server started' "$logs/server.log" 2>/dev/null; then
      say "node ${node_id} ready on 127.0.0.1:${port} (Apache Kafka ${version}, pid $(cat "$pidfile"))"
      return 0
    fi
    sleep 0.5
  done
  die "node ${node_id} did not become ready within ${KSCHED_KAFKA_START_TIMEOUT:-90} s; logs are in $logs"
}

# Launches node $node_id (its variables set by `node`) without waiting.
launch() {
  if pid_alive; then
    return 0
  fi
  if port_open "$port"; then
    die "127.0.0.1:${port} is taken by another process; stop it or set KSCHED_KAFKA_PORT"
  fi
  write_properties
  format_storage
  # A fresh server.log per start, so readiness is not read from an earlier run.
  rm -f "$logs/server.log"
  say "starting node ${node_id} (Apache Kafka ${version}) on 127.0.0.1:${port}"
  # shellcheck disable=SC2086
  nohup java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx1g} ${KAFKA_GC_OPTS:--XX:+UseG1GC -XX:MaxGCPauseMillis=20} \
    -Xlog:gc:file="$logs/gc.log":time,uptime:filecount=5,filesize=20M \
    -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$logs" \
    -cp "$jars/*" kafka.Kafka "$props" >"$logs/console.log" 2>&1 &
  echo $! >"$pidfile"
}

start() {
  need_java
  provision
  mkdir -p "$home"
  echo "$brokers" >"$nodes_file"
  if [ -n "$secure" ]; then
    make_credentials
  elif [ -f "$secure_dir/enabled" ]; then
    die "the node on port $base_port was made secure; start it with --secure, or reset it first"
  fi
  local i
  # Every node first: a quorum of controllers forms only when they can reach each other.
  for i in $(all_nodes); do
    node "$i"
    launch
  done
  for i in $(all_nodes); do
    node "$i"
    wait_ready
  done
  say "export KAFKA_BOOTSTRAP_SERVERS=$(bootstrap)"
}

stop_one() {
  if ! pid_alive; then
    rm -f "$pidfile"
    return 0
  fi
  local pid
  pid=$(cat "$pidfile")
  say "stopping node ${node_id} (pid $pid)"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + 30))
  while kill -0 "$pid" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      say "node ${node_id} did not stop within 30 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.2
  done
  rm -f "$pidfile"
}

stop() {
  local i any=""
  # In reverse: the last controllers standing let the others leave cleanly.
  for i in $(all_nodes | sort -rn); do
    node "$i"
    if pid_alive; then any=yes; fi
    stop_one
  done
  if [ -n "$any" ]; then say "stopped"; else say "not running"; fi
}

status() {
  local i rc=0
  for i in $(all_nodes); do
    node "$i"
    if pid_alive && port_open "$port"; then
      say "node ${node_id} running on 127.0.0.1:${port} (pid $(cat "$pidfile")), data in $data"
    elif pid_alive; then
      say "node ${node_id} starting (pid $(cat "$pidfile")), not answering yet on 127.0.0.1:${port}"
      rc=1
    else
      say "node ${node_id} not running"
      rc=1
    fi
  done
  return $rc
}

reset() {
  stop
  local i
  for i in $(all_nodes); do
    node "$i"
    rm -rf "$data" "$logs"
  done
  rm -f "$cluster_file" "$nodes_file"
  rm -rf "$secure_dir"
  say "deleted broker data"
}

one_node() {
  [ -n "$node_arg" ] || die "$cmd needs a node number (1..$brokers)"
  [ "$node_arg" -ge 1 ] && [ "$node_arg" -le "$brokers" ] || die "no node $node_arg (1..$brokers)"
  node "$node_arg"
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  status) status ;;
  credentials) credentials ;;
  provision) need_java; provision ;;
  reset) reset ;;
  logs) node "${node_arg:-1}"; exec tail -F "$logs/server.log" ;;
  kill-node)
    one_node
    if pid_alive; then
      say "killing node ${node_id} (pid $(cat "$pidfile")) with SIGKILL"
      kill -KILL "$(cat "$pidfile")"
      rm -f "$pidfile"
    fi
    ;;
  stop-node) one_node; stop_one ;;
  start-node) one_node; need_java; launch; wait_ready ;;
  *)
    sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
