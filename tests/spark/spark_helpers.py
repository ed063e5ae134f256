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


class CliCluster:
    """A local cluster started through ``python -m replikafka cluster start``.

    Why not ``LocalCluster`` in this process: it starts brokers with a
    ``preexec_fn`` (a plain ``fork()``), and a fork of a process that already
    runs gRPC (this one does, once a test has used a client) can abort the
    child inside gRPC's fork handlers ("epoll_wait error: Bad file
    descriptor", exit -6). The CLI process has no gRPC, and this process
    starts it with ``vfork``-style spawning (no ``preexec_fn``).
    """

    def __init__(self, base_dir: str, zookeeper_connect: str, overrides: dict[str, str], brokers: int = 3):
        self.base_dir = base_dir
        self.zookeeper_connect = zookeeper_connect
        self.overrides = overrides
        self.n = brokers
        self.state: dict = {}

    def start(self) -> "CliCluster":
        import subprocess
        import sys
        cmd = [sys.executable, "-m", "replikafka", "cluster", "start", "--dir", self.base_dir,
               "--brokers", str(self.n), "--zookeeper", self.zookeeper_connect]
        for k, v in self.overrides.items():
            cmd += ["--override", f"{k}={v}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
        if done.returncode != 0:
            raise RuntimeError(f"cluster start failed ({done.returncode}): {done.stdout}\n{done.stderr}")
        from replikafka.local_cluster import load_state
        self.state = load_state(self.base_dir)
        return self

    @property
    def ids(self) -> list[int]:
        return sorted(int(b) for b in self.state["brokers"])

    @property
    def bootstrap_servers(self) -> str:
        return self.state["bootstrap_servers"]

    def address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.state['brokers'][str(broker_id)]['port']}"

    def kill(self, broker_id: int) -> None:
        import os
        import signal
        from replikafka.local_cluster import pid_alive
        pid = self.state["brokers"][str(broker_id)]["pid"]
        os.kill(pid, signal.SIGKILL)
        deadline = time.time() + 10
        while pid_alive(pid) and time.time() < deadline:
            time.sleep(0.02)

    def tail(self, broker_id: int, lines: int = 15) -> str:
        import os
        path = os.path.join(self.base_dir, f"broker-{broker_id}.log")
        try:
            with open(path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        import subprocess
        import sys
        if self.state:
            subprocess.run([sys.executable, "-m", "replikafka", "cluster", "stop", "--dir", self.base_dir],
                           capture_output=True, timeout=120)
            self.state = {}
