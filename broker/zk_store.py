"""Every ZooKeeper path and JSON codec replikafka uses, behind one class.

Layout (ARCHITECTURE.md; JSON values carry ``"version": 1``)::

    /controller                                   {"version":1,"brokerid":N,"timestamp":"ms"}  ephemeral
    /controller_epoch                             "E" (CAS on the znode version)
    /brokers/ids/[id]                             {"version":1,"host":..,"port":..}  ephemeral
    /brokers/topics/[topic]                       {"version":1,"partitions":{"0":[1,2,3],...}}
    /brokers/topics/[topic]/partitions/[p]/state  {"version":1,"leader":N,"leader_epoch":E,"controller_epoch":C,"isr":[..]}
    /config/topics/[topic]                        {"version":1,"config":{..},"schema":"<base64 Arrow IPC schema>"}
    /admin/delete_topics/[topic]
    /admin/reassign_partitions                    {"version":1,"partitions":[{"topic":t,"partition":p,"replicas":[..]}]}
    /admin/preferred_replica_election             {"version":1,"partitions":[{"topic":t,"partition":p}]}
    /isr_change_notification/isr_change_NNNN      {"version":1,"partitions":[{"topic":t,"partition":p}]}
    /log_dir_event_notification/log_dir_event_NNNN {"version":1,"broker":N,"event":1,"partitions":[..]}
    /latest_producer_id_block                     {"version":1,"block_start":S,"block_end":E}

Thread-safe: kazoo clients are; this class holds no state but the client.
Every partition-state update is a conditional write on the znode version.

Size: ZooKeeper drops the connection of any request over its ``jute.maxbuffer``
(1 MiB by default), and the client sees only ``ConnectionLoss``. So no write
here carries more than ``ZNODE_DATA_BYTES_MAX``: notifications listing
partitions are split over several sequential znodes (their readers take all
children anyway), and a document that cannot be split (a topic's assignment,
a reassignment plan, an election) is refused with a named error instead.
"""
from __future__ import annotations

import base64
import json
import logging
import struct
import time
from collections import namedtuple
from collections.abc import Callable
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import (EXCEPTIONS, BadVersionError, ConnectionLoss, NodeExistsError, NoNodeError,
                              UnimplementedError)
from kazoo.protocol.serialization import (CheckVersion, SetData, Transaction, int_struct, multiheader_struct,
                                          stat_struct, write_string)
from kazoo.protocol.states import ZnodeStat

log = logging.getLogger(__name__)

CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
BROKER_IDS = "/brokers/ids"
BROKER_TOPICS = "/brokers/topics"
CONFIG_TOPICS = "/config/topics"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
DELETE_TOPICS = "/admin/delete_topics"
PARTITIONS_REMOVE = "/admin/partitions_remove"       # [topic]/[partition]: seed 000 section H
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
ISR_CHANGE = "/isr_change_notification"
PRODUCER_ID_BLOCK = "/latest_producer_id_block"
PRODUCER_ID_BLOCK_SIZE = 1000
# One ZooKeeper multi is limited by jute.maxbuffer (~1 MB); stay well below it.
MULTI_OPS_MAX = 1000
#: The most data one znode write (or a topic's creation, one multi) carries, in bytes:
#: jute.maxbuffer's default is 1,048,575 and the request holds paths and headers besides.
ZNODE_DATA_BYTES_MAX = 1_024_000

LOG_DIR_EVENT = "/log_dir_event_notification"
PERSISTENT_PATHS = (BROKER_IDS, BROKER_TOPICS, CONFIG_TOPICS, CONFIG_CHANGES, DELETE_TOPICS, PARTITIONS_REMOVE,
                    ISR_CHANGE, LOG_DIR_EVENT)


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's leadership as stored in its state znode."""
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int

    def to_json(self) -> bytes:
        # The bytes json.dumps gives for the same dict, formatted directly: a failover
        # writes tens of thousands of these and json.dumps cost ~8 µs each.
        return b'{"version": 1, "leader": %d, "leader_epoch": %d, "controller_epoch": %d, "isr": [%s]}' % (
            self.leader, self.leader_epoch, self.controller_epoch, b", ".join(b"%d" % b for b in self.isr))

    @staticmethod
    def from_json(data: bytes) -> "LeaderAndIsr":
        d = json.loads(data)
        return LeaderAndIsr(int(d["leader"]), int(d["leader_epoch"]), tuple(int(b) for b in d["isr"]),
                            int(d["controller_epoch"]))


class _StateDecoder(dict):
    """Decodes state znode values, each distinct value once: a read of many states
    meets few distinct ones (a few brokers, epochs and versions: at 50,000 partitions
    on 3 brokers, tens), and a JSON decode each was most of a controller failover's
    read (LeaderAndIsr is frozen, so equal states share one object). Lives for one read."""

    def __call__(self, data: bytes) -> LeaderAndIsr:
        s = self.get(data)
        if s is None:
            s = self[data] = LeaderAndIsr.from_json(data)
        return s


def _json(d: dict) -> bytes:
    return json.dumps({"version": 1, **d}, sort_keys=True).encode()


def _check_size(nbytes: int, what: str, error, hint: str) -> None:
    """Raise ``error`` (a ReplikafkaError class) naming ``what``, its size and the limit,
    with ``hint``, unless one write can carry ``nbytes``: sent anyway, ZooKeeper would
    only drop the connection."""
    if nbytes > ZNODE_DATA_BYTES_MAX:
        raise error(f"{what} would be {nbytes:,} bytes in ZooKeeper, over the {ZNODE_DATA_BYTES_MAX:,} one "
                    f"znode may hold (the server's jute.maxbuffer): {hint}")


