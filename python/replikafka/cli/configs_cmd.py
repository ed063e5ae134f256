"""`replikafka configs`: entity configs, as ``kafka-configs.sh``.

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
from replikafka.security import scram

ENTITY_TYPES = ("users",)


def add_parser(sub, name):
    p = sub.add_parser(name, help="alter or describe entity configs (as kafka-configs)")
    p.add_argument("--zookeeper", metavar="H:P", required=True, help="the cluster's ZooKeeper (with chroot)")
    p.add_argument("--entity-type", required=True, choices=ENTITY_TYPES)
    p.add_argument("--entity-name", metavar="NAME")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--alter", action="store_true")
    action.add_argument("--describe", action="store_true")
    p.add_argument("--add-config", metavar="K=V,...", help="users: 'SCRAM-SHA-256=[password=...]'")
    p.add_argument("--delete-config", metavar="K,...", help="users: SCRAM-SHA-256 and/or SCRAM-SHA-512")
    p.set_defaults(func=run)


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
