"""The control-plane guard's StopReplica(delete) rule: a replica is deleted only
when ZooKeeper says it must go (pure logic against a scripted ZooKeeper view)."""
from __future__ import annotations

from replikafka.broker.control_plane_guard import ControlPlaneGuard
from replikafka.broker.wire_limits import WireLimits
from replikafka.protocol import replikafka_pb2 as pb


class ZkView:
    """What ZooKeeper says, scripted (the guard's ClusterTruth)."""

    def __init__(self, assignments, deleting=(), moving=None, removing=None):
        self.assignments, self.deleting = assignments, list(deleting)
        self.moving, self.removing = moving or {}, removing or {}
        self.zxid = 1
        self.versions = {t: self.zxid for t in assignments}   # each topic znode's mzxid
        self.reads = 0                                        # whole assignments read

    def write(self, topic, assignment):
        """ZooKeeper's assignment of ``topic`` changes (None: the topic is gone)."""
        self.zxid += 1
        if assignment is None:
            self.assignments.pop(topic, None)
            self.versions.pop(topic, None)
        else:
            self.assignments[topic] = assignment
            self.versions[topic] = self.zxid

    def controller_epoch(self):
        return 5, 0

    def get_controller_id(self):
        return 1

    def get_assignment(self, topic):
        self.reads += 1
        return self.assignments.get(topic)

    def assignment_version(self, topic):
        return self.versions.get(topic)

    def live_brokers(self, epochs=None):
        return {}

    def topics_pending_deletion(self):
        return self.deleting

    def get_reassignment(self):
        return self.moving

    def partition_removals(self):
        return self.removing


def deleted(view: ZkView, broker_id: int, *tps) -> list[tuple[str, int]]:
    req = pb.StopReplicaRequest(controller_id=1, controller_epoch=5, delete_partitions=True, partitions=[
        pb.TopicPartitionRef(topic=t, partition=p) for t, p in tps])
    kept, errors = ControlPlaneGuard(view, WireLimits()).filter_stop_replica(req, broker_id)
    assert len(kept.partitions) + len(errors) == len(tps)
    return [(r.topic, r.partition) for r in kept.partitions]


def test_a_forged_delete_of_an_assigned_live_replica_deletes_nothing():
    view = ZkView({"t": {0: [1, 2], 1: [2, 3]}})
    assert deleted(view, 2, ("t", 0), ("t", 1)) == []
    assert deleted(view, 1, ("t", 1)) == [("t", 1)]          # not assigned to broker 1: may go


def test_deletes_zookeeper_asks_for_go_through():
    view = ZkView({"t": {0: [1, 2], 1: [1, 2], 2: [1, 2]}, "gone": {0: [1]}},
                  deleting=["gone"], moving={("t", 0): [3, 4]}, removing={"t": {2}})
    assert deleted(view, 1, ("gone", 0)) == [("gone", 0)]    # topic deletion
    assert deleted(view, 1, ("t", 0)) == [("t", 0)]          # reassignment moves it away
    assert deleted(view, 1, ("t", 2)) == [("t", 2)]          # /admin/partitions_remove names it
    assert deleted(view, 1, ("t", 1)) == []                  # nothing asks for partition 1


def test_a_leader_and_isr_keeps_its_broker_epoch_and_goes_as_it_came_when_all_of_it_is_legal():
    """The recipient's broker epoch (KIP-380) survives the filter, so a request decided for
    an earlier registration of this broker is still refused after it; a request wholly
    legal is passed on as it is (a failover's carries 16,667 entries: not copied)."""
    guard = ControlPlaneGuard(ZkView({"t": {0: [1, 2], 1: [1, 2]}}), WireLimits())

    def request(*partitions):
        req = pb.LeaderAndIsrRequest(controller_id=1, controller_epoch=5, broker_epoch=77)
        for p in partitions:
            req.partitions.add(topic="t", partition=p, leader=1, leader_epoch=3, isr=[1, 2], replicas=[1, 2])
        return req

    legal = request(0, 1)
    out, errors = guard.filter_leader_and_isr(legal)
    assert out is legal and errors == []
    out, errors = guard.filter_leader_and_isr(request(0, 7))        # partition 7 is not ZooKeeper's
    assert [s.partition for s in out.partitions] == [0] and [(e.topic, e.partition) for e in errors] == [("t", 7)]
    assert (out.broker_epoch, out.controller_id, out.controller_epoch) == (77, 1, 5)


def test_an_assignment_is_read_once_per_znode_version_and_a_new_version_is_obeyed():
    """Each LeaderAndIsr asks ZooKeeper only for the topic's znode version; the whole
    assignment is read again when that version moved (a partition added, the topic
    deleted), and a request is judged against the new one."""
    view = ZkView({"t": {0: [1, 2], 1: [1, 2]}})
    guard = ControlPlaneGuard(view, WireLimits())

    def refused(*partitions):
        req = pb.LeaderAndIsrRequest(controller_id=1, controller_epoch=5)
        for p in partitions:
            req.partitions.add(topic="t", partition=p, leader=1, leader_epoch=3, isr=[1, 2], replicas=[1, 2])
        _out, errors = guard.filter_leader_and_isr(req)
        return [e.partition for e in errors]

    assert refused(0, 1, 2) == [2] and view.reads == 1
    assert refused(0, 1, 2) == [2] and view.reads == 1          # same version: not read again
    view.write("t", {0: [1, 2], 1: [1, 2], 2: [1, 2]})           # partition 2 added
    assert refused(0, 1, 2) == [] and view.reads == 2
    view.write("t", None)                                         # the topic is deleted
    assert refused(0) == [0]
    view.write("t", {0: [1, 2]})                                  # and created again
    assert refused(0, 1) == [1] and view.reads == 3
    view.write("t", None)                                         # deleted and created again between two
    view.write("t", {0: [3, 4]})                                  # requests, elsewhere (a new znode: its
    assert refused(0) == [0] and view.reads == 4                  # version restarts, its mzxid does not)


