"""`replikafka configs`: entity configs, as ``kafka-configs.sh``.

    replikafka configs --bootstrap-server H:P --entity-type topics --entity-name events \
        --alter --add-config retention.ms=3600000,min.insync.replicas=2 [--delete-config segment.bytes]
    replikafka configs --bootstrap-server H:P --entity-type topics --entity-name events --describe [--all]

    replikafka configs --zookeeper H:P --entity-type users --entity-name alice \\
        --alter --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret]'
    replikafka configs --zookeeper H:P --entity-type users --entity-name alice --alter --delete-config SCRAM-SHA-512
    replikafka configs --zookeeper H:P --entity-type users [--entity-name alice] --describe

Users: SCRAM credentials are stored salted and hashed in ``/config/users/<user>``
(Kafka's format); passwords are never stored or printed. Brokers pick a change
up through a watch. With ``zookeeper.set.acl=true`` set
``REPLIKAFKA_ZK_DIGEST=user:password`` (the brokers' ZooKeeper identity).
"""
from __future__ import annotations

from replikafka import errors as E
from replikafka.cli import command_config
from replikafka.security import scram

ENTITY_TYPES = ("topics", "users")


def add_parser(sub, name):
    p = sub.add_parser(name, help="alter or describe entity configs (as kafka-configs)")
    p.add_argument("--bootstrap-server", metavar="H:P", help="brokers to connect to (topics)")
    command_config.add_argument(p)
    p.add_argument("--zookeeper", metavar="H:P", help="the cluster's ZooKeeper, with chroot (users; topics too)")
    p.add_argument("--entity-type", required=True, choices=ENTITY_TYPES)
    p.add_argument("--entity-name", metavar="NAME")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true")
    action.add_argument("--describe", action="store_true")
    p.add_argument("--all", action="store_true", help="--describe topics: defaults too, not only overrides")
    p.add_argument("--add-config", metavar="K=V,...",
                   help="topics: 'retention.ms=1000,segment.bytes=1048576'; users: 'SCRAM-SHA-256=[password=...]'")
    p.add_argument("--delete-config", metavar="K,...",
                   help="topics: keys to remove; users: SCRAM-SHA-256 and/or SCRAM-SHA-512")
    p.set_defaults(func=run)


# ---------------------------------------------------------------- topics (over the cluster's RPCs)
def parse_topic_add_config(text: str) -> dict[str, str]:
    """``k1=v1,k2=v2`` (kafka-configs' form; a value holding commas goes in [..])."""
    out: dict[str, str] = {}
    depth, start, items = 0, 0, []
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    for item in (i.strip() for i in items):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise E.InvalidConfigError(f"--add-config: {item!r} is not KEY=VALUE")
        value = value.strip()
        out[key.strip()] = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    return out


def _run_topics(args) -> int:
    from replikafka.cli.topics_cmd import admin_for

    if not args.entity_name:
        raise E.InvalidConfigError("--entity-type topics needs --entity-name")
    with admin_for(args) as admin:
        if args.alter:
            add = parse_topic_add_config(args.add_config or "")
            delete = [k.strip() for k in (args.delete_config or "").split(",") if k.strip()]
            if not add and not delete:
                raise E.InvalidConfigError("--alter needs --add-config or --delete-config")
            admin.alter_topic_config(args.entity_name, add, delete)
            print(f"Completed updating config for topic {args.entity_name}.")
            return 0
        entries = admin.describe_topic_config(args.entity_name)
        shown = {k: vs for k, vs in sorted(entries.items()) if args.all or vs[1] == "DYNAMIC_TOPIC_CONFIG"}
        print(f"{'All' if args.all else 'Dynamic'} configs for topic {args.entity_name} are:")
        for key, (value, source) in shown.items():
            print(f"  {key}={value} sensitive=false synonyms={{{source}:{key}={value}}}")
    return 0


def _alter_user(zk, user: str, add_config: str | None, delete_config: str | None) -> None:
    from replikafka.security.zk_security import CredentialStore
    add = {}
    for mech, fields in (scram.parse_add_config(add_config) if add_config else {}).items():
        if mech not in scram.MECHANISMS:
            raise E.InvalidConfigError(f"--add-config: {mech} is not a user config "
                                       f"(users take {', '.join(scram.MECHANISMS)})")
        try:
            iterations = int(fields.get("iterations", scram.ITERATIONS_DEFAULT))
        except ValueError:
            raise E.InvalidConfigError(f"--add-config: {mech} iterations {fields['iterations']!r} "
                                       f"is not an integer") from None
        add[mech] = scram.make_credential(mech, fields["password"], iterations)
    delete = tuple(m.strip() for m in (delete_config or "").split(",") if m.strip())
    for m in delete:
        if m not in scram.MECHANISMS:
            raise E.InvalidConfigError(f"--delete-config: {m} is not one of {', '.join(scram.MECHANISMS)}")
    if not add and not delete:
        raise E.InvalidConfigError("--alter needs --add-config or --delete-config")
    CredentialStore(zk).alter(user, add, delete)
    print(f"Completed updating config for user {user}.")


def run(args) -> int:
    if args.entity_type == "topics":
        if not args.bootstrap_server and not args.zookeeper:
            raise E.InvalidConfigError("--entity-type topics needs --bootstrap-server (or --zookeeper)")
        return _run_topics(args)
    if not args.zookeeper:
        raise E.InvalidConfigError("--entity-type users needs --zookeeper")
    return _run_users(args)


# ---------------------------------------------------------------- users (SCRAM credentials in ZooKeeper)
def _run_users(args) -> int:
    from replikafka.cli.zk_session import zk_session
    from replikafka.security.zk_security import CredentialStore

    if args.alter and not args.entity_name:
        raise E.InvalidConfigError("--alter needs --entity-name")
    with zk_session(args.zookeeper) as zk:
        if args.alter:
            _alter_user(zk, args.entity_name, args.add_config, args.delete_config)
            return 0
        store = CredentialStore(zk)
        for user in ([args.entity_name] if args.entity_name else store.users()):
            creds = store.get(user)
            shown = ",".join(f"{m}=iterations={c.iterations}" for m, c in sorted(creds.items()))
            print(f"SCRAM credential configs for user-principal '{user}' are {shown}")
    return 0
