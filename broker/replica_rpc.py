"""The replica RPCs' edge: protobuf (and the follower wire codec, and the produced
records' wire checks) to and from the plain data of ``broker/replica/messages.py``.

Nothing in ``broker/replica/`` sees protobuf: the servicer (``rpc_server.py``)
converts each request here, calls the replica manager, and converts its results
back; a follower reaches its leader through :class:`GrpcLeaderEndpoint`, which
does the same on the other side. Errors meet wire codes here
(``protocol/rpc_errors.py``). Pure functions and one stateless class; thread-safe.
"""
from __future__ import annotations

import grpc

from replikafka import errors as E
from replikafka.broker import produce_decoding, replica_fetch_codec
from replikafka.broker.replica import messages as M
from replikafka.client.connection import open_channel, target_of
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg
from replikafka.protocol.rpc_errors import from_flight_error, from_pb, from_rpc_error, to_pb


# ---------------------------------------------------------------- controller requests
# (the controller's side, plain to protobuf, is broker/controller_rpc.py)
def _partition_roles(states) -> tuple[M.PartitionRole, ...]:
    return tuple(M.PartitionRole(s.topic, s.partition, s.leader, s.leader_epoch, tuple(s.isr), tuple(s.replicas),
                                 s.zk_version, s.controller_epoch) for s in states)


def _topic_infos(topics) -> dict[str, M.TopicInfo]:
    return {t.name: M.TopicInfo(t.schema, dict(t.config), t.topic_id, t.partition_count) for t in topics}


def _broker_endpoints(brokers) -> tuple[M.BrokerEndpoint, ...]:
    return tuple(M.BrokerEndpoint(b.id, b.host, b.port, tuple(b.endpoints), b.broker_epoch) for b in brokers)


def leader_and_isr_request(req: pb.LeaderAndIsrRequest) -> M.LeaderAndIsrRequest:
    return M.LeaderAndIsrRequest(req.controller_id, req.controller_epoch, req.broker_epoch,
                                 _partition_roles(req.partitions), _topic_infos(req.topics),
                                 _broker_endpoints(req.live_leaders))


def update_metadata_request(req: pb.UpdateMetadataRequest) -> M.UpdateMetadataRequest:
    return M.UpdateMetadataRequest(req.controller_id, req.controller_epoch, _partition_roles(req.partitions),
                                   _broker_endpoints(req.live_brokers), _topic_infos(req.topics),
                                   tuple(req.deleted_topics), req.full)


def stop_replica_request(req: pb.StopReplicaRequest) -> M.StopReplicaRequest:
    return M.StopReplicaRequest(req.controller_id, req.controller_epoch, req.broker_epoch, req.delete_partitions,
                                tuple((r.topic, r.partition) for r in req.partitions))


def controller_response(result: M.ControllerRequestResult, response_type):
    """A LeaderAndIsrResponse or StopReplicaResponse (``response_type``) for ``result``."""
    out = response_type()
    if result.error is not None:
        out.error.CopyFrom(to_pb(result.error))
    out.partitions.extend(pb.PartitionError(topic=tp[0], partition=tp[1], error=to_pb(exc))
                          for tp, exc in result.partition_errors)
    return out


def handle_leader_and_isr(rm, metadata, req: M.LeaderAndIsrRequest) -> M.ControllerRequestResult:
    """A LeaderAndIsr, end to end: the metadata cache learns it once the replica manager accepted it."""
    return rm.leader_and_isr(req, accepted=lambda: metadata.apply_leader_and_isr(req))


def leader_and_isr(rm, metadata, req: pb.LeaderAndIsrRequest) -> pb.LeaderAndIsrResponse:
    return controller_response(handle_leader_and_isr(rm, metadata, leader_and_isr_request(req)),
                               pb.LeaderAndIsrResponse)


def stop_replica(rm, req: pb.StopReplicaRequest) -> pb.StopReplicaResponse:
    return controller_response(rm.stop_replica(stop_replica_request(req)), pb.StopReplicaResponse)


