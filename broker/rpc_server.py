"""The gRPC edge of a broker: every RPC passes through one pipeline.

For each call, in order:

1. the request bytes are decoded by a *safe* deserializer: undecodable bytes do
   not reach a handler; the call fails with ``INVALID_REQUEST`` naming the method
   and the decode error, and the log gets one line per peer and method per
   minute with a count (a fuzzing or broken client cannot flood it);
2. the caller is authenticated (``RequestGate.authenticate``): every request has
   a principal, ``User:ANONYMOUS`` on a PLAINTEXT listener;
3. the call is authorized (``RequestGate.authorize``) against the method's
   ``RpcSpec`` before the handler runs (allow-all unless an authorizer is
   configured); handlers that act per topic ask again through
   ``RequestContext.allowed``;
4. the handler runs with the request and a ``RequestContext``;
5. the outcome is observed once (``RequestObserver.observe``: method, seconds,
   error code or ``""``) for metrics;
6. errors of the one error tree map to the wire here and in
   ``protocol/rpc_errors.py`` only. An unexpected exception fails only that call
   (the broker keeps serving) and is logged with its traceback, rate-limited as in 1.

Handlers are plain methods of :class:`BrokerServicer`; the table
:data:`RPC_SPECS` says what each needs. One ``grpc.server`` runs per gRPC
listener, so a call knows which listener (and so which security protocol) it
came through.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import grpc
from google.protobuf.message import DecodeError
from kazoo.exceptions import KazooException

from replikafka import errors as E
from replikafka.broker import replica_fetch_codec, replica_rpc
from replikafka.broker.bulk_work import paused_gc
from replikafka.broker.wire_limits import WireLimits, check_request_entries
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.rpc_errors import abort, to_pb

log = logging.getLogger("replikafka.rpc")

ANONYMOUS = "User:ANONYMOUS"


# ---------------------------------------------------------------- what each RPC is
@dataclass(frozen=True)
class RpcSpec:
    """What an RPC is, for authorization, metrics and error mapping.

    ``kind``: ``client`` (produce/fetch/metadata: per-topic checks in the handler),
    ``admin`` (create/delete/alter topics), or ``cluster`` (controller-to-broker and
    broker-to-broker: needs ClusterAction on the cluster). With ``errors_in`` set,
    a failure is answered as ``errors_in(error=...)`` (Kafka style) instead of
    failing the call.
    """
    name: str
    kind: str
    request: type
    errors_in: type | None = None
    response_serializer: Callable[[Any], bytes] | None = None   # None: the response's SerializeToString
    path: str = ""                                             # "" = /replikafka.Replikafka/<name>

    @property
    def full_path(self) -> str:
        return self.path or f"/replikafka.Replikafka/{self.name}"


RPC_SPECS: dict[str, RpcSpec] = {s.name: s for s in [
    RpcSpec("Metadata", "client", pb.MetadataRequest),
    RpcSpec("Produce", "client", pb.ProduceRequest),
    RpcSpec("Fetch", "client", pb.FetchRequest),
    RpcSpec("ListOffsets", "client", pb.ListOffsetsRequest),
    RpcSpec("InitProducerId", "client", pb.InitProducerIdRequest),
    RpcSpec("CreateTopic", "admin", pb.CreateTopicRequest, pb.CreateTopicResponse),
    RpcSpec("DeleteTopic", "admin", pb.DeleteTopicRequest, pb.DeleteTopicResponse),
    RpcSpec("CreatePartitions", "admin", pb.CreatePartitionsRequest, pb.CreatePartitionsResponse),
    RpcSpec("AlterConfigs", "admin", pb.AlterConfigsRequest, pb.AlterConfigsResponse),
    RpcSpec("DescribeConfigs", "admin", pb.DescribeConfigsRequest, pb.DescribeConfigsResponse),
    RpcSpec("AlterPartitionReassignments", "admin", pb.AlterPartitionReassignmentsRequest,
            pb.AlterPartitionReassignmentsResponse),
    RpcSpec("ListPartitionReassignments", "admin", pb.ListPartitionReassignmentsRequest,
            pb.ListPartitionReassignmentsResponse),
    RpcSpec("ElectLeaders", "admin", pb.ElectLeadersRequest, pb.ElectLeadersResponse),
    RpcSpec("OffsetsForLeaderEpoch", "cluster", pb.OffsetsForLeaderEpochRequest),
    RpcSpec("LeaderAndIsr", "cluster", pb.LeaderAndIsrRequest),
    RpcSpec("UpdateMetadata", "cluster", pb.UpdateMetadataRequest),
    RpcSpec("StopReplica", "cluster", pb.StopReplicaRequest),
    RpcSpec("ControlledShutdown", "cluster", pb.ControlledShutdownRequest, pb.ControlledShutdownResponse),
    RpcSpec("ReplicaFetch", "cluster", pb.FetchRequest, None, replica_fetch_codec.encode, replica_fetch_codec.PATH),
]}


# ---------------------------------------------------------------- the per-call context and the hooks
@dataclass
class RequestContext:
    """Who is calling, through which listener, and what for. Handlers get one per call."""
    method: str
    listener: str          # the listener's security protocol: PLAINTEXT, SSL, SASL_SSL
    peer: str              # grpc's peer string, e.g. "ipv4:127.0.0.1:53412"
    principal: str         # "User:<name>"; ANONYMOUS on PLAINTEXT
    grpc_context: Any
    gate: "RequestGate"

    @property
    def peer_host(self) -> str:
        """The caller's host, as ACLs name it (``*`` matches any)."""
        kind, _, rest = self.peer.partition(":")
        if kind == "ipv6":
            rest = rest.removeprefix("[").partition("]")[0] or rest
            return rest
        return rest.rpartition(":")[0] or rest

    def is_active(self) -> bool:
        return self.grpc_context.is_active()

    def allowed(self, operation: str, resource: tuple[str, str]) -> bool:
        """May this caller do ``operation`` (Kafka's names: Read, Write, ...) on
        ``resource`` (``("Topic", name)`` or ``broker.security.CLUSTER``)?"""
        return self.gate.allowed(self, operation, resource)


