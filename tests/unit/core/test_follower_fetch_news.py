"""A follower names the high watermark it holds, and its leader answers only for the
partitions with news for it (records, a high watermark it does not hold, an error): an
idle follower of thousands of partitions no longer decodes and applies each of them
every round. Real partitions and logs on both sides; the follower's fetcher reaches
the leader's ReplicaManager directly (the wire is the RPC layer's)."""
from __future__ import annotations

import pyarrow as pa

from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import Partition
from replikafka.broker.replica.replica_fetcher import ReplicaFetcher
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.storage import Log, LogConfig, ManualClock

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", TS)])
T0 = 1_700_000_000_000
TPS = [("t", 0), ("t", 1), ("t", 2)]


def batch(n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([b"v%d" % i for i in range(n)], pa.binary()),
                            pa.array([T0 + i for i in range(n)], pa.int64()).view(TS)], schema=SCHEMA)


def replica(tmp_path, broker_id: int, tp, clock) -> Partition:
    log = Log.open(str(tmp_path / f"b{broker_id}-{tp[0]}-{tp[1]}"), LogConfig(), SCHEMA, clock=clock)
    return Partition(tp[0], tp[1], broker_id, log, clock)


def leader_manager(tmp_path, clock) -> ReplicaManager:
    metadata = MetadataCache()
    metadata.broker_epochs = {1: 100, 2: 200}
    rm = ReplicaManager(1, None, None, None, metadata, None, clock)
    for tp in TPS:
        part = replica(tmp_path, 1, tp, clock)
        part.make_leader(3, isr=[1, 2], replicas=[1, 2], zk_version=0, controller_epoch=1)
        rm.partitions[tp] = part
    return rm


class Leader:
    """The follower's LeaderEndpoint: the leader's ReplicaManager itself; keeps each answer."""

    def __init__(self, rm: ReplicaManager):
        self.rm, self.answers = rm, []

    def fetch(self, request, timeout_s):
        out = self.rm.fetch(request)
        self.answers.append(sorted((r.topic, r.partition) for r in out))
        return M.FetchResponse(out)

    def offsets_for_leader_epoch(self, replica_id, queries, timeout_s):
        return []

    def close(self):
        pass


def request(rm, offsets: dict, hws: dict | None, replica_id: int = 2, epoch: int = 3) -> list:
    parts = tuple(M.FetchPartition(t, p, offsets[(t, p)], epoch, 1 << 20, -1, None if hws is None else hws[(t, p)])
                  for t, p in TPS)
    return rm.fetch(M.FetchRequest(replica_id, parts, replica_epoch=200 if replica_id == 2 else 0))


def test_the_leader_answers_a_follower_only_for_partitions_with_news(tmp_path):
    clock = ManualClock(T0)
    rm = leader_manager(tmp_path, clock)
    rm.partitions[("t", 0)].append_as_leader([batch(4)], acks=1, min_insync=1)
    zero = {tp: 0 for tp in TPS}
    # Records for t-0; t-1 and t-2: empty, HW 0 as the follower holds: left out.
    assert [(r.partition, r.record_count) for r in request(rm, zero, zero)] == [(0, 4)]
    # The follower at 4: t-0's HW moves to 4, news it does not hold yet.
    at4 = {("t", 0): 4, ("t", 1): 0, ("t", 2): 0}
    [r] = request(rm, at4, zero)
    assert (r.partition, r.high_watermark, r.record_count, r.error) == (0, 4, 0, None)
    # Nothing new anywhere: an empty answer.
    assert request(rm, at4, {("t", 0): 4, ("t", 1): 0, ("t", 2): 0}) == []
    # Without its HW named, every partition is answered (consumers, older followers).
    assert [r.partition for r in request(rm, at4, None)] == [0, 1, 2]
    # An error is always news (a stale leader epoch here).
    assert [(r.partition, r.error.code) for r in request(rm, at4, {tp: 0 for tp in TPS} | {("t", 0): 4},
                                                         epoch=2)] == \
        [(0, "FENCED_LEADER_EPOCH"), (1, "FENCED_LEADER_EPOCH"), (2, "FENCED_LEADER_EPOCH")]


def follower_fetcher(tmp_path, clock, leader) -> tuple[dict, ReplicaFetcher]:
    """Broker 2's replicas of TPS, following broker 1 in epoch 3, and its fetcher from
    ``leader`` (a LeaderEndpoint), past truncation: (replicas by tp, fetcher)."""
    followers = {}
    for tp in TPS:
        part = replica(tmp_path, 2, tp, clock)
        part.make_follower(1, 3, isr=[1, 2], replicas=[1, 2], zk_version=0, controller_epoch=1)
        followers[tp] = part
    fetcher = ReplicaFetcher(2, 1, leader, followers.get, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                             backoff_ms=60_000, request_timeout_s=1.0, broker_epoch=lambda: 200)
    fetcher.add_many({tp: 3 for tp in TPS})
    for s in fetcher.states.values():
        s.truncating = False
    return followers, fetcher


def test_a_follower_round_applies_only_the_news_and_an_empty_answer_is_no_failure(tmp_path):
    clock = ManualClock(T0)
    rm = leader_manager(tmp_path, clock)
    leader = Leader(rm)
    followers, fetcher = follower_fetcher(tmp_path, clock, leader)
    rm.partitions[("t", 1)].append_as_leader([batch(5)], acks=1, min_insync=1)
    assert fetcher.do_work() is True                           # t-1's records
    assert fetcher.do_work() is True                           # t-1's HW, moved by that fetch
    assert leader.answers == [[("t", 1)], [("t", 1)]]
    assert (followers[("t", 1)].log.log_end_offset, followers[("t", 1)].hw) == (5, 5)
    # Idle: the answer names nothing, and that is not a failed round (no backoff).
    assert fetcher.do_work() is True and leader.answers[-1] == []
    rm.partitions[("t", 2)].append_as_leader([batch(2)], acks=1, min_insync=1)
    fetcher.do_work()
    fetcher.do_work()
    assert leader.answers[-2:] == [[("t", 2)], [("t", 2)]]
    assert [(followers[tp].log.log_end_offset, followers[tp].hw) for tp in TPS] == [(0, 0), (5, 5), (2, 2)]
    # The leader counted every partition's fetch, the idle ones too (the ISR's caught-up times).
    assert all(rm.partitions[tp].isr == (1, 2) for tp in TPS)


def test_idle_producers_are_looked_for_once_per_check_interval(tmp_path):
    """expire_producers walks every partition only once per
    producer.id.expiration.check.interval.ms, however often maintenance calls it."""
    from replikafka.broker.config import BrokerConfig
    clock = ManualClock(T0)
    cfg = BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "unused:1", "log.dirs": str(tmp_path),
                                  "producer.id.expiration.ms": "1000",
                                  "producer.id.expiration.check.interval.ms": "60000"})
    rm = leader_manager(tmp_path, clock)
    rm.config = cfg
    part = rm.partitions[("t", 0)]
    part.append_as_leader([batch(2)], acks=1, min_insync=1, producer_id=7, producer_epoch=0, base_sequence=0)
    rm.expire_producers()                          # the first walk: producer 7 is not idle yet
    assert 7 in part.producers.producers
    clock.advance(30_000)                          # idle past its expiration, but no check due
    rm.expire_producers()
    assert 7 in part.producers.producers
    clock.advance(30_000)                          # the next check
    rm.expire_producers()
    assert 7 not in part.producers.producers