def handle_update_metadata(rm, metadata, req: M.UpdateMetadataRequest, deletable=lambda tps: tps) -> None:
    """An UpdateMetadata, end to end: the metadata cache learns it, then replicas it
    says moved away from this broker go (those ``deletable`` agrees to)."""
    metadata.update(req)
    rm.remove_unassigned({s.tp: s.replicas for s in req.partitions}, req.controller_id, req.controller_epoch,
                         deletable)


# ---------------------------------------------------------------- produce
def produce_request(req: pb.ProduceRequest) -> M.ProduceRequest:
    """Each partition entry's records checked against the producer's CRC-32C, decoded
    and validated (:mod:`produce_decoding`: small entries of one schema together,
    in one Arrow read; each batch with the producer's message, which the log
    stores verbatim); an entry's refusal travels as its ``decode_error``."""
    entries, sizes = [], []      # sizes: each entry's records on the wire (byte-rate metrics)
    for d in req.partitions:
        records = d.records   # each read of a protobuf bytes field is a copy: read it once
        sizes.append(len(records))
        entries.append((records, d.records_crc32c if d.HasField("records_crc32c") else None,
                        f"{d.topic}-{d.partition}"))
    partitions = []
    for d, size, decoded in zip(req.partitions, sizes, produce_decoding.decode_produce_entries(entries)):
        pid = d.producer_id if d.producer_id > 0 else -1   # ids start at 1: 0 is protobuf's "unset"
        epoch, sequence = (d.producer_epoch, d.base_sequence) if pid > 0 else (-1, -1)
        if isinstance(decoded, E.ReplikafkaError):
            partitions.append(M.ProducePartition(d.topic, d.partition, (), size, pid, epoch, sequence,
                                                 decode_error=decoded))
        else:
            partitions.append(M.ProducePartition(d.topic, d.partition, decoded.batches, size, pid, epoch, sequence,
                                                 sent_messages=decoded.sent_messages))
    return M.ProduceRequest(req.acks, req.timeout_ms, tuple(partitions))


def produce_response(results: list[M.ProducePartitionResult]) -> pb.ProduceResponse:
    out = pb.ProduceResponse()
    for r in results:
        e = out.partitions.add(topic=r.topic, partition=r.partition, log_append_time_ms=r.log_append_time_ms)
        if r.error is not None:
            e.error.CopyFrom(to_pb(r.error))
        else:
            e.base_offset, e.record_count, e.log_start_offset = r.base_offset, r.record_count, r.log_start_offset
    return out


# ---------------------------------------------------------------- fetch
def fetch_request(req: pb.FetchRequest) -> M.FetchRequest:
    return M.FetchRequest(
        req.replica_id,
        tuple(M.FetchPartition(p.topic, p.partition, p.fetch_offset, p.current_leader_epoch, p.partition_max_bytes,
                               p.last_fetched_epoch,
                               p.follower_high_watermark if p.HasField("follower_high_watermark") else None)
              for p in req.partitions),
        max_wait_ms=req.max_wait_ms, min_bytes=req.min_bytes, max_bytes=req.max_bytes,
        replica_epoch=req.replica_epoch, columns=tuple(req.columns) or None,
        session_id=req.session_id, session_epoch=req.session_epoch if req.HasField("session_epoch") else None,
        forgotten=tuple((f.topic, f.partition) for f in req.forgotten))


def fetch_request_pb(req: M.FetchRequest) -> pb.FetchRequest:
    return pb.FetchRequest(
        replica_id=req.replica_id, max_wait_ms=req.max_wait_ms, min_bytes=req.min_bytes, max_bytes=req.max_bytes,
        replica_epoch=req.replica_epoch, columns=req.columns or (),
        partitions=[pb.FetchPartition(topic=p.topic, partition=p.partition, fetch_offset=p.fetch_offset,
                                      current_leader_epoch=p.current_leader_epoch,
                                      partition_max_bytes=p.partition_max_bytes,
                                      last_fetched_epoch=p.last_fetched_epoch,
                                      follower_high_watermark=p.follower_high_watermark)
                    for p in req.partitions],
        session_id=req.session_id, session_epoch=req.session_epoch,
        forgotten=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in req.forgotten])


