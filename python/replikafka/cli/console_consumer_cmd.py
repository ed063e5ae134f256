"""`replikafka console-consumer`: print committed records of a topic (as kafka-console-consumer.sh).

    replikafka console-consumer --bootstrap-server H:P --topic T [--from-beginning]
                                [--partition P [--offset O|earliest|latest]] [--max-messages N]
                                [--timeout-ms T] [--property print.key=true,print.offset=true,...]

Values are printed as UTF-8 (invalid bytes replaced), one per line; for a
topic with its own schema each record is a JSON object of its columns.
Without --from-beginning or --offset it starts at the end (the high
watermark). It stops after --max-messages records, or after --timeout-ms
without a new record; "Processed a total of N messages" goes to stderr.
"""
from __future__ import annotations

import base64
import datetime
import decimal
import json
import os
import sys
import time

from replikafka.cli.console_producer_cmd import parse_properties
from replikafka.cli import command_config

_PROPERTIES = {"print.key", "print.value", "print.offset", "print.partition", "print.timestamp",
               "print.headers", "key.separator", "line.separator", "headers.separator", "headers.key.separator"}


def add_parser(sub, name):
    p = sub.add_parser(name, help="print the committed records of a topic")
    p.add_argument("--bootstrap-server", dest="bootstrap_server", metavar="H:P",
                   help="brokers to connect to (comma-separated)")
    command_config.add_argument(p)
    p.add_argument("--topic", help="the topic to read")
    p.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    p.add_argument("--partition", type=int, help="read only this partition")
    p.add_argument("--offset", help="with --partition: start offset, or earliest/latest")
    p.add_argument("--max-messages", type=int, help="stop after this many records")
    p.add_argument("--timeout-ms", type=int, help="stop after this long without a new record")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="print.key, print.value, print.offset, print.partition, print.timestamp, print.headers "
                        "(true/false), key.separator (default tab), line.separator (default newline), "
                        "headers.separator (default ','), headers.key.separator (default ':')")
    p.add_argument("--consumer-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a Kafka consumer config key (fetch.max.bytes, max.partition.fetch.bytes, ...; repeatable)")
    p.set_defaults(func=run)


