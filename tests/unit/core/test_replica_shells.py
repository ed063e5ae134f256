"""The replica shells with no threads running: ``leader_and_isr()``, ``do_isr_work()``,
a fetcher's ``do_work()``, produce, fetch and ListOffsets are called once each and
their returned results (plain data, ``broker/replica/messages.py``) compared with
``==``, as dask's worker state machine tests do.

Real ReplicaManager, Partition and logs on a temp dir; the real ZkStore over the
simulation's in-memory ZooKeeper; a fetcher manager that records what it is asked;
a scripted leader for the fetcher."""
from __future__ import annotations

import os
import sys
import threading

import pyarrow as pa
import pytest

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker import zk_store as Z
from replikafka.broker.config import BrokerConfig, log_config_for_topic
from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import FOLLOWER, LEADER, Partition
from replikafka.broker.replica.replica_fetcher import ReplicaFetcher
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.server import PartitionLogs
from replikafka.broker.storage import LogManager, ManualClock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "sim"))
from sim_zookeeper import SimKazooClient, SimZooKeeper  # noqa: E402

TP = ("t", 0)
LAG_MS = 1000
SCHEMA = R.stored_schema(R.KAFKA_SCHEMA)
OK = M.ControllerRequestResult()


class RecordingFetchers:
    """The fetcher manager's interface; remembers which leader each partition follows."""

    def __init__(self):
        self.following: dict = {}

    def add_partitions(self, partitions):
        self.following.update(partitions)

    def remove_partitions(self, tps):
        for tp in tps:
            self.following.pop(tp, None)

    def remove_partition(self, tp):
        self.remove_partitions([tp])


def batch(clock, values) -> pa.RecordBatch:
    n = len(values)
    return pa.record_batch([pa.nulls(n, pa.binary()), pa.array(values, pa.binary()), pa.nulls(n, R.HEADER_TYPE),
                            R.constant_timestamps(clock.time_ms(), n)], schema=SCHEMA)


class Broker:
    """Broker 1's ReplicaManager for topic t (replicas 1, 2, 3), nothing started."""

    def __init__(self, tmp_path):
        self.clock = ManualClock(1_700_000_000_000)
        self.store = Z.ZkStore(SimKazooClient(SimZooKeeper()))
        self.store.ensure_paths()
        self.store.create_topic("t", {0: [1, 2, 3]}, R.schema_to_bytes(SCHEMA), {"topic.id": "x"})
        self.store.create_partition_states({TP: Z.LeaderAndIsr(1, 3, (1, 2, 3), 1)})
        cfg = BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "sim:1", "log.dirs": str(tmp_path),
                                      "replica.lag.time.max.ms": LAG_MS})
        self.logs = LogManager([str(tmp_path)], log_config_for_topic(cfg, {}), clock=self.clock)
        self.metadata = MetadataCache()
        self.metadata.broker_epochs = {1: 10, 2: 20, 3: 30}
        self.fetchers = RecordingFetchers()
        self.rm = ReplicaManager(1, cfg, PartitionLogs(cfg, self.logs), self.store, self.metadata, self.fetchers,
                                 self.clock)
        self.rm.registered_epoch = 10
        self.topics = {"t": M.TopicInfo(R.schema_to_bytes(SCHEMA), {}, "x")}

    def leader_and_isr(self, leader, epoch, isr, zk_version=0, broker_epoch=10, topics=None):
        return self.rm.leader_and_isr(M.LeaderAndIsrRequest(9, 1, broker_epoch, (
            M.PartitionRole("t", 0, leader, epoch, tuple(isr), (1, 2, 3), zk_version, 1),),
            self.topics if topics is None else topics))

    def produce(self, values, acks=-1):
        return self.rm.append_records(M.ProduceRequest(acks, 0, (
            M.ProducePartition("t", 0, (batch(self.clock, values),), 100),)))

    def follower_fetch(self, replica, offset, epoch=3):
        return self.rm.fetch(M.FetchRequest(replica, (M.FetchPartition("t", 0, offset, epoch, 1 << 20),),
                                            replica_epoch=replica * 10))


