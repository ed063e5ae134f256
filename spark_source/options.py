"""Options of ``format("replikafka")``: parsing, validation, one error per bad option.

Pure: no I/O. Everything the reader and writer need from the user's options is
parsed here once, on the driver, into frozen dataclasses that are pickled to
the planner and executor workers.

Names are Spark Kafka source's (see ``INTERFACE.md``); Spark hands them to us in
a case-insensitive dict (lower-cased keys), and every message names the option
the way the user wrote it in the docs (``startingOffsets``, not
``startingoffsets``). An unknown option is refused rather than ignored: a typo
such as ``startingOffset`` would otherwise silently read from the default.

Offset specs use Kafka's sentinels: ``-2`` earliest, ``-1`` latest (the high
watermark, HW). A timestamp spec asks the broker's time index for the first
offset whose timestamp is at or after the given milliseconds.
"""
from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from replikafka.errors import InvalidConfigError

EARLIEST = -2
LATEST = -1

#: Default for the executors' wait on data that was committed at planning time
#: but is not readable yet (leader change). Long enough for a leader election,
#: short enough that a stuck read fails loudly.
DEFAULT_FETCH_TIMEOUT_MS = 120_000
#: ``fetchMaxBytes``: what a task holds of a partition ahead of Spark, in bytes: its Flight
#: stream's receive window, or the size of each Fetch answer (without Flight). Measured: an
#: 8 MiB Fetch answer costs the broker ~2x the CPU per byte of a 2-4 MiB one.
DEFAULT_FETCH_MAX_BYTES = 2 * 1024 * 1024
DEFAULT_MAX_TRIGGER_DELAY_MS = 15 * 60 * 1000
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
DEFAULT_SINK_CHUNK_ROWS = 4096
#: Spark's ``fetchOffset.numRetries`` / ``fetchOffset.retryIntervalMs``: how often a
#: stream asks again when a high watermark is below its offset before calling it data loss.
DEFAULT_FETCH_OFFSET_RETRIES = 3
DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS = 10


class OptionError(InvalidConfigError):
    """A ``format("replikafka")`` option is missing, malformed or contradicts another."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"option '{option}': {message}")


# Canonical spellings; Spark lower-cases the keys it hands the data source.
SOURCE_OPTIONS = (
    "bootstrap.servers", "kafka.bootstrap.servers",
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets",
    "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "endingTimestamp", "endingOffsetsByTimestamp",
    "failOnDataLoss", "minPartitions", "maxRecordsPerPartition", "includeHeaders", "columns",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "fetchTimeoutMs", "fetchMaxBytes", "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
)
SINK_OPTIONS = ("bootstrap.servers", "kafka.bootstrap.servers", "topic", "deliveryTimeoutMs", "sinkChunkRows")
#: Security, as Spark's Kafka source passes client keys through (``kafka.`` + librdkafka's names).
SECURITY_OPTIONS = ("kafka.security.protocol", "kafka.ssl.ca.location", "kafka.ssl.certificate.location",
                    "kafka.ssl.key.location", "kafka.ssl.key.password", "kafka.sasl.mechanism",
                    "kafka.sasl.username", "kafka.sasl.password")
SOURCE_OPTIONS = SOURCE_OPTIONS + SECURITY_OPTIONS
SINK_OPTIONS = SINK_OPTIONS + SECURITY_OPTIONS
BATCH_ONLY = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")
#: Keys Spark itself may add to a source's or sink's options; never ours to judge.
SPARK_INJECTED = ("path", "paths", "checkpointLocation", "queryName")
#: Spark Kafka source options with no meaning here (no consumer, no consumer
#: group): accepted and ignored with a warning naming them, so ported jobs run.
SPARK_IGNORED = ("kafkaConsumer.pollTimeoutMs", "groupIdPrefix")
#: Other ``kafka.*`` options (Kafka client configs Spark passes to its consumer
#: and producer) than ``kafka.bootstrap.servers`` and ``SECURITY_OPTIONS`` are
#: accepted and ignored with a warning naming them.
KAFKA_PREFIX = "kafka."

_CANONICAL = {name.lower(): name for name in SOURCE_OPTIONS + SINK_OPTIONS + SPARK_INJECTED}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|sec|secs|m|min|mins|h|hour|hours|d|day|days)?\s*$", re.IGNORECASE)
_DURATION_MS = {None: 1, "ms": 1, "s": 1000, "sec": 1000, "secs": 1000, "m": 60_000, "min": 60_000,
                "mins": 60_000, "h": 3_600_000, "hour": 3_600_000, "hours": 3_600_000,
                "d": 86_400_000, "day": 86_400_000, "days": 86_400_000}


# ---------------------------------------------------------------- specs
@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: exactly one of the three forms."""
    kind: str                                  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()               # subscribe
    pattern: str = ""                          # subscribePattern
    assignment: tuple[tuple[str, tuple[int, ...]], ...] = ()   # assign

    @property
    def option(self) -> str:
        return self.kind

    def matches(self, topic: str) -> bool:
        if self.kind == "subscribe":
            return topic in self.topics
        if self.kind == "subscribePattern":
            return re.fullmatch(self.pattern, topic) is not None
        return any(t == topic for t, _ in self.assignment)