def partition_list_batches(tps, doc=lambda entries: _json({"partitions": entries})) -> list[list[tuple[str, int]]]:
    """``tps`` in order, cut into as few runs as keep each run's document (``doc`` of its
    ``{"topic", "partition"}`` entries) within ``ZNODE_DATA_BYTES_MAX``."""
    envelope = len(doc([])) + 64          # the document around the list, with room to spare
    batches: list[list[tuple[str, int]]] = []
    run: list[tuple[str, int]] = []
    size = envelope
    for t, p in tps:
        # json.dumps of {"partition": p, "topic": t} plus the ", " that separates entries
        entry = len(json.dumps(t)) + len(str(p)) + 28
        if run and size + entry > ZNODE_DATA_BYTES_MAX:
            batches.append(run)
            run, size = [], envelope
        run.append((t, p))
        size += entry
    if run:
        batches.append(run)
    return batches


def _partition_entries(tps) -> list[dict]:
    return [{"topic": t, "partition": p} for t, p in tps]


def _assignment_json(topic: str, assignment: dict[int, list[int]], beside: int = 0) -> bytes:
    """The topic's assignment znode, refused by name if it (with ``beside`` more bytes
    written in the same request) is too big for one write."""
    from replikafka.errors import InvalidPartitionsError
    data = _json({"partitions": {str(p): r for p, r in sorted(assignment.items())}})
    _check_size(len(data) + beside, f"the assignment of topic {topic!r} ({len(assignment):,} partitions)"
                + (" with its schema and config" if beside else ""), InvalidPartitionsError,
                "spread the partitions over more topics")
    return data


def topic_path(topic: str) -> str:
    return f"{BROKER_TOPICS}/{topic}"


def state_path(topic: str, partition: int) -> str:
    return f"{BROKER_TOPICS}/{topic}/partitions/{partition}/state"


def _registered_address(data: bytes) -> tuple[str, int] | None:
    """(host, port) of a ``/brokers/ids/[id]`` value, None if it does not parse."""
    try:
        d = json.loads(data)
        return str(d["host"]), int(d["port"])
    except (ValueError, KeyError, TypeError):
        return None


