#!/usr/bin/env python3
"""Least-privilege Kafka ACLs for ksched's roles (docs/security.md).

Grants each role exactly what it needs, with confluent-kafka's admin client, or prints the
equivalent `kafka-acls.sh` commands (--print) for clusters managed another way:

    deploy/ksched-acls.py --bootstrap 127.0.0.1:9093 --command-config admin.properties \\
        --prefix ksched. --processor ksched --job-topic jobs.acme --job-topic jobs.globex \\
        --worker worker-default:default --producer tenant-acme:jobs.acme --auditor auditor

Roles (principals are User:<name>):
  processor  its own topics (the prefix): read, write, create, describe, describe configs;
             the job topics: read, create, describe, describe configs; its consumer group, the shards'
             input groups (<group>-shard-<N>) and the owners' group (<group>-owners);
             its transactional ids (<group>-journal-<partition>)
  worker     read its pool's dispatch topic in the pool's group; write results and heartbeats
  producer   write one job topic
  auditor    read the journal and the DLQ (ksched audit, journal tail)
"""

import argparse
import sys

def bindings(args):
    """(principal, resource type, pattern type, name, operations) for every grant."""
    p = args.prefix
    group = args.processor_group
    out = []
    for user in args.processor:
        u = f"User:{user}"
        out.append((u, "TOPIC", "PREFIXED", p, ["READ", "WRITE", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]))
        for t in args.job_topic:
            out.append((u, "TOPIC", "LITERAL", t, ["READ", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS"]))
        out.append((u, "GROUP", "LITERAL", group, ["READ"]))
        # Shards other than 0 keep their input offsets in <group>-shard-<N>.
        out.append((u, "GROUP", "PREFIXED", f"{group}-shard-", ["READ"]))
        # processor.lease: instances elect the journal's owner in this group.
        out.append((u, "GROUP", "LITERAL", f"{group}-owners", ["READ"]))
        out.append((u, "TRANSACTIONAL_ID", "PREFIXED", f"{group}-journal-", ["WRITE", "DESCRIBE"]))
    for spec in args.worker:
        user, _, pool = spec.partition(":")
        if not pool:
            sys.exit(f"--worker {spec!r}: USER:POOL")
        u = f"User:{user}"
        out.append((u, "TOPIC", "LITERAL", f"{p}dispatch.{pool}", ["READ", "DESCRIBE"]))
        out.append((u, "GROUP", "LITERAL", f"{p}workers.{pool}", ["READ"]))
        for t in (f"{p}results", f"{p}heartbeats"):
            out.append((u, "TOPIC", "LITERAL", t, ["WRITE", "DESCRIBE"]))
    for spec in args.producer:
        user, _, topic = spec.partition(":")
        if not topic:
            sys.exit(f"--producer {spec!r}: USER:TOPIC")
        out.append((f"User:{user}", "TOPIC", "LITERAL", topic, ["WRITE", "DESCRIBE"]))
    for user in args.auditor:
        u = f"User:{user}"
        for t in (f"{p}journal", f"{p}dlq"):
            out.append((u, "TOPIC", "LITERAL", t, ["READ", "DESCRIBE"]))
        for g in ("ksched-journal-reader", "ksched-journal-tail"):
            out.append((u, "GROUP", "LITERAL", g, ["READ"]))
    return out


def read_properties(path):
    props = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line and line[0] not in "#!":
                key, _, value = line.partition("=")
                props[key.strip()] = value.strip()
    return props


def kafka_acls_commands(args, grants):
    flag = {"TOPIC": "--topic", "GROUP": "--group", "TRANSACTIONAL_ID": "--transactional-id"}
    for principal, rtype, pattern, name, ops in grants:
        op_flags = " ".join("--operation " + "".join(w.capitalize() for w in o.split("_")) for o in ops)
        print(
            f"kafka-acls.sh --bootstrap-server {args.bootstrap} --command-config ADMIN.properties "
            f"--add --allow-principal {principal} {op_flags} {flag[rtype]} '{name}' "
            f"--resource-pattern-type {pattern.lower()}"
        )


def apply(args, grants):
    from confluent_kafka.admin import (AclBinding, AclOperation, AclPermissionType, AdminClient,
                                       ResourcePatternType, ResourceType)
    conf = read_properties(args.command_config) if args.command_config else {}
    conf["bootstrap.servers"] = args.bootstrap
    admin = AdminClient(conf)
    acls = [
        AclBinding(getattr(ResourceType, rtype), name, getattr(ResourcePatternType, pattern),
                   principal, "*", getattr(AclOperation, op), AclPermissionType.ALLOW)
        for principal, rtype, pattern, name, ops in grants
        for op in ops
    ]
    failed = 0
    for binding, future in admin.create_acls(acls, request_timeout=30).items():
        try:
            future.result()
        except Exception as e:  # each refusal is reported; the exit code says whether any
            failed += 1
            print(f"ksched-acls: {binding}: {e}", file=sys.stderr)
    print(f"ksched-acls: {len(acls) - failed} ACLs granted, {failed} failed", file=sys.stderr)
    if failed:
        return 1
    if args.wait > 0 and not wait_until_visible(admin, acls, args.wait):
        return 1
    return 0


def acl_key(b):
    return (b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
            b.permission_type)


def wait_until_visible(admin, acls, timeout):
    """Waits until the broker answering DescribeAcls enforces every granted ACL.

    Under KRaft a CreateAcls request returns once the controller has committed the ACLs;
    each broker's authorizer applies them a moment later, from the metadata log. A client
    started right after this script could be refused in between (TopicAuthorizationFailed
    on a topic it was just granted), so the script returns only once they are in force.
    DescribeAcls is answered from the broker's own authorizer, so seeing them there means
    that broker enforces them; on a cluster of several brokers, others may lag a little more.
    """
    from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType,
                                       ResourcePatternType, ResourceType)
    import time
    wanted = {acl_key(b) for b in acls}
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    deadline = time.monotonic() + timeout
    missing = wanted
    while True:
        try:
            seen = {acl_key(b) for b in admin.describe_acls(everything, request_timeout=10).result()}
            missing = wanted - seen
        except Exception as e:  # a transient failure is tried again until the deadline
            print(f"ksched-acls: describing ACLs: {e}", file=sys.stderr)
        if not missing:
            return True
        if time.monotonic() >= deadline:
            print(f"ksched-acls: {len(missing)} granted ACLs still not in force after "
                  f"{timeout:g} s", file=sys.stderr)
            return False
        time.sleep(0.1)


def main():
    a = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("--bootstrap", required=True)
    a.add_argument("--command-config", help="the admin's librdkafka properties file")
    a.add_argument("--prefix", default="ksched.", help="ksched's topic prefix (topics.prefix)")
    a.add_argument("--processor-group", default="ksched-processor", help="processor.group_id")
    a.add_argument("--processor", action="append", default=[], metavar="USER")
    a.add_argument("--job-topic", action="append", default=[], metavar="TOPIC")
    a.add_argument("--worker", action="append", default=[], metavar="USER:POOL")
    a.add_argument("--producer", action="append", default=[], metavar="USER:TOPIC")
    a.add_argument("--auditor", action="append", default=[], metavar="USER")
    a.add_argument("--print", action="store_true", help="print kafka-acls.sh commands instead")
    a.add_argument("--wait", type=float, default=30, metavar="SECONDS",
                   help="wait until the broker enforces the granted ACLs (0: do not wait)")
    args = a.parse_args()
    grants = bindings(args)
    if args.print:
        kafka_acls_commands(args, grants)
        return 0
    return apply(args, grants)


if __name__ == "__main__":
    sys.exit(main())
