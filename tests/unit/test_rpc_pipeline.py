"""The broker's RPC pipeline (broker/rpc_server.py): every method of the wire
contract is served through it; undecodable requests get a named error and a
rate-limited log line; principals, authorization and observation happen once
per call. Real gRPC over loopback, with a recording servicer."""
from __future__ import annotations

import logging
from concurrent import futures

import grpc
import pytest

from replikafka import errors as E
from replikafka.broker.rpc_server import (ANONYMOUS, RPC_SPECS, MalformedRequest, OpenGate, RateLimitedLog,
                                          RequestContext, RpcPipeline, safe_deserializer)
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg
from replikafka.protocol.rpc_errors import from_rpc_error


def test_every_rpc_of_the_contract_has_a_spec():
    service = pb.DESCRIPTOR.services_by_name["Replikafka"]
    assert {m.name for m in service.methods} <= set(RPC_SPECS)
    for m in service.methods:
        assert RPC_SPECS[m.name].request.DESCRIPTOR.full_name == m.input_type.full_name
        if RPC_SPECS[m.name].errors_in is not None:
            assert RPC_SPECS[m.name].errors_in.DESCRIPTOR.full_name == m.output_type.full_name


def test_safe_deserializer_hands_on_what_it_could_not_decode():
    parse = safe_deserializer(pb.ProduceRequest)
    assert parse(pb.ProduceRequest(acks=1).SerializeToString()).acks == 1
    bad = parse(b"\xff\xff\xff")
    assert isinstance(bad, MalformedRequest) and bad.size == 3 and "DecodeError" in bad.reason


def test_rate_limited_log_counts_what_it_suppressed(caplog):
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("t.rl"), interval_s=60, keys_max=2, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t.rl"):
        assert rl.log(logging.WARNING, ("a",), "bad %s", "x")
        assert not rl.log(logging.WARNING, ("a",), "bad %s", "x")
        assert not rl.log(logging.WARNING, ("a",), "bad %s", "x")
        assert rl.log(logging.WARNING, ("b",), "other")
        now[0] = 61
        assert rl.log(logging.WARNING, ("a",), "bad %s", "x")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["bad x", "other", "bad x (2 more like it in the last 60 s)"]
    rl.log(logging.WARNING, ("c",), "third key")     # bounded: the oldest window goes
    assert len(rl._windows) == 2


@pytest.mark.parametrize("peer,host", [("ipv4:127.0.0.1:5000", "127.0.0.1"), ("ipv6:[::1]:5000", "::1"),
                                       ("unix:/tmp/s", "/tmp/s")])
def test_peer_host(peer, host):
    assert RequestContext("Fetch", "PLAINTEXT", peer, ANONYMOUS, None, OpenGate()).peer_host == host


