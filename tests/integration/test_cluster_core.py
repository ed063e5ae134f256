"""Cluster core against real processes: ZooKeeper, 3 brokers, gRPC on loopback."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import grpc
import pyarrow as pa
import pytest

import replikafka
from cluster_helpers import wait_until
from replikafka import errors as E
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

pytestmark = pytest.mark.integration


def values_batch(values: list[bytes]) -> pa.RecordBatch:
    n = len(values)
    return pa.record_batch([pa.array([None] * n, pa.binary()), pa.array(values, pa.binary()),
                            pa.array([None] * n, replikafka.records.HEADER_TYPE)],
                           names=["key", "value", "headers"])


def consume_all(bs, topic, partitions, expected_count, timeout_s=30):
    c = replikafka.Consumer(bs)
    c.assign([(topic, p) for p in range(partitions)])
    for p in range(partitions):
        c.seek((topic, p), 0)
    tables = []
    got = 0
    deadline_polls = int(timeout_s * 10)
    for _ in range(deadline_polls):
        t = c.poll(timeout_ms=100)
        if t.num_rows:
            tables.append(t)
            got += t.num_rows
        if got >= expected_count:
            break
    c.close()
    return pa.concat_tables(tables) if tables else None


def test_create_produce_consume_describe_across_three_brokers(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("events", partitions=3, replication_factor=3)
    parts = admin.describe_topic("events").partitions
    assert len(parts) == 3
    leaders = {p.leader for p in parts}
    assert leaders == {1, 2, 3}, "leaders are spread over the brokers"
    for p in parts:
        assert sorted(p.replicas) == [1, 2, 3]
        assert p.leader == p.replicas[0]

    sent = [f"v{i}".encode() for i in range(3000)]
    with replikafka.Producer(bs, acks="all") as prod:
        futs = [prod.send("events", values_batch(sent[i:i + 500]), partition=(i // 500) % 3)
                for i in range(0, 3000, 500)]
        metas = [f.result(timeout=30) for f in futs]
    assert sum(m.record_count for m in metas) == 3000
    # Offsets handed out per partition are dense and increasing.
    for part in range(3):
        offs = sorted(m.base_offset for m in metas if m.partition == part)
        assert offs == [0, 500]

    table = consume_all(bs, "events", 3, 3000)
    assert table is not None and table.num_rows == 3000
    assert sorted(table.column("value").to_pylist()) == sorted(sent)
    assert set(table.column_names) >= {"key", "value", "topic", "partition", "offset", "timestamp"}

    # Replication: every follower catches up and the ISR is all three.
    wait_until(lambda: all(sorted(p.isr) == [1, 2, 3] for p in admin.describe_topic("events").partitions),
               30, what="full ISR")
    for p in admin.describe_topic("events").partitions:
        assert p.high_watermark == 1000 and p.log_end_offset == 1000
    admin.close()


def _cli(*args, stdin=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "replikafka", *args], input=stdin, capture_output=True,
                          text=True, timeout=timeout)


def test_cli_topics_console_producer_and_consumer(cluster3):
    bs = cluster3.bootstrap_servers
    r = _cli("topics", "--bootstrap-server", bs, "--create", "--topic", "cli-t", "--partitions", "2",
             "--replication-factor", "3")
    assert r.returncode == 0, r.stderr
    r = _cli("topics", "--bootstrap-server", bs, "--list")
    assert "cli-t" in r.stdout.split()
    r = _cli("topics", "--bootstrap-server", bs, "--describe", "--topic", "cli-t")
    assert r.returncode == 0, r.stderr
    assert "Leader:" in r.stdout and "Replicas:" in r.stdout and "Isr:" in r.stdout
    lines = [f"line-{i}" for i in range(50)]
    r = _cli("console-producer", "--bootstrap-server", bs, "--topic", "cli-t", stdin="\n".join(lines) + "\n")
    assert r.returncode == 0, r.stderr
    r = _cli("console-consumer", "--bootstrap-server", bs, "--topic", "cli-t", "--from-beginning",
             "--max-messages", "50", "--timeout-ms", "20000")
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == sorted(lines)
    # A bad flag combination: one line naming the problem, no traceback.
    r = _cli("topics", "--bootstrap-server", bs, "--create", "--topic", "x", "--partitions", "0",
             "--replication-factor", "1")
    assert r.returncode != 0 and "Traceback" not in r.stderr and "partition" in r.stderr.lower()


def _controller_epoch(cluster) -> int:
    zk = cluster.zk()
    try:
        return int(zk.get("/controller_epoch")[0])
    finally:
        zk.stop()
        zk.close()


def test_controller_moves_when_its_broker_is_killed_and_stale_epochs_are_refused(cluster3):
    old = wait_until(lambda: cluster3.controller_id() if cluster3.controller_id() > 0 else None,
                     what="a controller")
    old_epoch = _controller_epoch(cluster3)
    cluster3.kill(old)
    new = wait_until(lambda: (c := cluster3.controller_id()) > 0 and c != old and c, 30, what="a new controller")
    assert new != old
    new_epoch = wait_until(lambda: (e := _controller_epoch(cluster3)) > old_epoch and e, what="a higher epoch")
    assert new_epoch > old_epoch
    # Let the new controller's requests reach the other broker, then play a stale controller.
    survivor = next(b for b in cluster3.ids if b not in (old, new))
    admin = replikafka.Admin(cluster3.address(survivor))
    admin.create_topic("after-failover", partitions=1, replication_factor=2)
    with grpc.insecure_channel(cluster3.address(survivor)) as ch:
        stub = pbg.ReplikafkaStub(ch)
        resp = stub.LeaderAndIsr(pb.LeaderAndIsrRequest(controller_id=old, controller_epoch=old_epoch,
                                                        partitions=[]), timeout=10)
        assert resp.error.code == "STALE_CONTROLLER_EPOCH"
        resp = stub.StopReplica(pb.StopReplicaRequest(controller_id=old, controller_epoch=old_epoch,
                                                      delete_partitions=True, partitions=[
                                                          pb.TopicPartitionRef(topic="after-failover", partition=0)]),
                                timeout=10)
        assert resp.error.code == "STALE_CONTROLLER_EPOCH"
    # The stale StopReplica deleted nothing: the topic still takes writes.
    with replikafka.Producer(cluster3.address(survivor), acks="all") as prod:
        assert prod.send("after-failover", b"still here").result(timeout=30).base_offset == 0
    admin.close()


def test_delete_and_recreate_topic_brings_no_old_data_back(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("recycled", partitions=2, replication_factor=3)
    with replikafka.Producer(bs, acks="all") as prod:
        for p in range(2):
            prod.send("recycled", values_batch([b"old"] * 100), partition=p).result(timeout=30)
    admin.delete_topic("recycled")
    assert "recycled" not in admin.list_topics()
    for bid in cluster3.ids:
        d = os.path.join(cluster3.base_dir, f"broker-{bid}-logs")
        assert not [x for x in os.listdir(d) if x.startswith("recycled-")], f"broker {bid} kept the old dirs"
    admin.create_topic("recycled", partitions=2, replication_factor=3)
    with replikafka.Producer(bs, acks="all") as prod:
        prod.send("recycled", values_batch([b"new"] * 3), partition=0).result(timeout=30)
    table = consume_all(bs, "recycled", 2, 3, timeout_s=5)
    assert table.column("value").to_pylist() == [b"new"] * 3
    admin.close()


def test_bad_input_gets_clear_errors_and_the_broker_keeps_serving(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("typed", partitions=1, replication_factor=3, schema="id BIGINT, name STRING")
    good = pa.record_batch([pa.array([1, 2], pa.int64()), pa.array(["a", "b"])], names=["id", "name"])
    with replikafka.Producer(bs, acks="all") as prod:
        assert prod.send("typed", good).result(timeout=30).record_count == 2
        # Wrong schema: the error names the column.
        bad = pa.record_batch([pa.array(["x"]), pa.array(["a"])], names=["id", "name"])
        with pytest.raises(E.InvalidSchemaError, match="'id'"):
            prod.send("typed", bad).result(timeout=30)
        with pytest.raises(E.UnknownTopicOrPartitionError, match="nope"):
            prod.send("nope", b"x").result(timeout=30)
    with pytest.raises(E.InvalidPartitionsError):
        admin.create_topic("zero", partitions=0, replication_factor=1)
    with pytest.raises(E.InvalidPartitionsError):
        admin.create_topic("neg", partitions=-3, replication_factor=1)
    with pytest.raises(E.InvalidReplicationFactorError, match="larger than"):
        admin.create_topic("toomany", partitions=1, replication_factor=4)
    with pytest.raises(E.InvalidTopicError):
        admin.create_topic("bad name!", partitions=1, replication_factor=1)
    with pytest.raises(E.InvalidSchemaError):
        admin.create_topic("badschema", partitions=1, replication_factor=1, schema="a NOTATYPE")
    # Oversize batch, sent straight to the leader so the client cannot split it.
    leader = admin.describe_topic("typed").partitions[0].leader
    huge = pa.record_batch([pa.array(range(300_000), pa.int64()), pa.array(["y" * 10] * 300_000)],
                           names=["id", "name"])
    huge = huge.append_column(replikafka.records.TIMESTAMP_FIELD,
                              pa.array([0] * huge.num_rows, pa.int64()).cast(replikafka.records.TIMESTAMP_TYPE))
    with grpc.insecure_channel(cluster3.address(leader), options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        stub = pbg.ReplikafkaStub(ch)
        resp = stub.Produce(pb.ProduceRequest(acks=1, timeout_ms=5000, partitions=[pb.PartitionProduceData(
            topic="typed", partition=0, records=(huge_payload := replikafka.records.encode_stream(
                huge.schema, [huge]).to_pybytes()), records_crc32c=replikafka.records.records_crc32c(huge_payload))]),
            timeout=30)
        assert resp.partitions[0].error.code == "MESSAGE_TOO_LARGE"
        # Garbage where Arrow IPC should be.
        resp = stub.Produce(pb.ProduceRequest(acks=1, partitions=[pb.PartitionProduceData(
            topic="typed", partition=0, records=b"\x00garbage")]), timeout=10)
        assert resp.partitions[0].error.code in ("CORRUPT_MESSAGE", "INVALID_REQUEST")
        # Bytes that are not even a protobuf message, straight to the port.
        raw = ch.unary_unary("/replikafka.Replikafka/Produce", request_serializer=None,
                             response_deserializer=None)
        with pytest.raises(grpc.RpcError) as info:
            raw(b"\xff\xff\xff\xff\x0f not protobuf", timeout=10)
        assert info.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.INVALID_ARGUMENT)
        with pytest.raises(grpc.RpcError) as info:
            stub.Produce(pb.ProduceRequest(acks=7, partitions=[]), timeout=10)
        assert "acks" in info.value.details()
    # Still serving, nothing stored lost.
    c = replikafka.Consumer(bs)
    c.assign([("typed", 0)])
    c.seek(("typed", 0), 0)
    t = c.poll(timeout_ms=5000)
    assert t.column("id").to_pylist() == [1, 2]
    c.close()
    admin.close()


def test_add_partitions_keeps_the_existing_assignment_and_serves_the_new_ones(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("grow", partitions=2, replication_factor=2)
    before = {p.partition: p.replicas for p in admin.describe_topic("grow").partitions}
    with replikafka.Producer(bs, acks="all") as prod:
        prod.send("grow", values_batch([b"old"] * 5), partition=1).result(timeout=30)
    r = _cli("topics", "--bootstrap-server", bs, "--alter", "--topic", "grow", "--partitions", "5")
    assert r.returncode == 0, r.stderr
    after = {p.partition: p.replicas for p in admin.describe_topic("grow").partitions}
    assert sorted(after) == [0, 1, 2, 3, 4]
    assert {p: after[p] for p in before} == before
    with replikafka.Producer(bs, acks="all") as prod:
        assert prod.send("grow", values_batch([b"new"] * 3), partition=4).result(timeout=30).base_offset == 0
    with pytest.raises(E.InvalidPartitionsError):
        admin.create_partitions("grow", 0)      # fewer (but some) is partition removal: test_partition_removal.py
    table = consume_all(bs, "grow", 5, 8)
    assert sorted(table.column("value").to_pylist()) == [b"new"] * 3 + [b"old"] * 5
    admin.close()


def test_cluster_command_starts_reports_and_stops_a_local_cluster(tmp_path):
    d = str(tmp_path / "rk")
    r = _cli("cluster", "start", "--brokers", "2", "--dir", d, timeout=120)
    try:
        assert r.returncode == 0, r.stderr
        bs = next(line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith("bootstrap servers"))
        assert len(bs.split(",")) == 2
        status = _cli("cluster", "status", "--dir", d)
        assert status.returncode == 0 and status.stdout.count(" up") >= 3, status.stdout
        admin = replikafka.Admin(bs)
        admin.create_topic("via-cli-cluster", partitions=2, replication_factor=2)
        with replikafka.Producer(bs, acks="all") as prod:
            assert prod.send("via-cli-cluster", b"x", partition=0).result(timeout=30).base_offset == 0
        admin.close()
    finally:
        stop = _cli("cluster", "stop", "--dir", d, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert not os.path.exists(os.path.join(d, "cluster.json"))
    r = _cli("cluster", "status", "--dir", d)
    assert r.returncode != 0 and "no cluster" in r.stderr
