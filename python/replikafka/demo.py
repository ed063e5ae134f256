"""`./build.sh demo`: the whole system on this machine in a few minutes.

1. an embedded ZooKeeper and 3 broker processes;
2. a topic with 6 partitions, replication factor 3, min.insync.replicas=2;
3. 1,000,000 records produced with acks=all through the idempotent producer;
4. a Spark batch aggregation over ``format("replikafka")``;
5. a Spark streaming query reading the topic into Parquet while more records
   arrive and one broker (a partition leader) is killed with SIGKILL and
   restarted;
6. a check that the stream saw every record exactly once; then clean-up.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pyarrow as pa

import replikafka
from replikafka.local_cluster import LocalCluster

TOPIC = "demo-events"
PARTITIONS = 6
BATCH = 10_000
PAYLOAD_BYTES = 100


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def make_batch(first_id: int, n: int) -> pa.RecordBatch:
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    offsets = np.arange(0, (n + 1) * PAYLOAD_BYTES, PAYLOAD_BYTES, dtype=np.int32)
    payload = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets),
                                                     pa.py_buffer(np.full(n * PAYLOAD_BYTES, 120, np.uint8))])
    return pa.record_batch([pa.array(ids), payload], names=["id", "payload"])


def produce(bs: str, first_id: int, count: int, security: dict | None = None) -> float:
    t = time.perf_counter()
    with replikafka.Producer(bs, acks="all", idempotent=True, linger_ms=5, security=security) as prod:
        futs = [prod.send(TOPIC, make_batch(i, min(BATCH, first_id + count - i)), partition=(i // BATCH) % PARTITIONS)
                for i in range(first_id, first_id + count, BATCH)]
        for f in futs:
            f.result(timeout=300)
    return time.perf_counter() - t


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="replikafka.demo")
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--keep", action="store_true", help="leave the cluster's files in place")
    ap.add_argument("--secure", action="store_true",
                    help="TLS + SASL (SCRAM) + ACLs + ZooKeeper ACLs, with throwaway certificates")
    args = ap.parse_args(argv)
    n = args.records
    started = time.time()
    root = tempfile.mkdtemp(prefix="replikafka-demo-")
    setup = None
    if args.secure:
        from replikafka.security.local_setup import SecureSetup
        setup = SecureSetup(os.path.join(root, "pki"))
    cluster = LocalCluster(os.path.join(root, "cluster"), 3, die_with_parent=True, security=setup,
                           overrides={"zookeeper.session.timeout.ms": "6000"})
    spark = None
    try:
        say("starting ZooKeeper (from the pyspark jars) and 3 brokers ...")
        cluster.start()
        bs = cluster.bootstrap_for("SASL_SSL") if setup else cluster.bootstrap_servers
        # secure: every client speaks SASL_SSL as User:admin; Spark takes the same keys prefixed with "kafka."
        sec = setup.client_config("admin", "SASL_SSL") if setup else None
        spark_sec = {f"kafka.{k}": v for k, v in (sec or {}).items()}
        say(f"cluster up: bootstrap servers {bs}, controller is broker {cluster.controller_id()}"
            + (" (TLS + SASL_SSL, ACLs, ZooKeeper ACLs)" if setup else ""))
        for bid in cluster.ids:   # Prometheus and the status page stay up while the demo runs
            say(f"  broker {bid}: metrics {cluster.metrics_url(bid)}/metrics  status page {cluster.metrics_url(bid)}/")

        admin = replikafka.Admin(bs, security=sec)
        admin.create_topic(TOPIC, partitions=PARTITIONS, replication_factor=3, schema="id BIGINT, payload BINARY",
                           config={"min.insync.replicas": "2"})
        for p in admin.describe_topic(TOPIC).partitions:
            say(f"  {TOPIC}-{p.partition}: leader {p.leader} replicas {list(p.replicas)} isr {list(p.isr)}")

        secs = produce(bs, 0, n, sec)
        say(f"produced {n:,} records (acks=all, RF=3) in {secs:.1f}s = {n / secs:,.0f} records/s")

        from replikafka.spark import local_session
        say("starting Spark (local[2]) ...")
        spark = local_session("replikafka-demo")
        from pyspark.sql import functions as F
        df = spark.read.format("replikafka").option("bootstrap.servers", bs).options(**spark_sec) \
            .option("subscribe", TOPIC).load()
        t = time.perf_counter()
        rows = df.groupBy("partition").agg(F.count("*").alias("records"), F.sum("id").alias("sum_id")) \
            .orderBy("partition").collect()
        total = sum(r["records"] for r in rows)
        say(f"Spark batch aggregation over {total:,} records in {time.perf_counter() - t:.1f}s:")
        for r in rows:
            say(f"  partition {r['partition']}: {r['records']:,} records, sum(id) = {r['sum_id']:,}")
        expected_sum = n * (n - 1) // 2
        assert total == n and sum(r["sum_id"] for r in rows) == expected_sum, "batch read is not what was produced"
        say(f"  total matches what was produced (count {n:,}, sum(id) {expected_sum:,})")

        out_dir, ckpt = os.path.join(root, "stream-out"), os.path.join(root, "stream-ckpt")
        stream = (spark.readStream.format("replikafka").option("bootstrap.servers", bs).options(**spark_sec)
                  .option("subscribe", TOPIC).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", str(max(n // 5, 1))).load()
                  .select("id", "partition", "offset"))
        query = (stream.writeStream.format("parquet").option("path", out_dir).option("checkpointLocation", ckpt)
                 .trigger(processingTime="1 second").start())
        say("streaming query started (Parquet sink, exactly-once with its checkpoint)")

        extra = n // 5
        producer = threading.Thread(target=produce, args=(bs, n, extra, sec), daemon=True)
        producer.start()
        time.sleep(2)
        victim = admin.describe_topic(TOPIC).partitions[0].leader
        say(f"kill -9 broker {victim} (leader of {TOPIC}-0) while producing and streaming")
        cluster.kill(victim)
        deadline = time.time() + 60
        while time.time() < deadline and admin.describe_topic(TOPIC).partitions[0].leader in (victim, -1):
            time.sleep(0.2)
        say(f"  new leader of {TOPIC}-0: broker {admin.describe_topic(TOPIC).partitions[0].leader}")
        survivor = next(b for b in cluster.ids if b != victim)
        say(f"  under-replicated partitions now: {cluster.metrics_url(survivor)}/?state=under-replicated")
        time.sleep(3)
        say(f"restarting broker {victim}")
        cluster.start_broker(victim)
        producer.join(timeout=300)
        want = n + extra
        say(f"produced {extra:,} more records during the failure; waiting for the stream to see all {want:,}")
        consumer = replikafka.Consumer(bs, security=sec)
        tps = [(TOPIC, p) for p in range(PARTITIONS)]
        ends = consumer.end_offsets(tps)
        consumer.close()
        assert sum(ends.values()) == want, f"high watermarks sum to {sum(ends.values())}, expected {want}"
        deadline = time.time() + 120
        while time.time() < deadline:
            progress = query.lastProgress
            if progress and progress["sources"]:
                import json
                end = progress["sources"][0]["endOffset"]
                end = json.loads(end) if isinstance(end, str) else end
                if end and sum(end.get(TOPIC, {}).values()) >= want and not query.status["isDataAvailable"]:
                    break
            time.sleep(1)
        query.processAllAvailable()
        query.stop()
        seen = spark.read.parquet(out_dir)
        count = seen.count()
        distinct_ids = seen.select("id").distinct().count()
        distinct_offsets = seen.select("partition", "offset").distinct().count()
        say(f"stream wrote {count:,} rows: {distinct_ids:,} distinct ids, {distinct_offsets:,} distinct offsets")
        ok = count == want and distinct_ids == want and distinct_offsets == want
        wait_isr = time.time() + 60
        while time.time() < wait_isr and not all(len(p.isr) == 3 for p in admin.describe_topic(TOPIC).partitions):
            time.sleep(0.5)
        for p in admin.describe_topic(TOPIC).partitions:
            say(f"  {TOPIC}-{p.partition}: leader {p.leader} isr {list(p.isr)} hw {p.high_watermark:,}")
        admin.close()
        if ok:
            say(f"EXACTLY ONCE: the stream saw every one of the {want:,} records once, across a broker kill "
                f"({time.time() - started:.0f}s in all)")
            return 0
        say("FAILED: the stream did not see every record exactly once")
        return 1
    finally:
        if spark is not None:
            spark.stop()
        cluster.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            say(f"files kept in {root}")


if __name__ == "__main__":
    sys.exit(main())