class Recorder:
    """A servicer that records what reached it (the pipeline under test is real)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        if name not in RPC_SPECS:
            raise AttributeError(name)

        def handle(request, ctx):
            self.calls.append((name, ctx.principal, ctx.listener, ctx.peer_host))
            if name == "Metadata" and request.topics == ["boom"]:
                raise RuntimeError("a bug")
            if name == "Metadata" and request.topics == ["nosuch"]:
                raise E.UnknownTopicOrPartitionError("topic 'nosuch' does not exist")
            if name == "CreateTopic":
                raise E.InvalidTopicError("topic name '..' is not allowed")
            return RPC_SPECS[name].errors_in() if RPC_SPECS[name].errors_in else pb.MetadataResponse()
        return handle


class Observer:
    def __init__(self):
        self.seen = []

    def observe(self, method, seconds, error_code):
        assert seconds >= 0
        self.seen.append((method, error_code))


class DenyCreate(OpenGate):
    def authenticate(self, listener, grpc_context):
        return "User:alice"

    def authorize(self, ctx, spec, request):
        if spec.kind == "cluster":
            raise E.ClusterAuthorizationFailedError(f"{ctx.principal} may not ClusterAction on the cluster")


@pytest.fixture
def served():
    recorder, observer = Recorder(), Observer()
    made = []

    def start(gate=None):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pipeline = RpcPipeline(recorder, "PLAINTEXT", gate, observer,
                               RateLimitedLog(logging.getLogger("replikafka.rpc"), interval_s=60))
        server.add_generic_rpc_handlers((pipeline.handler(),))
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        made.append((server, channel))
        return channel
    yield start, recorder, observer
    for server, channel in made:
        channel.close()
        server.stop(0)


def test_calls_reach_the_handler_with_a_principal_and_are_observed(served):
    start, recorder, observer = served
    stub = pbg.ReplikafkaStub(start())
    stub.Metadata(pb.MetadataRequest(topics=["t"]), timeout=5)
    assert recorder.calls == [("Metadata", ANONYMOUS, "PLAINTEXT", "127.0.0.1")]
    with pytest.raises(grpc.RpcError) as info:
        stub.Metadata(pb.MetadataRequest(topics=["nosuch"]), timeout=5)
    assert isinstance(from_rpc_error(info.value), E.UnknownTopicOrPartitionError)
    resp = stub.CreateTopic(pb.CreateTopicRequest(name=".."), timeout=5)     # admin: error in the response
    assert resp.error.code == "INVALID_TOPIC_EXCEPTION" and "'..'" in resp.error.message
    assert observer.seen == [("Metadata", ""), ("Metadata", "UNKNOWN_TOPIC_OR_PARTITION"),
                             ("CreateTopic", "INVALID_TOPIC_EXCEPTION")]


def test_malformed_request_gets_a_named_error_and_one_log_line(served, caplog):
    start, recorder, observer = served
    channel = start()
    raw = channel.unary_unary("/replikafka.Replikafka/Produce")
    with caplog.at_level(logging.WARNING, logger="replikafka.rpc"):
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as info:
                raw(b"\x0a\xff\xff\xff\xff\x0f", timeout=5)
            err = from_rpc_error(info.value)
            assert err.code == "INVALID_REQUEST" and "malformed Produce request (6 bytes)" in err.message
    assert recorder.calls == []                                   # never reached a handler
    assert len([r for r in caplog.records if "malformed Produce" in r.getMessage()]) == 1
    assert observer.seen == [("Produce", "INVALID_REQUEST")] * 5
    # The follower path, whose response is not protobuf, is guarded the same way.
    with pytest.raises(grpc.RpcError) as info:
        channel.unary_unary("/replikafka.ReplicaData/Fetch")(b"\xff", timeout=5)
    assert from_rpc_error(info.value).code == "INVALID_REQUEST"


def test_unexpected_exception_fails_only_that_call(served, caplog):
    start, recorder, observer = served
    stub = pbg.ReplikafkaStub(start())
    with caplog.at_level(logging.ERROR, logger="replikafka.rpc"):
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as info:
                stub.Metadata(pb.MetadataRequest(topics=["boom"]), timeout=5)
            assert "RuntimeError: a bug" in from_rpc_error(info.value).message
    assert len([r for r in caplog.records if r.exc_info]) == 1      # one traceback, not one per call
    stub.Metadata(pb.MetadataRequest(topics=["t"]), timeout=5)      # still serving


def test_gate_refuses_before_the_handler_runs(served):
    start, recorder, observer = served
    stub = pbg.ReplikafkaStub(start(DenyCreate()))
    with pytest.raises(grpc.RpcError) as info:
        stub.StopReplica(pb.StopReplicaRequest(), timeout=5)
    err = from_rpc_error(info.value)
    assert isinstance(err, E.ClusterAuthorizationFailedError) and "User:alice" in err.message
    resp = stub.ControlledShutdown(pb.ControlledShutdownRequest(broker_id=1), timeout=5)
    assert resp.error.code == "CLUSTER_AUTHORIZATION_FAILED"
    stub.Metadata(pb.MetadataRequest(), timeout=5)
    assert recorder.calls == [("Metadata", "User:alice", "PLAINTEXT", "127.0.0.1")]
