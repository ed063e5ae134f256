"""Broker and topic configuration, with Kafka's key names and defaults.

One declarative table, :data:`BROKER_CONFIG_KEYS`, lists every broker key with
its type, default, unit, one-line doc and validator; :data:`TOPIC_CONFIG_KEYS`
does the same for the topic-level keys given at topic creation
(``--config k=v``). Loading, validation, the README's reference table and the
tests all iterate over these tables, so a key exists in exactly one place.

Typical use::

    cfg = BrokerConfig.load("conf/server.properties", ["broker.id=2"])
    cfg.broker_id                          # 2 (int)
    cfg.get("replica.lag.time.max.ms")     # 30000 (int)
    cfg.log_retention_ms                   # effective: .ms > .minutes > .hours
    log_cfg = log_config_for_topic(cfg, {"segment.bytes": "1048576"})

An unknown key or a bad value raises :class:`replikafka.errors.InvalidConfigError`
whose message names the key, the bad value and what is allowed.
"""
from __future__ import annotations

import difflib
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, NamedTuple

from replikafka.broker.storage.log_config import LogConfig
from replikafka.errors import InvalidConfigError

INT_MAX = 2**31 - 1
INT_MIN = -(2**31)
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)


class _Required:
    """The default of a key that has none: it must be set."""

    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


# --------------------------------------------------------------------------
# Types: turn a raw value (a string from a file or the command line, or a
# Python value from a dict) into the typed value. A failure raises ValueError
# with a short reason; ConfigKey turns it into InvalidConfigError.
# --------------------------------------------------------------------------
class ConfigType(ABC):
    name = "?"
    description = "?"

    @abstractmethod
    def parse(self, raw: Any) -> Any:
        """The typed value of a raw (string or Python) value; ValueError if it is not one."""

    def format(self, value: Any) -> str:
        return str(value)


class _IntType(ConfigType):
    def __init__(self, name: str, lo: int, hi: int, description: str):
        self.name, self.lo, self.hi, self.description = name, lo, hi, description

    def parse(self, raw: Any) -> int:
        if isinstance(raw, bool):
            raise ValueError(f"not {self.description}")
        if isinstance(raw, int):
            value = raw
        elif isinstance(raw, str):
            text = raw.strip()
            if not re.fullmatch(r"[+-]?[0-9]+", text):
                raise ValueError(f"not {self.description}")
            value = int(text)
        else:
            raise ValueError(f"not {self.description} (got {type(raw).__name__})")
        if not self.lo <= value <= self.hi:
            raise ValueError(f"out of the range of {self.description} [{self.lo}, {self.hi}]")
        return value


class _BoolType(ConfigType):
    name = "boolean"
    description = "true or false"

    def parse(self, raw: Any) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise ValueError("not a boolean")

    def format(self, value: Any) -> str:
        return "true" if value else "false"


class _StringType(ConfigType):
    name = "string"
    description = "a string"

    def parse(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise ValueError(f"not a string (got {type(raw).__name__})")
        return raw.strip()


class Endpoint(NamedTuple):
    """One listener: ``PLAINTEXT://host:port``. An empty host binds every interface."""

    protocol: str
    host: str
    port: int

    @property
    def address(self) -> str:
        host = self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.protocol}://{self.address}"


class _ListType(ConfigType):
    name = "list"
    description = "a comma-separated list"

    def parse(self, raw: Any) -> tuple:
        if isinstance(raw, str):
            items = raw.split(",")
        elif isinstance(raw, (list, tuple)) and all(isinstance(x, (str, Endpoint)) for x in raw):
            items = [str(x) for x in raw]
        else:
            raise ValueError("not a comma-separated list")
        return tuple(item.strip() for item in items if item.strip())

    def format(self, value: Any) -> str:
        return ",".join(str(v) for v in value)


INT = _IntType("int", INT_MIN, INT_MAX, "a 32-bit integer")
LONG = _IntType("long", LONG_MIN, LONG_MAX, "a 64-bit integer")
BOOLEAN = _BoolType()
STRING = _StringType()
LIST = _ListType()


# --------------------------------------------------------------------------
# Validators: check (and possibly normalize) an already-typed value.
# ``describe()`` says what is allowed, for messages and the reference table.
# --------------------------------------------------------------------------
class Validator(ABC):
    @abstractmethod
    def __call__(self, value: Any) -> Any:
        """The (possibly normalized) value; ValueError with a short reason if not allowed."""

    @abstractmethod
    def describe(self) -> str:
        """What is allowed, for messages and the reference table."""


class Range(Validator):
    def __init__(self, lo: int | None = None, hi: int | None = None):
        self.lo, self.hi = lo, hi

    def __call__(self, value: int) -> int:
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise ValueError("out of range")
        return value

    def describe(self) -> str:
        if self.lo is not None and self.hi is not None:
            return f"{self.lo}..{self.hi}"
        if self.lo is not None:
            return f">= {self.lo}"
        return f"<= {self.hi}"


class OneOf(Validator):
    """One of a fixed set of strings; matched case-insensitively, normalized to the canonical spelling."""

    def __init__(self, *values: str):
        self.values = values
        self._canon = {v.lower(): v for v in values}

    def __call__(self, value: str) -> str:
        try:
            return self._canon[value.lower()]
        except KeyError:
            raise ValueError("not one of the allowed values") from None

    def describe(self) -> str:
        return " | ".join(self.values)


_LISTENER_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]\s]*):([0-9]+)")
# gRPC listeners (client, admin, inter-broker and controller requests) and the
# Arrow Flight read listener. TLS protocols need the ssl.* keys.
GRPC_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")
FLIGHT_PROTOCOLS = ("FLIGHT",)
SUPPORTED_PROTOCOLS = GRPC_PROTOCOLS + FLIGHT_PROTOCOLS


