"""A Python producer and consumer of ksched topics the way Kafka users write them: with
confluent-kafka's Schema Registry client, AvroSerializer and AvroDeserializer
(services/ksched/tests/registry.rs drives it).

    registry_client.py produce BOOTSTRAP REGISTRY TOPIC JOB_ID [--newer]
        Produces a JobRequest with AvroSerializer: the subject's (`<topic>-value`) first
        schema, the one ksched registered at start, or with --newer a newer producer schema
        (an added optional field) registered by the serializer itself.
        Prints the schema id used.
    registry_client.py consume BOOTSTRAP REGISTRY TOPIC SECONDS
        Reads the topic from the beginning with AvroDeserializer for SECONDS and prints
        each value as a JSON line (bytes as their length, records of a union as they come).
"""

import json
import struct
import sys
import time

from confluent_kafka import Consumer, Producer
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext


def newer(schema_str):
    schema = json.loads(schema_str)
    schema["fields"].append(
        {"name": "x_cost_center", "type": ["null", "string"], "default": None,
         "doc": "a field a newer producer added; ksched does not know it"})
    return json.dumps(schema)


def produce(bootstrap, registry, topic, job_id, is_newer):
    client = SchemaRegistryClient({"url": registry, "timeout": 10})
    subject = f"{topic}-value"
    # The first version under the subject: the one ksched registered at start.
    first = client.get_version(subject, min(client.get_versions(subject)))
    if is_newer:
        serializer = AvroSerializer(client, newer(first.schema.schema_str),
                                    conf={"auto.register.schemas": True})
    else:
        serializer = AvroSerializer(client, first.schema.schema_str,
                                    conf={"auto.register.schemas": False})
    request = {
        "job_id": job_id,
        "tenant_id": "acme",
        "labels": {"origin": "python-avro-serializer"},
        # fastavro fills missing fields from their defaults, but cannot turn the JSON default
        # of a bytes field ("") into bytes.
        "payload": b"",
        "submitted_at": int(time.time() * 1000),
    }
    if is_newer:
        request["x_cost_center"] = "cc-42"
    value = serializer(request, SerializationContext(topic, MessageField.VALUE))
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, key=job_id.encode(), value=value)
    if p.flush(30) != 0:
        sys.exit("the record was not delivered")
    assert value[0] == 0, "the Confluent wire format starts with magic byte 0"
    print(struct.unpack(">I", value[1:5])[0])


def consume(bootstrap, registry, topic, seconds):
    client = SchemaRegistryClient({"url": registry, "timeout": 10})
    deserializer = AvroDeserializer(client)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"registry-client-{time.time()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "isolation.level": "read_committed"})
    c.subscribe([topic])
    deadline = time.time() + seconds
    while time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        # A registry call that times out (seen once: a request Apicurio never answered) is
        # tried again, up to three times.
        for attempt in range(3):
            try:
                value = deserializer(m.value(), SerializationContext(topic, MessageField.VALUE))
                break
            except Exception as e:  # noqa: BLE001 - reported, then tried again
                print(f"registry_client: {e!r}; trying again", file=sys.stderr, flush=True)
                if attempt == 2:
                    raise
        print(json.dumps(value, default=lambda b: len(b) if isinstance(b, bytes) else str(b)),
              flush=True)
    c.close()


def main():
    cmd = sys.argv[1]
    if cmd == "produce":
        produce(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], "--newer" in sys.argv)
    elif cmd == "consume":
        consume(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
