"""Helpers for the Spark source tests: topics with known contents."""
from __future__ import annotations

import re
import time
import uuid

import numpy as np
import pyarrow as pa

from replikafka.client.admin import Admin
from replikafka.client.producer import Producer
from replikafka.records import HEADER_TYPE


# An availableNow query over a few thousand records takes seconds on a quiet machine;
# a shared 2-core machine at a load of 30 took more than 120 s once.
AVAILABLE_NOW_TIMEOUT_S = 300


def await_available_now(query, timeout_s: float = AVAILABLE_NOW_TIMEOUT_S) -> None:
    """Wait for an availableNow query to finish. A failed query raises Spark's
    StreamingQueryException; one still running after ``timeout_s`` is stopped
    and fails the test with its last progress."""
    query.awaitTermination(timeout_s)
    if query.isActive:
        last = query.lastProgress
        query.stop()
        raise AssertionError(f"availableNow query still running after {timeout_s}s; last progress: {last}")


def kafka_batch(partition: int, start: int, n: int, value_bytes: int = 0, headers: bool = False) -> pa.RecordBatch:
    """Records whose value is ``b"<partition>:<i>"`` (padded to ``value_bytes``) and key ``b"k<i>"``."""
    values = [b"%d:%d" % (partition, i) for i in range(start, start + n)]
    if value_bytes:
        values = [v.ljust(value_bytes, b".") for v in values]
    hdrs = pa.array([[{"key": "i", "value": b"%d" % i}] for i in range(start, start + n)], HEADER_TYPE) \
        if headers else pa.nulls(n, HEADER_TYPE)
    return pa.record_batch([pa.array([b"k%d" % i for i in range(start, start + n)], pa.binary()),
                            pa.array(values, pa.binary()), hdrs], names=["key", "value", "headers"])


SCORES_SCHEMA = "id BIGINT NOT NULL, name STRING, amount DOUBLE"


def scores_batch(start: int, n: int) -> pa.RecordBatch:
    ids = np.arange(start, start + n, dtype=np.int64)
    return pa.record_batch([pa.array(ids), pa.array([f"n{i}" for i in ids]), pa.array(ids * 0.5)],
                           schema=pa.schema([pa.field("id", pa.int64(), nullable=False), ("name", pa.string()),
                                             ("amount", pa.float64())]))


class TopicTool:
    def __init__(self, cluster, test_name: str):
        self.cluster = cluster
        self.bootstrap = cluster.bootstrap_servers
        self.admin = Admin(self.bootstrap)
        self.label = re.sub(r"[^A-Za-z0-9]", "", test_name)[-30:]
        self._producer: Producer | None = None

    @property
    def producer(self) -> Producer:
        if self._producer is None:
            self._producer = Producer(self.bootstrap, acks="all", linger_ms=1)
        return self._producer

    def new(self, partitions: int = 3, schema=None, config=None, replication_factor: int = 3) -> str:
        name = f"{self.label}-{uuid.uuid4().hex[:6]}"
        self.admin.create_topic(name, partitions=partitions, replication_factor=replication_factor,
                                schema=schema, config=config or {})
        return name

    def produce(self, topic: str, batches_by_partition: dict[int, pa.RecordBatch]) -> None:
        futures = [self.producer.send(topic, b, partition=p) for p, b in batches_by_partition.items()]
        for f in futures:
            f.result(timeout=60)

    def fill(self, topic: str, counts: dict[int, int], value_bytes: int = 0, headers: bool = False,
             batch_rows: int | None = None) -> None:
        """Append ``counts[p]`` Kafka-shaped records to each partition, numbered on from what is there.
        With ``batch_rows``: one acknowledged append (one stored batch) per ``batch_rows`` records."""
        hw = self.high_watermarks(topic)
        futures = []
        for p, n in counts.items():
            step = batch_rows or n or 1
            for start in range(0, n, step):
                f = self.producer.send(topic, kafka_batch(p, hw[p] + start, min(step, n - start), value_bytes,
                                                          headers), partition=p)
                if batch_rows:
                    f.result(timeout=60)
                futures.append(f)
        for f in futures:
            f.result(timeout=60)

    def high_watermarks(self, topic: str) -> dict[int, int]:
        """Each partition's HW (ListOffsets to the leaders, retried through leader changes)."""
        from replikafka.spark.cluster_access import ClusterClient
        client = ClusterClient(self.bootstrap)
        try:
            n = len(self.admin.describe_topic(topic))
            return {tp[1]: b.high_watermark for tp, b in client.bounds([(topic, p) for p in range(n)]).items()}
        finally:
            client.close()

    def describe(self, topic: str):
        return self.admin.describe_topic(topic)

    def wait_leaders(self, topic: str, timeout_s: float = 30.0, avoid: int | None = None) -> None:
        deadline = time.time() + timeout_s
        from replikafka.errors import ReplikafkaError
        while time.time() < deadline:
            try:
                parts = Admin(self.bootstrap).describe_topic(topic)     # a fresh metadata view each time
            except ReplikafkaError:
                parts = ()      # e.g. a just restarted broker that has no metadata yet
            if parts and all(p.leader >= 0 and p.leader != avoid and p.high_watermark is not None and
                             len(p.isr) == len(p.replicas) for p in parts):
                return
            time.sleep(0.2)
        raise AssertionError(f"{topic}: no leaders within {timeout_s}s: {self.admin.describe_topic(topic)}")

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close()


