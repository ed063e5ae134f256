"""The controller's RPC edge: its plain requests (``broker/replica/messages.py``:
LeaderAndIsr, UpdateMetadata, StopReplica) to protobuf, and the brokers' answers
back to plain results (``ControllerRequestResult``, errors of the one error tree).

The broker's side of the same requests is ``broker/replica_rpc.py``; the two meet
only on the wire. Nothing in ``broker/controller/`` sees protobuf: the channel
manager (``controller/broker_channels.py``) encodes here what the controller
sends. Pure functions; thread-safe.
"""
from __future__ import annotations

from replikafka.broker.replica import messages as M
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import from_pb


def broker_endpoints_pb(brokers: tuple[M.BrokerEndpoint, ...]) -> list[pb.BrokerEndpoint]:
    return [pb.BrokerEndpoint(id=b.id, host=b.host, port=b.port, endpoints=b.endpoints, broker_epoch=b.broker_epoch)
            for b in brokers]


def partition_state_pb(s: M.PartitionRole) -> pb.PartitionState:
    return pb.PartitionState(topic=s.topic, partition=s.partition, controller_epoch=s.controller_epoch,
                             leader=s.leader, leader_epoch=s.leader_epoch, isr=s.isr, zk_version=s.zk_version,
                             replicas=s.replicas)


class StateMemo:
    """Partition states already encoded, by identity: the controller sends the same
    ``PartitionRole`` objects in an UpdateMetadata and in the LeaderAndIsrs after it
    (or, for a failed broker's new leaders, in LeaderAndIsrs and the UpdateMetadata
    after them), and at 50,000 partitions encoding each once, then copying it, is a
    good part of a failover. Holds what was encoded since the last :meth:`reset` and
    the generation before it (the LeaderAndIsrs an UpdateMetadata follows), at most
    ``limit`` entries each."""

    def __init__(self, limit: int = 1_000_000):
        self.limit = limit
        self.encoded: dict[int, tuple[M.PartitionRole, pb.PartitionState]] = {}
        self.previous: dict[int, tuple[M.PartitionRole, pb.PartitionState]] = {}

    def reset(self) -> None:
        self.previous, self.encoded = self.encoded, {}

    def get(self, s: M.PartitionRole) -> pb.PartitionState:
        hit = self.encoded.get(id(s))
        if hit is None:
            hit = self.previous.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        out = partition_state_pb(s)
        if len(self.encoded) < self.limit:
            self.encoded[id(s)] = (s, out)   # the role is kept: its id stays its own
        return out


def partition_states_pb(roles: tuple[M.PartitionRole, ...], memo: StateMemo | None = None) -> list[pb.PartitionState]:
    if memo is None:
        return [partition_state_pb(s) for s in roles]
    return [memo.get(s) for s in roles]


def topic_infos_pb(topics: dict[str, M.TopicInfo]) -> list[pb.TopicInfo]:
    return [pb.TopicInfo(name=name, schema=t.schema, config=t.config, partition_count=t.partition_count,
                         topic_id=t.topic_id) for name, t in topics.items()]


def leader_and_isr_pb(req: M.LeaderAndIsrRequest, memo: StateMemo | None = None) -> pb.LeaderAndIsrRequest:
    return pb.LeaderAndIsrRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                  broker_epoch=req.broker_epoch, partitions=partition_states_pb(req.partitions, memo),
                                  live_leaders=broker_endpoints_pb(req.live_leaders),
                                  topics=topic_infos_pb(req.topics))


def update_metadata_pb(req: M.UpdateMetadataRequest, memo: StateMemo | None = None) -> pb.UpdateMetadataRequest:
    return pb.UpdateMetadataRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                    partitions=partition_states_pb(req.partitions, memo),
                                    live_brokers=broker_endpoints_pb(req.live_brokers),
                                    topics=topic_infos_pb(req.topics), deleted_topics=req.deleted_topics,
                                    full=req.full)


def stop_replica_pb(req: M.StopReplicaRequest, memo: StateMemo | None = None) -> pb.StopReplicaRequest:
    return pb.StopReplicaRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                 broker_epoch=req.broker_epoch, delete_partitions=req.delete_partitions,
                                 partitions=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in req.partitions])


def request_result(resp) -> M.ControllerRequestResult:
    """A LeaderAndIsr-, UpdateMetadata- or StopReplicaResponse as a plain result."""
    return M.ControllerRequestResult(from_pb(resp.error), [((e.topic, e.partition), from_pb(e.error))
                                                           for e in getattr(resp, "partitions", ())])


#: Each plain controller request's RPC method and its encoder.
CALLS = {
    M.LeaderAndIsrRequest: ("LeaderAndIsr", leader_and_isr_pb),
    M.UpdateMetadataRequest: ("UpdateMetadata", update_metadata_pb),
    M.StopReplicaRequest: ("StopReplica", stop_replica_pb),
}


def encode(request, memo: StateMemo | None = None) -> tuple[str, object]:
    """The RPC method and protobuf message for a plain controller request. With ``memo``
    an UpdateMetadata starts it afresh and the requests after it reuse its states."""
    method, to_pb = CALLS[type(request)]
    if memo is not None and type(request) is M.UpdateMetadataRequest:
        memo.reset()
    return method, to_pb(request, memo)
