"""`./build.sh bench replication`: replication costs and failover at scale.

* produce with acks=all to RF=3 (3 local brokers, min.insync.replicas=2), as a
  ratio of acks=1 to RF=1 on the same cluster in the same run, and with the
  followers fetching over Flight instead of gRPC (interleaved rounds), with the
  CPU seconds of client, leader and followers;
* failover at scale: N partitions (default 10,000; REPLIKAFKA_BENCH_PARTITIONS)
  led by one broker, which is killed; time from the controller noticing to every
  partition having a new leader, and to every partition having accepted a write;
* controller failover with those N partitions: time to load and resend state;
* end-to-end latency (produce acks=all -> consumer) at 1,000 batches/s of 10
  records, with a breakdown by stage (see ``latency``).
"""
from __future__ import annotations

import os
import re
import shutil
import statistics
import tempfile
import threading
import time
from datetime import datetime

import grpc
import numpy as np
import pyarrow as pa

import replikafka
from bench.cluster_bench import process_cpu_s
from replikafka.local_cluster import LocalCluster
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

RECORDS = 1_000_000
BATCH = 10_000
PARTITIONS = 6
THROUGHPUT_ROUNDS = 4
SCALE_PARTITIONS = int(os.environ.get("REPLIKAFKA_BENCH_PARTITIONS", "10000"))
LATENCY_SECONDS = 5.0
LATENCY_BATCHES_PER_S = 1000     # the "modest load": 1,000 batches/s of 10 records
LATENCY_BATCH_RECORDS = 10


def _batch(first: int, n: int) -> pa.RecordBatch:
    offsets = np.arange(0, (n + 1) * 100, 100, dtype=np.int32)
    values = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(np.full(n * 100, 7, np.uint8))])
    return pa.record_batch([values], names=["value"])


def _produce(bs: str, topic: str, acks) -> tuple[float, float]:
    """(seconds, this process's CPU seconds) to produce RECORDS to ``topic``."""
    batches = [_batch(i, BATCH) for i in range(0, RECORDS, BATCH)]
    with replikafka.Producer(bs, acks=acks, linger_ms=0) as p:
        p.send(topic, batches[0].slice(0, 1), partition=0).result(timeout=60)  # warm: connections, imports
        cpu = _own_cpu_s()
        t = time.perf_counter()
        futs = [p.send(topic, b, partition=i % PARTITIONS) for i, b in enumerate(batches)]
        for f in futs:
            f.result(timeout=300)
        return time.perf_counter() - t, _own_cpu_s() - cpu


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


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


def _produce_with_cpu(cluster, topic: str, acks) -> tuple[float, float, dict[int, float]]:
    """(seconds, client CPU s, broker id -> CPU s) of one produce of RECORDS."""
    before = {b: process_cpu_s(cluster.procs[b].pid) for b in cluster.ids}
    took, client_cpu = _produce(cluster.bootstrap_servers, topic, acks)
    return took, client_cpu, {b: process_cpu_s(cluster.procs[b].pid) - before[b] for b in cluster.ids}


