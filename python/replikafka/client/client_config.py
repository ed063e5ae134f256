"""Kafka-style client configuration: ``Producer({"bootstrap.servers": ..., "acks": "all"})``.

A Kafka user passes one dict of dotted keys (as to Kafka's Java clients or
confluent-kafka); the clients here take Python keyword arguments. This module
turns such a dict into the keyword arguments of one client class, so a dict is
never mistaken for a bootstrap address.

- A key this client honours becomes its keyword argument (value converted).
- A key of Kafka's own client configuration that means nothing here (e.g.
  ``client.id``, ``compression.type``) is accepted and listed once in a warning.
- Security keys (``security.protocol``, ``ssl.*``, ``sasl.*``) become the
  client's ``security`` argument, checked there.
- Any other key is refused with :class:`InvalidConfigError`, naming it and the
  closest known key.

Pure: no I/O except the one warning through :mod:`logging`.
"""
from __future__ import annotations

import difflib
import functools
import logging
from typing import Any, Callable, Mapping

from replikafka import errors as E

log = logging.getLogger("replikafka.client")


def _int(key: str, v: Any) -> int:
    try:
        return int(str(v).strip()) if not isinstance(v, int) or isinstance(v, bool) else v
    except ValueError:
        raise E.InvalidConfigError(f"client config {key}: {v!r} is not an integer") from None


