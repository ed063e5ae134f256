"""A zombie leader (it missed its demotion) finds its state znode moved on during ISR
maintenance. Whichever comes first, its own discovery in ``do_isr_work()`` or the
controller's LeaderAndIsr for the new leader and epoch, it ends up a follower of the
new leader *with a fetcher*: otherwise it never catches up or rejoins the ISR.

Both orders are driven deterministically, with no threads: the real ReplicaManager,
Partition and log on a temp dir, the real ZkStore over the in-memory ZooKeeper of
the simulation, and a fetcher manager that records the changes asked of it."""
from __future__ import annotations

import os
import sys

import pyarrow as pa
import pytest

from replikafka import records as R
from replikafka.broker import zk_store as Z
from replikafka.broker.config import BrokerConfig, log_config_for_topic
from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import FOLLOWER, LEADER
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.server import PartitionLogs
from replikafka.broker.storage import LogManager, ManualClock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "sim"))
from sim_zookeeper import SimKazooClient, SimZooKeeper  # noqa: E402

TP = ("t", 0)
LAG_MS = 1000


class RecordingFetchers:
    """The fetcher manager's interface; remembers which leader each partition follows."""

    def __init__(self):
        self.following: dict = {}
        self.calls: list = []

    def add_partitions(self, partitions):
        if partitions:
            self.calls.append(("add", dict(partitions)))
        self.following.update(partitions)

    def remove_partitions(self, tps):
        tps = list(tps)
        if tps:
            self.calls.append(("remove", tps))
        for tp in tps:
            self.following.pop(tp, None)

    def remove_partition(self, tp):
        self.remove_partitions([tp])


@pytest.fixture
def zombie(tmp_path):
    """Broker 1 leads t-0 in epoch 3 with ISR [1, 2, 3]; its followers never fetch, so
    after the lag time it wants to shrink the ISR. Meanwhile the controller moved the
    leadership to broker 2, epoch 4 (the zombie has not heard of it)."""
    clock = ManualClock(1_700_000_000_000)
    zk = SimKazooClient(SimZooKeeper())
    store = Z.ZkStore(zk)
    store.ensure_paths()
    schema = R.stored_schema(R.KAFKA_SCHEMA)
    store.create_topic("t", {0: [1, 2, 3]}, R.schema_to_bytes(schema), {"topic.id": "x"})
    store.create_partition_states({TP: Z.LeaderAndIsr(1, 3, (1, 2, 3), 1)})
    cfg = BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "sim:1", "log.dirs": str(tmp_path),
                                  "replica.lag.time.max.ms": LAG_MS})
    lm = LogManager([str(tmp_path)], log_config_for_topic(cfg, {}), clock=clock)
    fetchers = RecordingFetchers()
    rm = ReplicaManager(1, cfg, PartitionLogs(cfg, lm), store, MetadataCache(), fetchers, clock)
    topics = {"t": M.TopicInfo(R.schema_to_bytes(schema), {}, "x")}

    def leader_and_isr(leader, epoch, isr, zk_version):
        return rm.leader_and_isr(M.LeaderAndIsrRequest(9, 1, -1, (
            M.PartitionRole("t", 0, leader, epoch, tuple(isr), (1, 2, 3), zk_version, 1),), topics))

    assert leader_and_isr(1, 3, (1, 2, 3), 0) == M.ControllerRequestResult()
    batch = pa.record_batch([pa.nulls(2, pa.binary()), pa.array([b"a", b"b"]), pa.nulls(2, R.HEADER_TYPE),
                             R.constant_timestamps(clock.time_ms(), 2)], schema=schema)
    rm.get(TP).append_as_leader([batch], acks=1, min_insync=1)
    clock.advance(LAG_MS + 1)
    assert store.update_partition_state("t", 0, Z.LeaderAndIsr(2, 4, (2, 3), 1), 0) == 1
    fetchers.calls.clear()
    yield rm, fetchers, leader_and_isr
    lm.close()


def test_zombie_finds_out_first_then_the_controller_tells_it(zombie):
    rm, fetchers, leader_and_isr = zombie
    assert rm.do_isr_work() == 0          # its shrink loses the conditional write
    part = rm.get(TP)
    assert (part.role, part.leader_id, part.leader_epoch) == (FOLLOWER, 2, 4)
    assert fetchers.following == {TP: (2, 4)}
    assert leader_and_isr(2, 4, (2, 3), 1) == M.ControllerRequestResult()    # a repeat now: changes nothing
    assert (part.role, part.leader_id, part.leader_epoch, part.zk_version) == (FOLLOWER, 2, 4, 1)
    assert fetchers.following == {TP: (2, 4)}
    assert fetchers.calls == [("add", {TP: (2, 4)})]


def test_the_controller_tells_it_first_then_isr_work_finds_nothing_to_do(zombie):
    rm, fetchers, leader_and_isr = zombie
    assert leader_and_isr(2, 4, (2, 3), 1) == M.ControllerRequestResult()
    part = rm.get(TP)
    assert (part.role, part.leader_id, part.leader_epoch) == (FOLLOWER, 2, 4)
    assert rm.do_isr_work() == 0
    assert (part.role, part.leader_id, part.leader_epoch) == (FOLLOWER, 2, 4)
    assert fetchers.following == {TP: (2, 4)}
    assert fetchers.calls == [("add", {TP: (2, 4)})]


def test_a_deleted_state_znode_takes_the_zombie_offline_without_a_fetcher(zombie):
    rm, fetchers, _ = zombie
    rm.store.zk.delete(Z.state_path(*TP))
    assert rm.do_isr_work() == 0
    part = rm.get(TP)
    assert (part.role, part.leader_id, part.leader_epoch) == (FOLLOWER, -1, 4)
    assert fetchers.following == {}


def test_a_stale_request_without_a_leader_leaves_the_current_fetcher_alone(zombie):
    """A LeaderAndIsr of an older epoch naming no leader, delivered late, is stale: it
    must not take away the fetcher of the current epoch (found by the simulation)."""
    rm, fetchers, leader_and_isr = zombie
    assert leader_and_isr(2, 4, (2, 3), 1) == M.ControllerRequestResult()
    assert fetchers.following == {TP: (2, 4)}
    leader_and_isr(-1, 3, (3,), 1)
    part = rm.get(TP)
    assert (part.role, part.leader_id, part.leader_epoch) == (FOLLOWER, 2, 4)
    assert fetchers.following == {TP: (2, 4)}
    leader_and_isr(-1, 5, (3,), 2)     # a newer epoch without a leader: stop fetching
    assert fetchers.following == {} and part.leader_epoch == 5
