"""The metric registry wiring (broker/metrics.py), the HTTP port (broker/http_server.py),
the status page's pure parts (broker/status_page.py) and log levels (broker/log_levels.py)."""
from __future__ import annotations

import gc
import json
import logging
import urllib.error
import urllib.request
from types import SimpleNamespace

import pyarrow as pa
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from replikafka import errors as E
from replikafka.broker import log_levels
from replikafka.broker.config import BrokerConfig
from replikafka.broker.controller.controller_events import Elect
from replikafka.broker.controller.controller import Controller
from replikafka.broker.http_server import BrokerHttpServer
from replikafka.broker.metrics import (BrokerMetrics, ControllerCollector, ReplicaManagerCollector,
                                       ZooKeeperCollector, ZkSessionStats)
from replikafka.broker.replica.partition import Partition
from replikafka.broker import replica_rpc
from replikafka.broker.replica.replica_fetcher import ReplicaFetcherManager
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.status_page import (ClusterSnapshot, PartitionRow, Query, render_html,
                                           select_partitions)
from replikafka.broker.storage import Log, LogConfig, ManualClock
from replikafka.broker.zk_store import LeaderAndIsr
from replikafka.protocol import replikafka_pb2 as pb

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", TS)])
T0 = 1_700_000_000_000


def samples(registry) -> dict[str, dict[tuple, float]]:
    from prometheus_client import generate_latest
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def batch(n: int) -> pa.RecordBatch:
    return pa.record_batch([pa.array([b"v"] * n, pa.binary()), pa.array([T0] * n, pa.int64()).view(TS)],
                           schema=SCHEMA)


# ---------------------------------------------------------------- registries and counters
def test_each_broker_has_its_own_registry_and_the_default_one_is_untouched():
    before = {m.name for m in REGISTRY.collect()}
    a, b = BrokerMetrics(1), BrokerMetrics(2)
    a.replica_stats.produced("t", 100, 10)
    a.requests.observe("Produce", 0.002, "")
    assert samples(a.registry)["kafka_server_brokertopicmetrics_bytesin_total"] == {(("topic", "t"),): 100}
    assert "kafka_server_brokertopicmetrics_bytesin_total" not in samples(b.registry)
    assert "kafka_network_requestmetrics_requests_total" not in samples(b.registry)
    assert {m.name for m in REGISTRY.collect()} == before


def test_gc_pauses_count_each_generations_collections_and_their_seconds():
    a = BrokerMetrics(1)
    before = samples(a.registry)
    gc.collect(0)
    gc.collect()
    gc.collect()
    after = samples(a.registry)
    count, total = "python_gc_pause_seconds_count", "python_gc_pause_seconds_sum"
    young, full = (("generation", "0"),), (("generation", "2"),)
    assert after[count][full] == before[count][full] + 2
    assert after[count][young] >= before[count][young] + 1
    assert after[total][full] > before[total][full]
    assert after["python_gc_pause_seconds_max"][()] > 0
    # One callback per process, however many brokers it runs (tests run several).
    BrokerMetrics(2)
    assert sum(1 for cb in gc.callbacks if getattr(cb, "__self__", None).__class__.__name__ == "GcPauses") == 1


def test_request_metrics_count_requests_errors_by_code_and_latency_with_kafkas_request_names():
    m = BrokerMetrics(1)
    m.requests.observe("Produce", 0.003, "")
    m.requests.observe("Produce", 0.020, "NOT_LEADER_OR_FOLLOWER")
    m.requests.observe("ReplicaFetch", 0.5, "")
    m.requests.observe("Fetch", 0.001, "")
    m.observe_request("FlightDoGet", 0.004)
    s = samples(m.registry)
    req = s["kafka_network_requestmetrics_requests_total"]
    assert req[(("request", "Produce"),)] == 2
    assert req[(("request", "FetchFollower"),)] == 1
    assert req[(("request", "FetchConsumer"),)] == 1
    assert req[(("request", "FlightDoGet"),)] == 1
    assert s["kafka_network_requestmetrics_errors_total"] == {
        (("error", "NOT_LEADER_OR_FOLLOWER"), ("request", "Produce")): 1}
    hist = s["kafka_network_requestmetrics_totaltimems_bucket"]
    assert hist[(("le", "5.0"), ("request", "Produce"))] == 1       # 3 ms
    assert hist[(("le", "25.0"), ("request", "Produce"))] == 2      # and 20 ms
    assert s["kafka_network_requestmetrics_totaltimems_sum"][(("request", "Produce"),)] == pytest.approx(23)


