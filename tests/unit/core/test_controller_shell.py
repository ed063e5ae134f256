"""The controller's shell, driven with no threads: events in through ``do_work()``, the
plain requests it sends out (``broker/replica/messages.py``) compared with ``==``, as
dask's worker-state tests compare instructions. The real Controller and ZkStore over
the simulation's in-memory ZooKeeper, and a channel manager that records what it is
given and answers as a broker would. The wire encoding of the same requests is
checked here too: the controller's side (``controller_rpc``) and the broker's side
(``replica_rpc``) must agree field by field."""
from __future__ import annotations

import concurrent.futures
import os
import sys

import pytest

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker import controller_rpc, replica_rpc
from replikafka.broker import zk_store as Z
from replikafka.broker.controller import controller as C
from replikafka.broker.controller import controller_events as V
from replikafka.broker.controller.broker_channels import ControllerChannelManager, HeldSends
from replikafka.broker.replica import messages as M
from replikafka.protocol import replikafka_pb2 as pb

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "sim"))
from sim_zookeeper import SimKazooClient, SimZooKeeper  # noqa: E402

SCHEMA = R.schema_to_bytes(R.stored_schema(R.KAFKA_SCHEMA))


class RecordingChannels:
    """The channel manager's interface: records each (broker, request) and answers
    each request at once with ``answer(broker, request)`` (success by default)."""

    def __init__(self):
        self.sent: list[tuple[int, object]] = []
        self.live: dict = {}
        self.answer = lambda broker, request: M.ControllerRequestResult()
        self.holds = HeldSends(self._queue)   # as ControllerChannelManager.held
        self.sent_held: list[bool] = []   # per request sent: whether inside held()
        self.on_queued = lambda broker, request: None   # called as each request is queued

    def held(self):
        return self.holds.block()

    def set_brokers(self, live):
        self.live = dict(live)

    def send(self, broker_id, request, on_response=None):
        self.sent_held.append(self.holds.add(broker_id, request, on_response))
        if not self.sent_held[-1]:
            self._queue(broker_id, request, on_response)

    def _queue(self, broker_id, request, on_response):
        self.on_queued(broker_id, request)
        self.sent.append((broker_id, request))
        if on_response is not None:
            on_response(broker_id, self.answer(broker_id, request))

    def drain(self, timeout_s):
        return True

    def close(self):
        pass

    def take(self) -> list[tuple[int, object]]:
        out, self.sent = self.sent, []
        return out


class Cluster:
    """Brokers 1-3 registered; broker 1's controller, not yet elected."""

    def __init__(self):
        self.server = SimZooKeeper()
        self.zks = {b: SimKazooClient(self.server) for b in (1, 2, 3)}
        self.epochs = {b: Z.ZkStore(zk).register_broker(b, f"h{b}", 9000 + b) for b, zk in self.zks.items()}
        self.store = Z.ZkStore(self.zks[1])
        self.store.ensure_paths()
        self.controller = C.Controller(1, self.store, clock=lambda: 0.0)
        self.channels = self.controller.channels = RecordingChannels()

    def endpoint(self, b: int) -> M.BrokerEndpoint:
        return M.BrokerEndpoint(b, f"h{b}", 9000 + b, (), self.epochs[b])

    def run(self, event=None) -> None:
        if event is not None:
            self.controller.enqueue(event)
        while self.controller.do_work():
            pass


def role(tp, leader, isr, replicas, leader_epoch=0, zk_version=0, controller_epoch=1) -> M.PartitionRole:
    return M.PartitionRole(tp[0], tp[1], leader, leader_epoch, tuple(isr), tuple(replicas), zk_version,
                           controller_epoch)


@pytest.fixture
def cluster():
    c = Cluster()
    c.store.create_topic("t", {0: [3, 1, 2], 1: [1, 2, 3]}, SCHEMA, {"topic.id": "x"})
    c.run(V.Elect())
    assert c.controller.active and c.controller.ctx.epoch == 1
    return c


