"""KIP-207: the HW a reader sees never moves backwards on a leader change (invariant I7).

A new leader starts from its follower HW, which may lag the HW its predecessor
reported. Until that HW reaches the start of its epoch, it reports no HW: Fetch
answers are empty with HW -1, ListOffsets latest is OFFSET_NOT_AVAILABLE (retriable).
Real Partition, real ReplicaManager request handling, real log on a temp dir."""
from __future__ import annotations

import os
import sys

import pyarrow as pa
import pytest

from replikafka import errors as E
from replikafka.broker import replica_rpc
from replikafka.broker.replica.partition import Partition
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.storage import ManualClock
from replikafka.protocol import replikafka_pb2 as pb

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "storage"))
from storage_testlib import T0, fill, open_log  # noqa: E402


class NoMetadata:
    def topic(self, name):
        return None


def new_leader(tmp_path, *, leo=20, follower_hw=5):
    """Broker 2 followed with ``leo`` records and a stale HW, and now leads epoch 1."""
    clock = ManualClock(T0)
    log = open_log(tmp_path / "t-0", clock=clock)
    fill(log, leo // 5, epoch=0)
    part = Partition("t", 0, 2, log, clock, hw=follower_hw)
    assert part.make_follower(1, 0, (1, 2, 3), (1, 2, 3), 0, 1)
    assert part.make_leader(1, (2, 3), (1, 2, 3), 1, 2)
    rm = ReplicaManager(2, None, None, None, NoMetadata(), None, clock)
    rm.partitions[part.tp] = part
    return part, rm


def consumer_fetch(rm, offset):
    resp = replica_rpc.fetch(rm, pb.FetchRequest(replica_id=-1, max_bytes=1 << 20, partitions=[
        pb.FetchPartition(topic="t", partition=0, fetch_offset=offset, current_leader_epoch=-1)]))
    return resp.partitions[0]


def list_latest(rm, ts=-1):
    resp = replica_rpc.list_offsets(rm, pb.ListOffsetsRequest(partitions=[
        pb.ListOffsetsPartition(topic="t", partition=0, timestamp_ms=ts, current_leader_epoch=-1)]))
    return resp.partitions[0]


def test_a_new_leader_reports_no_hw_until_it_reaches_its_epoch_start(tmp_path):
    part, rm = new_leader(tmp_path)
    assert part.hw == 5 and part.leader_state.epoch_start_offset == 20
    # Fetch: empty, no HW (the old leader may have reported up to 20).
    r = consumer_fetch(rm, 0)
    assert (r.error.code, r.record_count, r.high_watermark, r.log_end_offset) == ("", 0, -1, 20)
    # ListOffsets latest: retriable OFFSET_NOT_AVAILABLE; earliest still answers.
    r = list_latest(rm)
    assert r.error.code == "OFFSET_NOT_AVAILABLE" and E.error_for_code(r.error.code).retriable
    assert isinstance(E.error_for_code(r.error.code), E.OffsetNotAvailableError)
    r = list_latest(rm, ts=-2)
    assert (r.error.code, r.offset, r.high_watermark) == ("", 0, -1)
    # A time found below the HW still answers; one that is not is not available yet.
    assert list_latest(rm, ts=T0 + 2).offset == 2
    assert list_latest(rm, ts=T0 + 12).error.code == "OFFSET_NOT_AVAILABLE"
    # The follower in the ISR fetches at 15: the HW moves, but is still below 20.
    part.read_for_follower(3, 15, 1 << 20, 1)
    assert part.hw == 15 and consumer_fetch(rm, 0).high_watermark == -1
    # It reaches 20: the HW is known again and never below what the old leader showed.
    part.read_for_follower(3, 20, 1 << 20, 1)
    r = consumer_fetch(rm, 0)
    assert (r.error.code, r.high_watermark, r.record_count > 0) == ("", 20, True)
    r = list_latest(rm)
    assert (r.error.code, r.offset, r.high_watermark) == ("", 20, 20)


def test_a_leader_alone_in_its_isr_knows_its_hw_at_once(tmp_path):
    clock = ManualClock(T0)
    log = open_log(tmp_path / "t-0", clock=clock)
    fill(log, 2)
    part = Partition("t", 0, 2, log, clock, hw=3)
    part.make_leader(4, (2,), (1, 2), 0, 1)
    assert part.leader_state.client_hw() == part.hw == 10