@pytest.fixture
def broker(tmp_path):
    b = Broker(tmp_path)
    yield b
    b.logs.close()


# ---------------------------------------------------------------- leader_and_isr()
def test_leader_and_isr_makes_a_leader_and_stops_its_fetcher(broker):
    broker.fetchers.following[TP] = (2, 2)       # it followed broker 2 in epoch 2
    assert broker.leader_and_isr(1, 3, (1, 2, 3)) == OK
    part = broker.rm.get(TP)
    assert (part.role, part.leader_epoch, part.isr, part.replicas, part.zk_version) == \
        (LEADER, 3, (1, 2, 3), (1, 2, 3), 0)
    assert broker.fetchers.following == {}
    assert broker.metadata.topic("t") is None    # no RPC layer here: `accepted` was not asked to do anything


def test_leader_and_isr_makes_a_follower_with_its_fetcher_and_a_repeat_changes_nothing(broker):
    assert broker.leader_and_isr(2, 4, (2, 3)) == OK
    assert broker.fetchers.following == {TP: (2, 4)}
    broker.fetchers.following.clear()
    assert broker.leader_and_isr(2, 4, (2, 3, 1), zk_version=1) == OK     # a repeat: the ISR is learnt
    part = broker.rm.get(TP)
    assert (part.role, part.leader_id, part.isr, part.zk_version) == (FOLLOWER, 2, (2, 3, 1), 1)
    assert broker.fetchers.following == {}


def test_role_changes_are_recent_while_a_leader_and_isr_is_handled_and_for_a_while_after(broker):
    """What the broker's scans of every partition wait for (server.ROLE_CHANGE_SETTLE_S)."""
    assert not broker.rm.role_changes_recent(5.0)               # none handled yet
    with broker.rm.role_change_lock:                            # one being handled
        assert broker.rm.role_changes_recent(0.0)
    assert broker.leader_and_isr(1, 3, (1, 2, 3)) == OK
    assert broker.rm.role_changes_recent(5.0)
    broker.clock.advance(4_999)
    assert broker.rm.role_changes_recent(5.0)
    broker.clock.advance(1)
    assert not broker.rm.role_changes_recent(5.0)
    refused = broker.leader_and_isr(1, 3, (1, 2, 3), broker_epoch=9)   # refused: took nothing up
    assert refused.error is not None and not broker.rm.role_changes_recent(5.0)


def test_leader_and_isr_for_an_earlier_registration_is_refused_and_changes_nothing(broker):
    result = broker.leader_and_isr(1, 3, (1, 2, 3), broker_epoch=9)
    assert (result.error.code, result.partition_errors) == ("STALE_BROKER_EPOCH", [])
    assert broker.rm.get(TP) is None


def test_leader_and_isr_names_the_partition_it_cannot_create(broker):
    result = broker.leader_and_isr(1, 3, (1, 2, 3), topics={})     # no schema anywhere
    assert result.error is None
    assert [(tp, e.code) for tp, e in result.partition_errors] == [(TP, "UNKNOWN_TOPIC_OR_PARTITION")]


def test_accepted_runs_once_the_request_passed_its_checks(broker):
    seen = []
    broker.rm.leader_and_isr(M.LeaderAndIsrRequest(9, 1, 9, (), {}), accepted=lambda: seen.append("stale"))
    broker.rm.leader_and_isr(M.LeaderAndIsrRequest(9, 1, 10, (), {}), accepted=lambda: seen.append("ok"))
    assert seen == ["ok"]


