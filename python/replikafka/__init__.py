"""replikafka: a replicated, partitioned log store whose records are Arrow batches.

    import replikafka
    admin = replikafka.Admin("127.0.0.1:9092")
    with replikafka.Producer("127.0.0.1:9092") as p:
        p.send("events", table).result()
    c = replikafka.Consumer("127.0.0.1:9092"); c.assign([("events", 0)]); c.poll(1000)

Errors form one tree rooted at :class:`ReplikafkaError` (each knows whether it
is ``retriable``); every class is exported here. The client classes are loaded
on first use, so ``import replikafka.errors`` (e.g. in the broker) stays light.
"""
from __future__ import annotations

from replikafka.errors import *  # noqa: F401,F403  (the whole error tree)
from replikafka.errors import __all__ as _errors_all

try:
    from importlib.metadata import PackageNotFoundError, version as _version
    __version__ = _version("replikafka")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.1.0"

_LAZY = {
    "Admin": "replikafka.client.admin",
    "TopicDescription": "replikafka.client.admin",
    "PartitionDescription": "replikafka.client.admin",
    "ClusterDescription": "replikafka.client.admin",
    "Producer": "replikafka.client.producer",
    "RecordMetadata": "replikafka.client.accumulator",
    "Consumer": "replikafka.client.consumer",
    "OffsetAndTimestamp": "replikafka.client.consumer",
    "BrokerInfo": "replikafka.client.metadata",
    "PartitionInfo": "replikafka.client.metadata",
    "TopicInfo": "replikafka.client.metadata",
    "partition_for_key": "replikafka.client.partitioner",
}

__all__ = sorted(set(_errors_all) | set(_LAZY) | {"__version__"})


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'replikafka' has no attribute {name!r}")
    import importlib
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return __all__