class RequestGate(Protocol):
    """Authentication and authorization of every call (security plugs in here)."""

    def authenticate(self, listener: str, grpc_context) -> str:
        """The caller's principal; raises :class:`errors.AuthenticationError`."""

    def authorize(self, ctx: RequestContext, spec: RpcSpec, request) -> None:
        """Refuse the whole call (raise an :class:`errors.AuthorizationError`) or let it through."""

    def allowed(self, ctx: RequestContext, operation: str, resource: tuple[str, str]) -> bool:
        """One ACL question, for handlers that decide per topic."""


class OpenGate:
    """No security configured: everyone is ``User:ANONYMOUS`` and may do anything."""

    def authenticate(self, listener: str, grpc_context) -> str:
        return ANONYMOUS

    def authorize(self, ctx: RequestContext, spec: RpcSpec, request) -> None:
        return None

    def allowed(self, ctx: RequestContext, operation: str, resource: tuple[str, str]) -> bool:
        return True


class RequestObserver(Protocol):
    def observe(self, method: str, seconds: float, error_code: str) -> None:
        """Called once per finished call; ``error_code`` is ``""`` on success. Must not block."""


class NoObserver:
    def observe(self, method: str, seconds: float, error_code: str) -> None:
        return None


# ---------------------------------------------------------------- rate-limited logging
class RateLimitedLog:
    """One log line per key per ``interval_s``, carrying how many were suppressed.

    Thread-safe. Bounded: at most ``keys_max`` keys are remembered (the oldest
    window is dropped first), so hostile peers cannot grow it without limit.
    """

    def __init__(self, logger: logging.Logger, interval_s: float = 60.0, keys_max: int = 10_000,
                 clock: Callable[[], float] = time.monotonic):
        self.logger = logger
        self.interval_s = interval_s
        self.keys_max = keys_max
        self.clock = clock
        self._lock = threading.Lock()
        self._windows: dict[tuple, tuple[float, int]] = {}   # key -> (window start, suppressed count)

    def log(self, level: int, key: tuple, msg: str, *args, exc_info=None) -> bool:
        """Log now (True) or count it for the next line of this key (False)."""
        now = self.clock()
        with self._lock:
            start, suppressed = self._windows.get(key, (None, 0))
            if start is not None and now - start < self.interval_s:
                self._windows[key] = (start, suppressed + 1)
                return False
            if start is None and len(self._windows) >= self.keys_max:
                self._windows.pop(next(iter(self._windows)))
            self._windows[key] = (now, 0)
        if suppressed:
            msg += " (%d more like it in the last %.0f s)"
            args = (*args, suppressed, self.interval_s)
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True


# ---------------------------------------------------------------- undecodable requests
@dataclass(frozen=True)
class MalformedRequest:
    """What the safe deserializer hands on instead of a request it could not decode."""
    size: int
    reason: str


def safe_deserializer(request_cls) -> Callable[[bytes], Any]:
    def parse(data: bytes):
        try:
            return request_cls.FromString(data)
        except (DecodeError, ValueError, TypeError, RecursionError) as exc:
            return MalformedRequest(len(data), f"{type(exc).__name__}: {exc}"[:200])
    return parse


def _zk_unavailable(exc: Exception) -> E.ReplikafkaError:
    """This broker's ZooKeeper session is down or being re-established: try again (or elsewhere)."""
    return E.BrokerNotAvailableError(f"ZooKeeper is not reachable from this broker right now "
                                     f"({type(exc).__name__}); retry")


