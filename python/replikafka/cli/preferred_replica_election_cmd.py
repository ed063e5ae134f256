"""`replikafka preferred-replica-election`: move leadership back to preferred replicas (seed 003).

    replikafka preferred-replica-election --zookeeper H:P [--path-to-json-file F]

Writes ``/admin/preferred_replica_election`` (all partitions, or those in
``F``: ``{"partitions":[{"topic":"t","partition":0}]}``); the controller makes
each partition's first replica its leader where that replica is alive and in
the ISR, then removes the node. The command waits for that and reports.
A list too long for one znode (ZooKeeper's jute.maxbuffer, about 25,000
partitions for short topic names) is elected in several rounds, one after another.
"""
from __future__ import annotations

import json
import sys
import time

from replikafka import cluster_admin
from replikafka import errors as E
from replikafka.cli import command_config


def add_parser(sub, name):
    p = sub.add_parser(name, help="move leadership back to the preferred (first) replicas")
    p.add_argument("--bootstrap-server", metavar="H:P", help="brokers to connect to (as Kafka 3.x)")
    command_config.add_argument(p)
    p.add_argument("--zookeeper", metavar="H:P", help="or the cluster's ZooKeeper (with chroot)")
    p.add_argument("--path-to-json-file", metavar="F", help="only these partitions (default: all)")
    p.add_argument("--timeout-ms", type=int, default=60_000, help="how long to wait for the controller (per round)")
    p.set_defaults(func=run)


def _read_partitions(path: str) -> list[tuple[str, int]]:
    try:
        with open(path) as f:
            d = json.load(f)
        tps = [(str(e["topic"]), int(e["partition"])) for e in d["partitions"]]
    except OSError as exc:
        raise ValueError(f"cannot read {path!r}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f'{path!r}: want {{"partitions":[{{"topic":"t","partition":0}}]}} ({exc!r})') from None
    if len(set(tps)) != len(tps):
        raise ValueError(f"{path!r} lists a partition twice")
    if not tps:
        raise ValueError(f"{path!r} lists no partitions")
    return tps


def run(args) -> int:
    try:
        wanted = _read_partitions(args.path_to_json_file) if args.path_to_json_file else None
    except ValueError as exc:
        sys.stderr.write(f"replikafka preferred-replica-election: error: {exc}\n")
        return 2
    from replikafka.cli.topics_cmd import open_store

    if not args.bootstrap_server and not args.zookeeper:
        sys.stderr.write("replikafka preferred-replica-election: error: --bootstrap-server (or --zookeeper) is required\n")
        return 2
    with open_store(args) as store:
        assignments = {t: store.get_assignment(t) or {} for t in store.list_topics()}
        if wanted is None:
            wanted = [(t, p) for t, a in sorted(assignments.items()) for p in sorted(a)]
            if not wanted:
                where = (f"the cluster at {args.bootstrap_server}" if args.bootstrap_server
                         else f"ZooKeeper at {args.zookeeper}")
                raise E.UnknownTopicOrPartitionError(f"{where} holds no topics"
                                                     + ("" if args.bootstrap_server else " (the wrong chroot?)"))
        unknown = [f"{t}-{p}" for t, p in wanted if p not in assignments.get(t, {})]
        if unknown:
            raise E.UnknownTopicOrPartitionError(f"partitions {', '.join(unknown)} do not exist")
        batches, znode_bytes_max = cluster_admin.election_rounds(wanted)
        for i, batch in enumerate(batches):
            store.create_preferred_election(batch)
            print(f"Started preferred replica election for {len(batch)} partitions"
                  + (f" (round {i + 1} of {len(batches)}: one znode holds at most {znode_bytes_max:,} bytes)."
                     if len(batches) > 1 else "."), flush=True)
            deadline = time.monotonic() + args.timeout_ms / 1000.0
            while store.get_preferred_election() is not None:
                if time.monotonic() > deadline:
                    raise E.KafkaTimeoutError(f"the controller did not finish the election in {args.timeout_ms} ms")
                time.sleep(0.2)
        # Leaders come from a broker's metadata, which may trail the finished election.
        states = cluster_admin.settled(
            store, lambda: store.get_partition_states(wanted),
            lambda st: all(tp in st and st[tp][0].leader == assignments[tp[0]][tp[1]][0] for tp in wanted))
        not_preferred = []
        for tp in wanted:
            replicas = assignments[tp[0]][tp[1]]
            s = states.get(tp)
            if s is None or s[0].leader != replicas[0]:
                not_preferred.append(f"{tp[0]}-{tp[1]} (leader {s[0].leader if s else '?'}, "
                                     f"preferred {replicas[0]} {'not in the ISR' if s and replicas[0] not in s[0].isr else 'unavailable'})")
        print(f"{len(wanted) - len(not_preferred)} of {len(wanted)} partitions are led by their preferred replica.")
        for line in not_preferred:
            print(f"  not moved: {line}")
        return 0