def throughput(root: str) -> list[dict]:
    """acks=all to RF=3 against acks=1 to RF=1 on the same cluster, and the same with
    the followers fetching over Flight (replica.fetch.transport=flight) on a second
    cluster, rounds interleaved (gRPC, Flight, acks=1, then acks=1, Flight, gRPC, ...). Every partition is
    led by broker 1 and followed by 2 and 3, so the CPU seconds per role (client,
    leader, followers; /proc/<pid>/stat) come out of each run."""
    clusters = {}
    rounds = {"grpc": [], "flight": []}
    try:
        for transport in ("grpc", "flight"):
            c = clusters[transport] = LocalCluster(os.path.join(root, f"tput-{transport}"), 3, die_with_parent=True,
                                                   overrides={"replica.fetch.transport": transport})
            c.start()
            admin = replikafka.Admin(c.bootstrap_servers)
            admin.create_topic("rf1", schema="value BINARY", assignment={p: [1] for p in range(PARTITIONS)})
            admin.close()
        base_rounds: list[float] = []
        for r in range(THROUGHPUT_ROUNDS):
            for transport in (("grpc", "flight", "rf1") if r % 2 == 0 else ("rf1", "flight", "grpc")):
                if transport == "rf1":    # the acks=1 RF=1 baseline, in the same rounds
                    base_rounds.append(_produce_with_cpu(clusters["grpc"], "rf1", 1)[0])
                    continue
                c = clusters[transport]
                admin = replikafka.Admin(c.bootstrap_servers)
                topic = f"rf3-{r}"
                admin.create_topic(topic, schema="value BINARY", config={"min.insync.replicas": "2"},
                                   assignment={p: [1, 2, 3] for p in range(PARTITIONS)})
                admin.close()
                time.sleep(1.0)   # the followers' fetchers start
                rounds[transport].append(_produce_with_cpu(c, topic, "all"))
    finally:
        for c in clusters.values():
            c.stop()
    best = {t: min(rs, key=lambda x: x[0]) for t, rs in rounds.items()}
    base = min(base_rounds)
    per_round = [b / x[0] for b, x in zip(base_rounds, rounds["grpc"])]
    rows = [dict(bench="replication", metric="produce acks=all RF=3 records/s, baseline acks=1 RF=1 (best of "
                                             "interleaved rounds each)",
                 value=RECORDS / best["grpc"][0], unit="records/s", baseline=RECORDS / base,
                 ratio=base / best["grpc"][0]),
            dict(bench="replication", metric=f"  the same: median of the {len(per_round)} per-round ratios "
                                             f"(lowest {min(per_round):.2f}, highest {max(per_round):.2f})",
                 value=statistics.median(per_round), unit="ratio"),
            dict(bench="replication", metric="produce acks=all RF=3 records/s, baseline the goal (3M)",
                 value=RECORDS / best["grpc"][0], unit="records/s", baseline=3e6,
                 ratio=RECORDS / best["grpc"][0] / 3e6),
            dict(bench="replication", metric="produce acks=all RF=3, followers over Flight: records/s, baseline "
                                             "followers over gRPC (best of interleaved rounds)",
                 value=RECORDS / best["flight"][0], unit="records/s", baseline=RECORDS / best["grpc"][0],
                 ratio=best["grpc"][0] / best["flight"][0])]
    for transport in ("grpc", "flight"):
        cpu = {k: statistics.median(x[1] if k == "client" else x[2][k] for x in rounds[transport])
               for k in ("client", 1, 2, 3)}
        rows.append(dict(bench="replication", metric=f"CPU s per {RECORDS:,} records acks=all RF=3 (followers over "
                                                    f"{transport}; median of rounds): client / leader / follower 2 "
                                                    f"/ follower 3",
                         value=f"{cpu['client']:.2f} / {cpu[1]:.2f} / {cpu[2]:.2f} / {cpu[3]:.2f}", unit="s"))
    return rows


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


