"""The controller's RPC edge: its plain requests (``broker/replica/messages.py``:
LeaderAndIsr, UpdateMetadata, StopReplica) to protobuf wire bytes, and the brokers' answers
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


def _varint(n: int) -> bytes:
    """Protobuf's base-128 varint of an int32/int64 (a negative one as its 64-bit two's complement)."""
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_SMALL_VARINTS = [_varint(i) for i in range(1 << 14)]


def varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if 0 <= n < 16384 else _varint(n)


def _int_field(tag: bytes, n: int) -> bytes:
    return tag + varint(n) if n else b""      # proto3: a zero is left out, as protobuf does


def _packed_field(tag: bytes, values) -> bytes:
    if not values:
        return b""
    packed = b"".join(varint(v) for v in values)
    return tag + varint(len(packed)) + packed


#: ``partitions`` is field 3 (length-delimited) of both LeaderAndIsrRequest and UpdateMetadataRequest.
_PARTITIONS_TAG = b"\x1a"
_STATE_FIELDS_MAX = 10_000    # cached topic and role encodings, each (a bound; they are few)


class StateMemo:
    """Partition states encoded as a request's ``partitions`` entries (protobuf wire
    bytes of PartitionState, tag and length included), each once: the controller sends
    the same ``PartitionRole`` objects in an UpdateMetadata and in the LeaderAndIsrs
    after it (or, for a failed broker's new leaders, in LeaderAndIsrs and the
    UpdateMetadata after them), and every request is its other fields followed by the
    entries joined (a serialized message is the concatenation of its fields). At 50,000
    partitions building a protobuf message per partition and copying it into each
    request was a third of a controller failover. Entries are by identity: those since
    the last :meth:`reset` and the generation before, at most ``limit`` each. What
    follows the topic and partition (leader, epochs, ISR, replicas, version) takes few
    distinct values across partitions and is encoded once per value."""

    def __init__(self, limit: int = 1_000_000):
        self.limit = limit
        self.encoded: dict[int, tuple[M.PartitionRole, bytes]] = {}
        self.previous: dict[int, tuple[M.PartitionRole, bytes]] = {}
        self.topics: dict[str, bytes] = {}
        self.roles: dict[tuple, bytes] = {}

    def reset(self) -> None:
        self.previous, self.encoded = self.encoded, {}

    def get(self, s: M.PartitionRole) -> bytes:
        hit = self.encoded.get(id(s))
        if hit is None:
            hit = self.previous.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1]
        out = self._entry(s)
        if len(self.encoded) < self.limit:
            self.encoded[id(s)] = (s, out)   # the role is kept: its id stays its own
        return out

    def _entry(self, s: M.PartitionRole) -> bytes:
        topic = self.topics.get(s.topic)
        if topic is None:
            if len(self.topics) >= _STATE_FIELDS_MAX:
                self.topics.clear()
            name = s.topic.encode()
            topic = self.topics[s.topic] = b"\x0a" + varint(len(name)) + name if name else b""
        key = (s.controller_epoch, s.leader, s.leader_epoch, s.isr, s.zk_version, s.replicas)
        role = self.roles.get(key)
        if role is None:
            if len(self.roles) >= _STATE_FIELDS_MAX:
                self.roles.clear()
            role = self.roles[key] = b"".join((
                _int_field(b"\x18", s.controller_epoch), _int_field(b"\x20", s.leader),
                _int_field(b"\x28", s.leader_epoch), _packed_field(b"\x32", s.isr),
                _int_field(b"\x38", s.zk_version), _packed_field(b"\x42", s.replicas)))
        p = s.partition
        body = topic + (b"\x10" + (_SMALL_VARINTS[p] if 0 <= p < 16384 else _varint(p)) if p else b"") + role
        n = len(body)
        return _PARTITIONS_TAG + (_SMALL_VARINTS[n] if n < 16384 else _varint(n)) + body


def partition_states_wire(roles: tuple[M.PartitionRole, ...], memo: StateMemo | None = None) -> bytes:
    """``roles`` as the ``partitions`` field of a LeaderAndIsr or UpdateMetadata request."""
    get = (memo or StateMemo()).get
    return b"".join([get(s) for s in roles])


def broker_endpoints_pb(brokers: tuple[M.BrokerEndpoint, ...]) -> list[pb.BrokerEndpoint]:
    return [pb.BrokerEndpoint(id=b.id, host=b.host, port=b.port, endpoints=b.endpoints, broker_epoch=b.broker_epoch)
            for b in brokers]


def topic_infos_pb(topics: dict[str, M.TopicInfo]) -> list[pb.TopicInfo]:
    return [pb.TopicInfo(name=name, schema=t.schema, config=t.config, partition_count=t.partition_count,
                         topic_id=t.topic_id) for name, t in topics.items()]


def leader_and_isr_wire(req: M.LeaderAndIsrRequest, memo: StateMemo | None = None) -> bytes:
    """A serialized LeaderAndIsrRequest: its other fields, then its partitions' entries."""
    return pb.LeaderAndIsrRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                  broker_epoch=req.broker_epoch, live_leaders=broker_endpoints_pb(req.live_leaders),
                                  topics=topic_infos_pb(req.topics)).SerializeToString() \
        + partition_states_wire(req.partitions, memo)


def update_metadata_wire(req: M.UpdateMetadataRequest, memo: StateMemo | None = None) -> bytes:
    """A serialized UpdateMetadataRequest: its other fields, then its partitions' entries."""
    return pb.UpdateMetadataRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                    live_brokers=broker_endpoints_pb(req.live_brokers),
                                    topics=topic_infos_pb(req.topics), deleted_topics=req.deleted_topics,
                                    full=req.full).SerializeToString() + partition_states_wire(req.partitions, memo)


def stop_replica_wire(req: M.StopReplicaRequest, memo: StateMemo | None = None) -> bytes:
    return pb.StopReplicaRequest(controller_id=req.controller_id, controller_epoch=req.controller_epoch,
                                 broker_epoch=req.broker_epoch, delete_partitions=req.delete_partitions,
                                 partitions=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in req.partitions]
                                 ).SerializeToString()


def request_result(resp) -> M.ControllerRequestResult:
    """A LeaderAndIsr-, UpdateMetadata- or StopReplicaResponse as a plain result."""
    return M.ControllerRequestResult(from_pb(resp.error), [((e.topic, e.partition), from_pb(e.error))
                                                           for e in getattr(resp, "partitions", ())])


#: Each plain controller request's RPC method, its encoder (to wire bytes) and the answer's type.
CALLS = {
    M.LeaderAndIsrRequest: ("LeaderAndIsr", leader_and_isr_wire, pb.LeaderAndIsrResponse),
    M.UpdateMetadataRequest: ("UpdateMetadata", update_metadata_wire, pb.UpdateMetadataResponse),
    M.StopReplicaRequest: ("StopReplica", stop_replica_wire, pb.StopReplicaResponse),
}
#: The answer's type of each method.
RESPONSES = {method: response for method, _encode, response in CALLS.values()}


def encode(request, memo: StateMemo | None = None) -> tuple[str, bytes]:
    """The RPC method and the serialized protobuf request for a plain controller request
    (sent as they are: one UpdateMetadata's bytes go to every broker). With ``memo`` an
    UpdateMetadata starts it afresh and the requests after it reuse its states."""
    method, to_wire, _response = CALLS[type(request)]
    if memo is not None and type(request) is M.UpdateMetadataRequest:
        memo.reset()
    return method, to_wire(request, memo)