def test_failover_sends_the_full_metadata_then_each_broker_its_roles(cluster):
    """What a new controller sends: one full UpdateMetadata to every live broker, then
    one LeaderAndIsr per broker carrying every partition it hosts (created here: the
    first live replica leads, every live replica is in the ISR, epoch 0, version 0)."""
    sent = cluster.channels.take()
    t0, t1 = role(("t", 0), 3, [3, 1, 2], [3, 1, 2]), role(("t", 1), 1, [1, 2, 3], [1, 2, 3])
    live = tuple(cluster.endpoint(b) for b in (1, 2, 3))
    topics = {"t": M.TopicInfo(SCHEMA, {"topic.id": "x"}, "x", 2)}
    metadata = M.UpdateMetadataRequest(1, 1, (t0, t1), live, topics, full=True)
    assert sent == [(1, metadata), (2, metadata), (3, metadata)] + [
        (b, M.LeaderAndIsrRequest(1, 1, cluster.epochs[b], (t0, t1), topics, live)) for b in (3, 1, 2)]
    # all encoded before any is queued (ControllerChannelManager.held)
    assert cluster.channels.sent_held == [True] * len(sent)


def test_a_broker_failure_moves_its_leaderships_and_tells_the_survivors(cluster):
    """Leaders first (Kafka's onBrokerFailure): the partition 3 led gets its new leader,
    written and sent to its replicas (LeaderAndIsr, then metadata), before 3 leaves the
    ISR of the partition whose leader lives (metadata, then LeaderAndIsr, as before)."""
    cluster.channels.take()
    cluster.server.expire(cluster.zks[3].session_id)      # broker 3 dies
    cluster.run()
    t0 = role(("t", 0), 1, [1, 2], [3, 1, 2], leader_epoch=1, zk_version=1)   # 3 led: 1 is next in the ISR
    t1 = role(("t", 1), 1, [1, 2], [1, 2, 3], leader_epoch=0, zk_version=1)   # 3 only leaves the ISR
    live = (cluster.endpoint(1), cluster.endpoint(2))
    topics = {"t": M.TopicInfo(SCHEMA, {"topic.id": "x"}, "x", 2)}
    assert cluster.channels.take() == [
        (1, M.LeaderAndIsrRequest(1, 1, cluster.epochs[1], (t0,), topics, live)),
        (2, M.LeaderAndIsrRequest(1, 1, cluster.epochs[2], (t0,), topics, live)),
        (1, M.UpdateMetadataRequest(1, 1, (t0,), live, topics)),
        (2, M.UpdateMetadataRequest(1, 1, (t0,), live, topics)),
        (1, M.UpdateMetadataRequest(1, 1, (t1,), live, topics)),
        (2, M.UpdateMetadataRequest(1, 1, (t1,), live, topics)),
        (1, M.LeaderAndIsrRequest(1, 1, cluster.epochs[1], (t1,), topics, live)),
        (2, M.LeaderAndIsrRequest(1, 1, cluster.epochs[2], (t1,), topics, live))]
    assert cluster.channels.live == {1: ("h1", 9001), 2: ("h2", 9002)}


def test_a_new_controller_writes_what_the_dead_broker_changes_then_sends_the_full_state(cluster):
    """The controller's broker dies; broker 2's controller takes over. Before anything is
    sent, the partition 1 led gets its new leader and 1 leaves the other's ISR (both
    written, guarded by the new epoch); then one full state to each live broker."""
    cluster.server.expire(cluster.zks[1].session_id)
    new = C.Controller(2, Z.ZkStore(cluster.zks[2]), clock=lambda: 0.0)
    channels = new.channels = RecordingChannels()
    new.enqueue(V.Elect())
    while new.do_work():
        pass
    assert new.active and new.ctx.epoch == 2
    assert channels.take() == failover_requests(cluster)


def failover_requests(cluster):
    """What broker 2's controller sends when broker 1, the controller, died: t-0, which 1
    only followed, leaves 1 out of its ISR; t-1, which 1 led, gets leader 2; the full
    state to both live brokers, then their LeaderAndIsrs."""
    t0 = role(("t", 0), 3, [3, 2], [3, 1, 2], zk_version=1, controller_epoch=2)
    t1 = role(("t", 1), 2, [2, 3], [1, 2, 3], leader_epoch=1, zk_version=1, controller_epoch=2)
    live = (cluster.endpoint(2), cluster.endpoint(3))
    topics = {"t": M.TopicInfo(SCHEMA, {"topic.id": "x"}, "x", 2)}
    full = M.UpdateMetadataRequest(2, 2, (t0, t1), live, topics, full=True)
    return [(2, full), (3, full),
            (3, M.LeaderAndIsrRequest(2, 2, cluster.epochs[3], (t0, t1), topics, live)),
            (2, M.LeaderAndIsrRequest(2, 2, cluster.epochs[2], (t0, t1), topics, live))]


