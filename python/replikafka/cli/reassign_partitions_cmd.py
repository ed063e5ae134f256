"""`replikafka reassign-partitions`: move partitions to other brokers (seed 003).

    replikafka reassign-partitions --bootstrap-server H:P --topics-to-move-json-file F --broker-list "4,5,6" --generate
    replikafka reassign-partitions --bootstrap-server H:P --reassignment-json-file F --execute [--no-wait]
    replikafka reassign-partitions --zookeeper H:P --reassignment-json-file F --verify

``--generate`` prints the current assignment and a proposal (Kafka's round-robin
over the given brokers); nothing changes. ``--execute`` writes the plan to
``/admin/reassign_partitions``, where the controller carries it out, and shows
its progress until it is done (``--no-wait``: return at once). ``--verify``
reports each partition: completed, still in progress, or failed (exit 0 only
when all completed). Files use the seed-003 JSON:
``{"version":1,"partitions":[{"topic":"t","partition":0,"replicas":[1,2,3]}]}``.
"""
from __future__ import annotations

import json
import sys
import time

from replikafka import cluster_admin
from replikafka import errors as E
from replikafka.cli import command_config

TP = tuple[str, int]


def add_parser(sub, name):
    p = sub.add_parser(name, help="move partitions to other brokers")
    p.add_argument("--bootstrap-server", metavar="H:P", help="brokers to connect to (as Kafka 3.x)")
    command_config.add_argument(p)
    p.add_argument("--zookeeper", metavar="H:P", help="or the cluster's ZooKeeper (with chroot)")
    p.add_argument("--generate", action="store_true", help="propose a plan for --topics-to-move-json-file")
    p.add_argument("--execute", action="store_true", help="start the plan in --reassignment-json-file")
    p.add_argument("--verify", action="store_true", help="check the plan in --reassignment-json-file")
    p.add_argument("--topics-to-move-json-file", metavar="F", help='{"version":1,"topics":[{"topic":"t"}]}')
    p.add_argument("--broker-list", metavar="IDS", help="--generate: the brokers to move to, e.g. \"4,5,6\"")
    p.add_argument("--reassignment-json-file", metavar="F", help="the plan (--execute, --verify)")
    p.add_argument("--no-wait", action="store_true", help="--execute: return once the plan is written")
    p.add_argument("--timeout-ms", type=int, default=600_000, help="--execute: how long to wait (default 600000)")
    p.set_defaults(func=run)


class UsageError(Exception):
    pass


def run(args) -> int:
    try:
        action = _check(args)
        if action == "generate":
            topics = _read_topics_file(args.topics_to_move_json_file)
            brokers = _parse_broker_list(args.broker_list)
        else:
            plan = _read_plan_file(args.reassignment_json_file)
    except UsageError as exc:
        sys.stderr.write(f"replikafka reassign-partitions: error: {exc}\n")
        return 2
    from replikafka.cli.topics_cmd import open_store

    with open_store(args) as store:
        if action == "generate":
            return _generate(store, topics, brokers)
        if action == "execute":
            return _execute(store, plan, wait=not args.no_wait, timeout_s=args.timeout_ms / 1000.0)
        return _verify(store, plan)


def _check(args) -> str:
    chosen = [a for a in ("generate", "execute", "verify") if getattr(args, a)]
    if len(chosen) != 1:
        raise UsageError("give exactly one of --generate, --execute, --verify")
    action = chosen[0]
    if not args.bootstrap_server and not args.zookeeper:
        raise UsageError("--bootstrap-server (or --zookeeper) is required")
    if action == "generate" and (not args.topics_to_move_json_file or not args.broker_list):
        raise UsageError("--generate needs --topics-to-move-json-file and --broker-list")
    if action != "generate" and not args.reassignment_json_file:
        raise UsageError(f"--{action} needs --reassignment-json-file")
    return action


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except OSError as exc:
        raise UsageError(f"cannot read {what} {path!r}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"{what} {path!r} is not valid JSON: {exc}") from None


def _read_topics_file(path: str) -> list[str]:
    d = _read_json(path, "topics-to-move file")
    try:
        topics = [str(e["topic"]) for e in d["topics"]]
    except (KeyError, TypeError):
        raise UsageError(f'topics-to-move file {path!r}: want {{"version":1,"topics":[{{"topic":"t"}}]}}') from None
    if not topics:
        raise UsageError(f"topics-to-move file {path!r} lists no topics")
    return topics


def _parse_broker_list(text: str) -> list[int]:
    try:
        brokers = [int(b) for b in text.split(",") if b.strip()]
    except ValueError:
        raise UsageError(f"--broker-list must be broker ids separated by commas, got {text!r}") from None
    if not brokers or len(set(brokers)) != len(brokers):
        raise UsageError(f"--broker-list must name distinct brokers, got {text!r}")
    return brokers


def _read_plan_file(path: str) -> dict[TP, list[int]]:
    d = _read_json(path, "reassignment file")
    try:
        plan = cluster_admin.parse_reassignment(json.dumps(d).encode())
    except E.InvalidRequestError as exc:
        raise UsageError(f"reassignment file {path!r}: {exc.message if hasattr(exc, 'message') else exc}") from None
    if not plan:
        raise UsageError(f"reassignment file {path!r} lists no partitions")
    for (t, p), replicas in plan.items():
        if not replicas or len(set(replicas)) != len(replicas):
            raise UsageError(f"reassignment file {path!r}: {t}-{p} needs distinct replicas, got {replicas}")
    return plan


def plan_json(plan: dict[TP, list[int]]) -> str:
    return json.dumps({"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": list(r)}
                                                    for (t, p), r in sorted(plan.items())]})


