"""`replikafka broker conf/server.properties [--override key=value ...]`."""
from __future__ import annotations

import argparse
import logging
import os


def add_parser(sub, name):
    p = sub.add_parser(name, help="run one broker in the foreground")
    p.add_argument("config", help="server.properties file")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of the properties file (repeatable)")
    p.add_argument("--log-level", default=os.environ.get("REPLIKAFKA_LOG_LEVEL"), type=_log_level,
                   help=f"root log level, one of {', '.join(LOG_LEVELS)}, over the config's log.level "
                        f"(default: log.level, or $REPLIKAFKA_LOG_LEVEL)")
    p.set_defaults(func=run)


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    level = str(text).strip().upper()
    if level == "WARN":
        level = "WARNING"
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a log level (use {', '.join(LOG_LEVELS)})")
    return level


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

    from replikafka.broker import log_levels

    _die_with_parent()
    config = BrokerConfig.load(args.config, args.override)  # a bad key stops us here, named
    logging.basicConfig(format="%(asctime)s %(levelname)s [%(threadName)s] %(name)s: %(message)s")
    logging.getLogger("kazoo").setLevel(logging.WARNING)
    log_levels.apply(config)                      # log.level and log.level.<logger> keys
    if args.log_level:
        log_levels.set_level("", args.log_level)
    if config.ignored_kafka_keys:
        logging.getLogger("replikafka.broker").warning(
            "ignoring Kafka config keys that do not apply to replikafka: %s", ", ".join(config.ignored_kafka_keys))
    return run_broker(config)