class InFlightClient(SimKazooClient):
    """State multis take effect when their answer is awaited, as on a real ZooKeeper the
    controller's work while they are in flight comes first; ``before_write(request)`` runs
    just before one takes effect (another writer's move in between)."""

    def __init__(self, server, before_write=lambda request: None):
        super().__init__(server)
        self.before_write = before_write

    def _call(self, request, async_object):
        if not isinstance(request, Z._StateMulti):
            return super()._call(request, async_object)
        done: list = []

        def answer(block=True, timeout=None):
            if not done:
                self.before_write(request)
                done.append(_Answer())
                SimKazooClient._call(self, request, done[0])
            return done[0].get()
        async_object.get = answer
        return True


class _Answer:
    def set(self, value):
        self.value = value

    def get(self):
        return self.value


def _failover_with_writes_in_flight(cluster, before_write):
    """Broker 1 (the controller) dies; broker 2's controller takes over, its state writes
    in flight while it works, each request checked against ZooKeeper as it is queued."""
    cluster.server.expire(cluster.zks[1].session_id)
    zk = InFlightClient(cluster.server, before_write)
    new = C.Controller(2, Z.ZkStore(zk), clock=lambda: 0.0)
    channels = new.channels = RecordingChannels()

    def written_before_queued(broker, request):
        for r in request.partitions:
            s, version = Z.ZkStore(cluster.zks[2]).get_partition_state(r.topic, r.partition)
            assert (r.leader, r.leader_epoch, r.isr, r.zk_version) == (s.leader, s.leader_epoch, s.isr, version)
    channels.on_queued = written_before_queued
    new.enqueue(V.Elect())
    while new.do_work():
        pass
    return new, channels


def test_a_new_controller_encodes_while_its_writes_are_in_flight_and_queues_once_they_are_written(cluster):
    """The full state is encoded while ZooKeeper writes the states (from the states those
    writes make) and queued only after every write returned: each role queued is the
    one in ZooKeeper by then."""
    new, channels = _failover_with_writes_in_flight(cluster, lambda request: None)
    assert channels.take() == failover_requests(cluster)
    assert channels.sent_held == [True] * 4     # encoded once: nothing encoded again


def test_a_write_that_finds_a_moved_version_has_the_full_state_encoded_again(cluster):
    """The leader of t-0 shrinks its ISR while the new controller's writes are in flight:
    that write fails on its version, t-0 is re-read (1 already out of its ISR: nothing to
    write) and what goes out is ZooKeeper's state, not the one encoded ahead."""
    moved = []

    def leader_shrinks_isr(request):
        if not moved:
            moved.append(Z.ZkStore(cluster.zks[3]).update_partition_state("t", 0, Z.LeaderAndIsr(3, 0, (3,), 1), 0))
    new, channels = _failover_with_writes_in_flight(cluster, leader_shrinks_isr)
    assert moved and new.active
    sent = channels.take()
    t0 = role(("t", 0), 3, [3], [3, 1, 2], zk_version=1, controller_epoch=1)
    t1 = role(("t", 1), 2, [2, 3], [1, 2, 3], leader_epoch=1, zk_version=1, controller_epoch=2)
    assert [b for b, _ in sent] == [2, 3, 3, 2] and all(r.partitions == (t0, t1) for _, r in sent)
    assert len(channels.sent_held) == 8          # the 4 encoded ahead were dropped, 4 encoded again


def test_a_new_controller_whose_epoch_moves_under_its_writes_sends_nothing(cluster):
    """Another controller's election while the writes are in flight: the guard fails and
    nothing encoded ahead is queued."""
    def another_controller(request):
        cluster.zks[3].set(Z.CONTROLLER_EPOCH, b"3")
    new, channels = _failover_with_writes_in_flight(cluster, another_controller)
    assert not new.active and channels.take() == []