def test_recording_off_counts_nothing_on_the_hot_paths():
    m = BrokerMetrics(1, recording=False)
    m.replica_stats.produced("t", 100, 10)
    m.replica_stats.fetched("t", 100, 10, follower=False)
    m.replica_stats.isr_changed(3, 2)
    m.requests.observe("Produce", 0.01, "")
    s = samples(m.registry)
    assert "kafka_server_brokertopicmetrics_bytesin_total" not in s
    assert "kafka_network_requestmetrics_requests_total" not in s


def test_zookeeper_session_state_and_expirations():
    stats = ZkSessionStats()
    state = ["CONNECTED"]
    m = BrokerMetrics(1)
    m.registry.register(ZooKeeperCollector(lambda: state[0], stats))
    stats.state_changed("SUSPENDED")
    stats.state_changed("LOST")
    state[0] = "LOST"
    s = samples(m.registry)
    assert s["kafka_server_sessionexpirelistener_sessionstate"] == {
        (("state", "CONNECTED"),): 0, (("state", "SUSPENDED"),): 0, (("state", "LOST"),): 1}
    assert s["kafka_server_sessionexpirelistener_zookeeperexpires_total"][()] == 1
    assert s["kafka_server_sessionexpirelistener_zookeeperdisconnects_total"][()] == 1


# ---------------------------------------------------------------- scrape-time gauges over real objects
def test_replica_manager_gauges_read_the_partitions_at_scrape_time(tmp_path):
    clock = ManualClock(T0)
    rm = ReplicaManager(1, None, None, None, None, None, clock)
    cfg = LogConfig(min_insync_replicas=2)
    led = Partition("t", 0, 1, Log.open(str(tmp_path / "t-0"), cfg, SCHEMA, clock=clock), clock)
    led.make_leader(1, isr=[1], replicas=[1, 2, 3], zk_version=0, controller_epoch=1)   # under-replicated, < min ISR
    led.append_as_leader([batch(7)], acks=1, min_insync=1, producer_id=5, producer_epoch=0, base_sequence=0)
    followed = Partition("t", 1, 1, Log.open(str(tmp_path / "t-1"), cfg, SCHEMA, clock=clock), clock)
    followed.make_follower(2, 1, isr=[2, 1], replicas=[2, 1], zk_version=0, controller_epoch=1)
    rm.partitions = {led.tp: led, followed.tp: followed}
    fetchers = ReplicaFetcherManager(1, 1, rm.get, lambda leader: None)
    m = BrokerMetrics(1)
    rm.stats = m.replica_stats
    m.registry.register(ReplicaManagerCollector(rm, fetchers))
    # Follower 2 fetched at 3 of the leader's 7 records; follower 3 never fetched (unknown, not counted).
    led.read_for_follower(2, 3, 1 << 20, -1)
    # As a follower of t-1 we hold 0 records and the leader's last answer said its LEO is 9.
    from replikafka.broker.replica.replica_fetcher import FetchState, ReplicaFetcher
    fetcher = ReplicaFetcher(1, 2, None, rm.get, max_wait_ms=0, min_bytes=1, max_bytes=1, backoff_ms=0,
                             request_timeout_s=1)
    fetcher.states[followed.tp] = FetchState(1, truncating=False, leader_log_end=9)
    fetchers.fetchers[(2, 0)] = fetcher
    s = samples(m.registry)
    assert s["kafka_server_replicafetchermanager_maxlag"][()] == 9
    assert s["kafka_server_replicamanager_partitioncount"][()] == 2
    assert s["kafka_server_replicamanager_leadercount"][()] == 1
    assert s["kafka_server_replicamanager_underreplicatedpartitions"][()] == 1
    assert s["kafka_server_replicamanager_underminisrpartitioncount"][()] == 1
    assert s["kafka_server_replicamanager_produceridcount"][()] == 1
    assert s["kafka_server_replicamanager_replicamaxlag"][()] == 4
    assert s["kafka_server_fetchsessioncache_numincrementalfetchsessions"][()] == 0
    rm.fetch_sessions.max_slots = 1
    rm.fetch_sessions.new_session(2, 20, {led.tp: None}, T0, 0)
    rm.fetch_sessions.new_session(3, 30, {led.tp: None, followed.tp: None}, T0, 0)   # evicts 2's
    s = samples(m.registry)
    assert s["kafka_server_fetchsessioncache_numincrementalfetchsessions"][()] == 1
    assert s["kafka_server_fetchsessioncache_numincrementalfetchpartitionscached"][()] == 2
    assert s["kafka_server_fetchsessioncache_incrementalfetchsessionevictions_total"][()] == 1
    assert s["kafka_log_log_logendoffset"][(("partition", "0"), ("topic", "t"))] == 7
    assert s["kafka_log_log_numlogsegments"][(("partition", "0"), ("topic", "t"))] == 1
    assert s["kafka_log_log_size"][(("partition", "0"), ("topic", "t"))] > 0
    # The replica manager's own hot paths feed the counters.
    rm.stats.isr_changed(3, 1)
    rm.stats.isr_changed(1, 2)
    rm.stats.isr_changed(2, 3)
    s = samples(m.registry)
    assert s["kafka_server_replicamanager_isrshrinks_total"][()] == 1
    assert s["kafka_server_replicamanager_isrexpands_total"][()] == 2
    resp = replica_rpc.fetch(rm, pb.FetchRequest(replica_id=-1, partitions=[pb.FetchPartition(
        topic="t", partition=0, fetch_offset=0, current_leader_epoch=-1, partition_max_bytes=1 << 20)]))
    # The ISR is the leader alone: HW = LEO = 7, all of it readable.
    assert resp.partitions[0].record_count == 7
    s = samples(m.registry)
    assert s["kafka_server_brokertopicmetrics_messagesout_total"][(("topic", "t"),)] == 7
    assert s["kafka_server_brokertopicmetrics_bytesout_total"][(("topic", "t"),)] == len(resp.partitions[0].records)


