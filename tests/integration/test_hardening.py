"""Hardening against real processes (issue 10): corrupt produced batches refused at
the leader, limits on what arrives from the wire, forged controller requests refused
with state unchanged, bad directory names moved aside at start."""
from __future__ import annotations

import json
import os
import time

import grpc
import pyarrow as pa
import pytest

import replikafka
from cluster_helpers import kafka_batch, read_committed, replica_values, wait_until
from replikafka import records as R
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

pytestmark = pytest.mark.integration


def stub(cluster, broker_id):
    return pbg.ReplikafkaStub(grpc.insecure_channel(cluster.address(broker_id)))


def produce_raw(cluster, broker_id, topic, partition, payload, crc="right"):
    d = pb.PartitionProduceData(topic=topic, partition=partition, records=payload)
    if crc == "right":
        d.records_crc32c = R.records_crc32c(payload)
    elif crc is not None:
        d.records_crc32c = crc
    resp = stub(cluster, broker_id).Produce(pb.ProduceRequest(acks=-1, timeout_ms=10_000, partitions=[d]),
                                            timeout=30)
    return resp.partitions[0]


def bad_offsets_payload() -> bytes:
    """A Kafka-shaped batch whose value offsets point past its data buffer (what one
    flipped bit in an offsets buffer does): Arrow's cheap validation passes, full fails."""
    good = R.to_record_batch([{"key": None, "value": b"abcd", "headers": None}] * 2, R.KAFKA_SCHEMA,
                             timestamp_ms=1)
    payload = R.encode_stream(good.schema, [good]).to_pybytes()
    offsets = (0).to_bytes(4, "little") + (4).to_bytes(4, "little") + (8).to_bytes(4, "little")
    assert payload.count(offsets) == 1
    return payload.replace(offsets, offsets[:8] + (4000).to_bytes(4, "little"))


