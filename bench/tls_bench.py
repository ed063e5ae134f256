"""`./build.sh bench tls`: produce and consume throughput over TLS as a ratio to
plaintext, on the same broker in the same run.

One broker with three listeners (PLAINTEXT, SSL with mTLS, SASL_SSL) and the ACL
authorizer on (ACLs for every principal used, so each protocol pays the same
authorization), 100-byte values in batches of 10,000, RF=1, acks=1; consumers
read with Fetch (gRPC) on every protocol, so the same path is compared (an SSL
client never reads with Flight). The protocols take turns each round and the
best of the rounds counts; CPU seconds of client + broker are reported too, as
they say more than wall time on a busy machine. The goal is a ratio of at least 0.7."""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import replikafka
from bench import cluster_bench as C
from bench import storage_bench as S
from replikafka.local_cluster import LocalCluster

RECORDS = 500_000
ROUNDS = 3
PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_SSL")


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
    cpu = dict(best)    # CPU seconds of the client and the broker during the run
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
                bs, pid = cluster.bootstrap_for(proto), cluster.procs[1].pid
                for kind, work in (("produce", lambda: C._produce(bs, topic, batches, configs[proto])),
                                   ("consume", lambda: C._consume(bs, topic, n, pid, configs[proto], use_flight=False)[0])):
                    before = _cpu_s(pid)
                    best[proto, kind] = min(best[proto, kind], work())
                    cpu[proto, kind] = min(cpu[proto, kind], _cpu_s(pid) - before)
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
        for proto in ("SSL", "SASL_SSL"):   # less sensitive to a busy machine than wall time
            rows.append(dict(bench="tls", metric=f"{kind} over {proto} CPU s (client+broker)", value=cpu[proto, kind],
                             unit="s", baseline=cpu["PLAINTEXT", kind], ratio=cpu["PLAINTEXT", kind] / cpu[proto, kind]))
    return rows


def _cpu_s(broker_pid: int) -> float:
    """CPU seconds used so far by this process (the client, with gRPC's threads) and the broker."""
    t = os.times()
    return t.user + t.system + C.process_cpu_s(broker_pid)


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
