"""`replikafka console-producer`: one record per line of stdin (as kafka-console-producer.sh).

    replikafka console-producer --bootstrap-server H:P --topic T [--acks all|1|0]
                                [--property parse.key=true --property key.separator=:]

Lines are read in blocks of whatever stdin has ready and sent as one Arrow
batch per block (and per partition when keys choose it); the producer is
flushed at end of input. For a topic with its own schema each line is a JSON
object with the topic's columns. Exit 1 if any record was not delivered.
"""
from __future__ import annotations

import json
import os
import sys

import pyarrow as pa

from replikafka import errors as E
from replikafka.cli import command_config

_READ_BYTES = 1 << 20
_PROPERTIES = {"parse.key", "key.separator", "ignore.error"}


def add_parser(sub, name):
    p = sub.add_parser(name, help="produce stdin lines to a topic")
    p.add_argument("--bootstrap-server", "--broker-list", dest="bootstrap_server", metavar="H:P",
                   help="brokers to connect to (comma-separated)")
    command_config.add_argument(p)
    p.add_argument("--topic", help="the topic to produce to")
    p.add_argument("--acks", "--request-required-acks", dest="acks", default="all", choices=["all", "-1", "1", "0"],
                   help="acknowledgements to wait for (default all)")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="parse.key=true|false, key.separator=SEP (default tab), ignore.error=true|false")
    p.add_argument("--linger-ms", type=int, default=5, help="how long a batch may wait for more lines")
    p.add_argument("--producer-property", action="append", default=[], metavar="KEY=VALUE",
                   help="a Kafka producer config key (batch.size, linger.ms, enable.idempotence, ...; repeatable)")
    p.set_defaults(func=run)


def parse_properties(items: list[str], known: set[str], flag: str = "--property") -> dict[str, str]:
    """``["k=v", "k2=v2,k3=v3", ...]`` -> dict. An item is split on commas only
    when every part is KEY=VALUE (so ``key.separator=,`` works). An unknown key
    or an item without '=' raises ValueError naming it."""
    out = {}
    for item in items:
        parts = item.split(",")
        if len(parts) == 1 or not all("=" in p for p in parts):
            parts = [item]
        for part in parts:
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep or not key:
                raise ValueError(f"{flag} {part!r} is not KEY=VALUE")
            if key not in known:
                raise ValueError(f"{flag} {key!r} is not supported (known: {', '.join(sorted(known))})")
            out[key] = value
    return out


def _truthy(value: str | None) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def run(args) -> int:
    try:
        if not args.bootstrap_server:
            raise ValueError("--bootstrap-server is required")
        if not args.topic:
            raise ValueError("--topic is required")
        props = parse_properties(args.property, _PROPERTIES)
        from replikafka.cli.console_consumer_cmd import client_properties
        producer_props = client_properties(args.producer_property)
        if args.linger_ms < 0:
            raise ValueError("--linger-ms must not be negative")
    except ValueError as exc:
        sys.stderr.write(f"replikafka console-producer: error: {exc}\n")
        return 2
    from replikafka.client.producer import Producer

    parse_key = _truthy(props.get("parse.key"))
    separator = props.get("key.separator", "\t").encode().decode("unicode_escape").encode()
    ignore_error = _truthy(props.get("ignore.error"))
    settings = {"acks": args.acks, "linger.ms": args.linger_ms, **producer_props}  # --producer-property wins
    conf = command_config.client_config_of(args, args.bootstrap_server, **settings)
    with Producer(conf) as producer:
        writer = LineWriter(producer, args.topic, parse_key, separator)
        for block in read_blocks(sys.stdin.buffer):
            writer.write_lines(block)
            if writer.error is not None and not ignore_error:
                break
        producer.flush()
        writer.collect()
    if writer.error is not None:
        sys.stderr.write(f"replikafka console-producer: {writer.failed} record(s) not delivered: {writer.error}\n")
        return 1
    return 0


def read_blocks(stream):
    """Yield lists of complete lines (bytes, without line ends) as stdin makes
    them available; the last line needs no trailing newline."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):
        fd = None  # not a real file (e.g. in tests): read through the object
    rest = b""
    while True:
        chunk = os.read(fd, _READ_BYTES) if fd is not None else stream.read(_READ_BYTES)
        if not chunk:
            if rest:
                yield [rest.rstrip(b"\r")]
            return
        data = rest + chunk
        lines = data.split(b"\n")
        rest = lines.pop()
        if lines:
            yield [ln[:-1] if ln.endswith(b"\r") else ln for ln in lines]


class LineWriter:
    """Turns blocks of lines into Arrow batches and sends them; remembers the
    first delivery error. Used from one thread."""

    def __init__(self, producer, topic: str, parse_key: bool, separator: bytes):
        from replikafka.records import is_kafka_shaped

        self.producer = producer
        self.topic = topic
        self.parse_key = parse_key
        self.separator = separator
        self.schema = producer.topic_schema(topic)
        self.kafka_shaped = is_kafka_shaped(self.schema)
        self.partitions = len(producer.partitions_for(topic))
        self.pending = []
        self.error: BaseException | None = None
        self.failed = 0
        self.line_no = 0

    def write_lines(self, lines: list[bytes]) -> None:
        keys = None
        if self.parse_key:
            keys, values = [], []
            for line in lines:
                self.line_no += 1
                key, sep, value = line.partition(self.separator)
                if not sep:
                    self._fail(E.InvalidSchemaError, f"line {self.line_no}: no key separator {self.separator!r} found", 1)
                    return
                keys.append(key)
                values.append(value)
        else:
            values = lines
            self.line_no += len(lines)
        if keys is None:
            self._send(None, values, None)
            return
        from replikafka.client.partitioner import partition_for_key
        groups: dict[int, tuple[list, list]] = {}
        for k, v in zip(keys, values):
            ks, vs = groups.setdefault(partition_for_key(k, self.partitions), ([], []))
            ks.append(k)
            vs.append(v)
        for p, (ks, vs) in groups.items():
            self._send(p, vs, ks)

    def _send(self, partition: int | None, values: list[bytes], keys: list[bytes] | None) -> None:
        from replikafka.records import HEADER_TYPE

        n = len(values)
        if self.kafka_shaped:
            data = pa.record_batch([pa.array(keys if keys is not None else [None] * n, pa.binary()),
                                    pa.array(values, pa.binary()), pa.nulls(n, HEADER_TYPE)],
                                   names=["key", "value", "headers"])
        else:
            data = []
            first = self.line_no - n + 1
            for i, v in enumerate(values):
                try:
                    row = json.loads(v)
                except ValueError as exc:
                    self._fail(E.InvalidSchemaError, f"line {first + i} is not JSON: {exc}", n)
                    return
                if not isinstance(row, dict):
                    self._fail(E.InvalidSchemaError, f"line {first + i} is not a JSON object", n)
                    return
                data.append(row)
        try:
            self.pending.append((self.producer.send(self.topic, data, partition=partition), n))
        except E.ReplikafkaError as exc:  # refused at send time (schema, types, columns)
            self.failed += n
            if self.error is None:
                self.error = exc

    def _fail(self, cls, message: str, count: int) -> None:
        self.failed += count
        if self.error is None:
            self.error = cls(message)

    def collect(self) -> None:
        """Read the outcome of every send (after flush)."""
        for future, n in self.pending:
            exc = future.exception()
            if exc is not None:
                self.failed += n
                if self.error is None:
                    self.error = exc
        self.pending = []
