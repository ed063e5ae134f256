"""`replikafka acls`: add, remove and list ACLs, as ``kafka-acls.sh``.

    replikafka acls --zookeeper H:P --add --allow-principal User:alice --operation Read --topic orders
    replikafka acls --authorizer-properties zookeeper.connect=H:P --add --allow-principal User:app \\
        --operation Write --topic sales- --resource-pattern-type prefixed
    replikafka acls --zookeeper H:P --remove --allow-principal User:alice --operation Read --topic orders
    replikafka acls --zookeeper H:P --list [--topic T | --cluster] [--principal User:alice]

ACLs live in ZooKeeper (``/kafka-acl``, ``/kafka-acl-extended``); brokers see a
change through their watch within a second. With ``zookeeper.set.acl=true``
only the brokers' ZooKeeper identity may change them: set
``REPLIKAFKA_ZK_DIGEST=user:password``.
"""
from __future__ import annotations

import sys

from replikafka import errors as E
from replikafka.security import acl as A

# Kafka's --producer / --consumer shortcuts (AclCommand): per topic, plus on the cluster.
PRODUCER_TOPIC_OPS = ("Write", "Describe", "Create")
CONSUMER_TOPIC_OPS = ("Read", "Describe")


def add_parser(sub, name):
    p = sub.add_parser(name, help="add, remove or list ACLs (as kafka-acls)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--zookeeper", metavar="H:P", help="the cluster's ZooKeeper (with chroot)")
    where.add_argument("--authorizer-properties", metavar="K=V", nargs="+",
                       help="as kafka-acls: zookeeper.connect=H:P")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", action="store_true", help="add the ACLs described")
    action.add_argument("--remove", action="store_true", help="remove the ACLs described (all of the resource's "
                                                              "if no principal is given)")
    action.add_argument("--list", action="store_true", help="list ACLs")
    p.add_argument("--allow-principal", action="append", default=[], metavar="P", help="User:name, or User:*")
    p.add_argument("--deny-principal", action="append", default=[], metavar="P", help="User:name, or User:*")
    p.add_argument("--allow-host", action="append", default=[], metavar="H", help="default: * (any host)")
    p.add_argument("--deny-host", action="append", default=[], metavar="H", help="default: * (any host)")
    p.add_argument("--principal", metavar="P", help="--list: only ACLs of this principal")
    p.add_argument("--operation", action="append", default=[], metavar="OP",
                   help=f"one of {', '.join(A.OPERATIONS)} (repeatable; default All)")
    p.add_argument("--topic", action="append", default=[], metavar="T", help="a topic name, '*' or a prefix")
    p.add_argument("--cluster", action="store_true", help="the cluster resource")
    p.add_argument("--resource-pattern-type", default=None, metavar="TYPE",
                   help="literal (default) or prefixed; --list also takes any and match")
    p.add_argument("--producer", action="store_true", help="Write, Describe, Create on the topics")
    p.add_argument("--consumer", action="store_true", help="Read, Describe on the topics")
    p.add_argument("--force", action="store_true", help="accepted for compatibility (there is no prompt)")
    p.set_defaults(func=run)


def _connect(args) -> str:
    if args.zookeeper:
        return args.zookeeper
    props = dict(kv.partition("=")[::2] for kv in args.authorizer_properties)
    if not props.get("zookeeper.connect"):
        raise E.InvalidConfigError("--authorizer-properties needs zookeeper.connect=H:P")
    return props["zookeeper.connect"]


def _patterns(args, for_list: bool) -> list[A.ResourcePattern] | None:
    """The resource patterns named (None = every pattern, for --list without a resource)."""
    ptype = (args.resource_pattern_type or "literal").lower()
    if ptype in ("any", "match"):
        if not for_list:
            raise E.InvalidConfigError(f"--resource-pattern-type {ptype} is only for --list")
        ptype = None
    else:
        ptype = A.pattern_type_name(ptype)
    out = []
    for t in args.topic:
        out.extend(A.ResourcePattern("Topic", t, p) for p in ((ptype,) if ptype else A.PATTERN_TYPES)
                   if not (p == "prefixed" and t == A.WILDCARD))
    if args.cluster:
        out.append(A.CLUSTER)
    if not out:
        if for_list:
            return None
        raise E.InvalidConfigError("name a resource: --topic T and/or --cluster")
    return out


def _entries(args) -> dict[A.ResourcePattern, frozenset[A.AclEntry]] | None:
    patterns = _patterns(args, for_list=False)
    if args.producer or args.consumer:
        ops = (PRODUCER_TOPIC_OPS if args.producer else ()) + (CONSUMER_TOPIC_OPS if args.consumer else ())
    else:
        ops = tuple(A.operation_name(o) for o in args.operation) or ("All",)
    if args.remove and not (args.allow_principal or args.deny_principal):
        return None
    if not (args.allow_principal or args.deny_principal):
        raise E.InvalidConfigError("--add needs --allow-principal or --deny-principal")
    grants = [(A.check_principal(p), h, "Allow") for p in args.allow_principal
              for h in (args.allow_host or [A.WILDCARD])]
    grants += [(A.check_principal(p), h, "Deny") for p in args.deny_principal
               for h in (args.deny_host or [A.WILDCARD])]
    out = {}
    for pattern in patterns:
        pattern_ops = ops
        if pattern.resource_type == "Cluster" and (args.producer or args.consumer):
            pattern_ops = ("IdempotentWrite",) if args.producer else ()
        elif pattern.resource_type == "Topic" and not (args.producer or args.consumer):
            bad = [o for o in pattern_ops if o in ("ClusterAction", "IdempotentWrite")]
            if bad:
                raise E.InvalidConfigError(f"operation {bad[0]} applies to --cluster, not to a topic")
        out[pattern] = frozenset(A.AclEntry(p, h, op, perm) for p, h, perm in grants for op in pattern_ops)
    return out


def _print(pattern: A.ResourcePattern, entries, principal: str | None) -> None:
    shown = sorted(e for e in entries if principal is None or e.principal == principal)
    if shown:
        print(f"Current ACLs for resource `{pattern}`: ")
        for e in shown:
            print(f" \t{e} ")
        print()


def run(args) -> int:
    from replikafka.cli.zk_session import zk_session
    from replikafka.security.zk_security import AclStore

    if args.principal:
        A.check_principal(args.principal)
    with zk_session(_connect(args)) as zk:
        store = AclStore(zk)
        if args.list:
            wanted = _patterns(args, for_list=True)
            snapshot = store.snapshot()
            for pattern in sorted(snapshot.acls):
                if wanted is None or pattern in wanted or (
                        (args.resource_pattern_type or "").lower() == "match"
                        and any(pattern.matches(w.resource_type, w.name) for w in wanted)):
                    _print(pattern, snapshot.acls[pattern], args.principal)
            return 0
        store.ensure_paths()
        changes = _entries(args)
        if changes is None:   # --remove without principals: every ACL of the resources
            for pattern in _patterns(args, for_list=False):
                store.change(pattern, remove=None)
                print(f"Removed all ACLs for resource `{pattern}`")
            return 0
        for pattern, entries in changes.items():
            if args.add:
                after = store.change(pattern, add=entries)
                print(f"Adding ACLs for resource `{pattern}`: ")
            else:
                after = store.change(pattern, remove=entries)
                print(f"Removing ACLs for resource `{pattern}`: ")
            for e in sorted(entries):
                print(f" \t{e} ")
            print()
            _print(pattern, after, None)
    sys.stdout.flush()
    return 0