def test_controlled_shutdown_moves_leaders_away_then_stops_the_broker_replicas(cluster):
    cluster.channels.take()
    reply = concurrent.futures.Future()   # what the RPC thread waits on
    cluster.run(V.ControlledShutdown(broker_id=3, broker_epoch=cluster.epochs[3], reply=reply))
    assert reply.result(timeout=0) == []   # broker 3 leads nothing now
    # 3 led t-0: 1 is next in the ISR; 3 leaves both ISRs (a new leader epoch each, as Kafka's)
    t0 = role(("t", 0), 1, [1, 2], [3, 1, 2], leader_epoch=1, zk_version=1)
    t1 = role(("t", 1), 1, [1, 2], [1, 2, 3], leader_epoch=1, zk_version=1)
    sent = cluster.channels.take()
    topics = {"t": M.TopicInfo(SCHEMA, {"topic.id": "x"}, "x", 2)}
    live = tuple(cluster.endpoint(b) for b in (1, 2, 3))
    assert sent == [(b, M.UpdateMetadataRequest(1, 1, (t0, t1), live, topics)) for b in (1, 2, 3)] + [
        (1, M.LeaderAndIsrRequest(1, 1, cluster.epochs[1], (t0, t1), topics, live)),
        (2, M.LeaderAndIsrRequest(1, 1, cluster.epochs[2], (t0, t1), topics, live)),
        # the shutting broker learns no roles: it is told to stop (not delete) what it no longer leads
        (3, M.StopReplicaRequest(1, 1, cluster.epochs[3], False, (("t", 0), ("t", 1))))]


def test_topic_deletion_waits_for_every_replica_then_tells_everyone(cluster):
    cluster.channels.take()
    refusing = {2}
    cluster.channels.answer = lambda b, req: M.ControllerRequestResult(
        error=E.StorageError("disk") if b in refusing else None)
    cluster.store.zk.create(f"{Z.DELETE_TOPICS}/t", b"", makepath=True)
    cluster.run(V.DeleteTopics())
    stops = [(b, M.StopReplicaRequest(1, 1, cluster.epochs[b], True, (("t", 0), ("t", 1)))) for b in (1, 2, 3)]
    assert sorted(cluster.channels.take(), key=lambda s: s[0]) == stops     # broker 2 refused: not deleted
    assert "t" in cluster.controller.ctx.topics and cluster.store.get_assignment("t") is not None
    refusing.clear()
    cluster.run(V.DeleteTopics())
    live = tuple(cluster.endpoint(b) for b in (1, 2, 3))
    gone = M.UpdateMetadataRequest(1, 1, live_brokers=live, deleted_topics=("t",))
    sent = cluster.channels.take()
    assert sorted(sent[:3], key=lambda s: s[0]) == stops
    assert sent[3:] == [(1, gone), (2, gone), (3, gone)]
    assert "t" not in cluster.controller.ctx.topics and cluster.store.get_assignment("t") is None


def test_a_stale_controller_sends_nothing_after_it_resigned(cluster):
    cluster.channels.take()
    cluster.server.expire(cluster.zks[1].session_id)   # the controller's own session
    cluster.controller.on_session_lost()
    cluster.run(V.BrokerChange())
    assert cluster.channels.take() == []


# ---------------------------------------------------------------- the wire, both sides
def test_controller_requests_survive_the_wire_field_by_field(cluster):
    """Every request the controller sent above, encoded by the controller's edge and
    decoded by the broker's, is the same plain request."""
    cluster.channels.take()
    cluster.server.expire(cluster.zks[3].session_id)
    cluster.run()
    sent = [r for _b, r in cluster.channels.take()]
    sent.append(M.StopReplicaRequest(1, 7, 12, True, (("t", 0), ("u", 5))))
    sent.append(M.UpdateMetadataRequest(1, 7, deleted_topics=("t", "u"), full=True,
                                        live_brokers=(M.BrokerEndpoint(4, "h", 1, ("FLIGHT://h:2",), 99),)))
    decode = {"LeaderAndIsr": (pb.LeaderAndIsrRequest, replica_rpc.leader_and_isr_request),
              "UpdateMetadata": (pb.UpdateMetadataRequest, replica_rpc.update_metadata_request),
              "StopReplica": (pb.StopReplicaRequest, replica_rpc.stop_replica_request)}
    assert {type(r) for r in sent} == set(controller_rpc.CALLS)
    for request in sent:
        method, wire = controller_rpc.encode(request)
        pb_type, to_plain = decode[method]
        assert to_plain(pb_type.FromString(wire)) == request