class Listeners(Validator):
    """A comma-separated list of ``PLAINTEXT://host:port`` (port 0 = any free port when binding)."""

    def __init__(self, advertised: bool = False):
        self.advertised = advertised

    def __call__(self, value: tuple) -> tuple:
        if not value:
            raise ValueError("no listener given")
        out = []
        for item in value:
            if isinstance(item, Endpoint):
                item = str(item)
            m = _LISTENER_RE.fullmatch(item)
            if not m:
                raise ValueError(f"{item!r} is not PROTOCOL://host:port")
            protocol, host, port = m.group(1).upper(), m.group(2), int(m.group(3))
            if protocol not in SUPPORTED_PROTOCOLS:
                raise ValueError(f"protocol {m.group(1)!r} is not supported")
            if host.startswith("["):
                host = host[1:-1]
            if port > 65535:
                raise ValueError(f"port {port} is out of range")
            if self.advertised:
                if host in ("", "0.0.0.0", "::"):
                    raise ValueError(f"{item!r}: an advertised listener needs a host clients can reach")
            out.append(Endpoint(protocol, host, port))
        ports = [e.port for e in out if e.port != 0]
        if len(ports) != len(set(ports)):
            raise ValueError("two listeners use the same port")
        protocols = [e.protocol for e in out]
        if len(protocols) != len(set(protocols)):
            raise ValueError("two listeners use the same protocol (one listener per protocol)")
        if not any(p in GRPC_PROTOCOLS for p in protocols):
            raise ValueError(f"no {'/'.join(GRPC_PROTOCOLS)} listener (clients and brokers need one)")
        return tuple(out)

    def describe(self) -> str:
        what = "host:port clients can reach" if self.advertised else "host:port (empty host = all interfaces, port 0 = any free port)"
        return f"comma-separated PROTOCOL://{what}, PROTOCOL one of {', '.join(SUPPORTED_PROTOCOLS)}"


class Mechanisms(Validator):
    """SASL mechanisms: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512."""
    KNOWN = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")

    def __call__(self, value: tuple) -> tuple:
        out = tuple(v.strip().upper() for v in value if v.strip())
        for v in out:
            if v not in self.KNOWN:
                raise ValueError(f"{v!r} is not one of {', '.join(self.KNOWN)}")
        return out

    def describe(self) -> str:
        return "comma-separated " + " | ".join(self.KNOWN)


class ZkConnect(Validator):
    """``host:port[,host:port...][/chroot]``, as ZooKeeper clients take it."""

    def __call__(self, value: str) -> str:
        if not value:
            raise ValueError("empty")
        hosts, slash, chroot = value.partition("/")
        for hp in hosts.split(","):
            hp = hp.strip()
            m = re.fullmatch(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+)(?::([0-9]+))?", hp)
            if not m:
                raise ValueError(f"{hp!r} is not host:port")
            if m.group(2) is not None and not 1 <= int(m.group(2)) <= 65535:
                raise ValueError(f"port {m.group(2)} is out of range")
        if slash:
            chroot = "/" + chroot
            if chroot != "/" and (chroot.endswith("/") or "//" in chroot):
                raise ValueError(f"chroot {chroot!r} is not a valid ZooKeeper path")
        return value

    def describe(self) -> str:
        return "host:port[,host:port...][/chroot]"


class NonEmptyPaths(Validator):
    def __call__(self, value: tuple) -> tuple:
        if not value:
            raise ValueError("no directory given")
        if len(set(value)) != len(value):
            raise ValueError("a directory is listed twice")
        return tuple(value)

    def describe(self) -> str:
        return "comma-separated directories, at least one"


class HttpListener(Validator):
    """``http://host:port`` or ``https://host:port`` (port 0 = any free port), or empty for none."""

    def __call__(self, value: str) -> str:
        if not value:
            return ""
        m = re.fullmatch(r"(https?)://(\[[0-9A-Fa-f:.]+\]|[^:/\[\]\s]*):([0-9]+)/?", value, re.IGNORECASE)
        if not m:
            raise ValueError(f"{value!r} is not http://host:port or https://host:port")
        if int(m.group(3)) > 65535:
            raise ValueError(f"port {m.group(3)} is out of range")
        return f"{m.group(1).lower()}://{m.group(2)}:{int(m.group(3))}"

    def describe(self) -> str:
        return "http://host:port or https://host:port (port 0 = any free port) or empty"


#: log4j's level names (broker/log_levels.py maps them to Python's).
LOG_LEVEL_NAMES = ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")
#: ``log.level.<logger>`` keys: one per logger, so not in the table (see :func:`_broker_key`).
LOGGER_LEVEL_PREFIX = "log.level."


def http_listener_address(value: str) -> tuple[str, str, int] | None:
    """``metrics.listener``'s (scheme, host, port), or None when it is empty."""
    if not value:
        return None
    scheme, _, rest = value.partition("://")
    host, _, port = rest.rstrip("/").rpartition(":")
    return scheme, host.strip("[]"), int(port)


# --------------------------------------------------------------------------
# The table
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class ConfigKey:
    """One configuration key: what it is, its default, and what values are allowed.

    ``default`` is the typed default, :data:`REQUIRED` when the key must be set,
    or ``None`` when unset means "derived from another key" (the doc says which).
    ``synonym`` (topic keys only) names the broker key that supplies the
    topic's default.
    """

    name: str
    type: ConfigType
    default: Any
    unit: str
    doc: str
    validator: Validator | None = None
    synonym: str | None = None

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def allowed(self) -> str:
        v = self.validator
        if isinstance(v, Range) and isinstance(self.type, _IntType) and v.hi in (None, self.type.hi):
            return f"{self.type.name} >= {v.lo}"
        if isinstance(v, Range):
            return f"{self.type.name} in {v.lo}..{v.hi}"
        if v is not None:
            return f"{self.type.name}: {v.describe()}"
        return self.type.name if self.type is not BOOLEAN else "true | false"

    def parse(self, raw: Any, *, where: str = "") -> Any:
        """Typed and validated value of ``raw``; InvalidConfigError naming the key otherwise."""
        try:
            value = self.type.parse(raw)
            if self.validator is not None:
                value = self.validator(value)
            return value
        except ValueError as exc:
            unit = f" ({self.unit})" if self.unit not in ("", "bool", "string", "enum") else ""
            prefix = f"{where}: " if where else ""
            raise InvalidConfigError(
                f"{prefix}invalid value {_show(raw)} for configuration {self.name}: {exc}; "
                f"allowed: {self.allowed()}{unit}"
            ) from None

    def format(self, value: Any) -> str:
        """The normalized string form of a typed value (as it would appear in a properties file)."""
        if value is None or value is REQUIRED:
            return ""
        return self.type.format(value)