@dataclass(frozen=True)
class OffsetSpec:
    """Where a range starts or ends.

    ``kind``: ``"earliest"``, ``"latest"``, ``"offsets"`` (``per_partition``
    maps ``(topic, partition)`` to an offset or a -2/-1 sentinel),
    ``"timestamp"`` (``timestamp_ms`` for every partition) or
    ``"timestamps"`` (``per_partition`` maps to milliseconds). ``option`` is the
    option it came from, for error messages.
    """
    kind: str
    option: str
    per_partition: tuple[tuple[tuple[str, int], int], ...] = ()
    timestamp_ms: int = -1
    #: Spark's topic-level offsets, ``{"topic": "earliest"}``: every partition of the topic.
    per_topic: tuple[tuple[str, int], ...] = ()

    def as_dict(self) -> dict[tuple[str, int], int]:
        return dict(self.per_partition)

    def offset_of(self, tp: tuple[str, int]) -> int | None:
        """The offset (or -2/-1 sentinel) this spec gives ``tp``, per partition or per topic."""
        found = dict(self.per_partition).get(tp)
        return found if found is not None else dict(self.per_topic).get(tp[0])

    @property
    def topics(self) -> set[str]:
        return {t for (t, _), _ in self.per_partition} | {t for t, _ in self.per_topic}


@dataclass(frozen=True)
class SourceOptions:
    bootstrap: str
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    timestamp_strategy: str = "error"          # startingOffsetsByTimestampStrategy
    fail_on_data_loss: bool = True
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    include_headers: bool = False
    columns: tuple[str, ...] | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = DEFAULT_MAX_TRIGGER_DELAY_MS
    fetch_timeout_ms: int = DEFAULT_FETCH_TIMEOUT_MS
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    fetch_offset_retries: int = DEFAULT_FETCH_OFFSET_RETRIES
    fetch_offset_retry_interval_ms: int = DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS
    streaming: bool = False
    # (key, value) client security settings; never in repr (plans, logs)
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    #: ``(option, why)`` for options accepted but not used (warned about once).
    ignored: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    chunk_rows: int = DEFAULT_SINK_CHUNK_ROWS
    extra: dict = field(default_factory=dict)
    security: tuple[tuple[str, str], ...] = field(default=(), repr=False)
    ignored: tuple[tuple[str, str], ...] = ()


# ---------------------------------------------------------------- helpers
def _normalise(options: Mapping[str, Any], allowed: tuple[str, ...]) -> dict[str, str]:
    """Keys -> canonical spelling; refuses unknown keys, suggesting the close one."""
    out: dict[str, str] = {}
    allowed_lower = {a.lower(): a for a in allowed + SPARK_INJECTED}
    for key, value in options.items():
        low = str(key).lower()
        if low in _IGNORED_LOWER or (low.startswith(KAFKA_PREFIX) and low not in allowed_lower):
            continue
        if low in allowed_lower:
            name = allowed_lower[low]
            if name in SPARK_INJECTED:
                continue
            out[name] = "" if value is None else str(value)
            continue
        if low in _CANONICAL:
            raise OptionError(_CANONICAL[low], "does not apply here "
                              f"(the {'sink' if allowed is SOURCE_OPTIONS else 'source'} takes it)")
        close = difflib.get_close_matches(low, list(allowed_lower), n=1, cutoff=0.75)
        hint = f"; did you mean '{allowed_lower[close[0]]}'?" if close else ""
        raise OptionError(str(key), f"is not an option of format(\"replikafka\"){hint}")
    return out