def _state_pb(s: M.PartitionRole) -> pb.PartitionState:
    return pb.PartitionState(topic=s.topic, partition=s.partition, controller_epoch=s.controller_epoch,
                             leader=s.leader, leader_epoch=s.leader_epoch, isr=s.isr, zk_version=s.zk_version,
                             replicas=s.replicas)


def test_requests_encoded_as_joined_entries_parse_as_protobuf_builds_them():
    """The controller's requests are their other fields then their partitions' entries,
    encoded by hand once each: they parse as the same message protobuf builds field by
    field (negative leaders and versions, large epochs, an empty ISR, non-ASCII and
    empty topic names), and encode to the same bytes."""
    import random
    rng = random.Random(16)
    roles = tuple(M.PartitionRole(rng.choice(["t", "ü-topic", "", "x" * 200]), rng.choice([0, 1, 127, 128, 70000]),
                                  rng.choice([-1, 0, 1, 300]), rng.choice([0, 5, 1 << 20, 2 ** 31 - 1]),
                                  tuple(rng.sample([0, 1, 2, 3, -1, 500], rng.randint(0, 3))),
                                  tuple(rng.sample([0, 1, 2, 3, 16384], rng.randint(0, 3))),
                                  rng.choice([-1, 0, 7, 1 << 30]), rng.choice([0, 1, 9])) for _ in range(500))
    live = (M.BrokerEndpoint(1, "h", 2, ("FLIGHT://h:3",), 1 << 40),)
    topics = {"t": M.TopicInfo(SCHEMA, {"a": "b"}, "id", 3)}
    lai = M.LeaderAndIsrRequest(1, 5, 1 << 40, roles, topics, live)
    um = M.UpdateMetadataRequest(1, 5, roles, live, topics, ("gone",), True)
    want_lai = pb.LeaderAndIsrRequest(controller_id=1, controller_epoch=5, broker_epoch=1 << 40,
                                      partitions=[_state_pb(s) for s in roles],
                                      live_leaders=controller_rpc.broker_endpoints_pb(live),
                                      topics=controller_rpc.topic_infos_pb(topics))
    want_um = pb.UpdateMetadataRequest(controller_id=1, controller_epoch=5, partitions=[_state_pb(s) for s in roles],
                                       live_brokers=controller_rpc.broker_endpoints_pb(live),
                                       topics=controller_rpc.topic_infos_pb(topics), deleted_topics=["gone"], full=True)
    memo = controller_rpc.StateMemo()
    for _ in range(2):   # the second time from the memo
        assert pb.UpdateMetadataRequest.FromString(controller_rpc.encode(um, memo)[1]) == want_um
        assert pb.LeaderAndIsrRequest.FromString(controller_rpc.encode(lai, memo)[1]) == want_lai
    for s in roles:
        entry = pb.UpdateMetadataRequest(partitions=[_state_pb(s)]).SerializeToString()
        assert memo.get(s) == entry == controller_rpc.partition_states_wire((s,))


def test_a_broker_answer_reaches_the_controller_as_a_plain_result():
    result = M.ControllerRequestResult(None, [(("t", 1), E.NotLeaderOrFollowerError("no")),
                                              (("u", 0), E.StorageError("disk"))])
    back = controller_rpc.request_result(replica_rpc.controller_response(result, pb.StopReplicaResponse))
    assert back.error is None
    assert [(tp, type(e), e.message) for tp, e in back.partition_errors] == [
        (("t", 1), E.NotLeaderOrFollowerError, "no"), (("u", 0), E.StorageError, "disk")]
    refused = controller_rpc.request_result(pb.UpdateMetadataResponse(error=pb.Error(
        code="STALE_CONTROLLER_EPOCH", message="old")))
    assert isinstance(refused.error, E.StaleControllerEpochError) and refused.partition_errors == []