def _show(raw: Any) -> str:
    if isinstance(raw, str):
        return repr(raw)
    return f"{raw!r} ({type(raw).__name__})"


def _k(name, type_, default, unit, doc, validator=None, synonym=None) -> ConfigKey:
    return ConfigKey(name, type_, default, unit, doc, validator, synonym)


_WEEK_MS = 7 * 24 * 3600 * 1000

BROKER_CONFIG_KEYS: list[ConfigKey] = [
    # identity and addresses
    _k("broker.id", INT, REQUIRED, "id", "This broker's unique id in the cluster.", Range(0, INT_MAX)),
    _k("listeners", LIST, (Endpoint("PLAINTEXT", "127.0.0.1", 9092),), "address",
       "Where the broker listens for clients and other brokers.", Listeners()),
    _k("advertised.listeners", LIST, None, "address",
       "Addresses published in ZooKeeper for clients and brokers; unset = listeners.", Listeners(advertised=True)),
    _k("log.dirs", LIST, ("/tmp/replikafka-logs",), "path",
       "Directories holding the partition logs; partitions are spread over them.", NonEmptyPaths()),
    # ZooKeeper
    _k("zookeeper.connect", STRING, REQUIRED, "address",
       "ZooKeeper connection string, host:port[,host:port...][/chroot].", ZkConnect()),
    _k("zookeeper.session.timeout.ms", INT, 18000, "ms",
       "ZooKeeper session timeout; a broker silent this long is considered dead.", Range(1, INT_MAX)),
    _k("zookeeper.connection.timeout.ms", INT, None, "ms",
       "How long to wait to connect to ZooKeeper; unset = zookeeper.session.timeout.ms.", Range(1, INT_MAX)),
    # topic creation defaults
    _k("num.partitions", INT, 1, "partitions", "Default number of partitions of a new topic.", Range(1, INT_MAX)),
    _k("default.replication.factor", INT, 1, "replicas",
       "Default replication factor of a new topic.", Range(1, INT_MAX)),
    _k("min.insync.replicas", INT, 1, "replicas",
       "acks=all produce is refused when the ISR is smaller than this.", Range(1, INT_MAX)),
    _k("unclean.leader.election.enable", BOOLEAN, False, "bool",
       "Let an out-of-sync replica become leader when no ISR member is alive (may lose data)."),
    # replication
    _k("replica.lag.time.max.ms", LONG, 30000, "ms",
       "A follower that has not caught up with the leader for this long leaves the ISR (checked every half "
       "of it, as Kafka: it leaves within 1.5 times this).", Range(1, LONG_MAX)),
    _k("replica.fetch.max.bytes", INT, 1048576, "bytes",
       "Bytes a follower asks for per partition in one fetch (at least one batch is returned).", Range(0, INT_MAX)),
    _k("replica.fetch.response.max.bytes", INT, 10485760, "bytes",
       "Bytes a follower asks for in one fetch over all its partitions (at least one batch is returned).",
       Range(0, INT_MAX)),
    _k("replica.fetch.wait.max.ms", INT, 500, "ms",
       "Longest a follower's fetch waits at the leader for new data; must not exceed replica.lag.time.max.ms.",
       Range(0, INT_MAX)),
    _k("replica.fetch.min.bytes", INT, 1, "bytes",
       "Bytes a follower's fetch waits for before the leader answers.", Range(1, INT_MAX)),
    _k("replica.fetch.backoff.ms", INT, 1000, "ms",
       "Pause after a follower's fetch fails.", Range(0, INT_MAX)),
    _k("replica.fetch.transport", STRING, "grpc", "enum",
       "How followers fetch from leaders without security: grpc (/replikafka.ReplicaData/Fetch) or flight (the "
       "leader's Flight listener, action replica-fetch; same request and answer bytes). Secured clusters use grpc.",
       OneOf("grpc", "flight")),
    _k("max.incremental.fetch.session.cache.slots", INT, 1000, "sessions",
       "Followers' incremental fetch sessions a leader keeps (KIP-227; least recently used evicted; 0: none, "
       "every follower fetch names and reads every partition).", Range(0, INT_MAX)),
    _k("num.replica.fetchers", INT, 1, "threads",
       "Fetcher threads per source broker replicating its partitions.", Range(1, INT_MAX)),
    _k("replica.high.watermark.checkpoint.interval.ms", LONG, 5000, "ms",
       "How often the high watermarks are checkpointed to disk.", Range(1, LONG_MAX)),
    # log segments
    _k("log.segment.bytes", INT, 1024**3, "bytes", "Roll a new segment when the active one would exceed this.",
       Range(14, INT_MAX)),
    _k("log.roll.ms", LONG, None, "ms",
       "Roll a new segment when the active one is older than this; unset = log.roll.hours.", Range(1, LONG_MAX)),
    _k("log.roll.hours", INT, 168, "hours", "Segment age before a roll, used when log.roll.ms is unset.",
       Range(1, INT_MAX)),
    _k("log.index.interval.bytes", INT, 4096, "bytes", "Bytes between two offset-index entries.", Range(0, INT_MAX)),
    _k("message.max.bytes", INT, 1024 * 1024 + 12, "bytes", "Largest record batch the broker accepts.",
       Range(0, INT_MAX)),
    _k("log.message.timestamp.type", STRING, "CreateTime", "enum",
       "Record timestamps: the producer's (CreateTime) or the broker's append time (LogAppendTime).",
       OneOf("CreateTime", "LogAppendTime")),
    # retention
    _k("log.retention.ms", LONG, None, "ms",
       "Delete segments older than this; -1 = forever; unset = log.retention.minutes, then .hours.",
       Range(-1, LONG_MAX)),
    _k("log.retention.minutes", INT, None, "minutes",
       "Retention in minutes, used when log.retention.ms is unset.", Range(-1, INT_MAX)),
    _k("log.retention.hours", INT, 168, "hours",
       "Retention in hours, used when log.retention.ms and .minutes are unset.", Range(-1, INT_MAX)),
    _k("log.retention.bytes", LONG, -1, "bytes",
       "Delete the oldest segments while a partition is larger than this; -1 = no limit.", Range(-1, LONG_MAX)),
    _k("log.retention.check.interval.ms", LONG, 300000, "ms",
       "How often the retention rules are applied.", Range(1, LONG_MAX)),
    # flushing
    _k("log.flush.interval.messages", LONG, LONG_MAX, "count",
       "fsync a partition after this many unflushed records.", Range(1, LONG_MAX)),
    _k("log.flush.interval.ms", LONG, None, "ms",
       "fsync data older than this; unset = log.flush.scheduler.interval.ms.", Range(0, LONG_MAX)),
    _k("log.flush.scheduler.interval.ms", LONG, LONG_MAX, "ms",
       "How often the flusher checks whether a partition needs an fsync.", Range(0, LONG_MAX)),
    _k("num.recovery.threads.per.data.dir", INT, 8, "threads",
       "Logs read (and recovered after a crash) at once per log dir at start-up, and flushed at once "
       "at shutdown (the disk waits overlap).", Range(1, INT_MAX)),
    _k("log.idle.release.ms", LONG, 60000, "ms",
       "A partition neither written nor read for this long closes its files and memory maps "
       "(reopened on the next use), so open files follow busy partitions, not partitions.",
       Range(0, LONG_MAX)),
    _k("log.open.max.partitions", INT, 0, "partitions",
       "At most this many partitions hold open files and memory maps at once (1 file or map each, 3 "
       "once their indexes are written); using "
       "one more closes the least recently used ones' (reopened on their next use). 0: derived from "
       "the process's open-file limit and vm.max_map_count.", Range(0, INT_MAX)),
    # topics and leadership
    _k("delete.topic.enable", BOOLEAN, True, "bool", "Allow topics to be deleted."),
    _k("auto.leader.rebalance.enable", BOOLEAN, True, "bool",
       "The controller moves leadership back to preferred replicas when the imbalance is too high."),
    _k("leader.imbalance.per.broker.percentage", INT, 10, "percent",
       "Share of a broker's partitions led elsewhere that triggers a preferred-replica election.", Range(0, 100)),
    _k("leader.imbalance.check.interval.seconds", LONG, 300, "seconds",
       "How often the controller checks the leader imbalance.", Range(1, LONG_MAX)),
    _k("controlled.shutdown.enable", BOOLEAN, True, "bool",
       "On SIGTERM, move leadership away before stopping."),
    _k("controlled.shutdown.max.retries", INT, 3, "count",
       "Attempts at a controlled shutdown before an unclean one.", Range(0, INT_MAX)),
    _k("controlled.shutdown.retry.backoff.ms", LONG, 5000, "ms",
       "Pause between controlled shutdown attempts.", Range(0, LONG_MAX)),
    # requests
    _k("request.timeout.ms", INT, 30000, "ms",
       "Longest the broker waits on a request it makes (and longest an acks=all produce waits).", Range(1, INT_MAX)),
    _k("controller.socket.timeout.ms", INT, 30000, "ms",
       "Timeout of the controller's RPCs to brokers.", Range(1, INT_MAX)),
    _k("num.io.threads", INT, 8, "threads", "Threads serving requests.", Range(1, INT_MAX)),
    _k("python.switch.interval.us", INT, 1000, "us",
       "How long a thread holding Python's GIL runs on while another waits for it (sys.setswitchinterval; Python's "
       "default is 5000); 0 = Python's default.", Range(0, 1_000_000)),
    _k("python.gil.kept.write.max.bytes", INT, 64 * 1024, "bytes",
       "A write to a log segment of at most this many bytes (a copy into the page cache) keeps Python's GIL "
       "instead of giving it up and waiting a switch interval to take it back; if such a write hangs on the "
       "disk the whole broker waits, and its leaderships move once its ZooKeeper session expires. "
       "0 = every write gives the GIL up (a segment's reopen and a read mapping's open keep it unless "
       "python.gil.kept.file.calls.enable is false).",
       Range(0, INT_MAX)),
    _k("python.gil.kept.file.calls.enable", BOOLEAN, True, "bool",
       "Whether the file calls that keep Python's GIL do (segment writes up to python.gil.kept.write.max.bytes, "
       "a segment's reopen for writing, a read mapping's open, size, map, unmap and close); false = each gives "
       "the GIL up, for log dirs on a file system that can hang (NFS): a hung call then stalls its own thread, "
       "not the whole broker."),
    _k("python.gc.generation0.threshold.objects", INT, 50_000, "objects",
       "Net new objects between collections of Python's youngest generation (gc.set_threshold's first value; "
       "Python's default is 700, which promotes a request's objects to the old generation while it runs); "
       "0 = Python's default.", Range(0, INT_MAX)),
    _k("malloc.trim.threshold.bytes", INT, 64 << 20, "bytes",
       "Freed memory each glibc malloc arena keeps for reuse instead of returning it to the kernel (fetch-sized "
       "buffers are then not faulted in again; broker/malloc_tuning.py); 0 = glibc's defaults.", Range(0, INT_MAX)),
    _k("flight.max.bytes.in.flight", INT, 64 << 20, "bytes",
       "Stored bytes all Arrow Flight reads of this broker hold at once, handed to gRPC and not yet written "
       "(a read waits for room; one batch larger than this goes alone).", Range(1, INT_MAX)),
    _k("queued.max.requests", INT, 500, "requests",
       "Requests queued before the broker stops reading new ones.", Range(1, INT_MAX)),
    _k("socket.request.max.bytes", INT, 100 * 1024 * 1024, "bytes",
       "Largest request the broker reads; a larger one is refused before it is decoded.", Range(1024, INT_MAX)),
    _k("max.request.entries", INT, 1_000_000, "entries",
       "Most entries in any list or map of a request (partitions, topics, replicas); more is INVALID_REQUEST.",
       Range(1, INT_MAX)),
    _k("max.partitions.per.topic", INT, 100_000, "partitions",
       "Most partitions a topic may have (CreateTopic, CreatePartitions, controller requests).", Range(1, INT_MAX)),
    _k("max.replication.factor", INT, 32, "replicas",
       "Largest replication factor (and replica or ISR list) accepted from any request.", Range(1, INT_MAX)),
    _k("producer.id.expiration.ms", INT, 86400000, "ms",
       "Forget an idempotent producer's state after it has been idle this long.", Range(1, INT_MAX)),
    _k("producer.id.expiration.check.interval.ms", INT, 600000, "ms",
       "How often the broker looks for idempotent producers idle past producer.id.expiration.ms (a walk of every "
       "partition it hosts).", Range(1, INT_MAX)),
    # security (README "Securing a cluster")
    _k("security.inter.broker.protocol", STRING, "PLAINTEXT", "enum",
       "Listener protocol brokers and the controller use to reach each other (SSL: brokers present their certificates).",
       OneOf("PLAINTEXT", "SSL")),
    _k("ssl.ca.location", STRING, "", "path", "PEM file of the CA(s) that signed client and broker certificates."),
    _k("ssl.certificate.location", STRING, "", "path", "PEM file of this broker's certificate (TLS listeners)."),
    _k("ssl.key.location", STRING, "", "path", "PEM file of this broker's private key."),
    _k("ssl.key.password", STRING, "", "secret", "Password of ssl.key.location if it is encrypted; empty = none."),
    _k("ssl.client.auth", STRING, "none", "enum",
       "TLS listeners: required = clients must present a certificate signed by ssl.ca.location (mTLS).",
       OneOf("required", "requested", "none")),
    _k("ssl.principal.mapping.rules", STRING, r"RULE:^(?:.*,)?CN=([^,]+)(?:,.*)?$/$1/,DEFAULT", "rules",
       "Kafka's RULE:pattern/replacement/[LU],...,DEFAULT from a certificate subject to the User: name "
       "(default: the subject's CN)."),
    _k("sasl.enabled.mechanisms", LIST, ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"), "list",
       "Username/password mechanisms SASL_SSL listeners accept, checked against the SCRAM credentials in ZooKeeper.",
       Mechanisms()),
    _k("authorizer.class.name", STRING, "", "enum",
       "Empty = no authorization; AclAuthorizer (or Kafka's class names) = ACLs in ZooKeeper decide every request.",
       OneOf("", "AclAuthorizer", "kafka.security.authorizer.AclAuthorizer",
             "kafka.security.auth.SimpleAclAuthorizer")),
    _k("super.users", STRING, "", "principals",
       "Principals allowed everything, separated by ';' (e.g. User:broker;User:admin)."),
    _k("allow.everyone.if.no.acl.found", BOOLEAN, False, "bool",
       "With an authorizer: a resource without any ACL is open to everyone (Kafka's default: false)."),
    _k("zookeeper.set.acl", BOOLEAN, False, "bool",
       "Create znodes readable by all but writable only by the zookeeper.digest.username identity."),
    _k("zookeeper.digest.username", STRING, "", "name",
       "ZooKeeper digest identity of the brokers (as the Client section of Kafka's JAAS file); empty = none."),
    _k("zookeeper.digest.password", STRING, "", "secret", "Password of zookeeper.digest.username."),
    # monitoring and logs
    _k("metrics.listener", STRING, "http://127.0.0.1:0", "address",
       "HTTP port serving /metrics (Prometheus), the status page and /loggers; port 0 = any free port "
       "(published in the broker's registration); empty = none. https:// serves TLS with the ssl.* PEM files; "
       "with authorizer.class.name set it is HTTPS only and every request needs a principal and ACLs.",
       HttpListener()),
    _k("metrics.recording.enable", BOOLEAN, True, "bool",
       "Count requests, bytes and ISR changes on the hot paths (scrape-time gauges are always available)."),
    _k("log.level", STRING, "INFO", "enum",
       "Root log level (log4j names); log.level.<logger>=LEVEL sets one logger and its children.",
       OneOf(*LOG_LEVEL_NAMES)),
]

