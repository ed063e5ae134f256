"""A topic's partitions are decoded from its Metadata answer on first use: the
mapping must read exactly as the eager per-partition decode did (same keys in
partition order, same PartitionInfo values, same misses), whatever the order
and gaps of the answer's list."""
from __future__ import annotations

import copy
import pickle
import random

import pytest

from replikafka import errors as E
from replikafka.client.metadata import PartitionInfo, topic_info_from_pb
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import from_pb


def answer(ids: list[int]) -> pb.TopicMetadata:
    tm = pb.TopicMetadata(name="t", config={"k": "v"})
    for p in ids:
        leader = -1 if p % 5 == 4 else 1 + p % 3
        err = pb.Error(code="LEADER_NOT_AVAILABLE", message=f"t-{p} has no live leader") if leader < 0 else pb.Error()
        tm.partitions.append(pb.PartitionMetadata(partition=p, leader=leader, leader_epoch=p * 2,
                                                  replicas=[1, 2, 3], isr=[1 + p % 3], error=err))
    return tm


def eager(tm: pb.TopicMetadata) -> dict[int, PartitionInfo]:
    """The decode before: every partition at once, sorted by partition."""
    return {p.partition: PartitionInfo(tm.name, p.partition, p.leader, p.leader_epoch, tuple(p.replicas),
                                       tuple(p.isr), from_pb(p.error))
            for p in sorted(tm.partitions, key=lambda p: p.partition)}


def same(got: PartitionInfo, want: PartitionInfo) -> bool:
    # errors are fresh exception objects each decode: compare their class and message
    return (got.topic, got.partition, got.leader, got.leader_epoch, got.replicas, got.isr) == \
        (want.topic, want.partition, want.leader, want.leader_epoch, want.replicas, want.isr) and \
        type(got.error) is type(want.error) and str(got.error) == str(want.error)


@pytest.mark.parametrize("ids", [
    list(range(50)),                                  # as brokers list them
    [p for p in range(50) if p not in (0, 17, 49)],   # gaps (removed partitions)
    random.Random(3).sample(range(60), 60),           # any order
    [],
])
def test_lazy_partitions_read_as_the_eager_decode(ids):
    tm = answer(ids)
    want = eager(tm)
    got = topic_info_from_pb(tm).partitions
    assert list(got) == list(want) == sorted(ids)
    assert len(got) == len(want)
    for p in [-1, 0, 17, 49, 50, 59, 60, 1 << 40, "0", None]:
        assert (p in got) == (p in want)
        if p not in want:
            with pytest.raises(KeyError):
                got[p]
            assert got.get(p) is None
    for p in reversed(sorted(ids)):
        assert same(got[p], want[p])
        assert got[p] is got[p]   # decoded once
    assert sorted(got.keys()) == sorted(want)
    assert all(same(a, want[p]) for p, a in got.items())
    if 4 in want:
        assert isinstance(got[4].error, E.LeaderNotAvailableError)
    for again in (pickle.loads(pickle.dumps(topic_info_from_pb(tm))).partitions, copy.deepcopy(got)):
        assert list(again) == list(want) and all(same(again[p], want[p]) for p in want)
