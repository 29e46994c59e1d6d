#!/usr/bin/env python3
"""A ksched worker in Python, built only from schemas/ (confluent-kafka + fastavro).

It joins its pool's consumer group on <prefix>dispatch.<pool>, runs each dispatched job
(the "work" is upper-casing the payload), reports JobStarted and JobResult with the attempt
number, honours CancelDispatch for jobs not yet started, and heartbeats its owned partitions.

    python3 worker.py --bootstrap 127.0.0.1:9092 --pool default --worker-id py-1

Client properties (TLS, SASL) as Kafka's own tools take them: `-X key=value` (repeatable) and
`--command-config client.properties` (`key=value` lines), e.g.
`-X security.protocol=SASL_SSL -X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=...`.

`--keyring FILE` (or KSCHED_KEYRING) opens the job's sealed secrets and payload
(docs/security.md#secrets); a job whose sealed values do not open fails `secret_unavailable`
without running.
"""

import argparse
import os
import signal
import socket
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from ksched_avro import Codec
from ksched_secrets import Keyring, Unavailable, open_job


def now_ms():
    return int(time.time() * 1000)


class PyWorker:
    def __init__(self, args):
        self.args = args
        self.codec = Codec(args.schemas)
        self.keyring = Keyring(args.keyring) if args.keyring else None
        self.prefix = args.prefix
        self.dispatch_topic = f"{self.prefix}dispatch.{args.pool}"
        self.owned = []
        self.active = set()
        self.cancelled = set()
        self.done = 0
        self.stop = threading.Event()
        # Reports (starts, results) kept until the broker acknowledged them, by sequence
        # number; heartbeats are not kept (the next one supersedes them). A producer that
        # acknowledged nothing for three heartbeat intervals while records wait is replaced
        # and the kept reports sent again on the new one: after a broker restart librdkafka's
        # idempotent producer can stop delivering altogether, and a worker whose heartbeats
        # stall past the scheduler's worker_ttl_ms is declared lost.
        self.lock = threading.RLock()
        self.pending = {}
        self.seq = 0
        self.sent = self.reported = 0
        self.last_delivered = time.monotonic()
        self.stall = max(3 * args.heartbeat_interval, 2.0)
        self.replaced = 0
        self.producer = self.new_producer()
        self.consumer = Consumer({
            "bootstrap.servers": args.bootstrap,
            "group.id": f"{self.prefix}workers.{args.pool}",
            "client.id": f"ksched-py-{args.worker_id}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "reconnect.backoff.max.ms": 1000,
            **args.properties,
        })

    def new_producer(self):
        return Producer({
            "bootstrap.servers": self.args.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 1,
            # Heard again soon after an outage: the scheduler allows worker_ttl_ms from its
            # own recovery, and librdkafka's default reconnect back-off grows to 10 s.
            "reconnect.backoff.max.ms": 1000,
            "client.id": f"ksched-py-{self.args.worker_id}",
            **self.args.properties,
        })

    def send(self, topic, key, name, record, partition=None, keep=True):
        # A Dispatch names the results partition its shard reads (reply_partition), the
        # same for every dispatch to this worker; None: the partitioner's choice by key.
        value = self.codec.encode(name, record)
        with self.lock:
            if self.sent == self.reported:
                self.last_delivered = time.monotonic()  # the stall clock starts now
            self.seq += 1
            if keep:
                self.pending[self.seq] = (topic, key.encode(), value, partition)
            self.produce(self.seq, topic, key.encode(), value, partition)
            self.producer.poll(0)
            self.replace_if_stalled()

    def produce(self, seq, topic, key, value, partition):
        producer = self.producer
        extra = {} if partition is None else {"partition": partition}

        def done(err, _msg):
            with self.lock:
                if producer is not self.producer:
                    return  # a replaced producer's report
                self.reported += 1
                if err is None:
                    self.pending.pop(seq, None)
                    self.last_delivered = time.monotonic()

        try:
            producer.produce(topic, key=key, value=value, on_delivery=done, **extra)
        except KafkaException as e:
            if e.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                raise
            # A partition added to the results topic since this producer read its partitions
            # (a Dispatch names it at once; librdkafka reads them every 5 minutes): read
            # them again and send once more.
            producer.list_topics(topic, timeout=10)
            producer.produce(topic, key=key, value=value, on_delivery=done, **extra)
        self.sent += 1

    def replace_if_stalled(self):
        waited = time.monotonic() - self.last_delivered
        if self.sent == self.reported or waited < self.stall:
            return
        old, self.producer = self.producer, self.new_producer()
        self.replaced += 1
        self.sent = self.reported = 0
        self.last_delivered = time.monotonic()
        print(f"{self.args.worker_id}: the producer delivered nothing for {waited:.1f} s; "
              f"replaced, {len(self.pending)} reports sent again", file=sys.stderr, flush=True)
        old.purge()
        old.poll(0)
        for seq, (topic, key, value, partition) in sorted(self.pending.items()):
            self.produce(seq, topic, key, value, partition)

    def heartbeat(self, draining=False):
        self.send(f"{self.prefix}heartbeats", self.args.worker_id, "Heartbeat", keep=False, record={
            "worker_id": self.args.worker_id,
            "pool": self.args.pool,
            "active_jobs": len(self.active),
            "max_parallel_jobs": 1,
            "cpu_load": 0.0,
            "gpu_utilization": 0.0,
            "memory_load": 0.0,
            "memory_free_bytes": None,
            "capabilities": ["python"],
            "labels": {"lang": "python", "host": socket.gethostname()},
            "owned_partitions": sorted(self.owned),
            "active_job_ids": sorted(self.active),
            "draining": draining,
            "sent_at": now_ms(),
        })

    def heartbeats(self):
        while not self.stop.wait(self.args.heartbeat_interval):
            self.heartbeat()

    def on_assign(self, consumer, partitions):
        self.owned = [p.partition for p in partitions]
        self.heartbeat()

    def on_revoke(self, consumer, partitions):
        gone = {p.partition for p in partitions}
        self.owned = [p for p in self.owned if p not in gone]

    def run_job(self, dispatch):
        job = dispatch["job"]
        job_id, attempt = job["job_id"], dispatch["attempt"]
        reply = dispatch.get("reply_partition")
        if (job_id, attempt) in self.cancelled:
            return
        self.active.add(job_id)
        started = time.monotonic()
        self.send(f"{self.prefix}results", job_id, "JobStarted", {
            "job_id": job_id, "attempt": attempt,
            "worker_id": self.args.worker_id, "started_at": now_ms(),
        }, partition=reply)
        result = {
            "job_id": job_id,
            "attempt": attempt,
            "worker_id": self.args.worker_id,
            "status": "SUCCEEDED",
            "error_code": None,
            "error_message": None,
            "result_ptr": None,
            "result_meta": {"size_bytes": None, "content_type": None, "labels": {}},
            "execution_ms": 0,
            "finished_at": 0,
        }
        try:
            env, payload = open_job(self.keyring, job)
        except Unavailable as e:
            result.update(status="FAILED_FATAL", error_code="secret_unavailable", error_message=str(e))
        else:
            output = payload.upper()
            secrets = sum(1 for k in env if k.startswith("$"))
            result.update(
                result_ptr=f"inline:{output.decode(errors='replace')}",
                result_meta={
                    "size_bytes": len(output),
                    "content_type": "text/plain",
                    "labels": {"worker_lang": "python", "secrets_opened": str(secrets)},
                },
            )
        result.update(execution_ms=int((time.monotonic() - started) * 1000), finished_at=now_ms())
        self.send(f"{self.prefix}results", job_id, "JobResult", result, partition=reply)
        self.active.discard(job_id)
        self.done += 1
        print(f"{self.args.worker_id}: {job_id} attempt {attempt} done", flush=True)

    def run(self):
        self.consumer.subscribe([self.dispatch_topic], on_assign=self.on_assign, on_revoke=self.on_revoke)
        beat = threading.Thread(target=self.heartbeats, daemon=True)
        beat.start()
        print(f"{self.args.worker_id}: consuming {self.dispatch_topic}", flush=True)
        while not self.stop.is_set():
            msg = self.consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                print(f"{self.args.worker_id}: consumer error {msg.error()}", file=sys.stderr, flush=True)
                continue
            try:
                name, record = self.codec.decode(msg.value())
            except Exception as e:  # a record we cannot read is skipped, not fatal
                print(f"{self.args.worker_id}: skipping undecodable record: {e}", file=sys.stderr, flush=True)
                continue
            if name == "Dispatch":
                self.run_job(record)
            elif name == "CancelDispatch":
                self.cancelled.add((record["job_id"], record["attempt"]))
            if self.args.max_jobs and self.done >= self.args.max_jobs:
                break
        self.heartbeat(draining=True)
        self.producer.flush(10)
        self.consumer.close()
        self.stop.set()
        print(f"{self.args.worker_id}: stopped after {self.done} jobs", flush=True)