TOPIC_CONFIG_KEYS: list[ConfigKey] = [
    _k("retention.ms", LONG, _WEEK_MS, "ms", "Delete segments older than this; -1 = forever.",
       Range(-1, LONG_MAX), "log.retention.ms"),
    _k("retention.bytes", LONG, -1, "bytes", "Delete the oldest segments while the partition is larger; -1 = no limit.",
       Range(-1, LONG_MAX), "log.retention.bytes"),
    _k("segment.bytes", INT, 1024**3, "bytes", "Roll a new segment when the active one would exceed this.",
       Range(14, INT_MAX), "log.segment.bytes"),
    _k("segment.ms", LONG, _WEEK_MS, "ms", "Roll a new segment when the active one is older than this.",
       Range(1, LONG_MAX), "log.roll.ms"),
    _k("min.insync.replicas", INT, 1, "replicas", "acks=all produce is refused when the ISR is smaller than this.",
       Range(1, INT_MAX), "min.insync.replicas"),
    _k("unclean.leader.election.enable", BOOLEAN, False, "bool",
       "Let an out-of-sync replica become leader when no ISR member is alive.", None,
       "unclean.leader.election.enable"),
    _k("max.message.bytes", INT, 1024 * 1024 + 12, "bytes", "Largest record batch accepted.",
       Range(0, INT_MAX), "message.max.bytes"),
    _k("flush.messages", LONG, LONG_MAX, "count", "fsync after this many unflushed records.",
       Range(1, LONG_MAX), "log.flush.interval.messages"),
    _k("flush.ms", LONG, LONG_MAX, "ms", "fsync data older than this.", Range(0, LONG_MAX), "log.flush.interval.ms"),
    _k("message.timestamp.type", STRING, "CreateTime", "enum",
       "Record timestamps: the producer's (CreateTime) or the broker's append time (LogAppendTime).",
       OneOf("CreateTime", "LogAppendTime"), "log.message.timestamp.type"),
    _k("index.interval.bytes", INT, 4096, "bytes", "Bytes between two offset-index entries.",
       Range(0, INT_MAX), "log.index.interval.bytes"),
]

