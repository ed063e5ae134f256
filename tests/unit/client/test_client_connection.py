import time
from concurrent import futures

import grpc
import pytest

from replikafka import errors as E
from replikafka.client.connection import ConnectionPool, parse_bootstrap, target_of
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pb_grpc


def test_parse_bootstrap():
    assert parse_bootstrap("h1:1,h2:2") == ["h1:1", "h2:2"]
    assert parse_bootstrap(" h1:1 , h1:1,") == ["h1:1"]
    assert parse_bootstrap(["127.0.0.1:9092"]) == ["127.0.0.1:9092"]
    assert parse_bootstrap("[::1]:9092") == ["[::1]:9092"]


@pytest.mark.parametrize("bad, named", [
    ("", "no bootstrap servers"), (",", "no bootstrap servers"), ("host", "'host'"), ("host:", "'host:'"),
    (":9092", "':9092'"), ("host:abc", "'host:abc'"), ("host:0", "'host:0'"), ("host:70000", "'host:70000'"),
    ("a b:1", "'a b:1'"), ("::1:9092", "'::1:9092'"), ("h:1,oops", "'oops'"), (42, "42")])
def test_parse_bootstrap_rejects_bad_entries_naming_them(bad, named):
    with pytest.raises(E.InvalidConfigError) as info:
        parse_bootstrap(bad)
    assert named in str(info.value)


def test_target_of_brackets_ipv6():
    assert target_of("::1", 9) == "[::1]:9"
    assert target_of("10.0.0.1", 9) == "10.0.0.1:9"


class _Servicer(pb_grpc.ReplikafkaServicer):
    def Metadata(self, request, context):
        topic = request.topics[0] if request.topics else ""
        if topic == "abort":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "INVALID_TOPIC_EXCEPTION: topic name 'x y' is not legal")
        if topic == "plain":
            context.abort(grpc.StatusCode.INTERNAL, "something broke")
        if topic == "slow":
            time.sleep(1.0)
        return pb.MetadataResponse(controller_id=7)


@pytest.fixture
def server():
    s = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_ReplikafkaServicer_to_server(_Servicer(), s)
    port = s.add_insecure_port("127.0.0.1:0")
    s.start()
    yield f"127.0.0.1:{port}"
    s.stop(0)


def test_call_returns_response(server):
    pool = ConnectionPool()
    assert pool.call(server, "Metadata", pb.MetadataRequest(), 5).controller_id == 7
    pool.close()


def test_status_with_code_becomes_that_error(server):
    pool = ConnectionPool()
    with pytest.raises(E.InvalidTopicError) as info:
        pool.call(server, "Metadata", pb.MetadataRequest(topics=["abort"]), 5)
    assert "not legal" in info.value.message
    with pytest.raises(E.ReplikafkaError) as info:
        pool.call(server, "Metadata", pb.MetadataRequest(topics=["plain"]), 5)
    assert not info.value.retriable and "something broke" in str(info.value)
    pool.close()


def test_deadline_becomes_request_timed_out(server):
    pool = ConnectionPool()
    with pytest.raises(E.RequestTimedOutError) as info:
        pool.call(server, "Metadata", pb.MetadataRequest(topics=["slow"]), 0.2)
    assert info.value.retriable
    pool.close()


def test_nothing_listening_is_broker_not_available():
    pool = ConnectionPool()
    with pytest.raises(E.BrokerNotAvailableError) as info:
        pool.call("127.0.0.1:1", "Metadata", pb.MetadataRequest(), 5)
    assert info.value.retriable
    pool.close()


def test_closed_pool_refuses_calls(server):
    pool = ConnectionPool()
    pool.close()
    with pytest.raises(E.ReplikafkaError):
        pool.call(server, "Metadata", pb.MetadataRequest(), 5)


def test_broker_info_names_each_listener():
    from replikafka.client.metadata import BrokerInfo
    b = BrokerInfo(1, "h", 9092, ("PLAINTEXT://h:9092", "FLIGHT://h:9192", "SSL://[::1]:9093"))
    assert b.target == "h:9092"
    assert b.listener("FLIGHT") == "h:9192" and b.listener("flight") == "h:9192"
    assert b.listener("SSL") == "[::1]:9093" and b.listener("SASL_SSL") is None
    assert BrokerInfo(2, "h", 1).listener("FLIGHT") is None


def test_metadata_attempt_budget_shares_the_time_left_among_untried_addresses():
    from replikafka.client.metadata import METADATA_ATTEMPT_MIN_S, METADATA_ATTEMPT_S, attempt_budget_s
    assert attempt_budget_s(30.0, 2, 30.0) == METADATA_ATTEMPT_S            # plenty of time: the bound
    assert attempt_budget_s(4.0, 2, 30.0) == 2.0                            # a fair share
    assert attempt_budget_s(4.0, 1, 30.0) == 4.0                            # the last address gets the rest
    assert attempt_budget_s(2.0, 8, 30.0) == METADATA_ATTEMPT_MIN_S         # never below the floor...
    assert attempt_budget_s(0.5, 8, 30.0) == 0.5                            # ...nor past the deadline
    assert attempt_budget_s(30.0, 1, 2.0) == 2.0                            # nor the request timeout
    assert attempt_budget_s(-1.0, 3, 30.0) == 0.0