class ZkStore:
    def __init__(self, zk: KazooClient):
        self.zk = zk
        self._multi_read_ok = True
        # More fields for this broker's registration (its metrics_url, as Kafka's jmx_port).
        self.registration_extra: dict[str, str] = {}

    def ensure_paths(self) -> None:
        for p in PERSISTENT_PATHS:
            self.zk.ensure_path(p)

    # ------------------------------------------------------------ brokers
    def register_broker(self, broker_id: int, host: str, port: int, wait_s: float = 0.0,
                        endpoints: tuple[str, ...] = ()) -> int:
        """Create the ephemeral ``/brokers/ids/[id]``; returns its czxid (the broker epoch). A node left by our previous
        incarnation (killed, its session not expired yet) goes away by itself
        within the session timeout: wait up to ``wait_s`` for that, then fail
        naming the conflict (two live brokers with one id). ``endpoints`` are every
        advertised listener as ``PROTOCOL://host:port`` (Kafka's registration field);
        ``host``/``port`` stay the inter-broker gRPC listener."""
        data = _json({"host": host, "port": port, "endpoints": list(endpoints),
                      "timestamp": str(int(time.time() * 1000)), **self.registration_extra})
        path = f"{BROKER_IDS}/{broker_id}"
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.zk.create(path, data, ephemeral=True, makepath=True)
                return self.zk.exists(path).czxid
            except NodeExistsError:
                try:
                    held, stat = self.zk.get(path)
                except NoNodeError:
                    continue
                if stat.ephemeralOwner == self.zk.client_id[0]:
                    self.zk.set(path, data)
                    return stat.czxid
                holder = _registered_address(held)
                # We hold our own port now, so a node naming it is our previous incarnation's
                # (gone when its session expires); a node naming another address is a live broker.
                if holder != (host, port) or time.monotonic() >= deadline:
                    from replikafka.errors import InvalidConfigError
                    where = f" by a broker at {holder[0]}:{holder[1]}" if holder else " by another session"
                    raise InvalidConfigError(
                        f"broker.id={broker_id} is already registered in ZooKeeper{where} "
                        f"(two brokers with one broker.id?)") from None
                time.sleep(0.2)

    def live_brokers(self, watch=None, epochs: dict[int, int] | None = None,
                     endpoints: dict[int, tuple[str, ...]] | None = None) -> dict[int, tuple[str, int]]:
        """Registered brokers: id -> (host, port). If ``epochs`` is given it is filled
        with each registration's czxid (the broker epoch): a changed value means the
        broker restarted, even if the controller never saw it gone. If ``endpoints``
        is given it is filled with each broker's advertised listeners."""
        out = {}
        for child in self.zk.get_children(BROKER_IDS, watch=watch):
            try:
                data, stat = self.zk.get(f"{BROKER_IDS}/{child}")
            except NoNodeError:
                continue
            d = json.loads(data)
            out[int(child)] = (d["host"], int(d["port"]))
            if endpoints is not None:
                endpoints[int(child)] = tuple(d.get("endpoints") or ())
            if epochs is not None:
                epochs[int(child)] = stat.czxid
        return out

    # ------------------------------------------------------------ controller
    def get_controller_id(self, watch=None) -> int:
        try:
            data, _ = self.zk.get(CONTROLLER, watch=watch)
        except NoNodeError:
            return -1
        return int(json.loads(data)["brokerid"])

    def broker_registrations(self) -> dict[int, dict]:
        """Each live broker's registration, as registered."""
        out = {}
        for child in self.zk.get_children(BROKER_IDS):
            try:
                out[int(child)] = json.loads(self.zk.get(f"{BROKER_IDS}/{child}")[0])
            except NoNodeError:
                continue
        return out

    def controller_is_ours(self) -> bool:
        """Whether ``/controller`` is an ephemeral of this client's own session (an earlier
        incarnation's node, left until its session times out, is not)."""
        stat = self.zk.exists(CONTROLLER)
        return stat is not None and stat.ephemeralOwner == self.zk.client_id[0]

    def try_elect_controller(self, broker_id: int) -> bool:
        data = _json({"brokerid": broker_id, "timestamp": str(int(time.time() * 1000))})
        try:
            self.zk.create(CONTROLLER, data, ephemeral=True)
            return True
        except NodeExistsError:
            return False

    def increment_controller_epoch(self) -> tuple[int, int]:
        """CAS +1 on /controller_epoch; returns (new epoch, znode version)."""
        while True:
            try:
                data, stat = self.zk.get(CONTROLLER_EPOCH)
            except NoNodeError:
                try:
                    self.zk.create(CONTROLLER_EPOCH, b"1")
                    _, stat = self.zk.get(CONTROLLER_EPOCH)
                    return 1, stat.version
                except NodeExistsError:
                    continue
            epoch = int(data) + 1
            try:
                stat = self.zk.set(CONTROLLER_EPOCH, str(epoch).encode(), version=stat.version)
                return epoch, stat.version
            except BadVersionError:
                continue

    def controller_epoch(self) -> tuple[int, int]:
        try:
            data, stat = self.zk.get(CONTROLLER_EPOCH)
            return int(data), stat.version
        except NoNodeError:
            return 0, -1

    # ------------------------------------------------------------ topics
    def list_topics(self, watch=None) -> list[str]:
        try:
            return sorted(self.zk.get_children(BROKER_TOPICS, watch=watch))
        except NoNodeError:
            return []

    def get_assignment(self, topic: str, watch=None) -> dict[int, list[int]] | None:
        try:
            data, _ = self.zk.get(topic_path(topic), watch=watch)
        except NoNodeError:
            return None
        return {int(p): [int(b) for b in r] for p, r in json.loads(data)["partitions"].items()}

    def get_topic_config(self, topic: str) -> tuple[dict[str, str], bytes] | None:
        try:
            data, _ = self.zk.get(f"{CONFIG_TOPICS}/{topic}")
        except NoNodeError:
            return None
        d = json.loads(data)
        return dict(d.get("config", {})), base64.b64decode(d.get("schema", ""))

    def set_topic_config(self, topic: str, config: dict[str, str]) -> None:
        """Replace a topic's config overrides (its schema stays), then write a
        change notification (Kafka's ``/config/changes/config_change_N``,
        ``{"version":2,"entity_path":"topics/T"}``) that brokers watch; one multi,
        conditional on the config znode's version."""
        path = f"{CONFIG_TOPICS}/{topic}"
        data, stat = self.zk.get(path)
        d = json.loads(data)
        d["config"] = dict(config)
        tx = self.zk.transaction()
        tx.set_data(path, _json({k: v for k, v in d.items() if k != "version"}), version=stat.version)
        tx.create(f"{CONFIG_CHANGES}/{CONFIG_CHANGE_PREFIX}",
                  json.dumps({"version": 2, "entity_path": f"topics/{topic}"}).encode(), sequence=True)
        for r in tx.commit():
            if isinstance(r, Exception):
                raise r

    def purge_config_changes(self, older_than_ms: int, now_ms: int) -> int:
        """Delete change notifications created more than ``older_than_ms`` ago
        (every broker has long applied them; Kafka purges them the same way).
        Returns how many went; one another broker removed first is skipped."""
        gone = 0
        for child in self.zk.get_children(CONFIG_CHANGES):
            path = f"{CONFIG_CHANGES}/{child}"
            stat = self.zk.exists(path)
            if stat is not None and now_ms - stat.ctime > older_than_ms:
                try:
                    self.zk.delete(path)
                    gone += 1
                except NoNodeError:
                    pass
        return gone

    def config_changes(self, watch=None) -> list[tuple[int, str]]:
        """Change notifications as (sequence number, entity path), oldest first."""
        self.zk.ensure_path(CONFIG_CHANGES)
        out = []
        for child in self.zk.get_children(CONFIG_CHANGES, watch=watch):
            if not child.startswith(CONFIG_CHANGE_PREFIX):
                continue
            try:
                data, _ = self.zk.get(f"{CONFIG_CHANGES}/{child}")
                out.append((int(child[len(CONFIG_CHANGE_PREFIX):]), str(json.loads(data)["entity_path"])))
            except (NoNodeError, ValueError, KeyError, TypeError):
                continue  # removed meanwhile, or not one of ours
        return sorted(out)

    def create_topic(self, topic: str, assignment: dict[int, list[int]], schema: bytes,
                     config: dict[str, str]) -> None:
        """Config first, then the assignment the controller watches (one multi)."""
        cfg = _json({"config": config, "schema": base64.b64encode(schema).decode()})
        assignment_json = _assignment_json(topic, assignment, beside=len(cfg))
        tx = self.zk.transaction()
        if self.zk.exists(f"{CONFIG_TOPICS}/{topic}"):
            tx.set_data(f"{CONFIG_TOPICS}/{topic}", cfg)
        else:
            tx.create(f"{CONFIG_TOPICS}/{topic}", cfg)
        tx.create(topic_path(topic), assignment_json)
        results = tx.commit()
        for r in results:
            if isinstance(r, NodeExistsError):
                from replikafka.errors import TopicExistsError
                raise TopicExistsError(f"topic {topic!r} already exists")
            if isinstance(r, Exception):
                raise r

    def update_assignment(self, topic: str, changes: dict[int, list[int]]) -> dict[int, list[int]] | None:
        """Replace some partitions' replicas in a topic's assignment: read-modify-write on the
        znode version (an admin adding partitions meanwhile is not overwritten). Returns the
        new assignment, None if the topic is gone."""
        while True:
            try:
                data, stat = self.zk.get(topic_path(topic))
            except NoNodeError:
                return None
            assignment = {int(p): [int(b) for b in r] for p, r in json.loads(data)["partitions"].items()}
            assignment.update({p: list(r) for p, r in changes.items()})
            try:
                self.zk.set(topic_path(topic), _assignment_json(topic, assignment), version=stat.version)
                return assignment
            except BadVersionError:
                continue
            except NoNodeError:
                return None

    def request_topic_deletion(self, topic: str) -> None:
        try:
            self.zk.create(f"{DELETE_TOPICS}/{topic}", makepath=True)
        except NodeExistsError:
            pass

    def topics_pending_deletion(self, watch=None) -> list[str]:
        try:
            return sorted(self.zk.get_children(DELETE_TOPICS, watch=watch))
        except NoNodeError:
            return []

    # ------------------------------------------------------------ partition removal (seed 000 H)
    def request_partition_removal(self, topic: str, partitions: list[int]) -> None:
        """Create ``/admin/partitions_remove/[topic]/[p]`` for each partition, in one
        multi (the controller sees the whole request or none of it). A removal of
        the topic's partitions still in progress is refused."""
        tx = self.zk.transaction()
        tx.create(f"{PARTITIONS_REMOVE}/{topic}", b"")
        for p in partitions:
            tx.create(f"{PARTITIONS_REMOVE}/{topic}/{p}", b"")
        results = tx.commit()
        if any(isinstance(r, NodeExistsError) for r in results):
            from replikafka.errors import InvalidPartitionsError
            raise InvalidPartitionsError(f"a removal of partitions of {topic!r} is still in progress")
        for r in results:
            if isinstance(r, Exception):
                raise r

    def partition_removals(self, watch=None) -> dict[str, set[int]]:
        """Requested removals: topic -> partitions (watch: on the list of topics)."""
        try:
            topics = self.zk.get_children(PARTITIONS_REMOVE, watch=watch)
        except NoNodeError:
            return {}
        out = {}
        for t in topics:
            try:
                out[t] = {int(p) for p in self.zk.get_children(f"{PARTITIONS_REMOVE}/{t}") if p.isdigit()}
            except NoNodeError:
                pass
        return out

    def remove_partitions(self, topic: str, partitions: list[int]) -> None:
        """The znode steps of a removal: the assignment without them (on the znode's
        version), then their state znodes. Each step is idempotent (a new controller
        repeats them)."""
        doomed = set(partitions)
        while True:
            try:
                data, stat = self.zk.get(topic_path(topic))
            except NoNodeError:
                break
            assignment = {int(p): r for p, r in json.loads(data)["partitions"].items()}
            kept = {p: r for p, r in assignment.items() if p not in doomed}
            if kept == assignment:
                break
            try:
                self.zk.set(topic_path(topic), _assignment_json(topic, kept), version=stat.version)
                break
            except BadVersionError:
                continue
        for p in partitions:
            try:
                self.zk.delete(f"{topic_path(topic)}/partitions/{p}", recursive=True)
            except NoNodeError:
                pass

    def finish_partition_removal(self, topic: str) -> None:
        try:
            self.zk.delete(f"{PARTITIONS_REMOVE}/{topic}", recursive=True)
        except NoNodeError:
            pass

    def remove_topic(self, topic: str) -> None:
        """The last step of deletion: assignment, states, config, the admin node."""
        for path in (topic_path(topic), f"{CONFIG_TOPICS}/{topic}", f"{DELETE_TOPICS}/{topic}"):
            try:
                self.zk.delete(path, recursive=True)
            except NoNodeError:
                pass

    # ------------------------------------------------------------ reassignment (seed 003)
    def create_reassignment(self, plan: dict[tuple[str, int], list[int]]) -> None:
        """Write ``/admin/reassign_partitions``; refused while one is in progress."""
        from replikafka.errors import InvalidRequestError, ReassignmentInProgressError
        data = reassignment_to_json(plan)
        _check_size(len(data), f"a reassignment of {len(plan):,} partitions", InvalidRequestError,
                    "move the partitions in several smaller reassignments, one after another")
        try:
            self.zk.create(REASSIGN_PARTITIONS, data, makepath=True)
        except NodeExistsError:
            raise ReassignmentInProgressError(
                f"a partition reassignment is already in progress ({REASSIGN_PARTITIONS} exists); "
                f"wait for it (--verify) before starting another") from None

    def get_reassignment(self, watch=None) -> dict[tuple[str, int], list[int]]:
        """The pending reassignment: (topic, partition) -> target replicas (empty if none)."""
        try:
            if watch is not None and not self.zk.exists(REASSIGN_PARTITIONS, watch=watch):
                return {}
            data, _ = self.zk.get(REASSIGN_PARTITIONS)
        except NoNodeError:
            return {}
        return reassignment_from_json(data)

    def set_reassignment(self, remaining: dict[tuple[str, int], list[int]]) -> None:
        """The controller removes partitions as they complete; the znode goes with the last one."""
        try:
            if remaining:
                self.zk.set(REASSIGN_PARTITIONS, reassignment_to_json(remaining))
            else:
                self.zk.delete(REASSIGN_PARTITIONS)
        except NoNodeError:
            pass

    # ------------------------------------------------------------ preferred replica election
    def create_preferred_election(self, tps: list[tuple[str, int]]) -> None:
        from replikafka.errors import ElectionInProgressError, InvalidRequestError
        data = _json({"partitions": _partition_entries(sorted(tps))})
        _check_size(len(data), f"a preferred replica election of {len(tps):,} partitions", InvalidRequestError,
                    "elect them in several smaller sets, one after another (partition_list_batches; the "
                    "preferred-replica-election command does this by itself)")
        try:
            self.zk.create(PREFERRED_REPLICA_ELECTION, data, makepath=True)
        except NodeExistsError:
            raise ElectionInProgressError(
                f"a preferred replica election is already in progress ({PREFERRED_REPLICA_ELECTION} exists)") from None

    def get_preferred_election(self, watch=None) -> list[tuple[str, int]] | None:
        """Partitions asked for, or None when no election is pending."""
        try:
            if watch is not None and not self.zk.exists(PREFERRED_REPLICA_ELECTION, watch=watch):
                return None
            data, _ = self.zk.get(PREFERRED_REPLICA_ELECTION)
        except NoNodeError:
            return None
        return [(e["topic"], int(e["partition"])) for e in json.loads(data)["partitions"]]

    def delete_preferred_election(self) -> None:
        try:
            self.zk.delete(PREFERRED_REPLICA_ELECTION)
        except NoNodeError:
            pass

    # ------------------------------------------------------------ partition state
    def get_partition_state(self, topic: str, partition: int) -> tuple[LeaderAndIsr, int] | None:
        try:
            data, stat = self.zk.get(state_path(topic, partition))
        except NoNodeError:
            return None
        return LeaderAndIsr.from_json(data), stat.version

    def get_partition_states(self, tps: list[tuple[str, int]], mzxids: dict | None = None
                             ) -> dict[tuple[str, int], tuple[LeaderAndIsr, int]]:
        """Many state znodes, absent ones left out. Read with ZooKeeper's multiRead
        (3.6+): MULTI_OPS_MAX reads per request, all requests pipelined. Kazoo costs a
        wake-up of its connection thread and a loop turn per request, which for
        10,000 single gets took most of a controller failover; 10 requests do not.
        A server without multiRead gets pipelined single reads."""
        if self._multi_read_ok:
            try:
                return self._read_states_multi(tps, mzxids)
            except (UnimplementedError, ConnectionLoss) as exc:
                self._multi_read_ok = False
                log.warning("ZooKeeper multiRead failed (%r): reading partition states one by one", exc)
        return self._read_states_pipelined(tps, mzxids)

    def _read_states_multi(self, tps, mzxids=None):
        paths = [state_path(*tp) for tp in tps]
        chunks = [range(i, min(i + MULTI_OPS_MAX, len(tps))) for i in range(0, len(tps), MULTI_OPS_MAX)]
        asyncs = [(chunk, multi_read_async(self.zk, [paths[i] for i in chunk])) for chunk in chunks]
        out = {}
        decode = _StateDecoder()
        for chunk, a in asyncs:
            for i, result in zip(chunk, a.get()):
                if isinstance(result, NoNodeError):
                    continue
                if isinstance(result, Exception):
                    raise result
                data, stat = result
                out[tps[i]] = (decode(data), stat.version)
                if mzxids is not None:
                    mzxids[tps[i]] = stat.mzxid
        return out

    def _read_states_pipelined(self, tps, mzxids=None):
        asyncs = [(tp, self.zk.get_async(state_path(*tp))) for tp in tps]
        out = {}
        decode = _StateDecoder()
        for tp, a in asyncs:
            try:
                data, stat = a.get()
            except NoNodeError:
                continue
            out[tp] = (decode(data), stat.version)
            if mzxids is not None:
                mzxids[tp] = stat.mzxid
        return out

    def create_partition_states(self, states: dict[tuple[str, int], LeaderAndIsr]) -> dict[tuple[str, int], int]:
        """Create new partitions' state znodes; returns the versions (0) of those created.
        An existing znode (a retry after controller failover) is left as it is.

        Topics' parents first, then each partition's znode and its state znode in
        ``multi``s of MULTI_OPS_MAX ops, all pipelined: kazoo costs a wake-up of its
        connection thread and a loop turn per request, which for the 100,000 creates
        of a 50,000-partition topic took minutes; 100 requests do not. A multi that
        fails (some znode already exists) is done again one create at a time."""
        parents = []
        for t in {t for t, _p in states}:
            parents.append(self.zk.create_async(topic_path(t), b""))
            parents.append(self.zk.create_async(f"{topic_path(t)}/partitions", b""))
        for a in parents:
            try:
                a.get()
            except NodeExistsError:
                pass
        items = list(states.items())
        per = MULTI_OPS_MAX // 2
        inflight = []
        for chunk in (items[i:i + per] for i in range(0, len(items), per)):
            tx = self.zk.transaction()
            for (t, p), s in chunk:
                path = state_path(t, p)
                tx.create(path.rsplit("/", 1)[0], b"")
                tx.create(path, s.to_json())
            inflight.append((chunk, tx.commit_async()))
        out: dict[tuple[str, int], int] = {}
        retry = []
        for chunk, result in inflight:
            if any(isinstance(r, Exception) for r in result.get()):
                retry.extend(chunk)
            else:
                out.update((tp, 0) for tp, _s in chunk)
        out.update(self._create_states_one_by_one(dict(retry)))
        return out

    def _create_states_one_by_one(self, states: dict[tuple[str, int], LeaderAndIsr]) -> dict[tuple[str, int], int]:
        """Pipelined single creates; an existing znode is left as it is (ZooKeeper
        applies a session's requests in order, so each parent precedes its child)."""
        parents: list = []
        asyncs = []
        for (t, p), s in states.items():
            path = state_path(t, p)
            parents.append(self.zk.create_async(path.rsplit("/", 1)[0], b""))
            asyncs.append(((t, p), self.zk.create_async(path, s.to_json())))
        for a in parents:
            try:
                a.get()
            except NodeExistsError:
                pass
        out = {}
        for tp, a in asyncs:
            try:
                a.get()
                out[tp] = 0
            except NodeExistsError:
                pass
        return out

    def update_partition_states(self, updates: list[tuple[str, int, LeaderAndIsr, int]]) -> list:
        """Many conditional state writes (topic, partition, state, expected version),
        pipelined: one round trip for a leader's whole pass of ISR changes, not one
        each (after a restart a leader expands 16,000 ISRs). Per update, in order: the
        new version, None if the version did not match (or the znode is gone), or the
        exception ZooKeeper gave (the caller decides)."""
        asyncs = [self.zk.set_async(state_path(t, p), s.to_json(), version=v) for t, p, s, v in updates]
        out: list = []
        for a in asyncs:
            try:
                out.append(a.get().version)
            except (BadVersionError, NoNodeError):
                out.append(None)
            except Exception as exc:      # noqa: BLE001 - handed to the caller, in order
                out.append(exc)
        return out

    def update_partition_state(self, topic: str, partition: int, state: LeaderAndIsr,
                               expected_version: int) -> int | None:
        try:
            return self.zk.set(state_path(topic, partition), state.to_json(), version=expected_version).version
        except (BadVersionError, NoNodeError):
            return None

    # ------------------------------------------------------------ ISR change notifications
    def notify_isr_change(self, tps: list[tuple[str, int]]) -> None:
        """One sequential znode, or several when the list would not fit in one."""
        for batch in partition_list_batches(tps):
            self.zk.create(f"{ISR_CHANGE}/isr_change_", _json({"partitions": _partition_entries(batch)}),
                           sequence=True, makepath=True)

    def notify_log_dir_failure(self, broker_id: int, tps: list[tuple[str, int]]) -> None:
        """Kafka's log dir event notification (KIP-112), with the partitions that went
        offline (so the controller needs no round trip to learn them)."""
        def doc(entries):
            return _json({"version": 1, "broker": broker_id, "event": 1, "partitions": entries})
        for batch in partition_list_batches(tps, doc) if tps else [[]]:
            self.zk.create(f"{LOG_DIR_EVENT}/log_dir_event_", doc(_partition_entries(batch)), sequence=True,
                           makepath=True)

    def take_log_dir_events(self, watch=None) -> dict[int, set[tuple[str, int]]]:
        """Read and delete the log dir event notifications: broker -> its offline partitions."""
        out: dict[int, set[tuple[str, int]]] = {}
        try:
            children = self.zk.get_children(LOG_DIR_EVENT, watch=watch)
        except NoNodeError:
            return out
        for c in children:
            path = f"{LOG_DIR_EVENT}/{c}"
            try:
                data, _ = self.zk.get(path)
                doc = json.loads(data)
                out.setdefault(int(doc["broker"]), set()).update(
                    (e["topic"], int(e["partition"])) for e in doc.get("partitions", ()))
                self.zk.delete(path)
            except NoNodeError:
                continue
            except (ValueError, KeyError, TypeError):
                log.error("ignoring a malformed log dir event notification %s", path)
                self.zk.delete(path)
        return out

    def take_isr_change_notifications(self, watch=None) -> set[tuple[str, int]]:
        out = set()
        children = self.zk.get_children(ISR_CHANGE, watch=watch)
        for c in children:
            path = f"{ISR_CHANGE}/{c}"
            try:
                data, _ = self.zk.get(path)
                for e in json.loads(data)["partitions"]:
                    out.add((e["topic"], int(e["partition"])))
                self.zk.delete(path)
            except NoNodeError:
                continue
        return out

    # ------------------------------------------------------------ producer ids
    def allocate_producer_id_block(self) -> tuple[int, int]:
        """CAS on /latest_producer_id_block: returns [start, end) of a fresh block."""
        while True:
            try:
                data, stat = self.zk.get(PRODUCER_ID_BLOCK)
            except NoNodeError:
                try:
                    # Ids start at 1: 0 is protobuf's "unset" on the wire.
                    self.zk.create(PRODUCER_ID_BLOCK, _json({"block_start": 1, "block_end": 1 + PRODUCER_ID_BLOCK_SIZE}))
                    return 1, 1 + PRODUCER_ID_BLOCK_SIZE
                except NodeExistsError:
                    continue
            end = int(json.loads(data)["block_end"])
            new = _json({"block_start": end, "block_end": end + PRODUCER_ID_BLOCK_SIZE})
            try:
                self.zk.set(PRODUCER_ID_BLOCK, new, version=stat.version)
                return end, end + PRODUCER_ID_BLOCK_SIZE
            except BadVersionError:
                continue


