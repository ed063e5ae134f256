"""`./build.sh bench tls`: produce and consume throughput over TLS as a ratio to
plaintext, on the same broker in the same run.

One broker with three listeners (PLAINTEXT, SSL with mTLS, SASL_SSL) and the ACL
authorizer on (ACLs for every principal used, so each protocol pays the same
authorization), 100-byte values in batches of 10,000, RF=1, acks=1; producers
use gRPC Produce and consumers Fetch on every protocol, so the same path is
compared (an SSL client never uses Flight). SASL_SSL clients' default, Flight
(DoPut, DoGet) over TLS, is compared with the plaintext client's gRPC path: on a
broker with TLS listeners the Flight listener is TLS only, so that is what a
plaintext client of this broker uses.

The machine these runs share is noisy (other work comes and goes within seconds),
so one figure per protocol says little. The protocols take turns in each of
ROUNDS rounds, the order reversed every other round (PLAINTEXT, SSL, SASL_SSL,
then SASL_SSL, SSL, PLAINTEXT, ...), and each round gives its own ratio of TLS to
the plaintext run next to it; a row reports the median of those per-round
ratios, and the next row their spread (lowest-highest). CPU seconds of client +
broker per run are reported the same way: they say more than wall time on a busy
machine. The 1-minute load average before and after the run is the last row.
The goal is a ratio of at least 0.7."""
from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time

import replikafka
from bench import cluster_bench as C
from bench import storage_bench as S
from replikafka.client.connection import CHANNEL_OPTIONS, open_channel
from replikafka.local_cluster import LocalCluster

