"""The gRPC servicer: a thin shell that turns requests into ReplicaManager /
AdminManager calls and the error tree into responses.

Per-partition errors go back in the response; a request that is malformed as
a whole fails with INVALID_ARGUMENT naming the problem. Any unexpected
exception fails only that request: the broker keeps serving.
"""
from __future__ import annotations

import functools
import logging

import grpc
from kazoo.exceptions import KazooException

from replikafka import errors as E
from replikafka.broker import replica_fetch_codec
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg
from replikafka.protocol.rpc_errors import abort, to_pb

log = logging.getLogger("replikafka.rpc")


def _zk_unavailable(exc: Exception) -> E.ReplikafkaError:
    """This broker's ZooKeeper session is down or being re-established: try again (or elsewhere)."""
    return E.BrokerNotAvailableError(f"ZooKeeper is not reachable from this broker right now "
                                     f"({type(exc).__name__}); retry")


def _guard(method):
    @functools.wraps(method)
    def wrapper(self, request, context):
        try:
            return method(self, request, context)
        except E.ReplikafkaError as exc:
            abort(context, exc)
        except KazooException as exc:
            abort(context, _zk_unavailable(exc))
        except grpc.RpcError:
            raise
        except Exception as exc:  # a bug must not take the broker down
            log.exception("%s failed", method.__name__)
            abort(context, E.ReplikafkaError(f"{method.__name__}: {type(exc).__name__}: {exc}"))
    return wrapper


def _admin(resp_cls):
    """Admin RPCs answer with an Error field rather than a failed call (the method
    may return its own response; None means an empty one)."""
    def decorate(method):
        @functools.wraps(method)
        def wrapper(self, request, context):
            try:
                return method(self, request, context) or resp_cls()
            except E.ReplikafkaError as exc:
                return resp_cls(error=to_pb(exc))
            except KazooException as exc:
                return resp_cls(error=to_pb(_zk_unavailable(exc)))
            except Exception as exc:
                log.exception("%s failed", method.__name__)
                return resp_cls(error=to_pb(E.ReplikafkaError(f"{type(exc).__name__}: {exc}")))
        return wrapper
    return decorate


def replica_data_handler(servicer: "BrokerServicer"):
    """The follower fetch service (its response is not protobuf: see replica_fetch_codec)."""
    return grpc.method_handlers_generic_handler(replica_fetch_codec.SERVICE, {
        replica_fetch_codec.METHOD: grpc.unary_unary_rpc_method_handler(
            servicer.ReplicaFetch, request_deserializer=pb.FetchRequest.FromString,
            response_serializer=replica_fetch_codec.encode)})


class BrokerServicer(pbg.ReplikafkaServicer):
    def __init__(self, broker):
        self.broker = broker
        self.rm = broker.replica_manager
        self.admin = broker.admin_manager

    @_guard
    def Metadata(self, request, context):
        return self.broker.metadata.metadata_response(list(request.topics), request.all_topics)

    @_guard
    def Produce(self, request, context):
        return self.rm.produce(request)

    @_guard
    def Fetch(self, request, context):
        return self.rm.fetch(request, context.is_active)

    @_guard
    def ReplicaFetch(self, request, context):
        """A follower's fetch, answered in the ``replica_fetch_codec`` format."""
        if request.replica_id < 0:
            raise E.InvalidRequestError(f"{replica_fetch_codec.PATH} is for followers (replica_id >= 0), "
                                        f"got replica_id {request.replica_id}")
        batches: list[bytes] = []
        return self.rm.fetch(request, context.is_active, batches_out=batches), batches

    @_guard
    def ListOffsets(self, request, context):
        return self.rm.list_offsets(request)

    @_guard
    def OffsetsForLeaderEpoch(self, request, context):
        return self.rm.offsets_for_leader_epoch(request)

    @_guard
    def InitProducerId(self, request, context):
        pid, epoch = self.admin.init_producer_id()
        return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    @_admin(pb.CreateTopicResponse)
    def CreateTopic(self, request, context):
        self.admin.create_topic(request)

    @_admin(pb.DeleteTopicResponse)
    def DeleteTopic(self, request, context):
        self.admin.delete_topic(request)

    @_admin(pb.CreatePartitionsResponse)
    def CreatePartitions(self, request, context):
        self.admin.create_partitions(request)

    @_guard
    def LeaderAndIsr(self, request, context):
        try:
            return self.rm.leader_and_isr(request)
        except E.StaleControllerEpochError as exc:
            return pb.LeaderAndIsrResponse(error=to_pb(exc))

    @_guard
    def UpdateMetadata(self, request, context):
        try:
            self.rm.check_controller_epoch(request.controller_epoch)
        except E.StaleControllerEpochError as exc:
            return pb.UpdateMetadataResponse(error=to_pb(exc))
        self.broker.metadata.update(request)
        self.rm.remove_unassigned(request)
        self.rm.notify_data()
        return pb.UpdateMetadataResponse()

    @_admin(pb.ControlledShutdownResponse)
    def ControlledShutdown(self, request, context):
        """Errors come back in the response (the shutting broker retries or gives up)."""
        timeout_s = self.broker.config.get("request.timeout.ms") / 1000.0
        remaining = self.broker.controller.controlled_shutdown(request.broker_id, request.broker_epoch, timeout_s)
        return pb.ControlledShutdownResponse(
            remaining=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in remaining])

    @_guard
    def StopReplica(self, request, context):
        try:
            return self.rm.stop_replica(request)
        except E.StaleControllerEpochError as exc:
            return pb.StopReplicaResponse(error=to_pb(exc))