BROKER_KEYS: dict[str, ConfigKey] = {k.name: k for k in BROKER_CONFIG_KEYS}


def _broker_key(name: str) -> ConfigKey | None:
    """The table's key, or a ``log.level.<logger>`` key made for that logger."""
    key = BROKER_KEYS.get(name)
    if key is None and name.startswith(LOGGER_LEVEL_PREFIX) and len(name) > len(LOGGER_LEVEL_PREFIX):
        key = ConfigKey(name, STRING, "INFO", "enum", f"Log level of logger {name[len(LOGGER_LEVEL_PREFIX):]}.",
                        OneOf(*LOG_LEVEL_NAMES))
    return key
TOPIC_KEYS: dict[str, ConfigKey] = {k.name: k for k in TOPIC_CONFIG_KEYS}

# topic key -> LogConfig field
_LOG_CONFIG_FIELDS = {
    "segment.bytes": "segment_bytes",
    "segment.ms": "segment_ms",
    "retention.ms": "retention_ms",
    "retention.bytes": "retention_bytes",
    "flush.messages": "flush_interval_messages",
    "flush.ms": "flush_interval_ms",
    "index.interval.bytes": "index_interval_bytes",
    "max.message.bytes": "max_message_bytes",
    "message.timestamp.type": "message_timestamp_type",
    "min.insync.replicas": "min_insync_replicas",
    "unclean.leader.election.enable": "unclean_leader_election_enable",
}