def _float(key: str, v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        raise E.InvalidConfigError(f"client config {key}: {v!r} is not a number") from None


def _bool(key: str, v: Any) -> bool:
    if isinstance(v, bool):
        return v
    text = str(v).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise E.InvalidConfigError(f"client config {key}: {v!r} is not true or false")


def _same(key: str, v: Any) -> Any:
    return v


Converter = Callable[[str, Any], Any]

# Kafka key -> (keyword argument, converter), per client. Common keys first.
_COMMON: dict[str, tuple[str, Converter]] = {
    "bootstrap.servers": ("bootstrap_servers", _same),
    "request.timeout.ms": ("request_timeout_ms", _int),
    "retry.backoff.ms": ("retry_backoff_ms", _int),
}
PRODUCER_KEYS: dict[str, tuple[str, Converter]] = {
    **_COMMON,
    "acks": ("acks", _same),
    "enable.idempotence": ("idempotent", _bool),
    "linger.ms": ("linger_ms", _float),
    "batch.size": ("batch_size", _int),
    "delivery.timeout.ms": ("delivery_timeout_ms", _int),
    "max.in.flight.requests.per.connection": ("max_in_flight", _int),
    "buffer.memory": ("buffer_memory", _int),
    "max.block.ms": ("max_block_ms", _int),
    "max.request.size": ("max_request_size", _int),
    "produce.use.flight": ("use_flight", _bool),
}
CONSUMER_KEYS: dict[str, tuple[str, Converter]] = {
    **_COMMON,
    "fetch.max.bytes": ("fetch_max_bytes", _int),
    "max.partition.fetch.bytes": ("max_partition_fetch_bytes", _int),
    "fetch.max.wait.ms": ("fetch_max_wait_ms", _int),
    "fetch.min.bytes": ("fetch_min_bytes", _int),
    "auto.offset.reset": ("auto_offset_reset", _same),
    "columns": ("columns", _same),
    "fetch.use.flight": ("use_flight", _bool),
}
ADMIN_KEYS: dict[str, tuple[str, Converter]] = dict(_COMMON)

# librdkafka's security keys: every client passes them on as its ``security`` dict.
SECURITY_KEYS = frozenset({"security.protocol", "ssl.ca.location", "ssl.certificate.location",
                           "ssl.key.location", "ssl.key.password", "sasl.mechanism", "sasl.username",
                           "sasl.password"})

# Kafka's own client keys (producer, consumer, admin: the names in Kafka's
# ProducerConfig / ConsumerConfig / AdminClientConfig / CommonClientConfigs)
# that have no meaning here: accepted, listed once as ignored.
KAFKA_CLIENT_KEYS_IGNORED = frozenset({
    "client.id", "client.dns.lookup", "client.rack", "connections.max.idle.ms", "metadata.max.age.ms",
    "metadata.max.idle.ms", "metric.reporters", "metrics.num.samples", "metrics.recording.level",
    "metrics.sample.window.ms", "receive.buffer.bytes", "send.buffer.bytes", "reconnect.backoff.ms",
    "reconnect.backoff.max.ms", "retry.backoff.max.ms", "socket.connection.setup.timeout.ms",
    "socket.connection.setup.timeout.max.ms", "default.api.timeout.ms", "retries", "auto.include.jmx.reporter",
    "enable.metrics.push", "interceptor.classes", "key.serializer", "value.serializer", "key.deserializer",
    "value.deserializer", "compression.type", "compression.gzip.level", "compression.lz4.level",
    "compression.zstd.level", "partitioner.class", "partitioner.ignore.keys", "partitioner.adaptive.partitioning.enable",
    "partitioner.availability.timeout.ms", "transactional.id", "transaction.timeout.ms", "group.id",
    "group.instance.id", "group.protocol", "group.remote.assignor", "session.timeout.ms", "heartbeat.interval.ms",
    "enable.auto.commit", "auto.commit.interval.ms", "max.poll.records", "max.poll.interval.ms",
    "partition.assignment.strategy", "isolation.level", "check.crcs", "exclude.internal.topics",
    "allow.auto.create.topics", "internal.leave.group.on.close", "security.providers",
})


def _is_security_key(key: str) -> bool:
    """librdkafka's security keys, passed on as the client's ``security`` config."""
    return key == "security.protocol" or key.startswith("ssl.") or key.startswith("sasl.")


def _suggest(key: str, known: Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def kwargs_from_config(client: str, config: Mapping[str, Any], table: Mapping[str, tuple[str, Converter]],
                       ) -> dict[str, Any]:
    """The keyword arguments of ``client`` for a Kafka-style ``config`` dict.
    Raises :class:`InvalidConfigError` for a key that is neither honoured nor
    one of Kafka's own client keys; warns once listing the ignored Kafka keys."""
    out: dict[str, Any] = {}
    ignored: list[str] = []
    security: dict[str, Any] = {}
    for raw_key, value in config.items():
        key = str(raw_key).strip()
        if _is_security_key(key):
            security[key] = value  # the client's TLS/SASL set-up reads and checks them
        elif key in table:
            name, convert = table[key]
            out[name] = convert(key, value)
        elif key in SECURITY_KEYS or key.startswith(("ssl.", "sasl.")):
            out.setdefault("security", {})[key] = value   # checked by ClientSecurity.from_config
        elif key in KAFKA_CLIENT_KEYS_IGNORED:
            ignored.append(key)
        else:
            raise E.InvalidConfigError(
                f"{client} config key {key!r} is not known{_suggest(key, table)}; "
                f"honoured: {', '.join(sorted(table))}")
    if "bootstrap_servers" not in out:
        raise E.InvalidConfigError(f"{client} config needs bootstrap.servers")
    if security:
        out["security"] = security
    if ignored:
        log.warning("%s: ignoring Kafka client config keys that do not apply here: %s", client,
                    ", ".join(sorted(ignored)))
    return out


def accepts_config_dict(client: str, table: Mapping[str, tuple[str, Converter]]):
    """Decorates a client's ``__init__(self, bootstrap_servers, ...)`` so its
    first argument may also be a Kafka-style config dict; keyword arguments
    given besides the dict win over its keys."""
    def decorate(init):
        @functools.wraps(init)
        def wrapper(self, bootstrap_servers, *args, **kwargs):
            if not isinstance(bootstrap_servers, Mapping):
                return init(self, bootstrap_servers, *args, **kwargs)
            if args:
                raise E.InvalidConfigError(
                    f"{client}: with a config dict, give the other settings in the dict or as keywords")
            return init(self, **{**kwargs_from_config(client, bootstrap_servers, table), **kwargs})
        return wrapper
    return decorate