RECORDS = 500_000
ROUNDS = 6
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
    # SASL_SSL consumers read with Flight (grpc+tls) by default; on this broker a plaintext client cannot
    # (its Flight listener is TLS only, as every listener of a broker with TLS listeners), so its Flight
    # read is compared with the plaintext client's Fetch, what that client reads with here.
    # The same holds for producers (Flight DoPut is a SASL_SSL producer's default).
    kinds = {"PLAINTEXT": ("produce", "consume"), "SSL": ("produce", "consume"),
             "SASL_SSL": ("produce", "consume", "produce via Flight", "consume via Flight")}
    baseline_kind = {"produce": "produce", "consume": "consume", "produce via Flight": "produce",
                     "consume via Flight": "consume"}
    took = {(p, k): [] for p in PROTOCOLS for k in kinds[p]}   # seconds, one per round
    cpu = {key: [] for key in took}    # CPU seconds of the client and the broker, one per round
    load_before = os.getloadavg()[0]
    try:
        alone = grpc_alone_rows(setup, batches)
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
            for proto in (PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]):
                topic = f"bench-{proto.lower()}-{r}"
                for name in ((topic, topic + "-flight") if "produce via Flight" in kinds[proto] else (topic,)):
                    admin.create_topic(name, partitions=1, replication_factor=1, schema="value BINARY",
                                       config={"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)})
                bs, pid = cluster.bootstrap_for(proto), cluster.procs[1].pid
                works = {"produce": lambda: C._produce(bs, topic, batches, configs[proto], use_flight=False),
                         "produce via Flight": lambda: C._produce(bs, topic + "-flight", batches, configs[proto]),
                         "consume": lambda: C._consume(bs, topic, n, pid, configs[proto], use_flight=False)[0],
                         "consume via Flight": lambda: C._consume(bs, topic, n, pid, configs[proto])[0]}
                for kind in kinds[proto]:
                    work = works[kind]
                    before = _cpu_s(pid)
                    took[proto, kind].append(work())
                    cpu[proto, kind].append(_cpu_s(pid) - before)
        admin.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    rows = []
    for kind in kinds["SASL_SSL"]:
        plain = took["PLAINTEXT", baseline_kind[kind]]
        tls = [p for p in ("SSL", "SASL_SSL") if kind in kinds[p]]
        for proto in tls:
            ours = took[proto, kind]
            ratios = [p / o for p, o in zip(plain, ours)]
            vs = "" if kind == baseline_kind[kind] else \
                f" vs PLAINTEXT {baseline_kind[kind]} with {'Fetch' if kind.startswith('consume') else 'Produce'}"
            rows.append(dict(bench="tls", metric=f"{kind} over {proto}{vs} records/s (ratio: median of {len(ratios)} "
                                                 f"per-round ratios)", value=n / statistics.median(ours),
                             unit="records/s", baseline=n / statistics.median(plain), ratio=statistics.median(ratios)))
            rows.append(dict(bench="tls", metric=f"  {kind} over {proto}: per-round ratios lowest-highest",
                             value=f"{min(ratios):.2f}-{max(ratios):.2f}", unit="ratio"))
        for proto in tls:   # less sensitive to a busy machine than wall time
            ratios = [p / o for p, o in zip(cpu["PLAINTEXT", baseline_kind[kind]], cpu[proto, kind])]
            rows.append(dict(bench="tls", metric=f"{kind} over {proto} CPU s (client+broker; ratio: median of "
                                                 f"per-round ratios, lowest-highest {min(ratios):.2f}-{max(ratios):.2f})",
                             value=statistics.median(cpu[proto, kind]), unit="s",
                             baseline=statistics.median(cpu["PLAINTEXT", baseline_kind[kind]]),
                             ratio=statistics.median(ratios)))
    rows += alone
    rows.append(dict(bench="tls", metric="load average (1 min) before / after the run",
                     value=f"{load_before:.1f} / {os.getloadavg()[0]:.1f}", unit=""))
    return rows


def grpc_alone_rows(setup, batches, message_bytes: int = 1 << 20, total_bytes: int = 100 << 20) -> list[dict]:
    """The transport's own cost, without replikafka: unary calls carrying ``message_bytes``
    up (as a produce) and down (as a fetch answer), to a gRPC server in this process with
    a plaintext and a TLS port (the broker's certificate), interleaved rounds as above.
    CPU is this process's (client and server)."""
    from concurrent import futures

    import grpc

    from replikafka.security import tls

    payload = os.urandom(message_bytes)
    handler = grpc.method_handlers_generic_handler("bench", {
        "up": grpc.unary_unary_rpc_method_handler(lambda req, ctx: b"ok"),
        "down": grpc.unary_unary_rpc_method_handler(lambda req, ctx: payload)})
    opts = list(CHANNEL_OPTIONS)
    server = grpc.server(futures.ThreadPoolExecutor(4), handlers=[handler], options=opts)
    cert = setup.broker_cert    # the broker's certificate, read as the broker reads it
    ports = {"PLAINTEXT": server.add_insecure_port("127.0.0.1:0"),
             "TLS": server.add_secure_port("127.0.0.1:0", tls.server_credentials(
                 cert.ca, cert.certificate, cert.key, cert.key_password, "none"))}
    server.start()
    with open(cert.ca, "rb") as f:
        roots = f.read()
    channels = {"PLAINTEXT": open_channel(f"127.0.0.1:{ports['PLAINTEXT']}", options=opts),
                "TLS": open_channel(f"127.0.0.1:{ports['TLS']}", grpc.ssl_channel_credentials(roots), options=opts)}
    took = {(p, d): [] for p in channels for d in ("up", "down")}
    cpu = {k: [] for k in took}
    try:
        for r in range(ROUNDS):
            for proto in (("PLAINTEXT", "TLS") if r % 2 == 0 else ("TLS", "PLAINTEXT")):
                up = channels[proto].unary_unary("/bench/up")
                down = channels[proto].unary_unary("/bench/down")
                up(b"warm"), down(b"warm")
                for direction, call, arg in (("up", up, payload), ("down", down, b"")):
                    t, c = time.perf_counter(), _cpu_s(os.getpid(), client=False)
                    for _ in range(total_bytes // message_bytes):
                        call(arg)
                    took[proto, direction].append(time.perf_counter() - t)
                    cpu[proto, direction].append(_cpu_s(os.getpid(), client=False) - c)
    finally:
        for ch in channels.values():
            ch.close()
        server.stop(None)
    flight = _flight_alone(setup, batches, total_bytes)
    rows = []
    for direction, name in (("up", "requests"), ("down", "answers")):
        ratios = [p / t for p, t in zip(took["PLAINTEXT", direction], took["TLS", direction])]
        cpu_ratios = [p / t for p, t in zip(cpu["PLAINTEXT", direction], cpu["TLS", direction])]
        mb = total_bytes / 1e6
        rows.append(dict(bench="tls", metric=f"gRPC alone, {message_bytes >> 20} MB {name}, TLS vs PLAINTEXT MB/s "
                                             f"(lowest-highest {min(ratios):.2f}-{max(ratios):.2f})",
                         value=mb / statistics.median(took["TLS", direction]), unit="MB/s",
                         baseline=mb / statistics.median(took["PLAINTEXT", direction]), ratio=statistics.median(ratios)))
        rows.append(dict(bench="tls", metric=f"gRPC alone, {message_bytes >> 20} MB {name}: CPU s per "
                                             f"{total_bytes >> 20} MB (lowest-highest {min(cpu_ratios):.2f}-"
                                             f"{max(cpu_ratios):.2f})",
                         value=statistics.median(cpu["TLS", direction]), unit="s",
                         baseline=statistics.median(cpu["PLAINTEXT", direction]), ratio=statistics.median(cpu_ratios)))
    n = sum(b.num_rows for b in batches)
    for what, i, unit in (("records/s", 0, "records/s"), ("CPU s", 1, "s")):
        ratios = [p[i] / t[i] for p, t in zip(flight["PLAINTEXT"], flight["TLS"])]
        value = [statistics.median(x[i] for x in flight[k]) for k in ("TLS", "PLAINTEXT")]
        if i == 0:
            value = [n / v for v in value]
        rows.append(dict(bench="tls", metric=f"pyarrow.flight alone, do_get of {n:,} records from memory, grpc+tls vs "
                                             f"grpc {what} (lowest-highest {min(ratios):.2f}-{max(ratios):.2f})",
                         value=value[0], unit=unit, baseline=value[1], ratio=statistics.median(ratios)))
    return rows


def _flight_alone(setup, batches, total_bytes: int) -> dict[str, list[tuple[float, float]]]:
    """(seconds, CPU seconds of this process) per round of a do_get of ``batches`` from a
    pyarrow.flight server in this process, over grpc and grpc+tls (the broker's certificate)."""
    import pyarrow as pa
    import pyarrow.flight as fl

    from replikafka.security.certs import decrypted_key_pem

    table = pa.Table.from_batches(batches)

    class Server(fl.FlightServerBase):
        def do_get(self, context, ticket):
            return fl.RecordBatchStream(table)

    cert = setup.broker_cert
    with open(cert.certificate, "rb") as f:
        chain = f.read()
    with open(cert.ca, "rb") as f:
        roots = f.read()
    servers = {"PLAINTEXT": Server("grpc://127.0.0.1:0"),
               "TLS": Server("grpc+tls://127.0.0.1:0", tls_certificates=[
                   fl.CertKeyPair(cert=chain, key=decrypted_key_pem(cert.key, cert.key_password))])}
    clients = {"PLAINTEXT": fl.connect(f"grpc://127.0.0.1:{servers['PLAINTEXT'].port}"),
               "TLS": fl.connect(f"grpc+tls://127.0.0.1:{servers['TLS'].port}", tls_root_certs=roots)}
    out: dict[str, list[tuple[float, float]]] = {k: [] for k in servers}
    try:
        for r in range(ROUNDS):
            for proto in (("PLAINTEXT", "TLS") if r % 2 == 0 else ("TLS", "PLAINTEXT")):
                clients[proto].do_get(fl.Ticket(b"warm")).read_all()
                t, c = time.perf_counter(), _cpu_s(os.getpid(), client=False)
                rows = clients[proto].do_get(fl.Ticket(b"all")).read_all().num_rows
                out[proto].append((time.perf_counter() - t, _cpu_s(os.getpid(), client=False) - c))
                assert rows == table.num_rows
    finally:
        for c in clients.values():
            c.close()
        for srv in servers.values():
            srv.shutdown()
    return out


def _cpu_s(broker_pid: int, client: bool = True) -> float:
    """CPU seconds used so far by this process (the client, with gRPC's threads) and the broker."""
    t = os.times()
    return t.user + t.system + (C.process_cpu_s(broker_pid) if client else 0.0)


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
