"""Monitoring against real broker processes (issue 15): Prometheus metrics with
Kafka's names on every broker's HTTP port, and the cluster status page loaded
in a real headless Chromium."""
from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
import time
import urllib.request

import grpc
import pyarrow.flight as fl
import pytest
from prometheus_client.parser import text_string_to_metric_families

import replikafka
from cluster_helpers import kafka_batch, wait_until
from replikafka import records as R
from replikafka.client.connection import ConnectionPool, parse_bootstrap
from replikafka.client.metadata import ClusterMetadata
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

pytestmark = pytest.mark.integration


def scrape(cluster, broker_id) -> dict[str, dict[tuple, float]]:
    """``{sample name: {sorted label items: value}}`` from the broker's /metrics."""
    with urllib.request.urlopen(cluster.metrics_url(broker_id) + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def value(cluster, broker_id, name, **labels) -> float:
    return scrape(cluster, broker_id).get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def total(cluster, brokers, name, **labels) -> float:
    return sum(value(cluster, b, name, **labels) for b in brokers)


def test_broker_kill_moves_under_replicated_and_offline_counts_as_kafka(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("replicated", partitions=4, replication_factor=3)
    admin.create_topic("single", partitions=9, replication_factor=1)
    controller = cluster.controller_id()
    single = admin.describe_topic("single").partitions
    # The non-controller with the most RF=1 partitions (the assignment is random).
    victim = max((b for b in cluster.ids if b != controller),
                 key=lambda b: sum(list(p.replicas) == [b] for p in single))
    survivors = [b for b in cluster.ids if b != victim]
    alone_on_victim = sum(1 for p in single if list(p.replicas) == [victim])
    assert alone_on_victim >= 1, "no RF=1 partition on a non-controller broker"

    wait_until(lambda: total(cluster, cluster.ids, "kafka_controller_kafkacontroller_globalpartitioncount") == 13,
               30, what="the controller to count 13 partitions")
    assert total(cluster, cluster.ids, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert value(cluster, controller, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert total(cluster, cluster.ids, "kafka_server_replicamanager_underreplicatedpartitions") == 0
    assert total(cluster, cluster.ids, "kafka_controller_kafkacontroller_offlinepartitionscount") == 0
    assert total(cluster, cluster.ids, "kafka_server_replicamanager_partitioncount") == 4 * 3 + 9
    assert total(cluster, cluster.ids, "kafka_server_replicamanager_leadercount") == 13

    cluster.kill(victim)
    # Kafka: every RF=3 partition is under-replicated at its (surviving) leader; the
    # RF=1 partitions of the dead broker are offline, counted by the controller only.
    wait_until(lambda: total(cluster, survivors, "kafka_server_replicamanager_underreplicatedpartitions") == 4,
               30, what="4 under-replicated partitions on the survivors")
    wait_until(lambda: total(cluster, survivors, "kafka_controller_kafkacontroller_offlinepartitionscount")
               == alone_on_victim, 30, what="offline partitions counted")
    assert value(cluster, controller, "kafka_controller_kafkacontroller_offlinepartitionscount") == alone_on_victim
    assert total(cluster, survivors, "kafka_controller_kafkacontroller_activecontrollercount") == 1
    assert total(cluster, survivors, "kafka_server_replicamanager_leadercount") == 13 - alone_on_victim
    assert value(cluster, controller, "kafka_controller_controllerstats_leaderelections_total") >= 1
    assert value(cluster, controller, "kafka_controller_controllerstats_uncleanleaderelections_total") == 0
    admin.close()


def test_isr_shrink_and_expand_counters_move_when_a_follower_pauses(cluster_factory):
    cluster = cluster_factory(3, zookeeper_session_timeout_ms=30000, replica_lag_time_max_ms=2000)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("lag", partitions=1, replication_factor=3)
    leader = admin.describe_topic("lag").partitions[0].leader
    slow = next(b for b in cluster.ids if b != leader)
    assert value(cluster, leader, "kafka_server_replicamanager_isrshrinks_total") == 0
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:   # every follower has fetched
        prod.send("lag", kafka_batch([b"first"])).result(timeout=30)
    # Bootstrapped at the leader: a new client must not pick the paused broker to learn the cluster from.
    with replikafka.Producer(cluster.address(leader), acks="1") as prod:
        prod.send("lag", kafka_batch([b"second"])).result(timeout=30)
        cluster.pause(slow)
        try:
            deadline = time.time() + 30
            lag_seen = 0.0   # the paused follower's lag, while the leader still tracks its position
            while True:
                metrics = scrape(cluster, leader)
                if metrics["kafka_server_replicamanager_isrshrinks_total"][()] >= 1:
                    break
                lag_seen = max(lag_seen, metrics["kafka_server_replicamanager_replicamaxlag"][()])
                assert time.time() < deadline, "ISR shrink not counted"
                prod.send("lag", kafka_batch([b"x" * 64] * 50)).result(timeout=30)
                time.sleep(0.1)
            assert lag_seen >= 50
            assert value(cluster, leader, "kafka_server_replicamanager_underreplicatedpartitions") == 1
        finally:
            cluster.resume(slow)
    wait_until(lambda: value(cluster, leader, "kafka_server_replicamanager_isrexpands_total") >= 1, 30,
               what="ISR expand counted")
    wait_until(lambda: value(cluster, leader, "kafka_server_replicamanager_underreplicatedpartitions") == 0, 30,
               what="no under-replicated partition")
    admin.close()


def test_zookeeper_session_state_and_expirations_follow_a_real_session_expiry(cluster_factory):
    """SessionExpireListener: a broker paused past its ZooKeeper session timeout comes
    back to an expired session (LOST), counts the expiration and the disconnect,
    re-registers, and reports CONNECTED again."""
    cluster = cluster_factory(1)
    (b,) = cluster.ids
    # Registered is not yet started: pause it only once start-up is over.
    wait_until(lambda: "serving on" in cluster.tail(b, 200), 30, what="the broker to finish starting")
    state = "kafka_server_sessionexpirelistener_sessionstate"
    expires = "kafka_server_sessionexpirelistener_zookeeperexpires_total"
    disconnects = "kafka_server_sessionexpirelistener_zookeeperdisconnects_total"
    m = scrape(cluster, b)
    assert {k[0][1]: v for k, v in m[state].items()} == {"CONNECTED": 1, "SUSPENDED": 0, "LOST": 0}
    assert m[expires][()] == 0 and m[disconnects][()] == 0
    zk = cluster.zk()
    try:
        before = zk.get(f"/brokers/ids/{b}")[1].czxid
        cluster.pause(b)
        try:   # the server expires the session and deletes the ephemeral registration
            wait_until(lambda: zk.exists(f"/brokers/ids/{b}") is None, 30, what="the session to expire")
        finally:
            cluster.resume(b)

        def registered_again():
            stat = zk.exists(f"/brokers/ids/{b}")
            return stat is not None and stat.czxid != before
        wait_until(registered_again, 30, what="the broker to re-register")
    finally:
        zk.stop()
        zk.close()
    wait_until(lambda: scrape(cluster, b)[expires][()] >= 1, 30, what="the expiration counted")
    m = scrape(cluster, b)
    assert m[disconnects][()] >= 1
    assert {k[0][1]: v for k, v in m[state].items()} == {"CONNECTED": 1, "SUSPENDED": 0, "LOST": 0}


def hosted(cluster, broker_id: int, tp: str) -> bool:
    with urllib.request.urlopen(f"{cluster.metrics_url(broker_id)}/replicas.json?tp={tp}", timeout=10) as r:
        return json.loads(r.read()).get(tp, {}).get("role") == "leader"


def test_per_topic_byte_and_message_counters_match_what_was_produced_and_fetched(cluster_factory):
    cluster = cluster_factory(2)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("bytes", partitions=2, replication_factor=2)
    parts = admin.describe_topic("bytes").partitions
    for p in parts:     # CreateTopic returns once the controller decided; the leader takes it up next
        wait_until(lambda: hosted(cluster, p.leader, f"bytes:{p.partition}"), 30,
                   what=f"broker {p.leader} hosting bytes-{p.partition}")
    produced_bytes = produced_records = 0
    for p in parts:
        with grpc.insecure_channel(cluster.address(p.leader)) as ch:
            stub = pbg.ReplikafkaStub(ch)
            for i in range(3):
                batch = R.to_record_batch([{"value": f"{p.partition}-{i}-{j}".encode() * (i + 1)}
                                           for j in range(10 + i)], R.KAFKA_SCHEMA, timestamp_ms=R.now_ms())
                records = R.encode_stream(batch.schema, [batch]).to_pybytes()
                resp = stub.Produce(pb.ProduceRequest(acks=-1, timeout_ms=10000, partitions=[
                    pb.PartitionProduceData(topic="bytes", partition=p.partition, records=records,
                                            records_crc32c=R.records_crc32c(records))]), timeout=30)
                assert not resp.partitions[0].error.code, resp
                produced_bytes += len(records)
                produced_records += batch.num_rows
    assert total(cluster, cluster.ids, "kafka_server_brokertopicmetrics_bytesin_total", topic="bytes") \
        == produced_bytes
    assert total(cluster, cluster.ids, "kafka_server_brokertopicmetrics_messagesin_total", topic="bytes") \
        == produced_records
    fetched_bytes = fetched_records = 0
    for p in parts:
        with grpc.insecure_channel(cluster.address(p.leader)) as ch:
            resp = pbg.ReplikafkaStub(ch).Fetch(pb.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1 << 20,
                                                                partitions=[pb.FetchPartition(
                                                                    topic="bytes", partition=p.partition,
                                                                    fetch_offset=0, current_leader_epoch=-1,
                                                                    partition_max_bytes=1 << 20)]), timeout=30)
            r = resp.partitions[0]
            assert not r.error.code, resp
            fetched_bytes += len(r.records)
            fetched_records += r.record_count
    assert fetched_records == produced_records
    assert total(cluster, cluster.ids, "kafka_server_brokertopicmetrics_bytesout_total", topic="bytes") \
        == fetched_bytes
    assert total(cluster, cluster.ids, "kafka_server_brokertopicmetrics_messagesout_total", topic="bytes") \
        == fetched_records
    # Followers fetched every stored batch: the leaders counted replication bytes.
    assert total(cluster, cluster.ids, "kafka_server_brokertopicmetrics_replicationbytesout_total",
                 topic="bytes") > 0
    # Per-RPC request metrics, through the RPC pipeline's observer.
    leader = parts[0].leader
    with grpc.insecure_channel(cluster.address(leader)) as ch:
        with pytest.raises(grpc.RpcError):
            pbg.ReplikafkaStub(ch).Produce(pb.ProduceRequest(acks=5), timeout=30)
    m = scrape(cluster, leader)
    assert m["kafka_network_requestmetrics_errors_total"][(("error", "INVALID_REQUEST"), ("request", "Produce"))] == 1
    assert total(cluster, cluster.ids, "kafka_network_requestmetrics_requests_total", request="Produce") == 6 + 1
    assert total(cluster, cluster.ids, "kafka_network_requestmetrics_requests_total", request="FetchConsumer") == 2
    assert total(cluster, cluster.ids, "kafka_network_requestmetrics_totaltimems_count", request="Produce") == 6 + 1
    for b in cluster.ids:
        m = scrape(cluster, b)
        assert m["kafka_network_requestmetrics_requests_total"][(("request", "FetchFollower"),)] > 0
        assert m["kafka_network_requestmetrics_requests_total"][(("request", "LeaderAndIsr"),)] >= 1
    # Arrow Flight reads report through the same request metrics (middleware on the Flight server).
    c = replikafka.Consumer(cluster.bootstrap_servers, use_flight=True)
    c.assign([("bytes", p.partition) for p in parts])
    for p in parts:
        c.seek(("bytes", p.partition), 0)
    got, deadline = 0, time.time() + 30
    while got < produced_records and time.time() < deadline:
        got += c.poll(timeout_ms=1000).num_rows
    c.close()
    assert got == produced_records
    assert total(cluster, cluster.ids, "kafka_network_requestmetrics_requests_total", request="FlightDoGet") >= 2
    meta = ClusterMetadata(ConnectionPool(), parse_bootstrap(cluster.bootstrap_servers), request_timeout_ms=10_000,
                           retry_backoff_ms=100)
    meta.refresh(all_topics=True)
    flight_at = meta.broker(leader).listener("FLIGHT")
    client = fl.connect(f"grpc+tcp://{flight_at}")
    with pytest.raises(fl.FlightError):
        client.do_get(fl.Ticket(b"\x00garbage")).read_all()
    client.close()
    assert value(cluster, leader, "kafka_network_requestmetrics_errors_total", request="FlightDoGet",
                 error="INVALID_REQUEST") == 1
    # Log levels at runtime over the HTTP port.
    req = urllib.request.Request(cluster.metrics_url(leader) + "/loggers",
                                 data=b"logger=replikafka.controller&level=DEBUG")
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert json.loads(resp.read()) == {"logger": "replikafka.controller", "level": "DEBUG"}
    with urllib.request.urlopen(cluster.metrics_url(leader) + "/loggers", timeout=10) as resp:
        assert json.loads(resp.read())["replikafka.controller"] == "DEBUG"
    # Per-partition log gauges: every replica holds the same records.
    for b in cluster.ids:
        for p in parts:
            wait_until(lambda: value(cluster, b, "kafka_log_log_logendoffset", topic="bytes",
                                     partition=str(p.partition)) == 10 + 11 + 12, 10, what="replica LEO")
            assert value(cluster, b, "kafka_log_log_numlogsegments", topic="bytes", partition=str(p.partition)) == 1
            assert value(cluster, b, "kafka_log_log_size", topic="bytes", partition=str(p.partition)) > 0
    admin.close()


# ---------------------------------------------------------------- the status page in Chromium
def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "Chromium is not installed: `./build.sh setup` installs Debian's chromium package"
    return path


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                  "--no-first-run", "--disable-extensions"]


def run_chromium(args: list[str], profile_dir: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile_dir}", *args],
                          capture_output=True, timeout=120)


class _Rows(html.parser.HTMLParser):
    """The status page's partition rows (``tr`` with ``data-topic``) and the summary counts."""

    def __init__(self):
        super().__init__()
        self.rows: dict[tuple[str, int], str] = {}
        self.ids: dict[str, str] = {}
        self._in_id = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-topic" in a:
            self.rows[(a["data-topic"], int(a["data-partition"]))] = a.get("class", "")
        if "id" in a:
            self._in_id = a["id"]

    def handle_data(self, data):
        if self._in_id and data.strip():
            self.ids.setdefault(self._in_id, data.strip())

    def handle_endtag(self, tag):
        self._in_id = None


def test_status_page_in_headless_chromium_shows_a_killed_brokers_partitions_under_replicated(cluster_factory,
                                                                                            tmp_path):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("orders", partitions=6, replication_factor=3)
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:
        for p in range(6):
            prod.send("orders", kafka_batch([b"v" * 32] * (10 * (p + 1))), partition=p).result(timeout=30)
    controller = cluster.controller_id()
    victim = next(b for b in cluster.ids if b != controller)
    led = {("orders", p.partition) for p in admin.describe_topic("orders").partitions if p.leader == victim}
    assert led, "the victim should lead some partitions"
    cluster.kill(victim)
    wait_until(lambda: all(victim not in p.isr and p.leader != victim
                           for p in admin.describe_topic("orders").partitions), 30, what="new leaders")
    survivor = controller
    url = cluster.metrics_url(survivor) + "/?refresh=0"
    profile = str(tmp_path / "chromium-profile")

    def dom():
        done = run_chromium(["--dump-dom", url], profile)
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        rows = _Rows()
        rows.feed(done.stdout.decode())
        return rows

    rows = wait_until(lambda: (lambda r: r if all("under-replicated" in r.rows.get(tp, "") for tp in led)
                               else None)(dom()), 60, interval_s=1, what="the page to show the victim's partitions")
    assert set(rows.rows) == {("orders", p) for p in range(6)}
    for tp in led:
        assert "under-replicated" in rows.rows[tp], rows.rows
    assert rows.ids["under-replicated-count"] == "6"     # RF=3 on 3 brokers: every partition lost a replica
    assert rows.ids["offline-count"] == "0"
    assert rows.ids["controller"] == str(controller)
    shot = tmp_path / "status-page.png"
    done = run_chromium([f"--screenshot={shot}", "--window-size=1400,1000", url], profile)
    assert done.returncode == 0 and shot.exists() and shot.stat().st_size > 10_000, done.stderr[-2000:]
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("REPLIKAFKA_STATUS_SCREENSHOT"):   # how docs/status-page.png was made
        shutil.copy(shot, os.environ["REPLIKAFKA_STATUS_SCREENSHOT"])
    admin.close()