def _fetch_header(out: pb.FetchResponse, r: M.FetchPartitionResult) -> pb.FetchPartitionResponse:
    # Added in place: appending a finished message would copy its records again.
    e = out.partitions.add(topic=r.topic, partition=r.partition, high_watermark=r.high_watermark,
                           log_end_offset=r.log_end_offset, log_start_offset=r.log_start_offset)
    if r.error is not None:   # (a follower's OFFSET_OUT_OF_RANGE still says where the leader's log is)
        e.error.CopyFrom(to_pb(r.error))
    elif r.records is not None:
        e.records_base_offset, e.record_count = r.records_base_offset, r.record_count
    return e


def fetch_response(results: list[M.FetchPartitionResult]) -> pb.FetchResponse:
    """A consumer's (or a debugging) Fetch answer: records in the protobuf message."""
    out = pb.FetchResponse()
    for r in results:
        e = _fetch_header(out, r)
        if r.error is None and r.records is not None:
            e.records = r.records if isinstance(r.records, bytes) else bytes(r.records)
    return out


def follower_fetch_response(answer: M.FetchResponse) -> tuple[pb.FetchResponse, list]:
    """A follower's Fetch answer in the ``replica_fetch_codec`` format: the header (each
    partition's ``records_size``, the session id, a whole-fetch error) and the stored
    batches, to be joined by its ``encode``."""
    out = pb.FetchResponse(session_id=answer.session_id)
    if answer.error is not None:
        out.error.CopyFrom(to_pb(answer.error))
    batches = []
    for r in answer.partitions:
        e = _fetch_header(out, r)
        if r.error is None and r.records is not None:
            batches.append(r.records)
            e.records_size = len(r.records)
    return out, batches


def follower_fetch_results(resp: replica_fetch_codec.FollowerFetchResponse) -> M.FetchResponse:
    """The follower's side of :func:`follower_fetch_response` (after the codec's ``decode``)."""
    return M.FetchResponse([M.FetchPartitionResult(p.topic, p.partition, from_pb(p.error), p.high_watermark,
                                                   p.log_end_offset, p.log_start_offset,
                                                   p.records if p.record_count else None, p.records_base_offset,
                                                   p.record_count) for p in resp.partitions],
                           resp.session_id, from_pb(resp.error))


def fetch(rm, req: pb.FetchRequest, context_active=lambda: True) -> pb.FetchResponse:
    return fetch_response(rm.fetch(fetch_request(req), context_active))


def follower_fetch(rm, req: pb.FetchRequest, context_active=lambda: True) -> tuple[pb.FetchResponse, list]:
    """``/replikafka.ReplicaData/Fetch``: for followers only."""
    if req.replica_id < 0:
        raise E.InvalidRequestError(f"{replica_fetch_codec.PATH} is for followers (replica_id >= 0), "
                                    f"got replica_id {req.replica_id}")
    return follower_fetch_response(rm.follower_fetch(fetch_request(req), context_active))


# ---------------------------------------------------------------- offsets
def list_offsets(rm, req: pb.ListOffsetsRequest) -> pb.ListOffsetsResponse:
    results = rm.list_offsets([M.ListOffsetsQuery(q.topic, q.partition, q.timestamp_ms, q.current_leader_epoch)
                               for q in req.partitions])
    out = pb.ListOffsetsResponse()
    for r in results:
        e = out.partitions.add(topic=r.topic, partition=r.partition, offset=r.offset, timestamp_ms=r.timestamp_ms,
                               high_watermark=r.high_watermark, log_end_offset=r.log_end_offset,
                               log_start_offset=r.log_start_offset, leader_epoch=r.leader_epoch)
        if r.error is not None:
            e.error.CopyFrom(to_pb(r.error))
    return out


def epoch_queries(req: pb.OffsetsForLeaderEpochRequest) -> list[M.EpochQuery]:
    return [M.EpochQuery(q.topic, q.partition, q.leader_epoch, q.current_leader_epoch) for q in req.partitions]


def epoch_queries_pb(replica_id: int, queries: list[M.EpochQuery]) -> pb.OffsetsForLeaderEpochRequest:
    return pb.OffsetsForLeaderEpochRequest(replica_id=replica_id, partitions=[
        pb.EpochQuery(topic=q.topic, partition=q.partition, current_leader_epoch=q.current_leader_epoch,
                      leader_epoch=q.leader_epoch) for q in queries])