def reassignment_to_json(plan: dict[tuple[str, int], list[int]]) -> bytes:
    return _json({"partitions": [{"topic": t, "partition": p, "replicas": list(r)}
                                 for (t, p), r in sorted(plan.items())]})


def reassignment_from_json(data: bytes) -> dict[tuple[str, int], list[int]]:
    """Parse the seed-003 reassignment JSON (also the CLI's plan files); errors name the fault."""
    from replikafka.errors import InvalidRequestError
    def whole(v) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{v!r} is not a whole number")
        return v

    try:
        d = json.loads(data)
        out = {}
        for e in d["partitions"]:
            if not isinstance(e["replicas"], list):
                raise ValueError(f"replicas must be a list of broker ids, got {e['replicas']!r}")
            tp = (str(e["topic"]), whole(e["partition"]))
            if tp in out:
                raise ValueError(f"{tp[0]}-{tp[1]} is listed twice")
            out[tp] = [whole(b) for b in e["replicas"]]
        return out
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequestError(f"bad reassignment JSON (want {{\"version\":1,\"partitions\":"
                                  f"[{{\"topic\":..,\"partition\":..,\"replicas\":[..]}}]}}): {exc!r}") from None


class _MultiRead(namedtuple("_MultiRead", "paths")):
    """ZooKeeper's multiRead request (opcode 22, ZooKeeper 3.6+; kazoo has no API for
    it): getData of many paths in one request, each answered on its own (a missing
    znode is an error result for that path only, not for the request). Wire format as
    ``MultiOperationRecord`` / ``MultiResponse``: per op a MultiHeader(type, done, err)
    then the GetDataRequest (path, watch) or the GetDataResponse (data, stat) or an
    error code, closed by MultiHeader(-1, true, -1)."""
    type = 22
    GET_DATA = 4
    ERROR = -1

    def serialize(self):
        b = bytearray()
        for path in self.paths:
            b += multiheader_struct.pack(self.GET_DATA, False, -1)
            b += write_string(path)
            b.append(0)  # no watch
        return b + multiheader_struct.pack(-1, True, -1)

    @classmethod
    def deserialize(cls, buf, offset):
        # Unrolled (kazoo's MultiHeader and read_buffer make a tuple and a call per
        # field): this runs on kazoo's one connection thread, while the controller
        # waits for the 50 replies of a 50,000-state read.
        results = []
        append = results.append
        head, head_size = multiheader_struct.unpack_from, multiheader_struct.size
        unpack_int, int_size = int_struct.unpack_from, int_struct.size
        unpack_stat, stat_size, make_stat = stat_struct.unpack_from, stat_struct.size, ZnodeStat._make
        kind, done, _err = head(buf, offset)
        offset += head_size
        while not done:
            (n,) = unpack_int(buf, offset)
            offset += int_size
            if kind == cls.GET_DATA:
                data = None
                if n >= 0:
                    data = buf[offset:offset + n]
                    offset += n
                append((data, make_stat(unpack_stat(buf, offset))))
                offset += stat_size
            elif kind == cls.ERROR:
                append(EXCEPTIONS[n]())
            else:
                raise ValueError(f"multiRead: unexpected result type {kind}")
            kind, done, _err = head(buf, offset)
            offset += head_size
        return results