def client_properties(items: list[str]) -> dict[str, str]:
    """``--producer-property`` / ``--consumer-property`` items -> a Kafka client config dict."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{item!r} is not KEY=VALUE")
        out[key.strip()] = value.strip()
    return out


def _truthy(value) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def _check(args) -> dict[str, str]:
    if not args.bootstrap_server:
        raise ValueError("--bootstrap-server is required")
    if not args.topic:
        raise ValueError("--topic is required")
    if args.offset is not None:
        if args.partition is None:
            raise ValueError("--offset needs --partition")
        if args.from_beginning:
            raise ValueError("--offset cannot be used with --from-beginning")
        if args.offset not in ("earliest", "latest") and not (args.offset.isdigit()):
            raise ValueError(f"--offset must be a non-negative number, earliest or latest, got {args.offset!r}")
    if args.partition is not None and args.partition < 0:
        raise ValueError(f"--partition must not be negative, got {args.partition}")
    if args.max_messages is not None and args.max_messages < 1:
        raise ValueError(f"--max-messages must be at least 1, got {args.max_messages}")
    if args.timeout_ms is not None and args.timeout_ms < 0:
        raise ValueError(f"--timeout-ms must not be negative, got {args.timeout_ms}")
    client_properties(args.consumer_property)
    return parse_properties(args.property, _PROPERTIES)


def run(args) -> int:
    try:
        props = _check(args)
    except ValueError as exc:
        sys.stderr.write(f"replikafka console-consumer: error: {exc}\n")
        return 2
    from replikafka import errors as E
    from replikafka.client.consumer import Consumer

    formatter = Formatter(props)
    count = 0
    with Consumer(command_config.client_config_of(args, args.bootstrap_server,
                                                  **client_properties(args.consumer_property))) as consumer:
        partitions = consumer.partitions_for(args.topic)
        if args.partition is not None:
            if args.partition not in partitions:
                raise E.UnknownTopicOrPartitionError(
                    f"topic {args.topic!r} has no partition {args.partition} (it has {len(partitions)})")
            partitions = [args.partition]
        tps = [(args.topic, p) for p in partitions]
        consumer.assign(tps)
        if args.offset is not None and args.offset.isdigit():
            consumer.seek(tps[0], int(args.offset))
        elif args.from_beginning or args.offset == "earliest":
            consumer.seek_to_beginning()
        else:
            consumer.seek_to_end()
        formatter.json_rows = not _is_kafka_shaped(consumer.topic_schema(args.topic))
        last_data = time.monotonic()
        try:
            while args.max_messages is None or count < args.max_messages:
                wait_ms = 1000
                if args.timeout_ms is not None:
                    left = args.timeout_ms - (time.monotonic() - last_data) * 1000
                    if left <= 0:
                        break
                    wait_ms = int(min(wait_ms, left)) + 1
                table = consumer.poll(timeout_ms=wait_ms)
                if table.num_rows == 0:
                    continue
                if args.max_messages is not None:
                    table = table.slice(0, args.max_messages - count)
                sys.stdout.write(formatter.format(table))
                sys.stdout.flush()
                count += table.num_rows
                last_data = time.monotonic()
        except BrokenPipeError:
            # the reader went away (e.g. `| head`): stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except KeyboardInterrupt:
            pass
    sys.stderr.write(f"Processed a total of {count} messages\n")
    return 0


def _is_kafka_shaped(schema) -> bool:
    from replikafka.records import is_kafka_shaped
    return is_kafka_shaped(schema)


def _text(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _json_default(value):
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, datetime.timedelta)):
        return str(value)
    return repr(value)


class Formatter:
    """Turns a polled table into output lines, Kafka's DefaultMessageFormatter
    order: CreateTime, Partition, Offset, key, value."""

    def __init__(self, props: dict[str, str]):
        self.print_key = _truthy(props.get("print.key", "false"))
        self.print_value = _truthy(props.get("print.value", "true"))
        self.print_offset = _truthy(props.get("print.offset", "false"))
        self.print_partition = _truthy(props.get("print.partition", "false"))
        self.print_timestamp = _truthy(props.get("print.timestamp", "false"))
        self.key_sep = props.get("key.separator", "\t").encode().decode("unicode_escape")
        self.line_sep = props.get("line.separator", "\n").encode().decode("unicode_escape")
        self.print_headers = _truthy(props.get("print.headers", "false"))
        self.headers_sep = props.get("headers.separator", ",").encode().decode("unicode_escape")
        self.headers_key_sep = props.get("headers.key.separator", ":").encode().decode("unicode_escape")
        self.json_rows = False

    def format(self, table) -> str:
        n = table.num_rows
        cols = {}
        for name in ("partition", "offset"):
            if getattr(self, f"print_{name}"):
                cols[name] = table.column(name).to_pylist()
        if self.print_timestamp:
            cols["timestamp"] = table.column("timestamp").cast("int64").to_pylist()
        if self.json_rows:
            data = [n_ for n_ in table.column_names if n_ not in ("topic", "partition", "offset", "timestamp")]
            values = [json.dumps(r, default=_json_default, ensure_ascii=False)
                      for r in table.select(data).to_pylist()] if self.print_value else None
            keys = None
        else:
            values = [_text(v) for v in table.column("value").to_pylist()] if self.print_value else None
            keys = [_text(k) for k in table.column("key").to_pylist()] if self.print_key else None
        headers = None
        if self.print_headers:
            raw = table.column("headers").to_pylist() if "headers" in table.column_names else [None] * n
            headers = [self.headers_sep.join(f"{h['key']}{self.headers_key_sep}{_text(h['value'])}" for h in hs)
                       if hs else "NO_HEADERS" for hs in raw]
        out = []
        for i in range(n):
            parts = []
            if self.print_timestamp:
                parts.append(f"CreateTime:{cols['timestamp'][i]}")
            if self.print_partition:
                parts.append(f"Partition:{cols['partition'][i]}")
            if self.print_offset:
                parts.append(f"Offset:{cols['offset'][i]}")
            if headers is not None:
                parts.append(headers[i])
            if keys is not None:
                parts.append(keys[i])
            if values is not None:
                parts.append(values[i])
            out.append(self.key_sep.join(parts))
        return self.line_sep.join(out) + self.line_sep