# ---------------------------------------------------------------- the pipeline
class RpcPipeline:
    """Runs every call of one listener through decode, authenticate, authorize,
    handle, observe and error mapping (see the module docstring)."""

    def __init__(self, servicer: "BrokerServicer", listener: str, gate: RequestGate | None = None,
                 observer: RequestObserver | None = None, problem_log: RateLimitedLog | None = None):
        self.servicer = servicer
        self.listener = listener
        self.gate = gate or OpenGate()
        self.observer = observer or NoObserver()
        self.problems = problem_log or RateLimitedLog(log)
        self.limits = getattr(servicer, "limits", None) or WireLimits()   # max.request.entries

    def handler(self) -> grpc.GenericRpcHandler:
        by_path = {}
        for spec in RPC_SPECS.values():
            by_path[spec.full_path] = grpc.unary_unary_rpc_method_handler(
                self._bind(spec), request_deserializer=safe_deserializer(spec.request),
                response_serializer=spec.response_serializer or _serialize)
        return _PathHandler(by_path)

    def _bind(self, spec: RpcSpec):
        method = getattr(self.servicer, spec.name)
        return lambda request, context: self.call(spec, method, request, context)

    def call(self, spec: RpcSpec, method, request, context):
        started = time.perf_counter()
        code = ""
        try:
            if isinstance(request, MalformedRequest):
                self.problems.log(logging.WARNING, ("malformed", context.peer(), spec.name),
                                  "malformed %s request from %s (%d bytes): %s",
                                  spec.name, context.peer(), request.size, request.reason)
                raise E.InvalidRequestError(f"malformed {spec.name} request ({request.size} bytes): "
                                            f"{request.reason}")
            check_request_entries(request, self.limits)
            principal = self.gate.authenticate(self.listener, context)
            ctx = RequestContext(spec.name, self.listener, context.peer(), principal, context, self.gate)
            self.gate.authorize(ctx, spec, request)
            response = method(request, ctx)
            if spec.errors_in is not None:
                response = response or spec.errors_in()
                code = response.error.code
            return response
        except E.ReplikafkaError as exc:
            code = exc.code
            return self._fail(spec, context, exc)
        except KazooException as exc:
            err = _zk_unavailable(exc)
            code = err.code
            return self._fail(spec, context, err)
        except grpc.RpcError:
            code = "RPC_ERROR"
            raise
        except Exception as exc:  # a bug must not take the broker down
            self.problems.log(logging.ERROR, ("unexpected", spec.name, type(exc).__name__),
                              "%s failed", spec.name, exc_info=True)
            err = E.ReplikafkaError(f"{spec.name}: {type(exc).__name__}: {exc}")
            code = err.code
            return self._fail(spec, context, err)
        finally:
            self.observer.observe(spec.name, time.perf_counter() - started, code)

    @staticmethod
    def _fail(spec: RpcSpec, context, exc: E.ReplikafkaError):
        """Answer with the response's ``error`` field where the RPC has one, else fail the call."""
        if spec.errors_in is not None:
            return spec.errors_in(error=to_pb(exc))
        abort(context, exc)


def _serialize(message) -> bytes:
    return message.SerializeToString()


class _PathHandler(grpc.GenericRpcHandler):
    def __init__(self, by_path: dict):
        self.by_path = by_path

    def service(self, handler_call_details):
        return self.by_path.get(handler_call_details.method)


