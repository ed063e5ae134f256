"""One partition's bad data never stops the others' replication: a follower's fetch
round appends every partition it can, and the one that failed (a corrupt batch from
the leader, a disk error) sits out replica.fetch.backoff.ms on its own."""
from __future__ import annotations

import pyarrow as pa

from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import Partition
from replikafka.broker.replica.replica_fetcher import ReplicaFetcher
from replikafka.broker.storage import Log, LogConfig, ManualClock

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", TS)])
T0 = 1_700_000_000_000


def batch(n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([b"v%d" % i for i in range(n)], pa.binary()),
                            pa.array([T0 + i for i in range(n)], pa.int64()).view(TS)], schema=SCHEMA)


class ScriptedLeader:
    """Answers each fetch with the stored batches of its own logs; ``rot`` flips a byte
    in one partition's answer (as a bit-rotted leader segment would send it)."""

    def __init__(self, logs: dict, rot: set):
        self.logs, self.rot, self.asked = logs, rot, []

    def fetch(self, request, timeout_s):
        self.asked.append([(p.topic, p.partition) for p in request.partitions])
        out = []
        for p in request.partitions:
            tp = (p.topic, p.partition)
            raw = self.logs[tp].read_raw(p.fetch_offset, 1 << 20)
            data = bytearray(raw.data)
            if tp in self.rot and data:
                data[-20] ^= 0x40
            leo = self.logs[tp].log_end_offset
            out.append(M.FetchPartitionResult(p.topic, p.partition, None, leo, leo, 0, bytes(data), raw.first_offset,
                                              raw.record_count))
        return M.FetchResponse(out)

    def offsets_for_leader_epoch(self, replica_id, queries, timeout_s):
        return []

    def close(self):
        pass


def test_a_corrupt_batch_of_one_partition_does_not_stop_the_others(tmp_path):
    clock = ManualClock(T0)
    tps = [("a", 0), ("b", 0), ("c", 3)]
    leader_logs, followers = {}, {}
    for t, p in tps:
        leader_logs[(t, p)] = Log.open(str(tmp_path / f"leader-{t}-{p}"), LogConfig(), SCHEMA, clock=clock)
        leader_logs[(t, p)].append([batch(5)], leader_epoch=1)
        part = Partition(t, p, 2, Log.open(str(tmp_path / f"{t}-{p}"), LogConfig(), SCHEMA, clock=clock), clock)
        part.make_follower(1, 1, isr=[1, 2], replicas=[1, 2], zk_version=0, controller_epoch=1)
        followers[(t, p)] = part
    leader = ScriptedLeader(leader_logs, rot={("b", 0)})
    fetcher = ReplicaFetcher(2, 1, leader, followers.get, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                             backoff_ms=60_000, request_timeout_s=1.0)
    fetcher.add_many({tp: 1 for tp in tps})
    for s in fetcher.states.values():
        s.truncating = False
    assert fetcher.do_work() is True                 # the round succeeded for the others
    assert followers[("a", 0)].log.log_end_offset == 5
    assert followers[("c", 3)].log.log_end_offset == 5
    assert followers[("b", 0)].log.log_end_offset == 0   # refused (CRC), nothing stored
    assert fetcher.states[("b", 0)].delayed_until_s > 0
    for tp in ("a", 0), ("c", 3):
        leader_logs[tp].append([batch(3)], leader_epoch=1)
    fetcher.do_work()                                # b-0 sits out its backoff; the others go on
    assert leader.asked[-1] == [("a", 0), ("c", 3)]
    assert followers[("a", 0)].log.log_end_offset == followers[("c", 3)].log.log_end_offset == 8


def test_a_round_checks_its_partitions_streams_with_one_arrow_read(tmp_path, monkeypatch):
    """A fetch answer naming many partitions is checked as one Arrow read
    (storage/raw_streams), not a read of each batch: each such read gives the GIL up
    several times, which a busy follower pays for a partition at a time. Every
    partition's batches are still appended, byte for byte."""
    import pyarrow.ipc
    clock = ManualClock(T0)
    tps = [("t", p) for p in range(12)]
    leader_logs, followers = {}, {}
    for t, p in tps:
        leader_logs[(t, p)] = Log.open(str(tmp_path / f"leader-{p}"), LogConfig(), SCHEMA, clock=clock)
        for n in range(1 + p % 3):
            leader_logs[(t, p)].append([batch(1 + n)], leader_epoch=1)
        part = Partition(t, p, 2, Log.open(str(tmp_path / f"f-{p}"), LogConfig(), SCHEMA, clock=clock), clock)
        part.make_follower(1, 1, isr=[1, 2], replicas=[1, 2], zk_version=0, controller_epoch=1)
        followers[(t, p)] = part
    fetcher = ReplicaFetcher(2, 1, ScriptedLeader(leader_logs, rot=set()), followers.get, max_wait_ms=0, min_bytes=1,
                             max_bytes=1 << 20, backoff_ms=60_000, request_timeout_s=1.0)
    fetcher.add_many({tp: 1 for tp in tps})
    for s in fetcher.states.values():
        s.truncating = False
    reads = []
    real_open, real_read = pyarrow.ipc.open_stream, pyarrow.ipc.read_record_batch
    monkeypatch.setattr(pyarrow.ipc, "open_stream", lambda src: reads.append("stream") or real_open(src))
    monkeypatch.setattr(pyarrow.ipc, "read_record_batch", lambda *a: reads.append("batch") or real_read(*a))
    assert fetcher.do_work() is True
    assert reads == ["stream"]
    for tp in tps:
        assert followers[tp].log.read_raw(0, 1 << 20).data == leader_logs[tp].read_raw(0, 1 << 20).data