def read_properties(path):
    """A Kafka client properties file: key=value or key: value lines, # and ! comments."""
    props = {}
    pending = ""
    with open(path, encoding="utf-8") as f:
        for n, raw in enumerate(f, 1):
            line = raw.strip()
            if not pending and (not line or line[0] in "#!"):
                continue
            if line.endswith("\\"):
                pending += line[:-1]
                continue
            line, pending = pending + line, ""
            at = min((i for i in (line.find("="), line.find(":")) if i >= 0), default=-1)
            if at <= 0:
                raise SystemExit(f"{path}: line {n}: {line!r} is not key=value")
            props[line[:at].strip()] = line[at + 1:].strip()
    return props


def property_flag(text):
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not key=value")
    return key.strip(), value


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    p.add_argument("--prefix", default="ksched.")
    p.add_argument("--pool", default="default")
    p.add_argument("--worker-id", default=f"py-{socket.gethostname()}-{os.getpid()}")
    p.add_argument("--schemas", default=os.path.join(here, "..", "..", "schemas"))
    p.add_argument("--heartbeat-interval", type=float, default=1.0)
    p.add_argument("--max-jobs", type=int, default=0, help="exit after this many jobs (0: run until SIGTERM)")
    p.add_argument("--print-fingerprints", action="store_true", help="print each top-level schema's fingerprint and exit")
    p.add_argument("-X", "--property", dest="props", action="append", type=property_flag, default=[],
                   metavar="KEY=VALUE", help="a librdkafka property (repeatable; over --command-config)")
    p.add_argument("--command-config", metavar="FILE", help="a Kafka client properties file")
    p.add_argument("--keyring", metavar="FILE", default=os.environ.get("KSCHED_KEYRING"),
                   help="the keyring that opens jobs' sealed secrets and payloads")
    args = p.parse_args()
    args.properties = read_properties(args.command_config) if args.command_config else {}
    args.properties.update(dict(args.props))
    if args.print_fingerprints:
        codec = Codec(args.schemas)
        for name in sorted(codec.current):
            print(name, codec.fingerprint_hex(name))
        return
    worker = PyWorker(args)
    signal.signal(signal.SIGTERM, lambda *_: worker.stop.set())
    signal.signal(signal.SIGINT, lambda *_: worker.stop.set())
    worker.run()


if __name__ == "__main__":
    main()
