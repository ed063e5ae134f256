"""`replikafka topics`: create, list, describe, delete and alter topics (as kafka-topics.sh).

    replikafka topics --bootstrap-server H:P --create --topic T [--partitions N] [--replication-factor R]
                      [--replica-assignment 1:2,2:3] [--config k=v ...] [--schema SCHEMA] [--if-not-exists]
    replikafka topics --bootstrap-server H:P --list
    replikafka topics --bootstrap-server H:P --describe [--topic T]
                      [--under-replicated-partitions] [--unavailable-partitions] [--under-min-isr-partitions]
                      [--at-min-isr-partitions] [--topics-with-overrides]
    replikafka topics --bootstrap-server H:P --delete --topic T [--if-exists]
    replikafka topics --bootstrap-server H:P --alter --topic T --partitions N [--force]

``--zookeeper H:P`` may replace ``--bootstrap-server``: the live brokers are
read from ``/brokers/ids`` and used as bootstrap servers.
"""
from __future__ import annotations

import json
import sys

from replikafka import errors as E
from replikafka.cli import command_config

_ACTIONS = ("create", "list", "describe", "delete", "alter")


def add_parser(sub, name):
    p = sub.add_parser(name, help="create, list, describe, delete or alter topics")
    p.add_argument("--bootstrap-server", metavar="H:P", help="brokers to connect to (comma-separated)")
    command_config.add_argument(p)
    p.add_argument("--zookeeper", metavar="H:P", help="find the brokers through this ZooKeeper")
    for action in _ACTIONS:
        p.add_argument(f"--{action}", action="store_true", help=f"{action} topics")
    p.add_argument("--topic", help="the topic")
    p.add_argument("--partitions", type=int, help="number of partitions (--create, --alter; --alter to fewer "
                   "removes the highest-numbered ones and their data)")
    p.add_argument("--force", action="store_true",
                   help="--alter to fewer partitions: remove them even if the topic is partitioned by key")
    p.add_argument("--replication-factor", type=int, help="replicas per partition (--create)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="topic config override (--create; repeatable)")
    p.add_argument("--schema", help="the topic's schema: a Spark DDL string or a JSON description (--create)")
    p.add_argument("--if-not-exists", action="store_true", help="--create: do nothing if the topic exists")
    p.add_argument("--if-exists", action="store_true", help="--delete/--alter/--describe: do nothing if it does not")
    p.add_argument("--under-replicated-partitions", action="store_true",
                   help="--describe: only partitions whose ISR is smaller than their replicas")
    p.add_argument("--unavailable-partitions", action="store_true",
                   help="--describe: only partitions without a live leader")
    p.add_argument("--under-min-isr-partitions", action="store_true",
                   help="--describe: only partitions whose ISR is smaller than min.insync.replicas")
    p.add_argument("--at-min-isr-partitions", action="store_true",
                   help="--describe: only partitions whose ISR is exactly min.insync.replicas")
    p.add_argument("--topics-with-overrides", action="store_true",
                   help="--describe: only topics with config overrides (their header lines)")
    p.add_argument("--replica-assignment", metavar="B:B,B:B,...",
                   help="--create/--alter: brokers per partition, e.g. 1:2,2:3,3:1 (replaces "
                        "--replication-factor; with --alter, the new partitions only)")
    p.set_defaults(func=run)


class UsageError(Exception):
    """A bad flag combination (exit 2)."""


def run(args) -> int:
    try:
        action = _check(args)
    except UsageError as exc:
        sys.stderr.write(f"replikafka topics: error: {exc}\n")
        return 2
    with admin_for(args) as admin:
        return _ACTION_FUNCS[action](admin, args)


def admin_for(args):
    """An Admin for a command's ``--bootstrap-server`` (or ``--zookeeper``) and ``--command-config``."""
    from replikafka.client.admin import Admin

    return Admin(command_config.client_config_of(args, bootstrap_from(args.bootstrap_server, args.zookeeper)))


def open_store(args):
    """The reassignment and election commands' view of the cluster (``cluster_admin.open_admin``):
    over RPCs with ``--bootstrap-server``, over ZooKeeper with ``--zookeeper``."""
    from replikafka.cluster_admin import open_admin

    return open_admin(admin_for(args) if getattr(args, "bootstrap_server", None) else None, args.zookeeper)


def _check(args) -> str:
    chosen = [a for a in _ACTIONS if getattr(args, a)]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --create, --list, --describe, --delete, --alter"
                         + (f" (got {', '.join('--' + a for a in chosen)})" if chosen else ""))
    action = chosen[0]
    if not args.bootstrap_server and not args.zookeeper:
        raise UsageError("--bootstrap-server (or --zookeeper) is required")
    if action in ("create", "delete", "alter") and not args.topic:
        raise UsageError(f"--topic is required with --{action}")
    if action == "create":
        # As Kafka 3.x: without --partitions / --replication-factor the brokers'
        # num.partitions / default.replication.factor apply.
        if args.partitions is not None and args.partitions < 1:
            raise UsageError(f"--partitions must be at least 1, got {args.partitions}")
        if args.replication_factor is not None and args.replication_factor < 1:
            raise UsageError(f"--replication-factor must be at least 1, got {args.replication_factor}")
        if args.replica_assignment and (args.partitions is not None or args.replication_factor is not None):
            raise UsageError("--replica-assignment replaces --partitions and --replication-factor")
    elif action == "alter":
        if args.partitions is None:
            raise UsageError("--partitions is required with --alter (topic configs: replikafka configs --alter)")
        if args.partitions < 1:
            raise UsageError(f"--partitions must be at least 1, got {args.partitions}")
    if args.replica_assignment:
        parse_replica_assignment(args.replica_assignment)
    for flag, allowed in (("partitions", ("create", "alter")), ("replication_factor", ("create",)),
                          ("schema", ("create",)), ("if_not_exists", ("create",)),
                          ("under_replicated_partitions", ("describe",)), ("unavailable_partitions", ("describe",)),
                          ("under_min_isr_partitions", ("describe",)), ("at_min_isr_partitions", ("describe",)),
                          ("topics_with_overrides", ("describe",)), ("replica_assignment", ("create", "alter")),
                          ("if_exists", ("delete", "alter", "describe")), ("force", ("alter",))):
        value = getattr(args, flag)
        if value not in (None, False) and action not in allowed:
            raise UsageError(f"--{flag.replace('_', '-')} cannot be used with --{action}")
    if args.config and action != "create":
        raise UsageError(f"--config cannot be used with --{action}")
    if action == "list" and args.topic:
        raise UsageError("--topic cannot be used with --list")
    parse_config(args.config)
    return action