def test_the_channel_manager_encodes_a_broadcast_once_and_answers_in_plain_data():
    class WireChannel:   # a BrokerChannel's interface: serialized protobuf in, a protobuf answer to the callback
        def __init__(self, broker_id):
            self.broker_id, self.got = broker_id, []

        def send(self, method, request, on_response=None):
            self.got.append((method, request))
            if on_response is not None:
                on_response(self.broker_id, pb.StopReplicaResponse(partitions=[pb.PartitionError(
                    topic="t", partition=0, error=pb.Error(code="KAFKA_STORAGE_ERROR", message="disk"))]))

        def close(self):
            pass

    manager = ControllerChannelManager()
    manager.channels = {1: WireChannel(1), 2: WireChannel(2)}
    update = M.UpdateMetadataRequest(5, 3, live_brokers=(M.BrokerEndpoint(1, "h", 1),))
    for b in (1, 2):
        manager.send(b, update)
    (m1, w1), = manager.channels[1].got
    (m2, w2), = manager.channels[2].got
    assert m1 == m2 == "UpdateMetadata" and w1 is w2 and w1 == controller_rpc.update_metadata_wire(update)
    answers = []
    manager.send(2, M.StopReplicaRequest(5, 3, 0, True, (("t", 0),)), lambda b, r: answers.append((b, r)))
    assert manager.channels[2].got[-1] == ("StopReplica", pb.StopReplicaRequest(
        controller_id=5, controller_epoch=3, delete_partitions=True,
        partitions=[pb.TopicPartitionRef(topic="t", partition=0)]).SerializeToString())
    (b, result), = answers
    assert b == 2 and result.error is None and [(tp, e.code) for tp, e in result.partition_errors] == [
        (("t", 0), "KAFKA_STORAGE_ERROR")]
    # the states of an UpdateMetadata are encoded once; a LeaderAndIsr after it reuses them, unchanged
    r = M.PartitionRole("t", 0, 1, 4, (1, 2), (1, 2, 3), 7, 3)
    manager.send(1, M.UpdateMetadataRequest(5, 3, (r,)))
    lai = M.LeaderAndIsrRequest(5, 3, 9, (r, M.PartitionRole("t", 1, 2, 0, (2,), (2,), 0, 3)))
    manager.send(1, lai)
    assert manager._states.encoded[id(r)][0] is r
    assert manager.channels[1].got[-1] == ("LeaderAndIsr", controller_rpc.leader_and_isr_wire(lai))
    # a failed broker's new leaders go out first: the UpdateMetadata after their
    # LeaderAndIsr reuses the states it encoded (the memo keeps one generation back)
    moved = M.PartitionRole("t", 2, 1, 5, (1,), (1, 3), 8, 3)
    manager.send(1, M.LeaderAndIsrRequest(5, 3, 9, (moved,)))
    first = pb.LeaderAndIsrRequest.FromString(manager.channels[1].got[-1][1]).partitions[0]
    manager.send(1, M.UpdateMetadataRequest(5, 3, (moved,)))
    assert pb.UpdateMetadataRequest.FromString(manager._states.previous[id(moved)][1]).partitions[0] == first
    assert manager.channels[1].got[-1] == ("UpdateMetadata", controller_rpc.update_metadata_wire(
        M.UpdateMetadataRequest(5, 3, (moved,))))
    # held: encoded at once, queued only when the block ends, in order
    before = {b: len(manager.channels[b].got) for b in (1, 2)}
    with manager.held():
        manager.send(2, update)
        with manager.held():
            manager.send(2, lai)
        manager.send(1, lai)
        assert {b: len(manager.channels[b].got) for b in (1, 2)} == before
    assert manager.channels[2].got[before[2]:] == [("UpdateMetadata", w1),
                                                   ("LeaderAndIsr", controller_rpc.leader_and_isr_wire(lai))]
    assert manager.channels[1].got[before[1]:] == [("LeaderAndIsr", controller_rpc.leader_and_isr_wire(lai))]
    manager.send(2, update)
    assert len(manager.channels[2].got) == before[2] + 3      # and not held after it
    # a block that raises queues nothing (its requests may rest on writes that failed);
    # entries dropped from the held list are not queued
    with pytest.raises(Z.ControllerMovedError):
        with manager.held():
            manager.send(2, lai)
            raise Z.ControllerMovedError("epoch moved")
    with manager.held() as held:
        manager.send(2, update)
        mark = len(held)
        manager.send(2, lai)
        del held[mark:]
    assert manager.channels[2].got[before[2] + 3:] == [("UpdateMetadata", w1)]
    manager.channels = {}
