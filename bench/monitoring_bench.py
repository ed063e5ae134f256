"""`./build.sh bench monitoring`: the cost of metrics on the produce path.

The same acks=all RF=3 produce (replication_bench's: 1M records of 100 bytes in
10,000-record batches over 6 partitions, 3 local brokers) against a cluster with
``metrics.recording.enable=false`` (the baseline) and one with metrics on and
Prometheus scraping every broker's /metrics once a second; both clusters run
side by side and the runs alternate between them, ``ROUNDS`` each (mean time). A second pair sends 100-record batches (more
requests per record: the per-request counters weigh more). Also the time of one
scrape of a broker holding ``SCRAPE_PARTITIONS`` partitions.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import urllib.request

import replikafka
from bench import replication_bench as RB
from replikafka.local_cluster import LocalCluster

ROUNDS = 4
SMALL_BATCH = 100
SMALL_RECORDS = 100_000
SCRAPE_PARTITIONS = int(os.environ.get("REPLIKAFKA_BENCH_SCRAPE_PARTITIONS", "2000"))


class Scraper:
    """Scrapes every broker's /metrics once a second, as Prometheus would."""

    def __init__(self, cluster):
        self.urls = [cluster.metrics_url(b) + "/metrics" for b in cluster.ids]
        self.stopped = threading.Event()
        self.scrapes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self.stopped.wait(1.0):
            for url in self.urls:
                with urllib.request.urlopen(url, timeout=10) as resp:
                    resp.read()
                self.scrapes += 1

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped.set()
        self.thread.join(timeout=15)


def _produce_small(bs: str, topic: str) -> float:
    batches = [RB._batch(i, SMALL_BATCH) for i in range(0, SMALL_RECORDS, SMALL_BATCH)]
    with replikafka.Producer(bs, acks="all", linger_ms=0) as p:
        p.send(topic, batches[0].slice(0, 1), partition=0).result(timeout=60)
        t = time.perf_counter()
        futs = [p.send(topic, b, partition=i % RB.PARTITIONS) for i, b in enumerate(batches)]
        for f in futs:
            f.result(timeout=300)
        return time.perf_counter() - t


def _start(root: str, recording: bool) -> LocalCluster:
    cluster = LocalCluster(os.path.join(root, "on" if recording else "off"), 3, die_with_parent=True,
                           overrides={"metrics.recording.enable": str(recording).lower()})
    cluster.start()
    admin = replikafka.Admin(cluster.bootstrap_servers)
    for t in ("big", "small"):
        admin.create_topic(t, partitions=RB.PARTITIONS, replication_factor=3, schema="value BINARY",
                           config={"min.insync.replicas": "2"})
    admin.close()
    return cluster


def _scrape_time(root: str) -> tuple[float, int]:
    cluster = LocalCluster(os.path.join(root, "scrape"), 1, die_with_parent=True)
    try:
        cluster.start()
        admin = replikafka.Admin(cluster.bootstrap_servers)
        admin.create_topic("many", partitions=SCRAPE_PARTITIONS, replication_factor=1, timeout_ms=300_000)
        admin.close()
        url = cluster.metrics_url(cluster.ids[0]) + "/metrics"
        want = f"kafka_server_replicamanager_partitioncount {float(SCRAPE_PARTITIONS)}"
        deadline = time.time() + 300
        while want not in urllib.request.urlopen(url, timeout=60).read().decode():   # every partition created
            if time.time() > deadline:
                raise RuntimeError(f"the broker never held {SCRAPE_PARTITIONS} partitions")
            time.sleep(0.5)
        best, size = float("inf"), 0
        for _ in range(3):
            t = time.perf_counter()
            with urllib.request.urlopen(url, timeout=60) as resp:
                size = len(resp.read())
            best = min(best, time.perf_counter() - t)
        return best, size
    finally:
        cluster.stop()


def hot_path_cost_s(partitions_per_request: int = RB.PARTITIONS, n: int = 200_000) -> float:
    """Seconds the recording adds to one Produce request: the RPC observer once, the
    per-topic counter once per partition (what the broker does with metrics on)."""
    from replikafka.broker.metrics import BrokerMetrics
    m = BrokerMetrics(0)
    t = time.perf_counter()
    for _ in range(n):
        m.requests.observe("Produce", 0.001, "")
    observe = (time.perf_counter() - t) / n
    t = time.perf_counter()
    for _ in range(n):
        m.replica_stats.produced("t", 100, 10)
    produced = (time.perf_counter() - t) / n
    return observe + produced * partitions_per_request


def run() -> list[dict]:
    """Both clusters run side by side; the produce runs alternate between them
    (``ROUNDS`` each, order flipped every round), so a busy machine slows both alike."""
    root = tempfile.mkdtemp(prefix="monitoring-bench-")
    spent = {(k, on): 0.0 for k in ("big", "small") for on in (False, True)}
    clusters: dict[bool, LocalCluster] = {}
    try:
        for on in (False, True):
            clusters[on] = _start(root, on)
        with Scraper(clusters[True]) as scraper:
            for r in range(ROUNDS):
                for on in ((False, True) if r % 2 == 0 else (True, False)):
                    bs = clusters[on].bootstrap_servers
                    spent[("big", on)] += RB._produce(bs, "big", "all")
                    spent[("small", on)] += _produce_small(bs, "small")
        for c in clusters.values():
            c.stop()
        clusters.clear()
        scrape_s, scrape_bytes = _scrape_time(root)
    finally:
        for c in clusters.values():
            c.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for key, records, label in (("big", RB.RECORDS, f"{RB.BATCH}-record batches"),
                                ("small", SMALL_RECORDS, f"{SMALL_BATCH}-record batches")):
        on, off = spent[(key, True)] / ROUNDS, spent[(key, False)] / ROUNDS
        rows.append(dict(bench="monitoring", metric=f"acks=all RF=3 {label}, metrics on, scraped 1/s; records/s",
                         value=records / on, unit="records/s", baseline=records / off, ratio=off / on))
    # The same cost without the noise of a shared machine: the counters' own time per request, against
    # the baseline's time per 100-record request (a request per partition per round: 6 partitions).
    per_request_s = spent[("small", False)] / ROUNDS / (SMALL_RECORDS / SMALL_BATCH)
    cost_s = hot_path_cost_s(1)
    rows.append(dict(bench="monitoring", metric="hot-path recording per 100-record Produce (us; ratio = baseline "
                                                "request time / (it + recording))", value=cost_s * 1e6, unit="us",
                     baseline=per_request_s * 1e6, ratio=per_request_s / (per_request_s + cost_s)))
    rows.append(dict(bench="monitoring", metric=f"one /metrics scrape, {SCRAPE_PARTITIONS} partitions "
                                                f"({scrape_bytes:,} B)", value=scrape_s * 1000, unit="ms"))
    rows.append(dict(bench="monitoring", metric="scrapes during the runs", value=scraper.scrapes, unit="scrapes"))
    return rows


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