def _rooted(zk: KazooClient, paths: list[str]) -> list[str]:
    """Our own paths (absolute, normalized: ``state_path``) under the client's chroot:
    kazoo's per-path normalization cost more than the rest of a 20,000-path multi."""
    return [zk.chroot + p for p in paths] if zk.chroot else list(paths)


def multi_read_async(zk: KazooClient, paths: list[str]):
    """Read many znodes in one multiRead; the async result gives, per path, (data,
    stat) or the KazooException for that path."""
    async_object = zk.handler.async_result()
    zk._call(_MultiRead(_rooted(zk, paths)), async_object)
    return async_object


_OP_HEAD = struct.Struct("!iBii")      # a multi op's MultiHeader(type, done=False, err=-1), then its path's length
_STAT_VERSION_OFFSET = 32              # a Stat's version follows czxid, mzxid, ctime and mtime (8 bytes each)


class _StateMulti(namedtuple("_StateMulti", "check writes updates body")):
    """kazoo's multi request (``Transaction``'s opcode and wire format) of a controller-epoch
    check and partition-state sets, its bytes made by ``guarded_state_writes`` on the
    caller's thread: each set op is serialized once (``_state_op``) and a multi is the check
    and its ops joined. kazoo's per-op tuples, path checks and serializer, and a Stat tuple
    per answer on its connection thread, were a good part of writing 50,000 states.
    ``check`` = (path, version), ``writes`` = [(tp, op bytes)], ``updates`` = {tp: (state,
    version)}: what the request says, for a reader that is not ZooKeeper."""
    type = Transaction.type

    def serialize(self):
        return self.body

    @classmethod
    def deserialize(cls, buf, offset):
        """(the check's answer, [the new version or the exception of each set]): True or
        an exception for the check; per set a version, or the exception its error names."""
        versions = []
        append = versions.append
        head, head_size = multiheader_struct.unpack_from, multiheader_struct.size
        unpack_int, int_size, stat_size = int_struct.unpack_from, int_struct.size, stat_struct.size
        check = None
        kind, done, _err = head(buf, offset)
        offset += head_size
        while not done:
            if kind == SetData.type:
                append(unpack_int(buf, offset + _STAT_VERSION_OFFSET)[0])
                offset += stat_size
            elif kind == CheckVersion.type:
                check = True
            elif kind == -1:
                exc = EXCEPTIONS[unpack_int(buf, offset)[0]]()
                offset += int_size
                if check is None:
                    check = exc
                else:
                    append(exc)
            else:
                raise ValueError(f"state multi: unexpected result type {kind}")
            kind, done, _err = head(buf, offset)
            offset += head_size
        return check, versions


