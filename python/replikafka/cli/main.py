"""`replikafka <command>`: the command line entry point (also `python -m replikafka`).

Each sub-command lives in its own module exposing ``add_parser(subparsers)``
and ``run(args) -> int``. Errors become a one-line message and a non-zero exit,
never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# command name -> module under replikafka.cli
COMMANDS = {
    "zookeeper": "zookeeper_cmd",
    "broker": "broker_cmd",
    "cluster": "cluster_cmd",
    "topics": "topics_cmd",
    "console-producer": "console_producer_cmd",
    "console-consumer": "console_consumer_cmd",
    "replica-verification": "replica_verification_cmd",
    "state-change-log-merger": "state_change_log_merger_cmd",
    "reassign-partitions": "reassign_partitions_cmd",
    "preferred-replica-election": "preferred_replica_election_cmd",
    "acls": "acls_cmd",
    "configs": "configs_cmd",
    "consumer-lag": "consumer_lag_cmd",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, no usage dump
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of command ``only`` alone: each command's module
    imports what it runs (a broker's start imported every client tool's module,
    seconds of a restart on a loaded machine)."""
    parser = _Parser(prog="replikafka", description="replikafka: a replicated Arrow log store")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, module in COMMANDS.items():
        if only is not None and name != only:
            continue
        try:
            mod = importlib.import_module(f"replikafka.cli.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"replikafka.cli.{module}":
                continue  # command not built in this tree
            raise
        mod.add_parser(sub, name)
    return parser


def main(argv: list[str] | None = None) -> int:
    from replikafka.errors import CommandError, ReplikafkaError

    argv = sys.argv[1:] if argv is None else argv
    # A known command first: build its parser alone (anything else: all, for help and errors).
    parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CommandError as exc:  # local: no server error code to show
        sys.stderr.write(f"replikafka {args.command}: {exc.message}\n")
        return 1
    except ReplikafkaError as exc:
        sys.stderr.write(f"replikafka {args.command}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