def _states(req, *entries):
    """Adds PartitionStates (topic, partition, replicas, isr, leader, leader_epoch) to ``req``."""
    for topic, p, replicas, isr, leader, epoch in entries:
        req.partitions.add(topic=topic, partition=p, leader=leader, leader_epoch=epoch, isr=isr, replicas=replicas)
    return req


# Legal entries and each way one is not, with replica lists the legal ones share (the
# one-pass check keeps what it found legal): each illegal entry is refused all the same,
# named, with the reason an entry alone gets.
_MIXED = [("t", 0, [1, 2, 3], [1, 2], 1, 3), ("t", 1, [1, 2, 3], [1, 2], 1, 3),
          ("bad/name", 2, [1, 2, 3], [1, 2], 1, 3),          # topic name
          ("t", 100_000, [1, 2, 3], [1, 2], 1, 3),           # partition id past max.partitions.per.topic
          ("t", -1, [1, 2, 3], [1, 2], 1, 3),                # negative partition id
          ("t", 3, [1, 2, 3], [1, 2], -2, 3),                # leader
          ("t", 4, [1, 2, 3], [1, 2], 1, -2),                # leader epoch
          ("t", 5, [1, 1, 3], [1, 2], 1, 3),                 # repeated replica
          ("t", 6, [1, 2, 3], [2, -1], 1, 3),                # negative ISR member
          ("t", 7, list(range(40)), [1, 2], 1, 3),           # over max.replication.factor
          ("t", 8, [1, 2, 3], [1, 2], 1, 3)]


def test_a_requests_partition_states_checked_in_one_pass_are_judged_as_each_alone():
    from replikafka.broker import wire_limits as W
    states = _states(pb.LeaderAndIsrRequest(), *_MIXED).partitions
    together = W.partition_state_errors(states, WireLimits())
    alone = [W.partition_state_error(s, WireLimits()) for s in states]
    assert [(type(e), str(e)) if e else None for e in together] == \
        [(type(e), str(e)) if e else None for e in alone]
    assert [i for i, e in enumerate(together) if e is None] == [0, 1, 10]
    assert "t-5 replicas" in str(together[7]) and "100000" in str(together[3])


def test_an_update_metadata_all_legal_goes_on_uncopied_and_one_with_illegal_entries_without_them():
    """A failover's UpdateMetadata (33,333 entries) is passed on as it came when all of it
    is legal; otherwise a request of only the legal entries."""
    guard = ControlPlaneGuard(ZkView({"t": {p: [1, 2, 3] for p in range(9)}}), WireLimits())
    legal = _states(pb.UpdateMetadataRequest(controller_id=1, controller_epoch=5),
                    *[e for e in _MIXED if e[1] in (0, 1, 8) and e[0] == "t"])
    out = guard.filter_update_metadata(legal)
    assert out is legal and [s.partition for s in out.partitions] == [0, 1, 8] and not out.full
    mixed = _states(pb.UpdateMetadataRequest(controller_id=1, controller_epoch=5), *_MIXED)
    out = guard.filter_update_metadata(mixed)
    assert out is not mixed and [(s.topic, s.partition) for s in out.partitions] == [("t", 0), ("t", 1), ("t", 8)]
    # A full update, all legal: of the cached topics it does not name, only those ZooKeeper
    # no longer has are deleted, and it replaces nothing else (in place, as it came).
    full = _states(pb.UpdateMetadataRequest(controller_id=1, controller_epoch=5, full=True),
                   ("t", 0, [1, 2, 3], [1, 2], 1, 3))
    out = guard.filter_update_metadata(full, cached_topics=["t", "gone-from-zk"])
    assert out is full and not out.full and list(out.deleted_topics) == ["gone-from-zk"]


def test_a_leader_and_isr_entry_whose_replicas_share_none_with_zookeepers_is_refused_among_legal_ones():
    """Replicas other than ZooKeeper's are obeyed while they overlap (a reassignment moving
    them); an entry sharing none is forged or confused. Judged per (replicas, ZooKeeper's)
    pair once per request, so each entry of a pair gets the same answer."""
    guard = ControlPlaneGuard(ZkView({"t": {p: [1, 2] for p in range(6)}}), WireLimits())
    req = _states(pb.LeaderAndIsrRequest(controller_id=1, controller_epoch=5),
                  ("t", 0, [1, 2], [1, 2], 1, 3), ("t", 1, [3, 4], [3, 4], 3, 3), ("t", 2, [2, 3], [2], 2, 3),
                  ("t", 3, [3, 4], [3], 3, 3), ("t", 4, [2, 1], [2, 1], 2, 3), ("t", 5, [4, 3], [4], 4, 3))
    out, errors = guard.filter_leader_and_isr(req)
    assert [s.partition for s in out.partitions] == [0, 2, 4]
    assert [e.partition for e in errors] == [1, 3, 5] and "share none" in errors[0].error.message