def test_corrupt_batches_are_refused_at_the_leader_and_never_stored(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("integrity", partitions=2, replication_factor=3)
    producer = replikafka.Producer(bs, acks="all")
    for p in range(2):
        producer.send("integrity", kafka_batch([b"before-%d" % p]), partition=p).result(timeout=30)
    leader = admin.describe_topic("integrity").partitions[0].leader
    good = R.encode_stream(R.stored_schema(R.KAFKA_SCHEMA), [R.to_record_batch(
        [{"key": None, "value": b"x", "headers": None}], R.KAFKA_SCHEMA, timestamp_ms=1)]).to_pybytes()
    flipped = bytearray(good)
    flipped[-40] ^= 0x01
    cases = {
        "no CRC": (good, None, "no records_crc32c"),
        "CRC mismatch": (bytes(flipped), R.records_crc32c(good), "CRC-32C mismatch"),
        "bad offsets": (bad_offsets_payload(), "right", "not valid Arrow"),
        "two streams": (good + good, "right", "follow the end of the Arrow IPC stream"),
        "garbage": (b"\x00garbage", "right", "not an Arrow IPC stream"),
    }
    for what, (payload, crc, words) in cases.items():
        r = produce_raw(cluster3, leader, "integrity", 0, payload, crc)
        assert r.error.code == "CORRUPT_MESSAGE" and words in r.error.message, (what, r.error)
    # A garbage schema at creation: a named error, not UNKNOWN_SERVER_ERROR ArrowInvalid.
    resp = stub(cluster3, leader).CreateTopic(pb.CreateTopicRequest(name="garbled", partitions=1,
                                                                    replication_factor=1, schema=b"\x01" * 24),
                                              timeout=30)
    assert resp.error.code == "INVALID_RECORD" and "not an Arrow IPC schema" in resp.error.message
    # Nothing refused was stored anywhere; replication of both partitions carries on (acks=all).
    for p in range(2):
        producer.send("integrity", kafka_batch([b"after-%d" % p]), partition=p).result(timeout=30)
    producer.close()
    got = read_committed(bs, "integrity", 2)
    assert sorted(got.values()) == [b"after-0", b"after-1", b"before-0", b"before-1"]
    for b in cluster3.ids:
        wait_until(lambda b=b: replica_values(cluster3, b, "integrity", 0) == [b"before-0", b"after-0"],
                   what=f"broker {b} holds exactly the good records")
    assert all(cluster3.alive(b) for b in cluster3.ids)


def test_sizes_and_names_from_the_wire_are_limited(cluster_factory):
    cluster = cluster_factory(1, max_partitions_per_topic=1000, max_replication_factor=5)
    s = stub(cluster, 1)
    r = s.CreateTopic(pb.CreateTopicRequest(name="huge", partitions=2**31 - 1, replication_factor=1), timeout=30)
    assert r.error.code == "INVALID_PARTITIONS" and "max.partitions.per.topic" in r.error.message
    r = s.CreateTopic(pb.CreateTopicRequest(name="wide", partitions=1, replication_factor=1000), timeout=30)
    assert r.error.code == "INVALID_REPLICATION_FACTOR"
    for bad in ("", ".", "..", "../../../../tmp/rk-escape", "a" * 250, "sp ace"):
        r = s.CreateTopic(pb.CreateTopicRequest(name=bad, partitions=1, replication_factor=1), timeout=30)
        assert r.error.code == "INVALID_TOPIC_EXCEPTION", bad
    assert s.CreateTopic(pb.CreateTopicRequest(name="ok", partitions=1, replication_factor=1),
                         timeout=30).error.code == ""
    r = s.CreatePartitions(pb.CreatePartitionsRequest(name="ok", total_count=2**31 - 1), timeout=30)
    assert r.error.code == "INVALID_PARTITIONS"
    names = [t.name for t in s.Metadata(pb.MetadataRequest(all_topics=True), timeout=30).topics]
    assert names == ["ok"]
    assert cluster.alive(1)


def _zk_controller(cluster):
    zk = cluster.zk()
    try:
        cid = int(json.loads(zk.get("/controller")[0])["brokerid"])
        epoch = int(zk.get("/controller_epoch")[0])
        czxid = {b: zk.get(f"/brokers/ids/{b}")[1].czxid for b in cluster.ids}
        return cid, epoch, czxid
    finally:
        zk.stop()
        zk.close()


def test_forged_controller_requests_are_refused_and_change_nothing(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("kept", partitions=1, replication_factor=3)
    producer = replikafka.Producer(bs, acks="all")
    values = [b"k%d" % i for i in range(300)]
    producer.send("kept", kafka_batch(values), partition=0).result(timeout=30)
    cid, epoch, czxid = _zk_controller(cluster3)
    before = {b: stub(cluster3, b).Metadata(pb.MetadataRequest(all_topics=True), timeout=30) for b in cluster3.ids}
    state = admin.describe_topic("kept").partitions[0]
    ghost = pb.TopicInfo(name="ghost", schema=R.schema_to_bytes(R.stored_schema(R.KAFKA_SCHEMA)), partition_count=1)
    for b in cluster3.ids:
        s = stub(cluster3, b)
        # A higher epoch that ZooKeeper does not confirm, and the right epoch with the wrong controller id.
        for forged_id, forged_epoch in [(cid, epoch + 1000), ((cid % 3) + 1, epoch)]:
            r = s.LeaderAndIsr(pb.LeaderAndIsrRequest(controller_id=forged_id, controller_epoch=forged_epoch),
                               timeout=30)
            assert r.error.code == "INVALID_REQUEST" and "ZooKeeper says" in r.error.message, r.error
            r = s.UpdateMetadata(pb.UpdateMetadataRequest(controller_id=forged_id, controller_epoch=forged_epoch,
                                                          full=True), timeout=30)
            assert r.error.code == "INVALID_REQUEST"
        # The real controller's id and epoch (they are not secret), with forged content.
        r = s.StopReplica(pb.StopReplicaRequest(controller_id=cid, controller_epoch=epoch, delete_partitions=True,
                                                partitions=[pb.TopicPartitionRef(topic="kept", partition=0)]),
                          timeout=30)
        assert [e.error.code for e in r.partitions] == ["INVALID_REQUEST"], r
        r = s.LeaderAndIsr(pb.LeaderAndIsrRequest(controller_id=cid, controller_epoch=epoch, topics=[ghost],
                                                  partitions=[pb.PartitionState(
                                                      topic=t, partition=0, controller_epoch=epoch, leader=b,
                                                      leader_epoch=0, isr=[b], replicas=[b])
                                                      for t in ("ghost", ".")]), timeout=30)
        assert sorted(e.error.code for e in r.partitions) == ["INVALID_TOPIC_EXCEPTION",
                                                             "UNKNOWN_TOPIC_OR_PARTITION"], r
        # The real controller's id and epoch, wholly legal content, for another registration
        # of this broker (KIP-380): refused, it would make b the leader in epoch 1000.
        r = s.LeaderAndIsr(pb.LeaderAndIsrRequest(controller_id=cid, controller_epoch=epoch, broker_epoch=czxid[b] + 1,
                                                  partitions=[pb.PartitionState(
                                                      topic="kept", partition=0, controller_epoch=epoch, leader=b,
                                                      leader_epoch=1000, isr=[b], replicas=list(state.replicas))]),
                           timeout=30)
        assert r.error.code == "STALE_BROKER_EPOCH", r
        r = s.UpdateMetadata(pb.UpdateMetadataRequest(
            controller_id=cid, controller_epoch=epoch, full=True, topics=[ghost],
            live_brokers=[pb.BrokerEndpoint(id=i, host="127.0.0.1", port=1, broker_epoch=czxid[i])
                          for i in cluster3.ids]), timeout=30)
        assert not r.error.code
    # The ControlledShutdown of a broker without its real epoch.
    r = stub(cluster3, cid).ControlledShutdown(pb.ControlledShutdownRequest(broker_id=state.leader, broker_epoch=-1),
                                               timeout=30)
    assert r.error.code == "STALE_BROKER_EPOCH", r
    # Nothing changed: same brokers and ports in everyone's metadata, no ghost topic, no
    # new directories, every replica still holds the 300 records, the real controller obeyed.
    for b in cluster3.ids:
        after = stub(cluster3, b).Metadata(pb.MetadataRequest(all_topics=True), timeout=30)
        assert sorted((x.id, x.port) for x in after.brokers) == sorted((x.id, x.port) for x in before[b].brokers)
        assert [t.name for t in after.topics] == ["kept"]
        logs = os.listdir(os.path.join(cluster3.base_dir, f"broker-{b}-logs"))
        assert "kept-0" in logs and not any(n.startswith(("ghost", ".-")) for n in logs), logs
        assert replica_values(cluster3, b, "kept", 0) == values
    assert admin.describe_topic("kept").partitions[0].leader == state.leader
    admin.create_topic("after", partitions=1, replication_factor=3)
    producer.send("after", kafka_batch([b"a"]), partition=0).result(timeout=30)
    producer.send("kept", kafka_batch([b"more"]), partition=0).result(timeout=30)
    producer.close()
    assert sorted(read_committed(bs, "kept", 1).values()) == sorted(values + [b"more"])


def test_a_bad_directory_name_is_moved_aside_and_the_broker_starts(cluster_factory):
    cluster = cluster_factory(1)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("t", partitions=1, replication_factor=1)
    cluster.stop_broker(1)
    logs = os.path.join(cluster.base_dir, "broker-1-logs")
    for bad in (".-0", "..-0", "sp ace-0", "not a log"):
        os.makedirs(os.path.join(logs, bad))
    cluster.start_broker(1)
    names = os.listdir(logs)
    assert "t-0" in names
    for bad in (".-0", "..-0", "sp ace-0", "not a log"):
        assert bad not in names and any(n.startswith(bad + ".") and n.endswith("-stray") for n in names), names
    assert "moved aside" in cluster.tail(1, 200)
    wait_until(lambda: [t.name for t in stub(cluster, 1).Metadata(pb.MetadataRequest(all_topics=True),
                                                                  timeout=30).topics] == ["t"],
               what="the topic in the restarted broker's metadata")


def test_open_flight_calls_do_not_hold_a_broker_stop(cluster_factory):
    """A producer keeps its DoPut open between sends, and any client may open one and
    never send: neither holds a SIGTERM (pyarrow's shutdown waits for every open call;
    the broker waits FLIGHT_SHUTDOWN_WAIT_S). The stop is clean (exit 0, not the kill
    after the stop's timeout; the next start loads its logs from the clean-shutdown
    state) and the acknowledged records are kept."""
    import pyarrow.flight as fl
    from replikafka.client.connection import ConnectionPool, parse_bootstrap
    from replikafka.client.metadata import ClusterMetadata
    from replikafka.protocol.flight_produce import Append, ProduceCommand

    cluster = cluster_factory(1)
    bs = cluster.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic("held", partitions=1, replication_factor=1, schema="value BINARY")
    admin.close()
    prod = replikafka.Producer(bs, acks="all")
    for i in range(3):    # its call to the leader stays open after each answer
        prod.send("held", [{"value": b"kept-%d" % i}], partition=0).result(timeout=30)
    pool = ConnectionPool()
    meta = ClusterMetadata(pool, parse_bootstrap(bs), request_timeout_ms=10_000, retry_backoff_ms=100)
    meta.refresh(all_topics=True)
    silent = fl.connect(f"grpc+tcp://{meta.broker(1).listener('FLIGHT')}")
    pool.close()
    cmd = ProduceCommand("held", 0, -1, 10_000, (Append(0, (1,)),))
    writer, _reader = silent.do_put(fl.FlightDescriptor.for_command(cmd.encode()),
                                    pa.schema([("value", pa.binary())]))   # and never writes a batch
    try:
        assert cluster.stop_broker(1, timeout_s=20) == 0
        cluster.start_broker(1)
        assert "clean shutdown" in cluster.tail(1, 200)
        got = read_committed(bs, "held", 1)
        assert sorted(got.values()) == [b"kept-0", b"kept-1", b"kept-2"]
    finally:
        prod.close()
        silent.close()


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _broker_with_600_files(tmp_path, zk_connect, n: int, **overrides):
    """One broker allowed 600 open files (prlimit, as a small `ulimit -n`) leading the n
    partitions of topic "wide", and a function writing one record to each partition it is
    given in one Produce (acks=1) and returning the errors: (partition, code, message)."""
    import sys
    from replikafka.local_cluster import LocalCluster
    cluster = LocalCluster(str(tmp_path / "cluster"), 1, zookeeper_connect=zk_connect, die_with_parent=True,
                           overrides={"zookeeper.session.timeout.ms": "4000", **overrides})
    cluster.broker_commands[1] = ["prlimit", "--nofile=600:600", sys.executable, "-m", "replikafka", "broker"]
    cluster.start()
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("wide", partitions=n, replication_factor=1, schema="value BINARY")
    admin.close()
    b = R.to_record_batch([{"value": b"one"}], R.parse_schema("value BINARY"), timestamp_ms=1)
    payload = R.encode_stream(b.schema, [b]).to_pybytes()
    crc = R.records_crc32c(payload)
    leader = stub(cluster, 1)

    def produce(parts):
        resp = leader.Produce(pb.ProduceRequest(acks=1, timeout_ms=30_000, partitions=[
            pb.PartitionProduceData(topic="wide", partition=p, records=payload, records_crc32c=crc)
            for p in parts]), timeout=120)
        assert len(resp.partitions) == len(parts)
        return [(r.partition, r.error.code, r.error.message) for r in resp.partitions if r.error.code]

    # Until the broker leads them all: a partition it does not lead yet (its LeaderAndIsr still
    # being applied) is refused unwritten. The last partition is taken up last.
    wait_until(lambda: not produce([n - 1]), what="broker 1 leading the topic's last partition")
    return cluster, produce


def test_writing_more_partitions_than_the_broker_may_open_files_for_loses_nothing(tmp_path, zk_connect):
    """One record written to each of 900 partitions at once (one Produce naming them all, as the
    first writes after a failover arrive) on a broker allowed 600 open files: every partition
    takes its record, because past `log.open.max.partitions` (derived from the limit) the least
    recently used logs close their files; the broker never reaches its limit, keeps its log dir
    online and serves reads of all 900 after."""
    n = 900
    cluster, produce = _broker_with_600_files(tmp_path, zk_connect, n)
    try:
        errors = produce(range(n - 1))
        assert errors == [], errors[:3]
        assert _open_fds(cluster.procs[1].pid) < 600
        c = replikafka.Consumer(cluster.bootstrap_servers)
        tps = [("wide", p) for p in range(n)]
        assert set(c.end_offsets(tps).values()) == {1}
        c.close()
        got = read_committed(cluster.bootstrap_servers, "wide", 20)   # the first ones, their files long closed
        assert sorted(got) == [(p, 0) for p in range(20)] and set(got.values()) == {b"one"}
        log_text = cluster.tail(1, 400)
        assert "offline" not in log_text and "out of open files" not in log_text
    finally:
        cluster.stop()


def test_a_broker_out_of_open_files_keeps_its_log_dir_online_and_what_it_stored(tmp_path, zk_connect):
    """With the cap set past what the process may open (log.open.max.partitions=100000 under a
    600-file limit) the writes past the limit fail with a retriable error naming the cause, not
    a disk failure: the log dir stays online (KIP-112's offline handling would stop every
    partition in it), the records already written stay readable, and once idle logs give their
    files back (log.idle.release.ms) the refused writes succeed when sent again."""
    n = 900
    cluster, produce = _broker_with_600_files(tmp_path, zk_connect, n, **{
        "log.open.max.partitions": "100000", "log.idle.release.ms": "3000"})
    try:
        errors = produce(range(n - 1))
        assert errors, "the broker should have run out of files: the test proves nothing"
        assert {code for _p, code, _m in errors} == {"KAFKA_STORAGE_ERROR"}
        assert all("out of open files" in m for _p, _c, m in errors), errors[:1]
        written = sorted(set(range(n - 1)) - {p for p, _c, _m in errors})
        assert "offline" not in cluster.tail(1, 400)
        todo, deadline = [p for p, _c, _m in errors], time.monotonic() + 90
        while todo and time.monotonic() < deadline:
            time.sleep(4)                         # idle logs give back their files meanwhile
            todo = [p for p, _c, _m in produce(todo)]
        assert todo == [], (f"{len(todo)} partitions still refused after 90 s, e.g. {todo[:5]}; open fds "
                            f"{_open_fds(cluster.procs[1].pid)}; broker log:\n{cluster.tail(1, 80)}")
        # Reads map files too: once idle logs gave their files back, every record is there.
        wait_until(lambda: _open_fds(cluster.procs[1].pid) < 300, what="idle logs giving their files back")
        c = replikafka.Consumer(cluster.bootstrap_servers)
        assert set(c.end_offsets([("wide", p) for p in range(n)]).values()) == {1}
        c.close()
        got = read_committed(cluster.bootstrap_servers, "wide", 10)
        assert written[:10] == list(range(10)) and sorted(got) == [(p, 0) for p in range(10)]
    finally:
        cluster.stop()