def epoch_end_offsets_pb(results: list[M.EpochEndOffset]) -> pb.OffsetsForLeaderEpochResponse:
    out = pb.OffsetsForLeaderEpochResponse()
    for r in results:
        e = out.partitions.add(topic=r.topic, partition=r.partition, leader_epoch=r.leader_epoch,
                               end_offset=r.end_offset)
        if r.error is not None:
            e.error.CopyFrom(to_pb(r.error))
    return out


def epoch_end_offsets(resp: pb.OffsetsForLeaderEpochResponse) -> list[M.EpochEndOffset]:
    return [M.EpochEndOffset(r.topic, r.partition, from_pb(r.error), r.leader_epoch, r.end_offset)
            for r in resp.partitions]


def offsets_for_leader_epoch(rm, req: pb.OffsetsForLeaderEpochRequest) -> pb.OffsetsForLeaderEpochResponse:
    return epoch_end_offsets_pb(rm.offsets_for_leader_epoch(epoch_queries(req)))


# ---------------------------------------------------------------- the follower's side
class GrpcLeaderEndpoint:
    """A follower's :class:`LeaderEndpoint` over gRPC: fetches in the follower codec
    (batches arrive as zero-copy slices of the response)."""

    def __init__(self, host: str, port: int, credentials: grpc.ChannelCredentials | None = None):
        self.target = target_of(host, port)
        self.channel = open_channel(self.target, credentials)
        self.stub = pbg.ReplikafkaStub(self.channel)
        self._fetch = self.channel.unary_unary(replica_fetch_codec.PATH,
                                               request_serializer=pb.FetchRequest.SerializeToString,
                                               response_deserializer=replica_fetch_codec.decode)

    def fetch(self, request: M.FetchRequest, timeout_s: float) -> M.FetchResponse:
        try:
            return follower_fetch_results(self._fetch(fetch_request_pb(request), timeout=timeout_s))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.target) from None

    def offsets_for_leader_epoch(self, replica_id: int, queries: list[M.EpochQuery],
                                 timeout_s: float) -> list[M.EpochEndOffset]:
        try:
            return epoch_end_offsets(self.stub.OffsetsForLeaderEpoch(epoch_queries_pb(replica_id, queries),
                                                                     timeout=timeout_s))
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, self.target) from None

    def close(self) -> None:
        self.channel.close()


class FlightLeaderEndpoint:
    """A follower's :class:`LeaderEndpoint` over the leader's Arrow Flight listener
    (``replica.fetch.transport=flight``): a ``replica-fetch`` action with the
    FetchRequest as its body, answered in the same ``replica_fetch_codec`` bytes
    (batches as zero-copy slices of the action's result). Flight's server calls the
    handler on its own gRPC thread (grpcio's hands each call to a worker pool first).
    OffsetsForLeaderEpoch (rare) goes through ``grpc_endpoint``."""

    ACTION = "replica-fetch"

    def __init__(self, location: str, grpc_endpoint: GrpcLeaderEndpoint):
        import pyarrow.flight as fl
        self._fl = fl
        self.location = location
        self.client = fl.FlightClient(location)
        self.grpc_endpoint = grpc_endpoint

    def fetch(self, request: M.FetchRequest, timeout_s: float) -> M.FetchResponse:
        fl = self._fl
        try:
            results = self.client.do_action(fl.Action(self.ACTION, fetch_request_pb(request).SerializeToString()),
                                            fl.FlightCallOptions(timeout=timeout_s))
            body = next(iter(results)).body
        except fl.FlightError as exc:
            raise from_flight_error(exc, self.location) from None
        return follower_fetch_results(replica_fetch_codec.decode(body))

    def offsets_for_leader_epoch(self, replica_id: int, queries: list[M.EpochQuery],
                                 timeout_s: float) -> list[M.EpochEndOffset]:
        return self.grpc_endpoint.offsets_for_leader_epoch(replica_id, queries, timeout_s)

    def close(self) -> None:
        self.client.close()
        self.grpc_endpoint.close()