def _security(opts: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``kafka.security.*``/``kafka.ssl.*``/``kafka.sasl.*`` options as client keys, checked now
    (on the driver) so a bad one fails the query with the option named."""
    from replikafka.security.tls import ClientSecurity
    sec = tuple(sorted((k[len("kafka."):], v) for k, v in opts.items() if k in SECURITY_OPTIONS))
    try:
        ClientSecurity.from_config(dict(sec))
    except InvalidConfigError as exc:
        raise OptionError("kafka.security.protocol", exc.message) from None
    return sec


_IGNORED_LOWER = {n.lower() for n in SPARK_IGNORED}


def ignored_options(options: Mapping[str, Any], allowed: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The options :func:`_normalise` passes over, with why (for a warning)."""
    allowed_lower = {a.lower() for a in allowed}
    out = []
    for key in options:
        low = str(key).lower()
        if low in _IGNORED_LOWER:
            out.append((next(n for n in SPARK_IGNORED if n.lower() == low),
                        "a Spark Kafka consumer setting; replikafka has no consumer to apply it to"))
        elif low.startswith(KAFKA_PREFIX) and low not in allowed_lower:
            out.append((str(key), "a Kafka client config; replikafka's own client does not use it"))
    return tuple(sorted(out))


def _bootstrap(opts: dict[str, str]) -> str:
    a, b = opts.get("bootstrap.servers"), opts.get("kafka.bootstrap.servers")
    if a is not None and b is not None and a.strip() != b.strip():
        raise OptionError("bootstrap.servers", "both 'bootstrap.servers' and 'kafka.bootstrap.servers' are set, "
                          "to different values; set one")
    value = (a if a is not None else b or "").strip()
    if not value:
        raise OptionError("bootstrap.servers", "is required (host:port[,host:port...])")
    for item in value.split(","):
        host, sep, port = item.strip().rpartition(":")
        if not item.strip():
            continue
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OptionError("bootstrap.servers", f"{item.strip()!r} is not host:port")
    return value


def parse_bool(opts: dict[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name)
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise OptionError(name, f"must be true or false, got {raw!r}")


def parse_int(opts: dict[str, str], name: str, minimum: int = 1) -> int | None:
    raw = opts.get(name)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        raise OptionError(name, f"must be an integer, got {raw!r}") from None
    if value < minimum:
        raise OptionError(name, f"must be >= {minimum}, got {value}")
    return value


def _int_or(value: int | None, default: int) -> int:
    return default if value is None else value


def parse_duration_ms(opts: dict[str, str], name: str, default: int) -> int:
    raw = opts.get(name)
    if raw is None:
        return default
    m = _DURATION.match(raw)
    if not m:
        raise OptionError(name, f"must be a duration such as 500ms, 30s, 15m, 1h, got {raw!r}")
    return int(m.group(1)) * _DURATION_MS[m.group(2).lower() if m.group(2) else None]


def _json(opts: dict[str, str], name: str) -> Any:
    try:
        return json.loads(opts[name])
    except json.JSONDecodeError as exc:
        raise OptionError(name, f"is not valid JSON ({exc.msg} at character {exc.pos}): {opts[name]!r}") from None


def _partition_number(name: str, topic: str, raw: Any) -> int:
    text = str(raw).strip()
    if isinstance(raw, bool) or not text.isdigit():
        raise OptionError(name, f"topic {topic!r}: partition {raw!r} is not a non-negative integer")
    return int(text)


def _per_partition_json(opts: dict[str, str], name: str, *, sentinels: bool, per_topic: list | None = None
                        ) -> tuple:
    """``{"t": {"p": n}}`` -> sorted ``(((t, p), n), ...)``. With ``per_topic``
    (a list to fill), Spark's topic-level form ``{"t": "earliest"|"latest"}`` is
    accepted too and lands there as ``(t, -2|-1)``."""
    doc = _json(opts, name)
    if not isinstance(doc, dict) or not doc:
        raise OptionError(name, 'must be a JSON object such as {"events":{"0":23,"1":-2}}')
    out = []
    for topic, parts in doc.items():
        if per_topic is not None and isinstance(parts, str):
            if parts.strip().lower() not in ("earliest", "latest"):
                raise OptionError(name, f'topic {topic!r} maps to {parts!r}; a topic-level offset is "earliest" '
                                  'or "latest"')
            per_topic.append((topic, EARLIEST if parts.strip().lower() == "earliest" else LATEST))
            continue
        if not isinstance(parts, dict) or not parts:
            raise OptionError(name, f'topic {topic!r} must map to an object such as {{"0": 23}}')
        for p, value in parts.items():
            pn = _partition_number(name, topic, p)
            if isinstance(value, bool) or not isinstance(value, int):
                raise OptionError(name, f"{topic}-{pn}: {value!r} is not an integer")
            if value < (-2 if sentinels else 0):
                raise OptionError(name, f"{topic}-{pn}: {value} is not "
                                  + ("an offset, -2 (earliest) or -1 (latest)" if sentinels else "a time in ms"))
            out.append(((topic, pn), value))
    return tuple(sorted(out))


def _timestamp(opts: dict[str, str], name: str) -> int:
    raw = opts[name].strip()
    if not raw.lstrip("-").isdigit():
        raise OptionError(name, f"must be milliseconds since the epoch, got {opts[name]!r}")
    value = int(raw)
    if value < 0:
        raise OptionError(name, f"must be milliseconds since the epoch (>= 0), got {value}")
    return value


def _subscription(opts: dict[str, str]) -> Subscription:
    given = [n for n in ("subscribe", "subscribePattern", "assign") if n in opts]
    if not given:
        raise OptionError("subscribe", "one of 'subscribe', 'subscribePattern' or 'assign' is required")
    if len(given) > 1:
        raise OptionError(given[1], f"only one of 'subscribe', 'subscribePattern', 'assign' may be set "
                          f"(got {', '.join(given)})")
    kind = given[0]
    raw = opts[kind]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.split(",") if t.strip()))
        if not topics:
            raise OptionError("subscribe", "names no topic; use a comma-separated list such as 'events,clicks'")
        return Subscription("subscribe", topics=topics)
    if kind == "subscribePattern":
        if not raw.strip():
            raise OptionError("subscribePattern", "is empty; give a regular expression such as 'events-.*'")
        try:
            re.compile(raw)
        except re.error as exc:
            raise OptionError("subscribePattern", f"is not a valid regular expression: {exc}") from None
        return Subscription("subscribePattern", pattern=raw)
    doc = _json(opts, "assign")
    if not isinstance(doc, dict) or not doc:
        raise OptionError("assign", 'must be a JSON object such as {"events":[0,1]}')
    assignment = []
    for topic, parts in doc.items():
        if not isinstance(parts, list) or not parts:
            raise OptionError("assign", f"topic {topic!r} must map to a non-empty list of partitions")
        nums = []
        for p in parts:
            if isinstance(p, bool) or not isinstance(p, int) or p < 0:
                raise OptionError("assign", f"topic {topic!r}: partition {p!r} is not a non-negative integer")
            nums.append(p)
        assignment.append((topic, tuple(sorted(set(nums)))))
    return Subscription("assign", assignment=tuple(sorted(assignment)))