# ---------------------------------------------------------------- produce, fetch, ListOffsets
def test_produce_fetch_and_list_offsets_return_plain_results(broker):
    broker.leader_and_isr(1, 3, (1, 2))
    results, waits = broker.produce([b"a", b"b", b"c"])
    assert results == [M.ProducePartitionResult("t", 0, None, 0, 3, 0)]
    assert [(w.result, w.end_offset, w.min_insync) for w in waits] == [(results[0], 3, 1)]
    assert broker.rm.get(TP).committed(3, 1) is False          # follower 2 has not fetched
    [r] = broker.follower_fetch(2, 0)
    assert (r.error, r.high_watermark, r.log_end_offset, r.records_base_offset, r.record_count) == \
        (None, 0, 3, 0, 3)
    [r] = broker.follower_fetch(2, 3)                          # acknowledges [0, 3): the HW moves
    assert (r.error, r.high_watermark, r.records) == (None, 3, None)
    assert broker.rm.get(TP).committed(3, 1) is True
    assert broker.rm.list_offsets([M.ListOffsetsQuery("t", 0, -1), M.ListOffsetsQuery("t", 0, -2)]) == [
        M.ListOffsetsResult("t", 0, None, 3, -1, 3, 3, 3, 0), M.ListOffsetsResult("t", 0, None, 0, -1, 3, 3, 3, 0)]
    assert broker.rm.offsets_for_leader_epoch([M.EpochQuery("t", 0, 3, 3)]) == [
        M.EpochEndOffset("t", 0, None, 3, 3)]


def test_a_refused_payload_fails_its_partition_and_the_entries_behind_it(broker):
    broker.leader_and_isr(1, 3, (1,))
    corrupt = M.ProducePartition("t", 0, (), 10, decode_error=E.CorruptRecordError("t-0: CRC-32C mismatch"))
    good = M.ProducePartition("t", 0, (batch(broker.clock, [b"x"]),), 10)
    results, waits = broker.rm.append_records(M.ProduceRequest(1, 0, (corrupt, good)))
    assert [(r.error.code, r.record_count) for r in results] == [("CORRUPT_MESSAGE", 0), ("CORRUPT_MESSAGE", 0)]
    assert waits == [] and broker.rm.get(TP).log.log_end_offset == 0


def test_a_follower_fetch_from_an_unassigned_broker_is_refused(broker):
    broker.leader_and_isr(1, 3, (1, 2))
    broker.metadata.broker_epochs[4] = 40
    [r] = broker.follower_fetch(4, 0)
    assert (r.error.code, r.records, r.high_watermark) == ("NOT_LEADER_OR_FOLLOWER", None, 0)


class RecordingCondition:
    """``data_arrived`` with its waits recorded (and returning at once)."""

    def __init__(self):
        self.waits = []
        self._lock = threading.Lock()

    def __enter__(self):
        return self._lock.__enter__()

    def __exit__(self, *exc):
        return self._lock.__exit__(*exc)

    def notify_all(self):
        pass

    def wait(self, timeout):
        self.waits.append(timeout)


def test_a_long_poll_never_sleeps_on_an_append_made_while_it_read(broker):
    """An append notified between the fetch's read and its wait would otherwise be
    missed: the follower slept a whole slice while the acks=all produce waited for it."""
    broker.leader_and_isr(1, 3, (1, 2))
    broker.rm.data_arrived = RecordingCondition()
    reads = []
    fetch_once = broker.rm._fetch_once

    def append_after_the_first_read(req):
        got = fetch_once(req)
        reads.append(got[1])
        if len(reads) == 1:
            broker.produce([b"a"])      # lands (and notifies) after this read saw nothing
        return got

    broker.rm._fetch_once = append_after_the_first_read
    [r] = broker.rm.fetch(M.FetchRequest(2, (M.FetchPartition("t", 0, 0, 3, 1 << 20),), max_wait_ms=30_000,
                                         replica_epoch=20))
    assert r.record_count == 1 and reads[0] == 0
    assert broker.rm.data_arrived.waits == []


