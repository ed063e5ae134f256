"""`./build.sh bench tls`: produce and consume throughput over TLS as a ratio to
plaintext, on the same broker in the same run.

One broker with three listeners (PLAINTEXT, SSL with mTLS, SASL_SSL) and the ACL
authorizer on (ACLs for every principal used, so each protocol pays the same
authorization), 100-byte values in batches of 10,000, RF=1, acks=1; the
protocols take turns each round and the best of the rounds counts. The goal is
a ratio of at least 0.7."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import replikafka
from bench import storage_bench as S
from replikafka.local_cluster import LocalCluster

RECORDS = 500_000
ROUNDS = 3
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


def _produce(cfg: dict, topic: str, batches) -> float:
    with replikafka.Producer({**cfg, "acks": 1, "linger.ms": 0, "batch.size": 32 << 20}) as p:
        p.send(topic, batches[0].slice(0, 1), partition=0).result(timeout=60)  # warm: connections, TLS
        t = time.perf_counter()
        futs = [p.send(topic, b, partition=0) for b in batches]
        for f in futs:
            f.result(timeout=120)
        return time.perf_counter() - t


def _consume(cfg: dict, topic: str, n: int) -> float:
    c = replikafka.Consumer({**cfg, "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    c.assign([(topic, 0)])
    c.seek((topic, 0), 0)
    got = c.poll(timeout_ms=1000).num_rows     # warm: connections, TLS
    t = time.perf_counter()
    while got < n + 1:
        got += c.poll(timeout_ms=1000).num_rows
    elapsed = time.perf_counter() - t
    c.close()
    return elapsed


def run() -> list[dict]:
    from replikafka.security import acl as A
    from replikafka.security.local_setup import SecureSetup
    from replikafka.security.zk_security import AclStore

    batches = S.make_batches()[: RECORDS // S.BATCH]
    n = len(batches) * S.BATCH
    root = tempfile.mkdtemp(prefix="tls-bench-")
    setup = SecureSetup(os.path.join(root, "pki"), users=("bench",))
    cluster = LocalCluster(os.path.join(root, "cluster"), 1, die_with_parent=True, security=setup,
                           protocols=("SSL", "SASL_SSL", "PLAINTEXT"),
                           overrides={"message.max.bytes": str(64 << 20)})
    best = {(p, k): float("inf") for p in PROTOCOLS for k in ("produce", "consume")}
    try:
        cluster.start()
        zk = cluster.zk(digest=setup.zk_digest)
        for principal in ("User:ANONYMOUS", "User:bench"):
            AclStore(zk).change(A.ResourcePattern("Topic", "bench-", "prefixed"),
                                add=frozenset({A.AclEntry(principal, "*", "All", "Allow")}))
        zk.stop()
        zk.close()
        configs = {"PLAINTEXT": {}, "SSL": setup.client_config("bench", "SSL"),
                   "SASL_SSL": setup.client_config("bench", "SASL_SSL")}
        admin = replikafka.Admin({"bootstrap.servers": cluster.bootstrap_for("SSL"), **setup.client_config("admin")})
        time.sleep(1.0)   # the broker's ACL watch
        for r in range(ROUNDS):
            for proto in PROTOCOLS:
                topic = f"bench-{proto.lower()}-{r}"
                admin.create_topic(topic, partitions=1, replication_factor=1, schema="value BINARY",
                                   config={"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)})
                cfg = {"bootstrap.servers": cluster.bootstrap_for(proto), **configs[proto]}
                best[proto, "produce"] = min(best[proto, "produce"], _produce(cfg, topic, batches))
                best[proto, "consume"] = min(best[proto, "consume"], _consume(cfg, topic, n))
        admin.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for kind in ("produce", "consume"):
        base = best["PLAINTEXT", kind]
        for proto in ("SSL", "SASL_SSL"):
            ours = best[proto, kind]
            rows.append(dict(bench="tls", metric=f"{kind} over {proto} records/s", value=n / ours, unit="records/s",
                             baseline=n / base, ratio=base / ours))
    return rows


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