def _unknown_key(name: str, table: Mapping[str, ConfigKey], what: str, where: str = "") -> InvalidConfigError:
    prefix = f"{where}: " if where else ""
    hint = ""
    if table is TOPIC_KEYS:
        topic_name = next((k.name for k in TOPIC_CONFIG_KEYS if k.synonym == name), None)
        if topic_name:
            hint = f" ({name} is a broker key; the topic-level key is {topic_name})"
    elif name in TOPIC_KEYS and name not in BROKER_KEYS:
        hint = f" ({name} is a topic-level key; the broker key is {TOPIC_KEYS[name].synonym})"
    if not hint:
        close = difflib.get_close_matches(name, list(table), n=1, cutoff=0.75)
        if close:
            hint = f" (did you mean {close[0]}?)"
    return InvalidConfigError(
        f"{prefix}unknown {what} configuration key {name!r}{hint}; "
        f"`python -m replikafka.broker.config` lists the known keys"
    )


# --------------------------------------------------------------------------
# Kafka compatibility: a Kafka server.properties loads (broker/kafka_compat.py)
# --------------------------------------------------------------------------
def _kafka_keys_ignored(raw: Mapping[str, Any]) -> list[str]:
    """Keys of ``raw`` that are Kafka's own broker keys but not replikafka's:
    accepted and ignored (the broker warns once, listing them)."""
    from replikafka.broker.kafka_compat import split_kafka_keys

    return split_kafka_keys(raw, BROKER_KEYS)[0]


def kafka_keys_honoured() -> list[str]:
    """Kafka's broker keys that replikafka implements (for the README)."""
    from replikafka.broker.kafka_compat import KAFKA_BROKER_KEYS

    return sorted(k for k in BROKER_KEYS if k in KAFKA_BROKER_KEYS)