#: Spark's precedence when several are set: the first wins, the others are ignored.
STARTING_PRECEDENCE = ("startingTimestamp", "startingOffsetsByTimestamp", "startingOffsets")
ENDING_PRECEDENCE = ("endingTimestamp", "endingOffsetsByTimestamp", "endingOffsets")


def overridden_options(opts: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """Options Spark's precedence sets aside (startingTimestamp > startingOffsetsByTimestamp
    > startingOffsets, and the same for ending), with why."""
    out = []
    for order in (STARTING_PRECEDENCE, ENDING_PRECEDENCE):
        given = [n for n in order if n in opts]
        out += [(n, f"{given[0]!r} takes precedence, as in Spark") for n in given[1:]]
    return tuple(out)


def _starting(opts: dict[str, str], streaming: bool) -> OffsetSpec:
    given = [n for n in STARTING_PRECEDENCE if n in opts]
    if not given:
        return OffsetSpec("latest" if streaming else "earliest", "startingOffsets")
    name = given[0]
    if name == "startingTimestamp":
        return OffsetSpec("timestamp", name, timestamp_ms=_timestamp(opts, name))
    if name == "startingOffsetsByTimestamp":
        return OffsetSpec("timestamps", name, per_partition=_per_partition_json(opts, name, sentinels=False))
    raw = opts[name].strip()
    if raw.lower() == "earliest":
        return OffsetSpec("earliest", name)
    if raw.lower() == "latest":
        if not streaming:
            raise OptionError(name, "'latest' is not allowed for a batch read (it would read nothing); "
                              "use 'earliest' or JSON offsets")
        return OffsetSpec("latest", name)
    if not raw.startswith("{"):
        raise OptionError(name, f"must be 'earliest', 'latest' or JSON such as {{\"events\":{{\"0\":23}}}}, got {raw!r}")
    topic_level: list = []
    spec = OffsetSpec("offsets", name, per_partition=_per_partition_json(opts, name, sentinels=True,
                                                                         per_topic=topic_level),
                      per_topic=tuple(sorted(topic_level)))
    if not streaming:
        for (t, p), off in spec.per_partition:
            if off == LATEST:
                raise OptionError(name, f"{t}-{p}: -1 (latest) is not allowed as a batch starting offset")
        for t, off in spec.per_topic:
            if off == LATEST:
                raise OptionError(name, f"topic {t!r}: \"latest\" is not allowed as a batch starting offset")
    return spec


def _ending(opts: dict[str, str], streaming: bool) -> OffsetSpec:
    given = [n for n in ENDING_PRECEDENCE if n in opts]
    if streaming:
        if given:
            raise OptionError(given[0], "applies to batch reads only; a stream has no end")
        return OffsetSpec("latest", "endingOffsets")
    if not given:
        return OffsetSpec("latest", "endingOffsets")
    name = given[0]
    if name == "endingTimestamp":
        return OffsetSpec("timestamp", name, timestamp_ms=_timestamp(opts, name))
    if name == "endingOffsetsByTimestamp":
        return OffsetSpec("timestamps", name, per_partition=_per_partition_json(opts, name, sentinels=False))
    raw = opts[name].strip()
    if raw.lower() == "latest":
        return OffsetSpec("latest", name)
    if raw.lower() == "earliest":
        raise OptionError(name, "'earliest' is not allowed as an ending offset (it would read nothing)")
    if not raw.startswith("{"):
        raise OptionError(name, f"must be 'latest' or JSON such as {{\"events\":{{\"0\":500}}}}, got {raw!r}")
    spec = OffsetSpec("offsets", name, per_partition=_per_partition_json(opts, name, sentinels=True))
    for (t, p), off in spec.per_partition:
        if off == EARLIEST:
            raise OptionError(name, f"{t}-{p}: -2 (earliest) is not allowed as an ending offset")
    return spec


def _columns(opts: dict[str, str]) -> tuple[str, ...] | None:
    raw = opts.get("columns")
    if raw is None:
        return None
    cols = [c.strip() for c in raw.split(",")]
    if not raw.strip() or any(not c for c in cols):
        raise OptionError("columns", f"must be a comma-separated list of column names, got {raw!r}")
    dup = [c for c in cols if cols.count(c) > 1]
    if dup:
        raise OptionError("columns", f"names {dup[0]!r} twice")
    return tuple(cols)


# ---------------------------------------------------------------- entry points
def parse_source_options(options: Mapping[str, Any], *, streaming: bool | None) -> SourceOptions:
    """Validate a read's options. Raises :class:`OptionError`.

    ``streaming``: True for readStream, False for read, None when the kind of
    read is not known yet (``DataSource.schema()``): then only what is wrong in
    both kinds is refused, and the reader checks the rest.
    """
    opts = _normalise(options, SOURCE_OPTIONS)
    if streaming is False:
        for name in STREAM_ONLY:
            if name in opts:
                raise OptionError(name, "applies to streaming reads (readStream) only")
    sub = _subscription(opts)
    starting = _starting(opts, streaming is not False)
    ending = _ending(opts, bool(streaming))
    strategy = opts.get("startingOffsetsByTimestampStrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError("startingOffsetsByTimestampStrategy", f"must be 'error' or 'latest', got {strategy!r}")
    if sub.kind == "assign":
        assigned = {(t, p) for t, ps in sub.assignment for p in ps}
        for spec in (starting, ending):
            extra = [tp for tp, _ in spec.per_partition if tp not in assigned]
            if extra:
                raise OptionError(spec.option, f"names {extra[0][0]}-{extra[0][1]}, which 'assign' does not assign")
        for spec in (starting, ending):
            extra = sorted(t for t, _ in spec.per_topic if t not in {a for a, _ in sub.assignment})
            if extra:
                raise OptionError(spec.option, f"names topic {extra[0]!r}, which 'assign' does not assign")
    elif sub.kind == "subscribe":
        for spec in (starting, ending):
            extra = sorted(t for t in spec.topics if t not in sub.topics)
            if extra:
                raise OptionError(spec.option, f"names topic {extra[0]!r}, which 'subscribe' does not list")
    if not streaming and starting.kind == "offsets" and ending.kind == "offsets":
        ends = ending.as_dict()
        for tp, s in starting.per_partition:
            e = ends.get(tp)
            if s >= 0 and e is not None and e >= 0 and s > e:
                raise OptionError("startingOffsets", f"{tp[0]}-{tp[1]}: starts at {s}, after its ending offset {e}")
    if not streaming and starting.kind == "timestamp" and ending.kind == "timestamp" \
            and starting.timestamp_ms > ending.timestamp_ms:
        raise OptionError("startingTimestamp", f"{starting.timestamp_ms} is after endingTimestamp {ending.timestamp_ms}")
    max_per_trigger = parse_int(opts, "maxOffsetsPerTrigger")
    min_per_trigger = parse_int(opts, "minOffsetsPerTrigger")
    if "maxTriggerDelay" in opts and min_per_trigger is None:
        raise OptionError("maxTriggerDelay", "only has a meaning together with 'minOffsetsPerTrigger'")
    if max_per_trigger is not None and min_per_trigger is not None and min_per_trigger > max_per_trigger:
        raise OptionError("minOffsetsPerTrigger", f"{min_per_trigger} is larger than maxOffsetsPerTrigger "
                          f"{max_per_trigger}")
    return SourceOptions(
        bootstrap=_bootstrap(opts),
        subscription=sub,
        starting=starting,
        ending=ending,
        timestamp_strategy=strategy,
        fail_on_data_loss=parse_bool(opts, "failOnDataLoss", True),
        min_partitions=parse_int(opts, "minPartitions"),
        max_records_per_partition=parse_int(opts, "maxRecordsPerPartition"),
        include_headers=parse_bool(opts, "includeHeaders", False),
        columns=_columns(opts),
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=parse_duration_ms(opts, "maxTriggerDelay", DEFAULT_MAX_TRIGGER_DELAY_MS),
        fetch_timeout_ms=parse_int(opts, "fetchTimeoutMs") or DEFAULT_FETCH_TIMEOUT_MS,
        fetch_max_bytes=parse_int(opts, "fetchMaxBytes", minimum=1024) or DEFAULT_FETCH_MAX_BYTES,
        fetch_offset_retries=_int_or(parse_int(opts, "fetchOffset.numRetries", minimum=0),
                                     DEFAULT_FETCH_OFFSET_RETRIES),
        fetch_offset_retry_interval_ms=_int_or(parse_int(opts, "fetchOffset.retryIntervalMs", minimum=0),
                                               DEFAULT_FETCH_OFFSET_RETRY_INTERVAL_MS),
        ignored=ignored_options(options, SOURCE_OPTIONS) + overridden_options(opts),
        streaming=bool(streaming),
        security=_security(opts),
    )


def parse_sink_options(options: Mapping[str, Any]) -> SinkOptions:
    """Validate a write's options. Raises :class:`OptionError`."""
    opts = _normalise(options, SINK_OPTIONS)
    topic = opts.get("topic")
    if topic is not None and not topic.strip():
        raise OptionError("topic", "is empty")
    return SinkOptions(
        bootstrap=_bootstrap(opts),
        topic=topic.strip() if topic else None,
        delivery_timeout_ms=parse_int(opts, "deliveryTimeoutMs") or DEFAULT_DELIVERY_TIMEOUT_MS,
        chunk_rows=parse_int(opts, "sinkChunkRows") or DEFAULT_SINK_CHUNK_ROWS,
        security=_security(opts),
        ignored=ignored_options(options, SINK_OPTIONS),
    )