def parse_replica_assignment(text: str) -> dict[int, list[int]]:
    """``1:2,2:3`` -> {0: [1, 2], 1: [2, 3]} (kafka-topics' --replica-assignment)."""
    out: dict[int, list[int]] = {}
    for p, part in enumerate(text.split(",")):
        try:
            brokers = [int(b) for b in part.split(":")]
        except ValueError:
            raise UsageError(f"--replica-assignment: {part!r} (partition {p}) is not broker ids joined by ':'") from None
        if len(set(brokers)) != len(brokers):
            raise UsageError(f"--replica-assignment: partition {p} names a broker twice ({part})")
        out[p] = brokers
    if len({len(b) for b in out.values()}) > 1:
        raise UsageError("--replica-assignment: every partition needs the same number of replicas")
    return out


def parse_config(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config {item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def bootstrap_from(bootstrap_server: str | None, zookeeper: str | None) -> str:
    """The bootstrap list: ``--bootstrap-server`` if given, else the live
    brokers registered in ZooKeeper under ``/brokers/ids``."""
    if bootstrap_server:
        return bootstrap_server
    from replikafka.cli.zk_session import zk_session

    endpoints = []
    with zk_session(zookeeper) as zk:
        ids = zk.get_children("/brokers/ids") if zk.exists("/brokers/ids") else []
        for bid in sorted(ids, key=lambda s: int(s) if s.isdigit() else s):
            try:
                data, _ = zk.get(f"/brokers/ids/{bid}")
                info = json.loads(data)
                endpoints.append(f"{info['host']}:{info['port']}")
            except Exception:  # a broker that vanished meanwhile, or a malformed registration
                continue
    if not endpoints:
        raise E.BrokerNotAvailableError(f"no live brokers are registered in ZooKeeper at {zookeeper}")
    return ",".join(endpoints)


# ------------------------------------------------------------ actions
def _create(admin, args) -> int:
    try:
        admin.create_topic(args.topic, partitions=args.partitions, replication_factor=args.replication_factor,
                           schema=args.schema, config=parse_config(args.config),
                           assignment=parse_replica_assignment(args.replica_assignment)
                           if args.replica_assignment else None)
    except E.TopicExistsError:
        if args.if_not_exists:
            return 0
        raise
    print(f"Created topic {args.topic}.")
    return 0


def _list(admin, args) -> int:
    for name in admin.list_topics():
        print(name)
    return 0


def _delete(admin, args) -> int:
    try:
        admin.delete_topic(args.topic)
    except E.UnknownTopicOrPartitionError:
        if args.if_exists:
            return 0
        raise
    print(f"Deleted topic {args.topic}.")
    return 0


def _alter(admin, args) -> int:
    try:
        admin.create_partitions(args.topic, args.partitions,
                                assignment=parse_replica_assignment(args.replica_assignment)
                                if args.replica_assignment else None, force=args.force)
    except E.UnknownTopicOrPartitionError:
        if args.if_exists:
            return 0
        raise
    print(f"Topic {args.topic} now has {args.partitions} partitions.")
    return 0


def _describe(admin, args) -> int:
    try:
        topics = admin.describe_topics([args.topic] if args.topic else None)
    except E.UnknownTopicOrPartitionError:
        if args.if_exists:
            return 0
        raise
    live = {b.id for b in admin.describe_cluster().brokers}
    by_isr = args.under_min_isr_partitions or args.at_min_isr_partitions
    only_filtered = args.under_replicated_partitions or args.unavailable_partitions or by_isr
    lines = []
    for t in topics:
        overrides = {k: v for k, v in t.config.items() if k != "topic.id"}
        if args.topics_with_overrides:
            if overrides:
                lines.append(format_topic_header(t))
            continue
        if not only_filtered:
            lines.append(format_topic_header(t))
        min_isr = int(admin.describe_topic_config(t.name)["min.insync.replicas"][0]) if by_isr else 0
        for p in t.partitions:
            unavailable = p.leader < 0 or p.leader not in live
            if args.under_replicated_partitions and not p.under_replicated:
                continue
            if args.unavailable_partitions and not unavailable:
                continue
            if args.under_min_isr_partitions and not len(p.isr) < min_isr:
                continue
            if args.at_min_isr_partitions and len(p.isr) != min_isr:
                continue
            lines.append(format_partition_line(t.name, p))
    if lines:
        print("\n".join(lines))
    return 0


_ACTION_FUNCS = {"create": _create, "list": _list, "describe": _describe, "delete": _delete, "alter": _alter}


def format_topic_header(t) -> str:
    from replikafka.records import is_kafka_shaped

    configs = ",".join(f"{k}={v}" for k, v in sorted(t.config.items()) if k != "topic.id")
    topic_id = t.config.get("topic.id")
    line = (f"Topic: {t.name}\t" + (f"TopicId: {topic_id}\t" if topic_id else "") + f"PartitionCount: {len(t.partitions)}\t"
            f"ReplicationFactor: {t.replication_factor}\tConfigs: {configs}")
    if not is_kafka_shaped(t.schema):
        line += "\tSchema: " + ", ".join(f"{f.name} {f.type}" for f in t.schema)
    return line


def format_partition_line(topic: str, p) -> str:
    """Kafka's describe layout (``\\tTopic: t\\tPartition: 0\\tLeader: 1\\tReplicas: 1,2,3\\tIsr: 1,2,3``)
    followed by the leader epoch and, when the leader answered, HW and LEO."""
    leader = str(p.leader) if p.leader >= 0 else "none"
    line = (f"\tTopic: {topic}\tPartition: {p.partition}\tLeader: {leader}\t"
            f"Replicas: {','.join(map(str, p.replicas))}\tIsr: {','.join(map(str, p.isr))}\t"
            f"LeaderEpoch: {p.leader_epoch}")
    if p.high_watermark is not None:
        line += f"\tHighWatermark: {p.high_watermark}\tLogEndOffset: {p.log_end_offset}"
    return line