def test_controller_gauges_only_on_the_active_controller():
    c = Controller(1, SimpleNamespace(zk=None))
    m = BrokerMetrics(1)
    m.registry.register(ControllerCollector(c))
    c.ctx.states = {("t", 0): (LeaderAndIsr(1, 0, (1, 2), 1), 0), ("t", 1): (LeaderAndIsr(-1, 3, (3,), 1), 0),
                    ("t", 2): (LeaderAndIsr(3, 0, (3,), 1), 0)}
    c.ctx.live = {1: ("h", 1), 2: ("h", 2)}
    s = samples(m.registry)
    assert s["kafka_controller_kafkacontroller_activecontrollercount"][()] == 0
    assert s["kafka_controller_kafkacontroller_offlinepartitionscount"][()] == 0
    c.active = True
    s = samples(m.registry)
    assert s["kafka_controller_kafkacontroller_activecontrollercount"][()] == 1
    assert s["kafka_controller_kafkacontroller_globalpartitioncount"][()] == 3
    assert s["kafka_controller_kafkacontroller_offlinepartitionscount"][()] == 2   # no leader; leader 3 is dead
    c.enqueue(Elect())
    assert samples(m.registry)["kafka_controller_controllereventmanager_eventqueuesize"][()] == 1
    c.stats.elections([1, 2, -1], [1, 3, 2])
    c.stats.unclean_election()
    c.stats.event_done(0.001, 0.2)
    s = samples(m.registry)
    assert s["kafka_controller_controllerstats_leaderelections_total"][()] == 2
    assert s["kafka_controller_controllerstats_uncleanleaderelections_total"][()] == 1
    assert s["kafka_controller_controllereventmanager_eventqueueprocessingtimems_count"][()] == 1