def _check_op(path: bytes, version: int) -> bytes:
    return _OP_HEAD.pack(CheckVersion.type, 0, -1, len(path)) + path + int_struct.pack(version)


_MULTI_END = multiheader_struct.pack(-1, True, -1)


def state_multi_async(zk: KazooClient, check: tuple[str, int], writes: list[tuple[tuple[str, int], bytes]],
                      updates: dict):
    """One multi: check ``check`` = (path, version), then the set ops of ``writes``; the
    async result gives (the check's answer, [the new version or exception per set])."""
    body = b"".join((_check_op((zk.chroot + check[0]).encode(), check[1]), *(op for _tp, op in writes), _MULTI_END))
    async_object = zk.handler.async_result()
    zk._call(_StateMulti(check, writes, updates, body), async_object)
    return async_object


#: How long a caller with work to do while its requests are in flight waits for them to
#: be on the wire first.
SEND_WAIT_MAX_S = 0.5


def _await_sent(zk: KazooClient, longest_s: float = SEND_WAIT_MAX_S) -> None:
    """Wait (bounded) until kazoo's connection thread has written every queued request.
    It writes one request a turn of its loop, and each turn needs the GIL back: while
    this thread runs Python code it gets it once a switch interval (5 ms), so 50 multis
    queued before a CPU-bound stretch reached ZooKeeper over a quarter of a second.
    Asleep here, this thread leaves it the GIL and they go out at once."""
    pending = getattr(zk, "_queue", None)   # kazoo's queue of requests not yet written
    deadline = time.monotonic() + longest_s
    while pending and time.monotonic() < deadline:
        time.sleep(0.0005)