def test_partition_lookups_do_not_wait_for_the_partition_map_lock(broker):
    """Produce, Fetch and the fetchers look up each partition they name: a thread holding
    the map's lock for a whole-map pass does not hold them up."""
    broker.leader_and_isr(1, 3, (1, 2, 3))
    held, release = threading.Event(), threading.Event()

    def hold():
        with broker.rm.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        got = []
        looker = threading.Thread(target=lambda: got.append(broker.rm.get(TP)))
        looker.start()
        looker.join(2)
        assert got == [broker.rm.partitions[TP]]
        [r] = broker.produce([b"a"], acks=1)[0]
        assert r.error is None and r.base_offset == 0
    finally:
        release.set()
        holder.join()
    looker.join()


# ---------------------------------------------------------------- do_isr_work()
def test_do_isr_work_shrinks_then_expands_the_isr_with_conditional_writes(broker):
    broker.leader_and_isr(1, 3, (1, 2, 3))
    broker.produce([b"a"])
    assert broker.rm.do_isr_work() == 0                        # within the lag time: nothing to do
    broker.clock.advance(LAG_MS + 1)
    broker.follower_fetch(3, 1)                                # 3 caught up; 2 never fetched
    assert broker.rm.do_isr_work() == 1
    part = broker.rm.get(TP)
    assert (part.isr, part.zk_version, part.hw) == ((1, 3), 1, 1)
    assert broker.store.get_partition_state("t", 0) == (Z.LeaderAndIsr(1, 3, (1, 3), 1), 1)
    broker.follower_fetch(2, 1)                                # 2 reached the HW: back in
    assert broker.rm.do_isr_work() == 1
    assert broker.store.get_partition_state("t", 0) == (Z.LeaderAndIsr(1, 3, (1, 2, 3), 1), 2)
    assert (part.isr, part.zk_version) == ((1, 2, 3), 2)
    assert broker.rm.do_isr_work() == 0


