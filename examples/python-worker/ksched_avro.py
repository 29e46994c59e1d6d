"""Avro single-object encoding of ksched records, from schemas/ alone.

A value on any ksched topic is C3 01, the 8-byte CRC-64-AVRO fingerprint of the writer
schema's Parsing Canonical Form (little-endian, which is the byte order fastavro's hex string
already has), then the Avro binary body.
"""

import glob
import io
import json
import os

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import fingerprint, load_schema, to_parsing_canonical_form

TOP_LEVEL = [
    "JobRequest", "JobStarted", "JobProgress", "JobResult", "Heartbeat", "CancelJob",
    "ApproveJob", "RejectJob", "Tick", "Dispatch", "CancelDispatch", "DeadLetter", "JournalEntry",
]
MAGIC = b"\xc3\x01"


def _fp(schema):
    return bytes.fromhex(fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


class Codec:
    def __init__(self, schemas_dir):
        self.current = {}  # short name -> parsed schema
        self.writers = {}  # fingerprint bytes -> (short name, parsed schema)
        for name in TOP_LEVEL:
            schema = load_schema(os.path.join(schemas_dir, f"io.ksched.{name}.avsc"))
            self.current[name] = schema
            self.writers[_fp(schema)] = (name, schema)
        # Every released version, so records from older writers decode too.
        for path in sorted(glob.glob(os.path.join(schemas_dir, "history", "*.avsc"))):
            with open(path) as fh:
                schema = parse_schema(json.load(fh))
            short = os.path.basename(path).split(".")[0]
            self.writers.setdefault(_fp(schema), (short, schema))

    def fingerprint_hex(self, name):
        return _fp(self.current[name]).hex()

    def encode(self, name, record):
        buf = io.BytesIO()
        buf.write(MAGIC)
        buf.write(_fp(self.current[name]))
        schemaless_writer(buf, self.current[name], record)
        return buf.getvalue()

    def decode(self, data):
        """Returns (short name, record); raises ValueError for anything that is not ours."""
        if len(data) < 10 or data[:2] != MAGIC:
            raise ValueError("not Avro single-object encoding")
        entry = self.writers.get(data[2:10])
        if entry is None:
            raise ValueError(f"unknown writer schema {data[2:10].hex()}")
        name, writer = entry
        record = schemaless_reader(io.BytesIO(data[10:]), writer, self.current[name])
        return name, record