# ---------------------------------------------------------------- the status page's pure parts
def rows() -> list[PartitionRow]:
    return [PartitionRow("orders", 0, 1, [1, 2, 3], [1, 2, 3], 0, 2),
            PartitionRow("orders", 1, 2, [2, 3, 1], [2, 1], 1, 2, detail={"hw": 10, "leo": 12, "log_start": 0,
                                                                              "followers": {"1": 9, "3": 4}}),
            PartitionRow("orders", 2, -1, [3], [3], 2, 1, offline=True),
            PartitionRow("clicks", 0, 1, [1, 2], [1], 0, 2)]


def test_select_filters_by_state_and_topic_and_pages():
    assert [(r.topic, r.partition) for r in select_partitions(rows(), Query(state="under-replicated"))[0]] == \
        [("orders", 1), ("orders", 2), ("clicks", 0)]
    assert [r.partition for r in select_partitions(rows(), Query(state="offline"))[0]] == [2]
    assert [r.topic for r in select_partitions(rows(), Query(state="under-min-isr"))[0]] == ["clicks"]
    assert len(select_partitions(rows(), Query(topic="ord"))[0]) == 3
    page, matched = select_partitions(rows(), Query(page=2, size=3))
    assert matched == 4 and [(r.topic, r.partition) for r in page] == [("clicks", 0)]


def test_query_parsing_falls_back_to_defaults_on_bad_values():
    q = Query.parse("state=bogus&page=-3&size=99999&refresh=x&topic=%20a%20")
    assert (q.state, q.page, q.size, q.refresh_s, q.topic) == ("all", 1, 1000, 5, "a")


def test_render_highlights_and_shows_follower_lag():
    snap = ClusterSnapshot(1, 2, {1: "h:1", 2: "h:2"}, rows(), {("orders", 0): [1, 2, 4]})
    q = Query(size=2)
    page, matched = select_partitions(snap.rows, q)
    text = render_html(snap, q, page, matched)
    assert "<tr class='under-replicated' data-topic='orders' data-partition='1'" in text
    assert "1: 1, 3: 6" in text                       # HW 10 minus each follower's fetch offset
    assert "id='under-replicated-count'>2<" in text and "id='offline-count'>1<" in text
    assert "data-broker='3'><td>3</td><td>-</td><td>offline</td>" in text    # not registered
    assert "<td>orders-0</td><td>1,2,4</td>" in text                          # a reassignment
    assert "page 1 of 2" in text and "id='next'" in text and "id='prev'" not in text
    assert "http-equiv='refresh' content='5'" in text
    assert "<script" not in render_html(ClusterSnapshot(1, 1, {}, [PartitionRow("<script>", 0, 1, [1], [1], 0, 1)]),
                                        Query(), [PartitionRow("<script>", 0, 1, [1], [1], 0, 1)], 1)


# ---------------------------------------------------------------- the HTTP port and log levels
@pytest.fixture
def http():
    m = BrokerMetrics(7)
    m.replica_stats.produced("t", 5, 1)
    server = BrokerHttpServer("127.0.0.1", 0, m.registry, local_replicas=lambda tps: {"asked": tps}).start()
    yield server
    server.stop()
    logging.getLogger("replikafka.test.http").setLevel(logging.NOTSET)


