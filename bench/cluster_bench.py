"""`./build.sh bench cluster`: one broker, RF=1, 100-byte values in batches of
10,000 — produce (acks=1) and consume records/s through the client library,
each as a ratio of the storage engine's own append / read of the same batches
measured in the same run (what a broker could do with zero RPC cost)."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import replikafka
from bench import storage_bench as S
from replikafka.local_cluster import LocalCluster

RECORDS = 1_000_000
ROUNDS = 2


def _produce(bs: str, topic: str, batches, security: dict | None = None) -> float:
    with replikafka.Producer(bs, acks=1, idempotent=True, linger_ms=0, batch_size=32 << 20,
                             max_in_flight=5, security=security) as p:
        p.send(topic, batches[0].slice(0, 1), partition=0).result(timeout=60)  # warm: connections, imports
        t = time.perf_counter()
        futs = [p.send(topic, b, partition=0) for b in batches]
        for f in futs:
            f.result(timeout=120)
        return time.perf_counter() - t


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _consume(bs: str, topic: str, n: int, broker_pid: int, security: dict | None = None) -> tuple[float, float]:
    """(seconds, broker CPU seconds) to read ``n`` records from partition 0."""
    c = replikafka.Consumer(bs, fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20, security=security)
    c.assign([(topic, 0)])
    c.seek((topic, 0), 0)
    got = 0
    cpu = process_cpu_s(broker_pid)
    t = time.perf_counter()
    while got < n:
        got += c.poll(timeout_ms=1000).num_rows
    elapsed = time.perf_counter() - t
    cpu = process_cpu_s(broker_pid) - cpu
    c.close()
    return elapsed, cpu


def run() -> list[dict]:
    batches = S.make_batches()[: RECORDS // S.BATCH]
    n = len(batches) * S.BATCH
    nbytes = n * S.VALUE_BYTES
    root = tempfile.mkdtemp(prefix="cluster-bench-")
    best = {k: float("inf") for k in ("produce", "consume", "append", "read", "consume_cpu")}
    cluster = LocalCluster(os.path.join(root, "cluster"), 1, die_with_parent=True,
                           overrides={"message.max.bytes": str(64 << 20)})
    try:
        cluster.start()
        admin = replikafka.Admin(cluster.bootstrap_servers)
        for r in range(ROUNDS):
            topic = f"bench-{r}"
            admin.create_topic(topic, partitions=1, replication_factor=1, schema="value BINARY",
                               config={"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)})
            best["produce"] = min(best["produce"], _produce(cluster.bootstrap_servers, topic, batches))
            took, cpu = _consume(cluster.bootstrap_servers, topic, n, cluster.procs[1].pid)
            best["consume"], best["consume_cpu"] = min(best["consume"], took), min(best["consume_cpu"], cpu)
            d = os.path.join(root, f"log-{r}")
            best["append"] = min(best["append"], S.log_append(d, batches))
            best["read"] = min(best["read"], _engine_read(d, n))
        admin.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for name, ours, base in (("produce acks=1", best["produce"], best["append"]),
                             ("consume", best["consume"], best["read"])):
        rows.append(dict(bench="cluster", metric=f"{name} records/s", value=n / ours, unit="records/s",
                         baseline=n / base, ratio=base / ours))
        rows.append(dict(bench="cluster", metric=f"{name} MB/s", value=nbytes / ours / 1e6, unit="MB/s",
                         baseline=nbytes / base / 1e6, ratio=base / ours))
    rows.append(dict(bench="cluster", metric="consume: broker CPU s per GB served",
                     value=best["consume_cpu"] / (nbytes / 1e9), unit="s/GB"))
    return rows


def _engine_read(d: str, n: int) -> float:
    from replikafka.broker.storage.log import Log
    log = Log.open(d, S.CONFIG, S.SCHEMA, recovery_point=n, clean=True)
    t = time.perf_counter()
    off = 0
    while off < n:
        off += log.read(off, 8 << 20, n).record_count
    elapsed = time.perf_counter() - t
    log.close()
    return elapsed


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