def _current(store, topics) -> dict[TP, list[int]]:
    out = {}
    for t in topics:
        assignment = store.get_assignment(t)
        if assignment is None:
            raise E.UnknownTopicOrPartitionError(f"topic {t!r} does not exist")
        out.update({(t, p): r for p, r in assignment.items()})
    return out


def _generate(store, topics: list[str], brokers: list[int]) -> int:
    current = _current(store, topics)
    proposed: dict[TP, list[int]] = {}
    for t in topics:
        parts = sorted(p for (tt, p) in current if tt == t)
        rf = len(current[(t, parts[0])])
        assignment = cluster_admin.propose_assignment(len(parts), rf, brokers)
        proposed.update({(t, p): assignment[p] for p in parts})
    print("Current partition replica assignment")
    print(plan_json(current))
    print()
    print("Proposed partition reassignment configuration")
    print(plan_json(proposed))
    return 0


def _execute(store, plan: dict[TP, list[int]], wait: bool, timeout_s: float) -> int:
    current = _current(store, sorted({t for t, _ in plan}))
    missing = [f"{t}-{p}" for (t, p) in plan if (t, p) not in current]
    if missing:
        raise E.UnknownTopicOrPartitionError(f"partitions {', '.join(missing)} do not exist")
    live = set(store.live_brokers())
    dead = sorted({b for r in plan.values() for b in r} - live)
    if dead:
        raise E.BrokerNotAvailableError(f"brokers {dead} in the plan are not registered (not running?)")
    print("Current partition replica assignment (save it to roll back)")
    print(plan_json({tp: current[tp] for tp in plan}))
    print()
    store.create_reassignment(plan)
    print(f"Successfully started reassignment of {len(plan)} partitions.")
    if not wait:
        return 0
    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        status = _status(store, plan)
        done = sum(1 for s in status.values() if s[0] != "in progress")
        line = f"reassignment: {done}/{len(plan)} partitions done"
        waiting = [f"{t}-{p} ({s[1]})" for (t, p), s in sorted(status.items()) if s[0] == "in progress"]
        if waiting:
            line += "; waiting for " + ", ".join(waiting[:5]) + (" ..." if len(waiting) > 5 else "")
        if line != last:
            print(line, flush=True)
            last = line
        if done == len(plan):
            # A broker's metadata may still show the old replicas of a partition ZooKeeper
            # has finished: give it time to catch up before calling that a failure.
            return _report(cluster_admin.settled(
                store, lambda: _status(store, plan), lambda st: all(s[0] == "completed" for s in st.values())))
        if time.monotonic() > deadline:
            print(f"reassignment not finished after {timeout_s:.0f}s; it continues in the cluster "
                  f"(check with --verify)", file=sys.stderr)
            return 1
        time.sleep(0.5)


def _status(store, plan: dict[TP, list[int]]) -> dict[TP, tuple[str, str]]:
    """(status, detail) per partition: completed, in progress, or failed."""
    pending = store.get_reassignment()
    # One read per topic and one batch of states, not a read per partition (over RPCs each is a Metadata).
    assignments = {t: store.get_assignment(t) or {} for t in {t for t, _ in plan}}
    states = store.get_partition_states([tp for tp in plan if tp in pending])
    out = {}
    for (t, p), replicas in plan.items():
        assignment = assignments[t]
        if (t, p) in pending:
            state = states.get((t, p))
            isr = set(state[0].isr) if state else set()
            lagging = [b for b in replicas if b not in isr]
            out[(t, p)] = ("in progress", f"replicas {lagging} not in sync yet" if lagging else "moving leadership")
        elif assignment.get(p) == list(replicas):
            out[(t, p)] = ("completed", "")
        else:
            out[(t, p)] = ("failed", f"replicas are {assignment.get(p)}, not {list(replicas)} "
                                     f"(see the controller's log)")
    return out


def _report(status) -> int:
    for (t, p), (s, detail) in sorted(status.items()):
        if s == "completed":
            print(f"Reassignment of partition {t}-{p} completed successfully")
        elif s == "in progress":
            print(f"Reassignment of partition {t}-{p} is still in progress: {detail}")
        else:
            print(f"Reassignment of partition {t}-{p} failed: {detail}")
    return 0 if all(s == "completed" for s, _ in status.values()) else 1


def _verify(store, plan: dict[TP, list[int]]) -> int:
    print("Status of partition reassignment:")
    return _report(_status(store, plan))