def get(url, data=None):
    try:
        with urllib.request.urlopen(url, data=data, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_http_port_serves_metrics_replicas_and_changes_log_levels(http):
    status, text = get(http.url + "/metrics")
    assert status == 200 and 'kafka_server_brokertopicmetrics_bytesin_total{topic="t"} 5.0' in text
    assert json.loads(get(http.url + "/replicas.json?tp=a:1&tp=bad")[1]) == {"asked": [["a", 1]]}
    status, body = get(http.url + "/loggers", b"logger=replikafka.test.http&level=DEBUG")
    assert status == 200 and json.loads(body) == {"logger": "replikafka.test.http", "level": "DEBUG"}
    assert logging.getLogger("replikafka.test.http").level == logging.DEBUG
    assert json.loads(get(http.url + "/loggers")[1])["replikafka.test.http"] == "DEBUG"
    status, body = get(http.url + "/loggers", b"logger=replikafka.test.http&level=LOUD")
    assert status == 400 and "unknown log level 'LOUD'" in body
    assert get(http.url + "/loggers", b"level=INFO")[0] == 400
    assert get(http.url + "/nope")[0] == 404
    assert get(http.url + "/")[0] == 404          # no status view given


def test_http_port_authentication_and_authorization_hooks(http):
    def authenticate(environ):
        if environ.get("HTTP_AUTHORIZATION") != "Bearer ok":
            raise E.AuthenticationError("no credentials")
        return "User:ops"
    def authorize(principal, environ):
        if environ["REQUEST_METHOD"] == "POST" and principal != "User:admin":
            raise E.ClusterAuthorizationFailedError(f"{principal} is not allowed Alter on Cluster")
    http.authenticate = authenticate
    http.authorize = authorize
    assert get(http.url + "/metrics")[0] == 401
    req = urllib.request.Request(http.url + "/metrics", headers={"Authorization": "Bearer ok"})
    assert get(req)[0] == 200
    req = urllib.request.Request(http.url + "/loggers", data=b"logger=x&level=INFO",
                                 headers={"Authorization": "Bearer ok"})
    assert get(req) == (403, "User:ops is not allowed Alter on Cluster\n")


def test_log_levels_from_config():
    cfg = BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "z:1", "log.level": "WARN",
                                  "log.level.replikafka.test.cfg": "trace"})
    root = logging.getLogger().level
    try:
        log_levels.apply(cfg)
        assert logging.getLogger().level == logging.WARNING
        assert logging.getLogger("replikafka.test.cfg").level == logging.DEBUG
        assert cfg.with_overrides(["log.level.replikafka.test.cfg=ERROR"]).logger_levels() == \
            {"replikafka.test.cfg": "ERROR"}
    finally:
        logging.getLogger().setLevel(root)
        logging.getLogger("replikafka.test.cfg").setLevel(logging.NOTSET)
    with pytest.raises(E.InvalidConfigError, match="log.level.x"):
        BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "z:1", "log.level.x": "LOUD"})
    with pytest.raises(E.InvalidConfigError, match="metrics.listener"):
        BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "z:1", "metrics.listener": "tcp://h:1"})


# ---------------------------------------------------------------- one log line per request at scale
def test_stop_replica_for_thousands_of_partitions_logs_one_line_per_request(caplog):
    from replikafka.broker.state_change_log import LOGGER_NAME
    fetchers = ReplicaFetcherManager(1, 1, lambda tp: None, lambda leader: None)
    rm = ReplicaManager(1, None, None, None, None, fetchers, ManualClock(T0))
    req = pb.StopReplicaRequest(controller_id=2, controller_epoch=3, delete_partitions=False, partitions=[
        pb.TopicPartitionRef(topic="t", partition=p) for p in range(5000)])
    with caplog.at_level(logging.INFO):
        replica_rpc.stop_replica(rm, req)
    broker_lines = [r for r in caplog.records if r.name == "replikafka.replica_manager"]
    state_records = [r for r in caplog.records if r.name == LOGGER_NAME]
    assert len(broker_lines) == 1 and "5000 partitions" in broker_lines[0].getMessage()
    assert len(state_records) == 1                                   # one record, a line per partition in the file
    assert state_records[0].getMessage().count("\n") == 4999


def test_open_partitions_gauges_follow_the_cap_on_open_logs(tmp_path):
    from replikafka.broker.metrics import OpenLogsCollector
    from replikafka.broker.storage import LogManager
    clock = ManualClock(T0)
    lm = LogManager([str(tmp_path)], LogConfig(), clock=clock, open_logs_max=2)
    m = BrokerMetrics(1)
    m.registry.register(OpenLogsCollector(lm.open_logs))
    for p in range(3):
        clock.advance(1)
        lm.get_or_create_log("t", p, SCHEMA).append([batch(1)], leader_epoch=0)
    s = samples(m.registry)
    assert s["replikafka_log_openpartitionsmax"][()] == 2
    assert s["replikafka_log_openpartitions"][()] == 1       # the third use dropped to 90% of the cap
    assert s["replikafka_log_openpartitionsreleased_total"][()] == 2
    lm.close()