class ControllerMovedError(Exception):
    """A guarded write found that /controller_epoch changed: another controller took over."""


def guarded_state_writes(zk: KazooClient, epoch_zk_version: int,
                         updates: dict[tuple[str, int], tuple[LeaderAndIsr, int]],
                         while_in_flight: Callable[[], None] | None = None
                         ) -> tuple[dict[tuple[str, int], int], list[tuple[str, int]]]:
    """Write many partition states as ZooKeeper ``multi``s of at most MULTI_OPS_MAX
    ops, each guarded by a check of the controller-epoch znode version, all
    chunks pipelined. Returns ({tp: new version}, [tps whose version did not
    match]); raises ControllerMovedError if the epoch guard failed.
    ``while_in_flight()`` runs once, after every multi of the first round is queued and
    before any answer is awaited: work of the caller's that ZooKeeper's need not wait for."""
    from kazoo.exceptions import RolledBackError, RuntimeInconsistency

    ok: dict[tuple[str, int], int] = {}
    failed: list[tuple[str, int]] = []
    # Each set op serialized once, in one pass: the path's bytes from its topic's prefix,
    # the data (with its length) once per decided state (decided states are shared
    # objects: by identity, as hashing the frozen dataclass is a Python call).
    head, pack_int, set_type = _OP_HEAD.pack, int_struct.pack, SetData.type
    prefixes: dict[str, bytes] = {}
    values: dict[int, tuple[LeaderAndIsr, bytes]] = {}
    writes = []
    append = writes.append
    for tp, (state, version) in updates.items():
        prefix = prefixes.get(tp[0])
        if prefix is None:
            prefix = prefixes[tp[0]] = (zk.chroot + state_path(tp[0], 0)[:-len("0/state")]).encode()
        value = values.get(id(state))
        if value is None:
            data = state.to_json()
            value = values[id(state)] = (state, pack_int(len(data)) + data)
        path = b"%s%d/state" % (prefix, tp[1])
        append((tp, b"".join((head(set_type, 0, -1, len(path)), path, value[1], pack_int(version)))))
    check = (CONTROLLER_EPOCH, epoch_zk_version)
    pending = [writes[i:i + MULTI_OPS_MAX] for i in range(0, len(writes), MULTI_OPS_MAX)]
    while pending:
        inflight = [(chunk, state_multi_async(zk, check, chunk, updates)) for chunk in pending]
        pending = []
        if while_in_flight is not None:
            while_in_flight, run = None, while_in_flight
            _await_sent(zk)
            run()
        for chunk, result in inflight:
            checked, results = result.get()
            if isinstance(checked, Exception) and not isinstance(checked, RolledBackError):
                raise ControllerMovedError("controller epoch changed under a state write")
            # ZooKeeper answers the op that failed with its own error, the ops before it
            # with RolledBackError and the ops after it with RuntimeInconsistency: only
            # the first kind failed on its own; the others are written again.
            bad = {tp for (tp, _), r in zip(chunk, results)
                   if isinstance(r, Exception) and not isinstance(r, (RolledBackError, RuntimeInconsistency))}
            if not bad:
                ok.update((tp, version) for (tp, _), version in zip(chunk, results))
                continue
            failed.extend(tp for tp, _ in chunk if tp in bad)
            rest = [w for w in chunk if w[0] not in bad]
            if rest:
                pending.append(rest)
    return ok, failed