def _latency_series(bs: str, topic: str, acks, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """(ack ms, end-to-end ms) per batch: LATENCY_BATCHES_PER_S batches of
    LATENCY_BATCH_RECORDS records sent without waiting (a fixed schedule), each
    acknowledged through its future's callback and seen by a consumer (its Flight
    long poll) in another thread; end to end is send -> the consumer's poll returns it."""
    seen: dict[int, float] = {}
    stop = threading.Event()
    ready = threading.Event()

    def consume():
        c = replikafka.Consumer(bs, fetch_max_wait_ms=200)
        c.assign([(topic, 0)])
        c.seek_to_end()
        c.position((topic, 0))
        ready.set()
        while not stop.is_set():
            t = c.poll(timeout_ms=200)
            now = time.perf_counter()
            if t.num_rows:
                for v in t.column("value").to_pylist()[::LATENCY_BATCH_RECORDS]:
                    seen.setdefault(int(v.split(b":")[0]), now)
        c.close()

    th = threading.Thread(target=consume, daemon=True)
    th.start()
    ready.wait(30)
    sent: dict[int, float] = {}
    acked: dict[int, float] = {}
    with replikafka.Producer(bs, acks=acks, linger_ms=0) as prod:
        prod.send(topic, [{"value": b"-1:warm"}], partition=0).result(timeout=30)
        time.sleep(0.5)
        total = int(seconds * LATENCY_BATCHES_PER_S)
        start = time.perf_counter()
        for i in range(total):
            due = start + i / LATENCY_BATCHES_PER_S
            while (left := due - time.perf_counter()) > 0:
                time.sleep(left)
            t0 = time.perf_counter()
            sent[i] = t0
            values = pa.array([b"%d:%d" % (i, j) for j in range(LATENCY_BATCH_RECORDS)], pa.binary())
            f = prod.send(topic, pa.record_batch([values], names=["value"]), partition=0)
            f.add_done_callback(lambda _f, i=i: acked.__setitem__(i, time.perf_counter()))
        prod.flush(60)
    _wait(lambda: all(i in seen for i in sent), 60, "the consumer to see every batch")
    stop.set()
    th.join(timeout=5)
    keys = sorted(sent)
    return (np.array([acked[k] - sent[k] for k in keys]) * 1000, np.array([seen[k] - sent[k] for k in keys]) * 1000)


def _round_trip_ms(cluster, n: int = 2000) -> np.ndarray:
    """A Flight no-op action's round trip to a broker: the transport's floor."""
    import pyarrow.flight as fl
    import replikafka.client.metadata as M
    from replikafka.client.connection import ConnectionPool, parse_bootstrap
    pool = ConnectionPool()
    meta = M.ClusterMetadata(pool, parse_bootstrap(cluster.bootstrap_servers), request_timeout_ms=10_000,
                             retry_backoff_ms=100)
    meta.refresh(all_topics=True)
    client = fl.connect(f"grpc+tcp://{meta.brokers()[0].listener('FLIGHT')}")
    out = []
    for _ in range(n):
        t = time.perf_counter()
        list(client.list_actions())
        out.append(time.perf_counter() - t)
    client.close()
    pool.close()
    return np.array(out) * 1000


def latency(root: str) -> list[dict]:
    """End-to-end latency at LATENCY_BATCHES_PER_S batches/s of LATENCY_BATCH_RECORDS
    records, acks=all to RF=3 (min.insync.replicas=2), and where the milliseconds
    go, from series measured in this run on this cluster: the transport's round
    trip (a Flight no-op), acks=1 to RF=1 (the producer's hand-offs, the RPC, the
    leader's append), acks=all's extra (the followers' fetch round trips, the HW's
    advance, the waiting produce's wake-up), and the consumer's part (the long
    poll's wake-up on the HW's advance and its DoGet: end to end minus the ack); and
    acks=all sent one at a time, so the wait behind the partition's append in flight
    (the producer keeps one per partition) shows apart from an append's own round,
    with the CPU per batch of each process (on 2 shared cores, CPU is what queues)."""
    cluster = LocalCluster(os.path.join(root, "lat"), 3, die_with_parent=True)
    try:
        cluster.start()
        bs = cluster.bootstrap_servers
        admin = replikafka.Admin(bs)
        # Led by broker 1, followed by 2 and 3: the CPU per role comes out of each series.
        admin.create_topic("lat3", schema="value BINARY", config={"min.insync.replicas": "2"},
                           assignment={0: [1, 2, 3]})
        admin.create_topic("lat1", schema="value BINARY", assignment={0: [1]})
        admin.close()
        rtt = _round_trip_ms(cluster)
        ack1, e2e1 = _latency_series(bs, "lat1", 1, LATENCY_SECONDS)
        before = _cpu_now(cluster)
        ack3, e2e3 = _latency_series(bs, "lat3", "all", LATENCY_SECONDS)
        cpu3 = [(b - a) / len(ack3) * 1000 for a, b in zip(before, _cpu_now(cluster))]
        one3 = _one_at_a_time_ms(bs, "lat3", "all", LATENCY_SECONDS)
    finally:
        cluster.stop()
    p = lambda a, q: float(np.percentile(a, q))
    rows = []
    for q in (50, 99):
        rows.append(dict(bench="replication", metric=f"end-to-end latency acks=all RF=3 p{q} (send -> consumer "
                                                    f"sees; {LATENCY_BATCHES_PER_S} batches/s of "
                                                    f"{LATENCY_BATCH_RECORDS}), baseline: RPC round trip p{q}",
                         value=p(e2e3, q), unit="ms", baseline=p(rtt, q), ratio=p(e2e3, q) / p(rtt, q)))
    for q in (50, 99):
        rows.append(dict(bench="replication", metric=f"produce ack latency acks=all RF=3 p{q}, baseline: "
                                                    f"acks=1 RF=1", value=p(ack3, q), unit="ms",
                         baseline=p(ack1, q), ratio=p(ack3, q) / p(ack1, q)))
    stages = [("RPC round trip (Flight no-op)", rtt),
              ("acks=1 RF=1 ack", ack1),
              ("acks=1 RF=1 end to end", e2e1),
              ("acks=all RF=3 ack", ack3),
              ("acks=all RF=3 end to end", e2e3),
              ("acks=all RF=3 ack, one send at a time (each waits for the previous ack)", one3)]
    for name, a in stages:
        rows.append(dict(bench="replication", metric=f"latency stage: {name} p50 / p99",
                         value=f"{p(a, 50):.2f} / {p(a, 99):.2f}", unit="ms"))
    breakdown = [("transport round trip", p(rtt, 50)),
                 ("producer hand-offs + leader append (acks=1 ack - round trip)", p(ack1, 50) - p(rtt, 50)),
                 ("replication: follower fetches, HW advance, produce wake-up (acks=all ack - acks=1 ack)",
                  p(ack3, 50) - p(ack1, 50)),
                 ("consumer: long-poll wake-up + DoGet (end to end - ack, acks=all)", p(e2e3, 50) - p(ack3, 50)),
                 ("of acks=all's ack, waiting behind the partition's append in flight (ack - one at a time)",
                  p(ack3, 50) - p(one3, 50))]
    for name, ms in breakdown:
        rows.append(dict(bench="replication", metric=f"latency breakdown p50: {name}", value=ms, unit="ms"))
    rows.append(dict(bench="replication", metric=f"CPU ms per batch at {LATENCY_BATCHES_PER_S} batches/s acks=all RF=3: "
                                                f"client (producer + consumer) / leader / follower / follower "
                                                f"({os.cpu_count()} cores)",
                     value=" / ".join(f"{v:.2f}" for v in cpu3), unit="ms"))
    return rows


def _cpu_now(cluster) -> list[float]:
    """CPU seconds so far of this process and brokers 1, 2, 3."""
    return [_own_cpu_s()] + [process_cpu_s(cluster.procs[b].pid) for b in (1, 2, 3)]


def _one_at_a_time_ms(bs: str, topic: str, acks, seconds: float) -> np.ndarray:
    """Send -> ack ms of batches of LATENCY_BATCH_RECORDS sent one at a time (each after
    the previous one's ack, at most LATENCY_BATCHES_PER_S a second): one append's own
    round, without the wait behind the partition's append in flight."""
    out = []
    with replikafka.Producer(bs, acks=acks, linger_ms=0) as prod:
        prod.send(topic, [{"value": b"-1:warm"}], partition=0).result(timeout=30)
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            values = pa.array([b"%d:%d" % (i, j) for j in range(LATENCY_BATCH_RECORDS)], pa.binary())
            t0 = time.perf_counter()
            prod.send(topic, pa.record_batch([values], names=["value"]), partition=0).result(timeout=30)
            out.append(time.perf_counter() - t0)
            i += 1
            time.sleep(max(0.0, 1.0 / LATENCY_BATCHES_PER_S - (time.perf_counter() - t0)))
    return np.array(out) * 1000


def run() -> list[dict]:
    root = tempfile.mkdtemp(prefix="replication-bench-")
    try:
        return throughput(root) + latency(root) + failover_at_scale(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