_KEEPER = r"""
import ctypes, json, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))   # PR_SET_PDEATHSIG: die with the test process
if os.getppid() != int(sys.argv[4]):
    sys.exit(3)
from replikafka.local_cluster import LocalCluster
cluster = LocalCluster(sys.argv[1], 3, zookeeper_connect=sys.argv[2], overrides=json.loads(sys.argv[3]),
                       die_with_parent=True)
try:
    cluster.start()
except BaseException as exc:
    cluster.stop()
    print(json.dumps({"error": str(exc)}), flush=True)
    sys.exit(2)
print(json.dumps({"bootstrap": cluster.bootstrap_servers, "ports": cluster.ports}), flush=True)
for line in sys.stdin:
    words = line.split()
    if words and words[0] == "kill":
        cluster.kill(int(words[1]))
        print("ok", flush=True)
    elif words and words[0] == "stop":
        break
cluster.stop()
print("stopped", flush=True)
"""


class KeptCluster:
    """A local 3-broker cluster run by a small keeper process.

    Why not ``LocalCluster`` in this process: it starts brokers with a
    ``preexec_fn`` (a plain ``fork()``), and a fork of a process that already
    runs gRPC (this one does, once a test has used a client) can abort the
    child inside gRPC's fork handlers ("epoll_wait error: Bad file
    descriptor", exit -6). The keeper has no gRPC, is started without a
    ``preexec_fn`` and ties itself to this process (PDEATHSIG); its brokers are
    tied to it. So nothing outlives a killed test run.
    """

    def __init__(self, base_dir: str, zookeeper_connect: str, overrides: dict[str, str]):
        self.base_dir = base_dir
        self.zookeeper_connect = zookeeper_connect
        self.overrides = overrides
        self.proc = None
        self.info: dict = {}

    def start(self) -> "KeptCluster":
        import json
        import os
        import subprocess
        import sys
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _KEEPER, self.base_dir, self.zookeeper_connect, json.dumps(self.overrides),
             str(os.getpid())], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        self.info = json.loads(line) if line.strip() else {"error": f"keeper exited with {self.proc.wait()}"}
        if "error" in self.info:
            raise RuntimeError(f"cluster start failed: {self.info['error']}")
        return self

    @property
    def ids(self) -> list[int]:
        return sorted(int(b) for b in self.info.get("ports", {}))

    @property
    def bootstrap_servers(self) -> str:
        return self.info["bootstrap"]

    def address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.info['ports'][str(broker_id)]}"

    def kill(self, broker_id: int) -> None:
        """SIGKILL one broker."""
        self.proc.stdin.write(f"kill {broker_id}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "ok"

    def tail(self, broker_id: int, lines: int = 15) -> str:
        import os
        path = os.path.join(self.base_dir, f"broker-{broker_id}.log")
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        except Exception:
            self.proc.kill()
            self.proc.wait()