# --------------------------------------------------------------------------
# Properties files and overrides
# --------------------------------------------------------------------------
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "\\" and i + 1 < len(text):
            n = text[i + 1]
            if n == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", text[i + 2:i + 6]):
                out.append(chr(int(text[i + 2:i + 6], 16)))
                i += 6
                continue
            out.append(_ESCAPES.get(n, n))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def parse_properties_lines(text: str) -> list[tuple[str, str, int]]:
    """Parse Java ``.properties`` text into ``(key, value, line number)`` in file order.

    Follows ``java.util.Properties.load``: ``#`` and ``!`` comments, ``=``, ``:``
    or whitespace between key and value, backslash line continuations and
    escapes (``\\t``, ``\\uXXXX``, ...). Values are returned with surrounding
    whitespace removed.
    """
    entries: list[tuple[str, str, int]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        lineno = i + 1
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        # join continuation lines (an odd number of trailing backslashes)
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1:
            line = line[:-1]
            if i >= len(lines):
                break
            line += lines[i].lstrip(" \t\f")
            i += 1
        # split key / value at the first unescaped separator
        j = 0
        while j < len(line):
            c = line[j]
            if c == "\\":
                j += 2
                continue
            if c in "=: \t\f":
                break
            j += 1
        key = line[:j]
        rest = line[j:].lstrip(" \t\f")
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip(" \t\f")
        entries.append((_unescape(key), _unescape(rest).strip(), lineno))
    return entries


def parse_properties(text: str) -> dict[str, str]:
    """Parse Java ``.properties`` text into a dict (a repeated key: the last one wins)."""
    return {k: v for k, v, _ in parse_properties_lines(text)}


def read_properties(path: str | os.PathLike) -> dict[str, str]:
    """Read a ``.properties`` file; a missing or unreadable file raises InvalidConfigError."""
    return {k: v for k, (v, _) in _read_properties_with_lines(path).items()}


def _read_properties_with_lines(path: str | os.PathLike) -> dict[str, tuple[str, int]]:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise InvalidConfigError(f"configuration file {os.fspath(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidConfigError(f"cannot read configuration file {os.fspath(path)!r}: {exc}") from None
    return {k: (v, n) for k, v, n in parse_properties_lines(text)}


def parse_override(item: str) -> tuple[str, str]:
    """``"key=value"`` -> ``(key, value)``; a malformed override raises InvalidConfigError naming it."""
    if not isinstance(item, str) or "=" not in item:
        raise InvalidConfigError(f"malformed override {item!r}: expected key=value")
    key, _, value = item.partition("=")
    key = key.strip()
    if not key or any(c.isspace() for c in key):
        raise InvalidConfigError(f"malformed override {item!r}: expected key=value with a non-empty key")
    return key, value.strip()


def parse_overrides(items: Iterable[str] | None) -> dict[str, str]:
    """Parse ``--override key=value`` arguments in order (a repeated key: the last one wins)."""
    out: dict[str, str] = {}
    for item in items or ():
        key, value = parse_override(item)
        out[key] = value
    return out


# --------------------------------------------------------------------------
# Effective values: Kafka's precedence rules between related keys
# --------------------------------------------------------------------------
def _hours_ms(h: int) -> int:
    return -1 if h < 0 else h * 3600 * 1000


def _effective(values: Mapping[str, Any], name: str) -> Any:
    v = values.get(name)
    if name == "log.retention.ms":
        if v is None:
            minutes = values.get("log.retention.minutes")
            v = minutes * 60 * 1000 if minutes is not None else _hours_ms(values["log.retention.hours"])
        return -1 if v < 0 else v
    if name == "log.roll.ms":
        return v if v is not None else _hours_ms(values["log.roll.hours"])
    if name == "log.flush.interval.ms":
        return v if v is not None else values["log.flush.scheduler.interval.ms"]
    if name == "zookeeper.connection.timeout.ms":
        return v if v is not None else values["zookeeper.session.timeout.ms"]
    if name == "advertised.listeners":
        return v if v is not None else values["listeners"]
    return v


_DEFAULTS = {k.name: k.default for k in BROKER_CONFIG_KEYS}


# --------------------------------------------------------------------------
# BrokerConfig
# --------------------------------------------------------------------------
class BrokerConfig:
    """A broker's validated configuration.

    ``cfg.get("replica.lag.time.max.ms")`` or ``cfg.replica_lag_time_max_ms``
    (dots become underscores) return the typed, *effective* value: related keys
    follow Kafka's precedence (``log.retention.ms`` > ``.minutes`` > ``.hours``,
    ``log.roll.ms`` > ``log.roll.hours``, ``log.flush.interval.ms`` >
    ``log.flush.scheduler.interval.ms``, ``zookeeper.connection.timeout.ms``
    defaults to the session timeout, ``advertised.listeners`` to ``listeners``).
    ``get(name, effective=False)`` gives the value exactly as set (``None`` if unset
    and without a default).
    """

    def __init__(self, values: Mapping[str, Any], explicit: Iterable[str] = (), source: str = ""):
        self._values = dict(values)
        self._explicit = frozenset(explicit)
        self.source = source
        # Kafka's own keys that were set but mean nothing here (logged once as ignored)
        self.ignored_kafka_keys: tuple[str, ...] = ()

    # ---- construction -----------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike, overrides: Iterable[str] | None = None) -> "BrokerConfig":
        """Read a ``server.properties`` file, apply ``key=value`` overrides, validate."""
        entries = _read_properties_with_lines(path)
        raw: dict[str, tuple[Any, str]] = {k: (v, f"{os.fspath(path)}:{n}") for k, (v, n) in entries.items()}
        for key, value in parse_overrides(overrides).items():
            raw[key] = (value, "--override")
        return cls._build(raw, source=os.fspath(path))

    @classmethod
    def from_dict(cls, props: Mapping[str, Any], overrides: Iterable[str] | None = None) -> "BrokerConfig":
        """Validate a mapping of key -> value (strings as in a file, or typed Python values)."""
        raw: dict[str, tuple[Any, str]] = {k: (v, "") for k, v in props.items()}
        for key, value in parse_overrides(overrides).items():
            raw[key] = (value, "--override")
        return cls._build(raw, source="dict")

    @classmethod
    def _build(cls, raw: Mapping[str, tuple[Any, str]], source: str) -> "BrokerConfig":
        values = dict(_DEFAULTS)
        ignored = _kafka_keys_ignored(raw)
        for name, (value, where) in raw.items():
            if name in ignored:
                continue
            key = _broker_key(name)
            if key is None:
                raise _unknown_key(name, BROKER_KEYS, "broker", where)
            values[name] = key.parse(value, where=where)
        missing = [k.name for k in BROKER_CONFIG_KEYS if values[k.name] is REQUIRED]
        if missing:
            raise InvalidConfigError(
                f"missing required configuration {', '.join(missing)}"
                + (f" in {source}" if source and source != "dict" else "")
                + f" ({'; '.join(BROKER_KEYS[m].doc for m in missing)})"
            )
        _cross_check(values)
        cfg = cls(values, explicit=[k for k in raw if k not in ignored], source=source)
        cfg.ignored_kafka_keys = tuple(ignored)
        return cfg

    def with_overrides(self, overrides: Iterable[str] | Mapping[str, Any]) -> "BrokerConfig":
        """A new config with ``key=value`` strings (or a mapping) applied on top of this one."""
        raw: dict[str, tuple[Any, str]] = {
            k: (_broker_key(k).format(self._values[k]), "") for k in self._explicit
        }
        if isinstance(overrides, Mapping):
            raw.update({k: (v, "") for k, v in overrides.items()})
        else:
            raw.update({k: (v, "--override") for k, v in parse_overrides(overrides).items()})
        return type(self)._build(raw, source=self.source)

    # ---- access -----------------------------------------------------------
    def get(self, name: str, effective: bool = True) -> Any:
        if name not in BROKER_KEYS:
            raise _unknown_key(name, BROKER_KEYS, "broker")
        return _effective(self._values, name) if effective else self._values[name]

    def logger_levels(self) -> dict[str, str]:
        """``log.level.<logger>`` settings: logger name -> log4j level name."""
        return {k[len(LOGGER_LEVEL_PREFIX):]: v for k, v in self._values.items()
                if k.startswith(LOGGER_LEVEL_PREFIX) and k not in BROKER_KEYS}

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        name = attr.replace("_", ".")
        if name in BROKER_KEYS:
            return self.get(name)
        raise AttributeError(f"{type(self).__name__} has no attribute {attr!r} (and no key {name!r})")

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def is_set(self, name: str) -> bool:
        """Was the key given explicitly (file, dict or override) rather than defaulted?"""
        if name not in BROKER_KEYS:
            raise _unknown_key(name, BROKER_KEYS, "broker")
        return name in self._explicit

    def advertised_endpoint(self) -> Endpoint:
        """The advertised listener of security.inter.broker.protocol (brokers and the controller
        reach each other there; it is the registration's host and port), else the first gRPC one."""
        advertised = self.get("advertised.listeners")
        inter = self.get("security.inter.broker.protocol")
        return next((e for e in advertised if e.protocol == inter), None) \
            or next(e for e in advertised if e.protocol in GRPC_PROTOCOLS)

    def grpc_listeners(self) -> list[Endpoint]:
        """The gRPC listeners to bind, in configured order."""
        return [e for e in self.get("listeners") if e.protocol in GRPC_PROTOCOLS]

    def listener(self, protocol: str) -> Endpoint | None:
        """The listener of ``protocol`` (e.g. ``"FLIGHT"``), or None."""
        return next((e for e in self.get("listeners") if e.protocol == protocol), None)

    def as_properties(self, include_defaults: bool = False) -> dict[str, str]:
        """Normalized string values: the explicitly set keys (or every key that has a value)."""
        names = [k.name for k in BROKER_CONFIG_KEYS
                 if k.name in self._explicit or (include_defaults and self._values[k.name] is not None)]
        names += sorted(LOGGER_LEVEL_PREFIX + name for name in self.logger_levels())
        return {n: _broker_key(n).format(self._values[n]) for n in names}

    def to_properties_text(self) -> str:
        return "".join(f"{k}={v}\n" for k, v in self.as_properties().items())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BrokerConfig) and self._values == other._values

    def __repr__(self) -> str:
        return f"BrokerConfig({self.as_properties()!r})"


def _cross_check(values: Mapping[str, Any]) -> None:
    if values["replica.fetch.wait.max.ms"] > values["replica.lag.time.max.ms"]:
        raise InvalidConfigError(
            f"invalid value {values['replica.fetch.wait.max.ms']} for configuration replica.fetch.wait.max.ms: "
            f"must not exceed replica.lag.time.max.ms ({values['replica.lag.time.max.ms']}), or followers "
            f"waiting on an idle leader would drop out of the ISR"
        )
    adv = values["advertised.listeners"]
    if adv is not None and sorted(e.protocol for e in adv) != sorted(e.protocol for e in values["listeners"]):
        raise InvalidConfigError(
            f"invalid value {LIST.format(adv)!r} for configuration advertised.listeners: "
            f"must advertise one address per listener, with the same protocols as listeners "
            f"({LIST.format(values['listeners'])})"
        )
    # Port 0 advertises the port bound (as Kafka's registration does), so only where the listener binds 0.
    bound_any = {e.protocol for e in values["listeners"] if e.port == 0}
    unbound = [e for e in adv or () if e.port == 0 and e.protocol not in bound_any]
    if unbound:
        raise InvalidConfigError(
            f"invalid value {LIST.format(adv)!r} for configuration advertised.listeners: "
            f"{unbound[0]} needs a real port (0, the bound port, only where its listener binds port 0)"
        )


# --------------------------------------------------------------------------
# Topic-level configuration
# --------------------------------------------------------------------------
def validate_topic_config(config: Mapping[str, Any] | None) -> dict[str, str]:
    """Validate topic-level overrides; return them as normalized strings (for ZooKeeper).

    An unknown key or a bad value raises InvalidConfigError naming the key.
    """
    out: dict[str, str] = {}
    for name, raw in (config or {}).items():
        key = TOPIC_KEYS.get(name)
        if key is None:
            raise _unknown_key(name, TOPIC_KEYS, "topic-level")
        out[name] = key.format(key.parse(raw))
    return out


def parse_topic_config_args(items: Iterable[str] | None) -> dict[str, str]:
    """``--config key=value`` arguments -> validated, normalized topic overrides."""
    out: dict[str, str] = {}
    for item in items or ():
        try:
            key, value = parse_override(item)
        except InvalidConfigError:
            raise InvalidConfigError(f"malformed --config {item!r}: expected key=value") from None
        out[key] = value
    return validate_topic_config(out)


def topic_defaults(broker_cfg: BrokerConfig | None = None) -> dict[str, Any]:
    """Each topic-level key's typed default: the broker's (effective) value of its synonym."""
    values = broker_cfg._values if broker_cfg is not None else _DEFAULTS
    return {k.name: _effective(values, k.synonym) for k in TOPIC_CONFIG_KEYS}


def log_config_for_topic(broker_cfg: BrokerConfig | None, topic_overrides: Mapping[str, Any] | None = None) -> LogConfig:
    """The LogConfig of a topic's partitions: broker defaults, then the topic's overrides.

    ``broker_cfg=None`` uses the built-in defaults (handy in storage tests).
    """
    values = topic_defaults(broker_cfg)
    for name, raw in (topic_overrides or {}).items():
        key = TOPIC_KEYS.get(name)
        if key is None:
            raise _unknown_key(name, TOPIC_KEYS, "topic-level")
        values[name] = key.parse(raw)
    return LogConfig(**{field: values[name] for name, field in _LOG_CONFIG_FIELDS.items()})


# --------------------------------------------------------------------------
# Reference documentation
# --------------------------------------------------------------------------
def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _default_text(key: ConfigKey) -> str:
    if key.default is REQUIRED:
        return "*(required)*"
    if key.default is None:
        return "*(unset)*"
    return f"`{key.format(key.default)}`"


def config_reference_markdown() -> str:
    """The broker and topic-level configuration tables as Markdown (for the README)."""
    lines = [
        "### Broker configuration (`conf/server.properties`, `--override key=value`)",
        "",
        "| key | default | unit | allowed | description |",
        "|---|---|---|---|---|",
    ]
    for k in BROKER_CONFIG_KEYS:
        lines.append(f"| `{k.name}` | {_default_text(k)} | {k.unit} | {_md(k.allowed())} | {_md(k.doc)} |")
    lines += [
        "",
        "### Topic-level configuration (`--config key=value` at topic creation)",
        "",
        "A topic-level key defaults to the broker's value of the key in the *broker key* column.",
        "",
        "| key | broker key | unit | allowed | description |",
        "|---|---|---|---|---|",
    ]
    for k in TOPIC_CONFIG_KEYS:
        lines.append(f"| `{k.name}` | `{k.synonym}` | {k.unit} | {_md(k.allowed())} | {_md(k.doc)} |")
    return "\n".join(lines) + "\n"


__all__ = [
    "REQUIRED", "ConfigKey", "ConfigType", "Validator", "Range", "OneOf", "Listeners", "ZkConnect",
    "NonEmptyPaths", "Endpoint", "INT", "LONG", "BOOLEAN", "STRING", "LIST",
    "BROKER_CONFIG_KEYS", "TOPIC_CONFIG_KEYS", "BROKER_KEYS", "TOPIC_KEYS",
    "BrokerConfig", "parse_properties", "parse_properties_lines", "read_properties",
    "parse_override", "parse_overrides", "validate_topic_config", "parse_topic_config_args",
    "topic_defaults", "log_config_for_topic", "config_reference_markdown",
]


if __name__ == "__main__":  # python -m replikafka.broker.config  -> the reference table
    print(config_reference_markdown(), end="")
