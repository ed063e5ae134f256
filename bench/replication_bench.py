"""`./build.sh bench replication`: replication costs and failover at scale.

* produce with acks=all to RF=3 (3 local brokers, min.insync.replicas=2), as a
  ratio of acks=1 to RF=1 on the same cluster in the same run;
* failover at scale: N partitions (default 10,000; REPLIKAFKA_BENCH_PARTITIONS)
  led by one broker, which is killed; time from the controller noticing to every
  partition having a new leader, and to every partition having accepted a write;
* controller failover with those N partitions: time to load and resend state;
* end-to-end latency (produce acks=all -> consumer) at a moderate rate.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import time
from datetime import datetime

import grpc
import numpy as np
import pyarrow as pa

import replikafka
from replikafka.local_cluster import LocalCluster
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

RECORDS = 1_000_000
BATCH = 10_000
PARTITIONS = 6
SCALE_PARTITIONS = int(os.environ.get("REPLIKAFKA_BENCH_PARTITIONS", "10000"))
LATENCY_SECONDS = 5.0
LATENCY_RATE = 500  # records/s


def _batch(first: int, n: int) -> pa.RecordBatch:
    offsets = np.arange(0, (n + 1) * 100, 100, dtype=np.int32)
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.full(n * 100, 7, np.uint8))])
    return pa.record_batch([values], names=["value"])


def _produce(bs: str, topic: str, acks) -> float:
    batches = [_batch(i, BATCH) for i in range(0, RECORDS, BATCH)]
    with replikafka.Producer(bs, acks=acks, linger_ms=0) as p:
        p.send(topic, batches[0].slice(0, 1), partition=0).result(timeout=60)  # warm: connections, imports
        t = time.perf_counter()
        futs = [p.send(topic, b, partition=i % PARTITIONS) for i, b in enumerate(batches)]
        for f in futs:
            f.result(timeout=300)
        return time.perf_counter() - t


def _log_time(line: str) -> float:
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _first_line(cluster, broker_id: int, pattern: str, after: float = 0.0) -> tuple[float, str] | None:
    with open(cluster.log_path(broker_id), errors="replace") as f:
        for line in f:
            if re.search(pattern, line) and line[:4].isdigit() and _log_time(line) >= after:
                return _log_time(line), line.strip()
    return None


def _wait(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        v = predicate()
        if v:
            return v
        time.sleep(0.05)
    raise RuntimeError(f"bench replication: timed out waiting for {what}")


def throughput(root: str) -> list[dict]:
    cluster = LocalCluster(os.path.join(root, "tput"), 3, die_with_parent=True)
    try:
        cluster.start()
        bs = cluster.bootstrap_servers
        admin = replikafka.Admin(bs)
        admin.create_topic("rf3", partitions=PARTITIONS, replication_factor=3, schema="value BINARY",
                           config={"min.insync.replicas": "2"})
        admin.create_topic("rf1", partitions=PARTITIONS, replication_factor=1, schema="value BINARY")
        base = _produce(bs, "rf1", 1)
        ours = _produce(bs, "rf3", "all")
        admin.close()
    finally:
        cluster.stop()
    return [dict(bench="replication", metric="produce acks=all RF=3 records/s", value=RECORDS / ours,
                 unit="records/s", baseline=RECORDS / base, ratio=base / ours)]


def _write_everywhere(address: str, topic: str, n: int) -> None:
    """One record to every partition, in one Produce request to the new leader
    (repeated for the partitions that are not ready yet): when it returns, every
    partition accepts writes."""
    from replikafka import records as R
    b = R.to_record_batch([{"value": b"x"}], R.parse_schema("value BINARY"), timestamp_ms=0)
    payload = R.encode_stream(b.schema, [b]).to_pybytes()
    stub = pbg.ReplikafkaStub(grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 256 << 20),
                                                                      ("grpc.max_send_message_length", 256 << 20)]))
    todo = list(range(n))
    deadline = time.time() + 600
    while todo and time.time() < deadline:
        resp = stub.Produce(pb.ProduceRequest(acks=1, timeout_ms=30000, partitions=[
            pb.PartitionProduceData(topic=topic, partition=p, records=payload,
                                    records_crc32c=R.records_crc32c(payload)) for p in todo]), timeout=120)
        todo = [r.partition for r in resp.partitions if r.error.code]
        if todo:
            time.sleep(0.05)
    if todo:
        raise RuntimeError(f"{len(todo)} partitions never accepted a write")


def failover_at_scale(root: str) -> list[dict]:
    n = SCALE_PARTITIONS
    cluster = LocalCluster(os.path.join(root, "scale"), 3, die_with_parent=True,
                           overrides={"zookeeper.session.timeout.ms": "3000", "replica.lag.time.max.ms": "60000",
                                      "message.max.bytes": str(64 << 20)})
    rows = []
    try:
        cluster.start()
        controller = _wait(lambda: cluster.controller_id() if cluster.controller_id() > 0 else None, 30, "a controller")
        leader, follower = [b for b in cluster.ids if b != controller][:2]
        stub = pbg.ReplikafkaStub(grpc.insecure_channel(cluster.address(follower), options=[
            ("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]))
        req = pb.CreateTopicRequest(name="big", replication_factor=2, timeout_ms=600_000,
                                    schema=pa.schema([("value", pa.binary())]).serialize().to_pybytes())
        for p in range(n):
            req.assignment[p].replicas.extend([leader, follower])
        t = time.perf_counter()
        resp = stub.CreateTopic(req, timeout=900)
        if resp.error.code:
            raise RuntimeError(f"create: {resp.error}")
        create_s = time.perf_counter() - t
        admin = replikafka.Admin(cluster.address(follower))
        # Both brokers have taken up their roles for every partition (not only the
        # controller's view), so the failover below measures failover alone.
        for b in (leader, follower):
            _wait(lambda b=b: _first_line(cluster, b, rf"LeaderAndIsr from .*: {n} partitions in"), 900,
                  f"broker {b} to take up its {n} replicas")
        _wait(lambda: all(len(p.isr) == 2 for p in admin.describe_topic("big").partitions), 600, "followers in sync")
        killed_at = time.time()
        cluster.kill(leader)
        _wait(lambda: all(p.leader == follower for p in admin.describe_topic("big").partitions), 600,
              "new leaders")
        all_led = time.time()
        _write_everywhere(cluster.address(follower), "big", n)
        all_written = time.time()
        noticed = _wait(lambda: _first_line(cluster, controller, rf"brokers \[{leader}\] failed", killed_at - 1),
                        30, "the controller's log line")[0]
        done = _first_line(cluster, controller, r"partition states written and sent in", noticed)
        rows.append(dict(bench="replication", metric=f"failover {n} partitions: controller decisions written+sent",
                         value=float(re.search(r"in ([0-9.]+)s", done[1]).group(1)), unit="s"))
        rows.append(dict(bench="replication", metric=f"failover {n} partitions: noticed -> all new leaders",
                         value=all_led - noticed, unit="s", baseline=n * 0.004, ratio=(all_led - noticed) / (n * 0.004)))
        rows.append(dict(bench="replication", metric=f"failover {n} partitions: noticed -> all accept writes",
                         value=all_written - noticed, unit="s"))
        rows.append(dict(bench="replication", metric=f"create topic with {n} partitions", value=create_s, unit="s"))
        # Controller failover with the same state.
        cluster.start_broker(leader, timeout_s=900)  # recovers N logs after its kill -9
        killed_at = time.time()
        cluster.kill(controller)
        line = _wait(lambda: next((l for b in cluster.ids if b != controller and cluster.alive(b)
                                   for l in [_first_line(cluster, b, r"controller failover: loaded", killed_at)] if l),
                                  None), 60, "a new controller")
        rows.append(dict(bench="replication", metric=f"controller failover {n} partitions: load + resend",
                         value=float(re.search(r"in ([0-9.]+)s", line[1]).group(1)), unit="s"))
        admin.close()
    finally:
        cluster.stop()
    return rows


def latency(root: str) -> list[dict]:
    cluster = LocalCluster(os.path.join(root, "lat"), 3, die_with_parent=True,
                           overrides={"replica.fetch.wait.max.ms": "500"})
    try:
        cluster.start()
        bs = cluster.bootstrap_servers
        admin = replikafka.Admin(bs)
        admin.create_topic("lat", partitions=1, replication_factor=3, schema="value BINARY",
                           config={"min.insync.replicas": "2"})
        admin.close()
        seen: dict[int, float] = {}
        stop = threading.Event()

        def consume():
            c = replikafka.Consumer(bs, fetch_max_wait_ms=100)
            c.assign([("lat", 0)])
            c.seek(("lat", 0), 0)
            while not stop.is_set():
                t = c.poll(timeout_ms=200)
                now = time.perf_counter()
                for v in t.column("value").to_pylist() if t.num_rows else []:
                    seen[int(v)] = now
            c.close()

        th = threading.Thread(target=consume, daemon=True)
        th.start()
        sent: dict[int, float] = {}
        acked: list[float] = []
        with replikafka.Producer(bs, acks="all", linger_ms=0) as prod:
            i = 0
            end = time.perf_counter() + LATENCY_SECONDS
            while time.perf_counter() < end:
                t0 = time.perf_counter()
                sent[i] = t0
                prod.send("lat", [{"value": str(i).encode()}], partition=0).result(timeout=30)
                acked.append(time.perf_counter() - t0)
                i += 1
                time.sleep(max(0.0, 1.0 / LATENCY_RATE - (time.perf_counter() - t0)))
        _wait(lambda: len(seen) >= len(sent), 30, "the consumer to see everything")
        stop.set()
        th.join(timeout=5)
    finally:
        cluster.stop()
    e2e = np.array([seen[k] - sent[k] for k in sent]) * 1000
    ack = np.array(acked) * 1000
    return [dict(bench="replication", metric="end-to-end latency acks=all p50", value=float(np.percentile(e2e, 50)),
                 unit="ms"),
            dict(bench="replication", metric="end-to-end latency acks=all p99", value=float(np.percentile(e2e, 99)),
                 unit="ms"),
            dict(bench="replication", metric="produce ack latency acks=all p50", value=float(np.percentile(ack, 50)),
                 unit="ms"),
            dict(bench="replication", metric="produce ack latency acks=all p99", value=float(np.percentile(ack, 99)),
                 unit="ms")]


def run() -> list[dict]:
    root = tempfile.mkdtemp(prefix="replication-bench-")
    try:
        return throughput(root) + latency(root) + failover_at_scale(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
