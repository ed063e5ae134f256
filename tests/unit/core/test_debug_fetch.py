"""The debugging fetch (replica id -2, replica-verification): any replica answers
with its own stored batches and offsets, and the fetch counts for nothing."""
from __future__ import annotations

import pyarrow as pa

from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import Partition
from replikafka.broker.replica.replica_manager import DEBUGGING_REPLICA_ID, ReplicaManager
from replikafka.broker.storage import Log, LogConfig, ManualClock
from replikafka.broker.storage import batch_format as bf

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", TS)])
T0 = 1_700_000_000_000


def batch(first: int, n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([f"v{o}".encode() for o in range(first, first + n)], pa.binary()),
                            pa.array([T0 + o for o in range(first, first + n)], pa.int64()).view(TS)],
                           schema=SCHEMA)


def manager_with(tmp_path, role: str) -> tuple[ReplicaManager, Partition]:
    clock = ManualClock(T0)
    log = Log.open(str(tmp_path / "t-0"), LogConfig(), SCHEMA, clock=clock)
    part = Partition("t", 0, 1, log, clock)
    if role == "leader":
        part.make_leader(3, isr=[1, 2], replicas=[1, 2], zk_version=0, controller_epoch=1)
        part.append_as_leader([batch(0, 4)], acks=1, min_insync=1)
        part.append_as_leader([batch(4, 6)], acks=1, min_insync=1)
    else:
        part.make_follower(2, 3, isr=[1, 2], replicas=[1, 2], zk_version=0, controller_epoch=1)
        leader_log = Log.open(str(tmp_path / "leader"), LogConfig(), SCHEMA, clock=clock)
        leader_log.append([batch(0, 4)], leader_epoch=3)
        leader_log.append([batch(4, 6)], leader_epoch=3)
        part.append_as_follower(leader_log.read_raw(0, 1 << 20).data, leader_hw=4, expected_epoch=3)
    metadata = MetadataCache()
    metadata.broker_epochs = {1: 100, 2: 200, 3: 300}     # as the controller's UpdateMetadata gives them
    rm = ReplicaManager(1, None, None, None, metadata, None, clock)
    rm.partitions[("t", 0)] = part
    return rm, part


def fetch(rm, replica_id: int, offset: int, replica_epoch: int | None = None):
    if replica_epoch is None:
        replica_epoch = replica_id * 100 if replica_id > 0 else 0
    req = M.FetchRequest(replica_id, (M.FetchPartition("t", 0, offset, -1, 1 << 20),), replica_epoch=replica_epoch)
    [result] = rm.fetch(req)
    return result


def stored_batches(records) -> list[tuple[int, int]]:
    """(base offset, count) of the stored batch messages after the schema message
    (``records``: the replica read's ``StoredBytes``)."""
    records = bytes(records)
    _schema, pos = bf.read_schema_message(records, len(records))
    out = []
    while pos < len(records):
        header, info = bf.read_header(records, pos, len(records))
        out.append((header.base_offset, header.record_count))
        pos += info.size
    return out


def test_a_follower_answers_with_its_own_batches_and_offsets(tmp_path):
    rm, part = manager_with(tmp_path, "follower")
    assert fetch(rm, -1, 0).error.code == "NOT_LEADER_OR_FOLLOWER"     # a consumer may not read a follower
    r = fetch(rm, DEBUGGING_REPLICA_ID, 0)
    assert r.error is None
    assert (r.high_watermark, r.log_end_offset, r.log_start_offset) == (4, 10, 0)
    assert stored_batches(r.records) == [(0, 4), (4, 6)]               # whole batches, above the HW too
    assert r.records_base_offset == 0 and r.record_count == 10
    r = fetch(rm, DEBUGGING_REPLICA_ID, 6)                              # from the batch holding offset 6
    assert stored_batches(r.records) == [(4, 6)]
    r = fetch(rm, DEBUGGING_REPLICA_ID, 10)                             # at the LEO: nothing, no error
    assert r.error is None and r.record_count == 0 and r.log_end_offset == 10


def test_on_the_leader_it_is_not_a_follower_fetch(tmp_path):
    rm, part = manager_with(tmp_path, "leader")
    before = {r: vars(p).copy() for r, p in part.leader_state.progress.items()}
    hw = part.hw
    r = fetch(rm, DEBUGGING_REPLICA_ID, 0)
    assert stored_batches(r.records) == [(0, 4), (4, 6)] and r.log_end_offset == 10
    assert r.high_watermark == hw == 0           # follower 2 never fetched: the HW has not moved
    r = fetch(rm, DEBUGGING_REPLICA_ID, 10)
    assert part.hw == 0 and part.isr == (1, 2)
    assert {r: vars(p) for r, p in part.leader_state.progress.items()} == before
    # whereas a follower's fetch at 10 acknowledges everything
    fetch(rm, 2, 10)
    assert part.hw == 10


def test_a_follower_fetch_is_served_only_to_assigned_replicas_in_their_current_epoch(tmp_path):
    """KIP-380: a fetch claiming an unassigned replica, a stale or made-up broker epoch,
    or an unknown broker is refused, named, and changes nothing (no follower state, HW
    or ISR effect)."""
    rm, part = manager_with(tmp_path, "leader")
    before = {r: vars(p).copy() for r, p in part.leader_state.progress.items()}
    for replica_id, epoch, code in [(3, 300, "NOT_LEADER_OR_FOLLOWER"),     # live, but not a replica of t-0
                                    (2, 199, "STALE_BROKER_EPOCH"),         # an older incarnation of broker 2
                                    (2, 0, "STALE_BROKER_EPOCH"),           # no epoch at all
                                    (9, 900, "NOT_LEADER_OR_FOLLOWER"),     # not a live broker
                                    (1, 100, "NOT_LEADER_OR_FOLLOWER")]:    # the leader itself
        r = fetch(rm, replica_id, 10, epoch)
        assert r.error.code == code, (replica_id, epoch, r.error)
        assert not r.records and r.record_count == 0
    assert part.hw == 0 and part.isr == (1, 2)
    assert {r: vars(p) for r, p in part.leader_state.progress.items()} == before
    fetch(rm, 2, 10, 200)                          # the real follower, in its epoch
    assert part.hw == 10