def test_do_isr_work_looks_at_every_leader_each_half_lag_and_at_a_returning_follower_at_once(broker, monkeypatch):
    """Kafka's isr-expiration period (half the lag time) for the whole pass; a follower
    out of the ISR that fetched is looked at on the next pass, whenever that is."""
    broker.leader_and_isr(1, 3, (1, 2, 3))
    broker.produce([b"a"])
    looked = []
    wanted = Partition.isr_change_wanted
    monkeypatch.setattr(Partition, "isr_change_wanted", lambda self, lag: looked.append(self.tp) or wanted(self, lag))
    assert broker.rm.do_isr_work() == 0 and looked == [TP]         # the first pass is a whole one
    broker.follower_fetch(3, 1)                                    # an ISR member fetched: nothing to look at
    assert broker.rm.do_isr_work() == 0 and looked == [TP]
    broker.clock.advance(LAG_MS // 2)
    assert broker.rm.do_isr_work() == 0 and looked == [TP] * 2     # whole again, 2 not behind for long enough
    broker.clock.advance(LAG_MS // 2 + 1)
    assert broker.rm.do_isr_work() == 1 and looked == [TP] * 3     # whole: 2 never fetched, it is dropped
    assert broker.rm.get(TP).isr == (1, 3)
    broker.follower_fetch(2, 1)                                    # 2 is back: looked at on the very next pass
    assert broker.rm.do_isr_work() == 1 and looked == [TP] * 4
    assert broker.rm.get(TP).isr == (1, 2, 3)
    assert broker.rm.do_isr_work() == 0 and looked == [TP] * 4


def test_do_isr_work_learns_a_newer_version_of_its_own_epoch_and_retries(broker):
    broker.leader_and_isr(1, 3, (1, 2, 3))
    broker.produce([b"a"])
    broker.clock.advance(LAG_MS + 1)
    broker.follower_fetch(3, 1)
    # Someone else wrote the same epoch's state meanwhile (version 0 -> 1).
    assert broker.store.update_partition_state("t", 0, Z.LeaderAndIsr(1, 3, (1, 2, 3), 1), 0) == 1
    assert broker.rm.do_isr_work() == 0                        # lost the conditional write
    part = broker.rm.get(TP)
    assert (part.role, part.zk_version, part.isr) == (LEADER, 1, (1, 2, 3))
    assert broker.rm.do_isr_work() == 1                        # retried on the version learnt
    assert broker.store.get_partition_state("t", 0) == (Z.LeaderAndIsr(1, 3, (1, 3), 1), 2)


def test_do_isr_work_announces_a_change_again_when_its_notification_failed(broker, monkeypatch):
    """The state znode was written but the isr_change notification was not (ZooKeeper
    away): the change is announced with the next pass, so the controller learns it."""
    broker.leader_and_isr(1, 3, (1, 2, 3))
    broker.produce([b"a"])
    broker.clock.advance(LAG_MS + 1)
    broker.follower_fetch(3, 1)
    announced = []
    real = broker.store.notify_isr_change

    def flaky(tps):
        if not announced:
            announced.append(None)
            raise Z.ConnectionLoss()
        announced.append(sorted(tps))
        return real(tps)
    monkeypatch.setattr(broker.store, "notify_isr_change", flaky)
    with pytest.raises(Z.ConnectionLoss):
        broker.rm.do_isr_work()
    assert broker.store.get_partition_state("t", 0) == (Z.LeaderAndIsr(1, 3, (1, 3), 1), 1)   # written
    assert broker.rm.do_isr_work() == 0                        # no new change, the old one announced
    assert announced == [None, [TP]]
    assert broker.store.take_isr_change_notifications() == {TP}
    assert broker.rm.do_isr_work() == 0 and announced == [None, [TP]]   # once


# ---------------------------------------------------------------- a fetcher's do_work()
class ScriptedLeader:
    """A LeaderEndpoint answering from a real leader Partition; remembers every request."""

    def __init__(self, leader: Partition):
        self.leader, self.requests = leader, []

    def offsets_for_leader_epoch(self, replica_id, queries, timeout_s):
        self.requests.append(("epochs", replica_id, list(queries)))
        out = []
        for q in queries:
            epoch, end = self.leader.end_offset_for_epoch(q.leader_epoch, q.current_leader_epoch)
            out.append(M.EpochEndOffset(q.topic, q.partition, None, epoch, end))
        return out

    def fetch(self, request, timeout_s):
        self.requests.append(("fetch", request))
        out = []
        for p in request.partitions:
            read = self.leader.read_for_follower(request.replica_id, p.fetch_offset, p.partition_max_bytes,
                                                 p.current_leader_epoch)
            raw = read.data
            out.append(M.FetchPartitionResult(p.topic, p.partition, None, read.high_watermark, read.log_end_offset,
                                              read.log_start_offset, raw.data if raw and raw.record_count else None,
                                              raw.first_offset if raw else 0, raw.record_count if raw else 0))
        return M.FetchResponse(out)

    def close(self):
        pass


def test_fetcher_do_work_truncates_by_leader_epoch_then_fetches(tmp_path):
    """The follower holds [0, 5) of epoch 1 and an uncommitted [5, 7) of epoch 1 the
    leader (epoch 2, started at 5) never had: one round truncates to 5 (not to its HW
    of 0) and fetches the leader's [5, 8)."""
    from replikafka.broker.storage import Log, LogConfig
    clock = ManualClock(1_700_000_000_000)
    leader_log = Log.open(str(tmp_path / "leader" / "t-0"), LogConfig(), SCHEMA, clock=clock)
    leader_log.append([batch(clock, [b"%d" % i for i in range(5)])], leader_epoch=1)
    leader = Partition("t", 0, 1, leader_log, clock)
    leader.make_leader(2, (1, 2), (1, 2), 0, 1)
    leader.append_as_leader([batch(clock, [b"n5", b"n6", b"n7"])], acks=1, min_insync=1)
    follower_log = Log.open(str(tmp_path / "follower" / "t-0"), LogConfig(), SCHEMA, clock=clock)
    follower_log.append([batch(clock, [b"%d" % i for i in range(5)])], leader_epoch=1)
    follower_log.append([batch(clock, [b"old5", b"old6"])], leader_epoch=1)
    follower = Partition("t", 0, 2, follower_log, clock)
    follower.make_follower(1, 2, (1, 2), (1, 2), 0, 1)
    endpoint = ScriptedLeader(leader)
    fetcher = ReplicaFetcher(2, 1, endpoint, {TP: follower}.get, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                             backoff_ms=10, request_timeout_s=1.0, broker_epoch=lambda: 20)
    fetcher.add(TP, 2)

    assert fetcher.do_work() is True
    assert endpoint.requests == [("epochs", 2, [M.EpochQuery("t", 0, 1, 2)]),
                                 ("fetch", M.FetchRequest(2, (M.FetchPartition("t", 0, 5, 2, 1 << 20, 1, 0),),
                                                          max_bytes=1 << 20, min_bytes=1, replica_epoch=20,
                                                          session_epoch=0))]   # a full fetch opening a session
    assert (follower_log.log_end_offset, fetcher.states[TP].truncating) == (8, False)
    assert (follower.hw, leader.hw) == (5, 5)                 # the fetch at 5 acknowledged [0, 5)
    assert fetcher.do_work() is True                          # the fetch at 8 acknowledges the rest
    assert (follower.hw, leader.hw) == (8, 8)
    values = [v for b in R.decode_stream(follower_log.read_raw(5, 1 << 20).data)[1]
              for v in b.column("value").to_pylist()]
    assert values == [b"n5", b"n6", b"n7"]


def test_fetcher_do_work_with_nothing_to_fetch_asks_to_back_off(tmp_path):
    fetcher = ReplicaFetcher(2, 1, ScriptedLeader(None), {}.get, max_wait_ms=0, min_bytes=1, max_bytes=1,
                             backoff_ms=10, request_timeout_s=1.0)
    assert fetcher.do_work() is False


def test_a_follower_behind_the_leaders_log_start_starts_over_there(broker, tmp_path):
    """The leader deleted what the follower still needs (retention, or a follower down
    for long): the follower's fetch is OFFSET_OUT_OF_RANGE with the leader's log start,
    and the fetcher starts the follower's log over at it (Kafka's follower does the same
    after asking the leader's earliest offset). Without the log start in the answer
    the follower truncated by epoch, fetched at its LEO again, and never caught up."""
    from replikafka.broker.storage import Log, LogConfig
    broker.leader_and_isr(1, 3, (1, 2))
    broker.produce([b"a", b"b", b"c"], acks=1)
    leader = broker.rm.get(TP)
    leader.log.delete_records_before(3)
    broker.produce([b"d"], acks=1)
    [r] = broker.follower_fetch(2, 0)
    assert (r.error.code, r.log_start_offset, r.log_end_offset) == ("OFFSET_OUT_OF_RANGE", 3, 4)

    class Leader(ScriptedLeader):   # answers through the real ReplicaManager
        def fetch(self, request, timeout_s):
            self.requests.append(("fetch", request))
            return M.FetchResponse(broker.rm.fetch(request))

    follower = Partition("t", 0, 2, Log.open(str(tmp_path / "follower" / "t-0"), LogConfig(), SCHEMA,
                                             clock=broker.clock), broker.clock)
    follower.make_follower(1, 3, (1, 2), (1, 2, 3), 0, 1)
    fetcher = ReplicaFetcher(2, 1, Leader(leader), {TP: follower}.get, max_wait_ms=0, min_bytes=1,
                             max_bytes=1 << 20, backoff_ms=10, request_timeout_s=1.0, broker_epoch=lambda: 20)
    fetcher.add(TP, 3)
    fetcher.do_work()                     # truncation (nothing to cut), a fetch at 0: out of range
    assert (follower.log.log_start_offset, follower.log.log_end_offset) == (3, 3)
    fetcher.do_work()                     # from the leader's log start on
    assert (follower.log.log_start_offset, follower.log.log_end_offset) == (3, 4)
    fetcher.do_work()                     # its fetch at 4 commits the rest
    assert (follower.hw, leader.hw) == (4, 4)
