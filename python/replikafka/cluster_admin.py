"""The administration API the command-line tools call: everything they need of
the cluster's own formats and rules, so that no command imports a broker module
(only ``replikafka broker`` runs one).

* :func:`open_admin`: the reassignment and election commands' view of the
  cluster, over a broker's RPCs (``--bootstrap-server``, as Kafka 3.x's tools)
  or over ZooKeeper (``--zookeeper``), with the same methods either way.
* :func:`parse_reassignment`: Kafka's reassignment JSON (the tool's plan files
  and the ``/admin/reassign_partitions`` znode hold the same format).
* :func:`propose_assignment`: replicas placed as the controller places a new
  topic's (Kafka's ``assignReplicasToBrokers``).
* :func:`read_properties`, :func:`parse_overrides`: ``.properties`` files and
  ``--override key=value``, read as the broker reads them.
* :func:`stored_batches`: the stored batches of a debugging fetch's answer,
  header by header.

Pure functions and one adapter class; thread-safe as the client Admin it wraps.
"""
from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

import crc32c as _crc32c

from replikafka import errors as E

TP = tuple[str, int]


# ---------------------------------------------------------------- the cluster's view
class AdminRpcStore:
    """The store methods the reassignment and election commands use (ZooKeeper's
    ``ZkStore`` has the same), answered by a broker through Metadata,
    AlterPartitionReassignments, ListPartitionReassignments and ElectLeaders over
    a :class:`replikafka.Admin`.

    The pending reassignments and elections are read from ZooKeeper by the broker,
    but assignments and leaders come from its metadata cache, which the controller
    updates after it finishes (UpdateMetadata): a command that sees its request done
    gives the cache ``metadata_settle_s`` to show the outcome before it reports."""

    metadata_settle_s = 10.0    # seconds; how long a broker's metadata may trail ZooKeeper

    def __init__(self, admin):
        self.admin = admin

    # ---- reads (Metadata)
    def list_topics(self) -> list[str]:
        return self.admin.list_topics()

    def _topic(self, topic: str):
        try:
            return self.admin.describe_topic(topic)
        except E.UnknownTopicOrPartitionError:  # reads as absent, as a missing znode
            return None

    def get_assignment(self, topic: str) -> dict[int, list[int]] | None:
        t = self._topic(topic)
        return None if t is None else {p.partition: list(p.replicas) for p in t.partitions}

    def get_partition_states(self, tps):
        out = {}
        for topic in sorted({t for t, _ in tps}):
            t = self._topic(topic)
            for p in (t.partitions if t else ()):
                if (topic, p.partition) in tps:
                    out[(topic, p.partition)] = (SimpleNamespace(leader=p.leader, isr=list(p.isr)), -1)
        return out

    def live_brokers(self) -> dict[int, tuple[str, int]]:
        return {b.id: (b.host, b.port) for b in self.admin.describe_cluster().brokers}

    # ---- admin requests
    def create_reassignment(self, plan) -> None:
        self.admin.alter_partition_reassignments(plan)

    def get_reassignment(self) -> dict[TP, list[int]]:
        return self.admin.list_partition_reassignments()[0]

    def create_preferred_election(self, tps) -> None:
        self.admin.elect_preferred_leaders(tps)

    def get_preferred_election(self):
        return [] if self.admin.list_partition_reassignments()[1] else None


@contextlib.contextmanager
def open_admin(admin=None, zookeeper: str | None = None):
    """The cluster's view for a command: over ``admin`` (a :class:`replikafka.Admin`,
    closed on exit) when given, else over ZooKeeper at ``zookeeper``
    (``H:P[/chroot]``, a short session; see ``cli/zk_session.py``)."""
    if admin is not None:
        with admin:
            yield AdminRpcStore(admin)
        return
    from replikafka.broker.zk_store import ZkStore
    from replikafka.cli.zk_session import zk_session
    with zk_session(zookeeper) as zk:
        yield ZkStore(zk)


def settled(store, read, ok, poll_s: float = 0.2):
    """``read()`` once the answer is ``ok``, re-read for at most the store's
    ``metadata_settle_s`` (0 for ZooKeeper, which is the record itself); the last
    answer either way, so a real failure is still reported, only later."""
    deadline = time.monotonic() + getattr(store, "metadata_settle_s", 0.0)
    got = read()
    while not ok(got) and time.monotonic() < deadline:
        time.sleep(poll_s)
        got = read()
    return got


# ---------------------------------------------------------------- formats and rules
def parse_reassignment(data: bytes) -> dict[TP, list[int]]:
    """Kafka's reassignment JSON (``{"version":1,"partitions":[{"topic":..,"partition":..,
    "replicas":[..]}]}``); an InvalidRequestError names what is wrong."""
    from replikafka.broker.zk_store import reassignment_from_json
    return reassignment_from_json(data)


def election_rounds(tps: list[TP]) -> tuple[list[list[TP]], int]:
    """``tps`` cut into runs that each fit in one election znode, and that znode's
    limit in bytes (ZooKeeper's jute.maxbuffer): a longer list is elected in rounds."""
    from replikafka.broker import zk_store
    return zk_store.partition_list_batches(tps), zk_store.ZNODE_DATA_BYTES_MAX


def propose_assignment(n_partitions: int, rf: int, brokers: list[int],
                       rng: random.Random | None = None) -> dict[int, list[int]]:
    """Partition -> replicas over ``brokers``, placed as the controller places a new topic's."""
    from replikafka.broker.controller.controller import random_assignment
    return random_assignment(n_partitions, rf, brokers, rng=rng)


def read_properties(path: str) -> dict[str, str]:
    """A ``.properties`` file as the broker reads it; InvalidConfigError if missing or unreadable."""
    from replikafka.broker.config import read_properties as read
    return read(path)


def parse_overrides(items: Iterable[str] | None) -> dict[str, str]:
    """``--override key=value`` arguments in order (a repeated key: the last wins); a
    malformed one is an InvalidConfigError naming it."""
    from replikafka.broker.config import parse_overrides as parse
    return parse(items)


@dataclass(frozen=True, slots=True)
class StoredBatch:
    """One stored batch's header as a debugging fetch returned it, and the CRC-32C of
    the body bytes that came with it."""
    base_offset: int
    record_count: int          # as the header says
    leader_epoch: int
    stored_crc: int            # the CRC-32C stored in the header
    body_crc: int              # the CRC-32C of the body received
    arrow_record_count: int    # as the Arrow batch itself says


def stored_batches(data, where: str = "fetch") -> Iterator[StoredBatch]:
    """The stored batches of a debugging fetch's answer (an Arrow IPC stream: the schema
    message, then stored batch messages), in order. Bytes that stop making sense raise
    CorruptRecordError naming where, after the batches before that point."""
    from replikafka.broker.storage import batch_format as bf

    limit = len(data)
    if not limit:
        return
    _schema, pos = bf.read_schema_message(data, limit, where)
    view = memoryview(data)
    while pos < limit:
        got = bf.read_header(data, pos, limit, f"{where} position {pos}")
        if got is None:
            return
        header, info = got
        body_start = pos + bf.PREFIX_SIZE + info.metadata_length
        yield StoredBatch(header.base_offset, header.record_count, header.leader_epoch, header.crc32c,
                          _crc32c.crc32c(view[body_start:pos + info.size]), info.record_count)
        pos += info.size