# ---------------------------------------------------------------- the handlers
class BrokerServicer:
    """One method per RPC: ``(request, RequestContext) -> response``. No error
    mapping here (the pipeline does it); errors are raised from the one tree."""

    def __init__(self, broker):
        self.broker = broker
        self.rm = broker.replica_manager
        self.admin = broker.admin_manager
        self.limits = WireLimits.from_config(broker.config)

    def Metadata(self, request, ctx: RequestContext):
        """Lists only the topics the caller may Describe: a named topic it may not is
        TOPIC_AUTHORIZATION_FAILED (whether or not it exists), others are left out."""
        response = self.broker.metadata.metadata_response(list(request.topics), request.all_topics)
        named = set(request.topics) if request.topics and not request.all_topics else set()
        shown = []
        for t in response.topics:
            if ctx.allowed("Describe", ("Topic", t.name)):
                shown.append(t)
            elif t.name in named:
                shown.append(pb.TopicMetadata(name=t.name, error=pb.Error(
                    code=E.TopicAuthorizationFailedError.code,
                    message=f"{ctx.principal} is not allowed Describe on Topic {t.name!r}")))
        if len(shown) != len(response.topics) or any(a is not b for a, b in zip(shown, response.topics)):
            del response.topics[:]
            response.topics.extend(shown)
        return response

    def Produce(self, request, ctx: RequestContext):
        return replica_rpc.produce_response(self.rm.produce(replica_rpc.produce_request(request)))

    def Fetch(self, request, ctx: RequestContext):
        return replica_rpc.fetch(self.rm, request, ctx.is_active)

    def ReplicaFetch(self, request, ctx: RequestContext):
        """A follower's fetch, answered in the ``replica_fetch_codec`` format."""
        return replica_rpc.follower_fetch(self.rm, request, ctx.is_active)

    def ListOffsets(self, request, ctx: RequestContext):
        return replica_rpc.list_offsets(self.rm, request)

    def OffsetsForLeaderEpoch(self, request, ctx: RequestContext):
        return replica_rpc.offsets_for_leader_epoch(self.rm, request)

    def InitProducerId(self, request, ctx: RequestContext):
        pid, epoch = self.admin.init_producer_id()
        return pb.InitProducerIdResponse(producer_id=pid, producer_epoch=epoch)

    def CreateTopic(self, request, ctx: RequestContext):
        self.admin.create_topic(request)

    def DeleteTopic(self, request, ctx: RequestContext):
        self.admin.delete_topic(request)

    def CreatePartitions(self, request, ctx: RequestContext):
        self.admin.create_partitions(request)

    def AlterConfigs(self, request, ctx: RequestContext):
        self.admin.alter_configs(request)

    def DescribeConfigs(self, request, ctx: RequestContext):
        return pb.DescribeConfigsResponse(entries=self.admin.describe_configs(request))

    def AlterPartitionReassignments(self, request, ctx: RequestContext):
        self.admin.alter_partition_reassignments(request)

    def ListPartitionReassignments(self, request, ctx: RequestContext):
        return self.admin.list_partition_reassignments()

    def ElectLeaders(self, request, ctx: RequestContext):
        self.admin.elect_leaders(request)

    def _controller_refusal(self, request) -> E.ReplikafkaError | None:
        """Why a controller request is not obeyed (control_plane_guard: its controller and
        epoch as ZooKeeper says, then the epoch this broker has seen), or None."""
        try:
            self.broker.control_guard.check_controller(request.controller_id, request.controller_epoch)
            self.rm.check_controller_epoch(request.controller_epoch)
        except (E.StaleControllerEpochError, E.InvalidRequestError) as exc:
            log.warning("%s refused: %s", type(request).__name__, exc)
            return exc
        return None

    def LeaderAndIsr(self, request, ctx: RequestContext):
        refusal = self._controller_refusal(request)
        if refusal is not None:
            return pb.LeaderAndIsrResponse(error=to_pb(refusal))
        with paused_gc():   # one object or more per partition named (broker/bulk_work.py)
            request, refused = self.broker.control_guard.filter_leader_and_isr(request)
            try:
                out = replica_rpc.leader_and_isr(self.rm, self.broker.metadata, request)
            except E.StaleControllerEpochError as exc:
                return pb.LeaderAndIsrResponse(error=to_pb(exc))
            out.partitions.extend(refused)
            return out

    def UpdateMetadata(self, request, ctx: RequestContext):
        refusal = self._controller_refusal(request)
        if refusal is not None:
            return pb.UpdateMetadataResponse(error=to_pb(refusal))
        guard = self.broker.control_guard
        with paused_gc():   # one object or more per partition named (broker/bulk_work.py)
            request = guard.filter_update_metadata(request, self.broker.metadata.topic_names())
            replica_rpc.handle_update_metadata(self.rm, self.broker.metadata,
                                               replica_rpc.update_metadata_request(request),
                                               lambda tps: guard.deletable_here(self.rm.broker_id, tps))
        self.rm.notify_data()
        return pb.UpdateMetadataResponse()

    def ControlledShutdown(self, request, ctx: RequestContext):
        """Errors come back in the response (the shutting broker retries or gives up)."""
        timeout_s = self.broker.config.get("request.timeout.ms") / 1000.0
        remaining = self.broker.controller.controlled_shutdown(request.broker_id, request.broker_epoch, timeout_s)
        return pb.ControlledShutdownResponse(
            remaining=[pb.TopicPartitionRef(topic=t, partition=p) for t, p in remaining])

    def StopReplica(self, request, ctx: RequestContext):
        refusal = self._controller_refusal(request)
        if refusal is not None:
            return pb.StopReplicaResponse(error=to_pb(refusal))
        request, refused = self.broker.control_guard.filter_stop_replica(request, self.rm.broker_id)
        try:
            out = replica_rpc.stop_replica(self.rm, request)
        except E.StaleControllerEpochError as exc:
            return pb.StopReplicaResponse(error=to_pb(exc))
        out.partitions.extend(refused)
        return out
