"""`replikafka broker conf/server.properties [--override key=value ...]`."""
from __future__ import annotations

import logging
import os


def add_parser(sub, name):
    p = sub.add_parser(name, help="run one broker in the foreground")
    p.add_argument("config", help="server.properties file")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the properties file (repeatable)")
    p.add_argument("--log-level", default=os.environ.get("REPLIKAFKA_LOG_LEVEL", "INFO"))
    p.set_defaults(func=run)


def _die_with_parent() -> None:
    """Under LocalCluster(die_with_parent=True): SIGKILL from the kernel when the
    process that started us dies (Linux), and exit now if it already has."""
    from replikafka.local_cluster import PARENT_PID_ENV
    from replikafka.zookeeper_server import _set_pdeathsig

    parent = os.environ.get(PARENT_PID_ENV)
    if parent:
        _set_pdeathsig()
        if os.getppid() != int(parent):
            os._exit(1)


def run(args) -> int:
    from replikafka.broker.config import BrokerConfig
    from replikafka.broker.server import run_broker

    _die_with_parent()
    config = BrokerConfig.load(args.config, args.override)  # a bad key stops us here, named
    logging.basicConfig(level=getattr(logging, str(args.log_level).upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    return run_broker(config)
