"""`./build.sh bench cluster`: one broker, RF=1, 100-byte values in batches of
10,000 — produce (acks=1) and consume records/s through the client library,
each as a ratio of the storage engine's own append / read of the same batches
measured in the same run (what a broker could do with zero RPC cost). The
produce goes through Flight DoPut (the producer's default) and, in interleaved
rounds, through gRPC Produce (``use_flight=False``), with the client's and the
broker's CPU seconds per GB for each.

The leader's validation of produced records is measured against the same broker
skipping it: `bench/trusting_broker.py` skips it for topics named ``trusted-*``
only, so both sides run on one broker process in interleaved rounds (validated,
trusted, trusted, validated, ...), through both of the producer's paths: Flight
DoPut (its default: Arrow's full validation; the CRC-32C the log computes to
store the batch must equal the producer's, which costs a comparison) and gRPC
Produce (the payload's CRC-32C, one IPC stream, Arrow's full validation). A row's
ratio is the median of the per-round ratios, with their spread. A gRPC produce
with a wrong CRC is sent to both topics first, to show the one refuses it and the
other really skips the check. The gRPC path's validation is also timed alone, in
this process, on the same payloads (no RPC noise).

The consumer reads through the broker's Arrow Flight listener (its default); the
same read is also timed against plain ``pyarrow.flight`` serving the same
batches from memory in this process (the transport's ceiling; measured with
gRPC's default client options and with the consumer's own), with ``Fetch``
only (``use_flight=False``), and with 4 consumers on 4 partitions at once. The
broker's CPU seconds per GB served come from /proc/<pid>/stat."""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import pyarrow as pa
import pyarrow.flight as fl

import replikafka
from bench import storage_bench as S
from replikafka.broker import produce_decoding
from replikafka.client.flight_reader import FLIGHT_CLIENT_GENERIC_OPTIONS
from replikafka.local_cluster import LocalCluster

RECORDS = 1_000_000
ROUNDS = 2
VALIDATION_ROUNDS = 6     # interleaved rounds of the validation row (each produces RECORDS twice)


def _produce(bs: str, topic: str, batches, security: dict | None = None, **producer) -> float:
    with replikafka.Producer(bs, acks=1, idempotent=True, linger_ms=0, batch_size=32 << 20,
                             max_in_flight=5, security=security, **producer) as p:
        p.send(topic, batches[0].slice(0, 1), partition=0).result(timeout=60)  # warm: connections, imports
        t = time.perf_counter()
        futs = [p.send(topic, b, partition=0) for b in batches]
        for f in futs:
            f.result(timeout=120)
        return time.perf_counter() - t


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (/proc/<pid>/stat fields 14 and 15)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _consume(bs: str, topic: str, n: int, broker_pid: int, security: dict | None = None,
             partition: int = 0, **consumer) -> tuple[float, float]:
    """(seconds, broker CPU seconds) to read ``n`` records from ``partition``."""
    c = replikafka.Consumer(bs, fetch_max_bytes=64 << 20, max_partition_fetch_bytes=16 << 20, security=security,
                            **consumer)
    c.assign([(topic, partition)])
    c.seek((topic, partition), 0)
    got = 0
    cpu = process_cpu_s(broker_pid)
    t = time.perf_counter()
    while got < n:
        got += c.poll(timeout_ms=1000).num_rows
    elapsed = time.perf_counter() - t
    cpu = process_cpu_s(broker_pid) - cpu
    c.close()
    return elapsed, cpu


class _MemoryFlightServer(fl.FlightServerBase):
    """Plain pyarrow.flight serving one table from memory: the transport's ceiling."""

    def __init__(self, table: pa.Table):
        super().__init__("grpc://127.0.0.1:0")
        self.table = table

    def do_get(self, context, ticket):
        return fl.RecordBatchStream(self.table)


def _flight_from_memory(batches, generic_options=()) -> float:
    server = _MemoryFlightServer(pa.Table.from_batches(batches))
    try:
        client = fl.connect(f"grpc://127.0.0.1:{server.port}", generic_options=list(generic_options))
        client.do_get(fl.Ticket(b"warm")).read_all()
        t = time.perf_counter()
        rows = client.do_get(fl.Ticket(b"all")).read_all().num_rows
        elapsed = time.perf_counter() - t
        assert rows == sum(b.num_rows for b in batches)
        client.close()
        return elapsed
    finally:
        server.shutdown()


def _rate_row(metric: str, value: float, baseline: float) -> dict:
    """A records/s row with its baseline from the same run, and their ratio."""
    return dict(bench="cluster", metric=metric, value=value, unit="records/s", baseline=baseline,
                ratio=value / baseline)


def _consume_parallel(bs: str, topic: str, partitions: int, n_each: int) -> float:
    """Seconds for ``partitions`` consumers (threads), one per partition, to read ``n_each`` each."""
    took = []

    def one(p):
        took.append(_consume(bs, topic, n_each, os.getpid(), partition=p)[0])
    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(p,)) for p in range(partitions)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(took) == partitions
    return time.perf_counter() - start


def run() -> list[dict]:
    batches = S.make_batches()[: RECORDS // S.BATCH]
    n = len(batches) * S.BATCH
    nbytes = n * S.VALUE_BYTES
    root = tempfile.mkdtemp(prefix="cluster-bench-")
    best = {k: float("inf") for k in ("produce", "consume", "append", "read", "consume_cpu", "memory_flight", "memory_flight_opts",
                                      "fetch", "fetch_cpu", "parallel", "produce_grpc", "produce_cpu",
                                      "produce_grpc_cpu", "client_cpu", "client_grpc_cpu")}
    cluster = LocalCluster(os.path.join(root, "cluster"), 1, die_with_parent=True,
                           overrides={"message.max.bytes": str(64 << 20)})
    try:
        cluster.start()
        admin = replikafka.Admin(cluster.bootstrap_servers)
        for r in range(ROUNDS):
            topic = f"bench-{r}"
            admin.create_topic(topic, partitions=1, replication_factor=1, schema="value BINARY",
                               config={"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)})
            for kind, flight in (("produce", True), ("produce_grpc", False))[:: 1 if r % 2 == 0 else -1]:
                t_name = topic if flight else f"{topic}-grpc"
                if not flight:
                    admin.create_topic(t_name, partitions=1, replication_factor=1, schema="value BINARY",
                                       config={"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)})
                cpu, own = process_cpu_s(cluster.procs[1].pid), _own_cpu_s()
                best[kind] = min(best[kind], _produce(cluster.bootstrap_servers, t_name, batches, use_flight=flight))
                best[f"{kind}_cpu"] = min(best[f"{kind}_cpu"], process_cpu_s(cluster.procs[1].pid) - cpu)
                client = "client_cpu" if flight else "client_grpc_cpu"
                best[client] = min(best[client], _own_cpu_s() - own)
            took, cpu = _consume(cluster.bootstrap_servers, topic, n, cluster.procs[1].pid)
            best["consume"], best["consume_cpu"] = min(best["consume"], took), min(best["consume_cpu"], cpu)
            best["memory_flight"] = min(best["memory_flight"], _flight_from_memory(batches))
            best["memory_flight_opts"] = min(best["memory_flight_opts"],
                                             _flight_from_memory(batches, FLIGHT_CLIENT_GENERIC_OPTIONS))
            took, cpu = _consume(cluster.bootstrap_servers, topic, n, cluster.procs[1].pid, use_flight=False)
            best["fetch"], best["fetch_cpu"] = min(best["fetch"], took), min(best["fetch_cpu"], cpu)
            four = f"bench4-{r}"
            admin.create_topic(four, partitions=4, replication_factor=1, schema="value BINARY",
                               config={"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)})
            for p in range(4):
                _produce_to(cluster.bootstrap_servers, four, batches[p::4], p)
            best["parallel"] = min(best["parallel"], _consume_parallel(cluster.bootstrap_servers, four, 4,
                                                                       len(batches[0::4]) * S.BATCH))
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
    rows.append(_rate_row("produce acks=1 via Flight DoPut (the default) records/s, baseline via gRPC Produce "
                          "(use_flight=False)", n / best["produce"], n / best["produce_grpc"]))
    rows.append(dict(bench="cluster", metric="produce acks=1 CPU s per GB: client / broker, via Flight DoPut; "
                                             "baseline: the same via gRPC Produce",
                     value=f"{best['client_cpu'] / (nbytes / 1e9):.2f} / {best['produce_cpu'] / (nbytes / 1e9):.2f}",
                     unit="s/GB", baseline=f"{best['client_grpc_cpu'] / (nbytes / 1e9):.2f} / "
                                          f"{best['produce_grpc_cpu'] / (nbytes / 1e9):.2f}"))
    rows.append(_rate_row("consume via Flight vs pyarrow.flight from memory records/s",
                          n / best["consume"], n / best["memory_flight"]))
    rows.append(_rate_row("pyarrow.flight from memory: the consumer's gRPC options (FLIGHT_CLIENT_GENERIC_OPTIONS), "
                          "baseline gRPC's defaults records/s", n / best["memory_flight_opts"], n / best["memory_flight"]))
    rows.append(_rate_row("consume via Flight vs pyarrow.flight from memory with the consumer's gRPC options "
                          "records/s", n / best["consume"], n / best["memory_flight_opts"]))
    rows.append(_rate_row("consume via Fetch only (use_flight=False) records/s", n / best["fetch"], n / best["consume"]))
    n4 = 4 * len(batches[0::4]) * S.BATCH
    rows.append(_rate_row("consume, 4 consumers on 4 partitions records/s", n4 / best["parallel"], n / best["consume"]))
    rows.append(dict(bench="cluster", metric="consume via Flight: broker CPU s per GB served",
                     value=best["consume_cpu"] / (nbytes / 1e9), unit="s/GB"))
    rows.append(dict(bench="cluster", metric="consume via Fetch: broker CPU s per GB served",
                     value=best["fetch_cpu"] / (nbytes / 1e9), unit="s/GB"))
    return rows + validation_rows(batches)


def validation_rows(batches) -> list[dict]:
    """Produce through a validating leader vs a trusting one (module doc), and the
    validation alone in this process."""
    import grpc

    from replikafka import records as R
    from replikafka.protocol import replikafka_pb2 as pb

    n = len(batches) * S.BATCH
    root = tempfile.mkdtemp(prefix="validation-bench-")
    cluster = LocalCluster(os.path.join(root, "cluster"), 1, die_with_parent=True,
                           overrides={"message.max.bytes": str(64 << 20)})
    cluster.broker_commands[1] = [sys.executable, os.path.join(os.path.dirname(__file__), "trusting_broker.py")]
    kinds = ("validated", "trusted")     # topic name prefixes: the broker trusts "trusted-*"
    paths = {"Flight DoPut": True, "gRPC Produce": False}   # the producer's two paths (use_flight)
    took: dict[tuple[str, str], list[float]] = {(k, p): [] for k in kinds for p in paths}
    cpu: dict[tuple[str, str], list[float]] = {key: [] for key in took}   # the broker's CPU seconds per round
    try:
        cluster.start()
        admin = replikafka.Admin(cluster.bootstrap_servers)
        cfg = {"max.message.bytes": str(64 << 20), "segment.bytes": str(1 << 30)}
        refused = {}
        for kind in kinds:
            topic = f"{kind}-crc-check"
            admin.create_topic(topic, schema="value BINARY", config=cfg)
            payload = R.encode_stream(batches[0].schema, [batches[0].slice(0, 1)]).to_pybytes()
            with grpc.insecure_channel(cluster.address(1)) as ch:
                produce = ch.unary_unary("/replikafka.Replikafka/Produce",
                                         request_serializer=pb.ProduceRequest.SerializeToString,
                                         response_deserializer=pb.ProduceResponse.FromString)
                request = pb.ProduceRequest(acks=1, timeout_ms=10_000, partitions=[pb.PartitionProduceData(
                    topic=topic, partition=0, records=payload, records_crc32c=R.records_crc32c(payload) ^ 1)])
                deadline = time.monotonic() + 60
                while True:   # until the broker has heard it leads the new topic
                    refused[kind] = produce(request, timeout=30).partitions[0].error.code
                    if refused[kind] not in ("NOT_LEADER_OR_FOLLOWER", "UNKNOWN_TOPIC_OR_PARTITION") \
                            or time.monotonic() > deadline:
                        break
                    time.sleep(0.2)
        if refused != {"validated": "CORRUPT_MESSAGE", "trusted": ""}:
            raise AssertionError(f"a produce with a wrong CRC-32C: {refused} (the trusted topic must store it, "
                                 f"the validated one refuse it with CORRUPT_MESSAGE)")
        for r in range(VALIDATION_ROUNDS):
            for path, use_flight in paths.items():
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    topic = f"{kind}-{r}-{'flight' if use_flight else 'grpc'}"
                    admin.create_topic(topic, schema="value BINARY", config=cfg)
                    before = process_cpu_s(cluster.procs[1].pid)
                    took[kind, path].append(_produce(cluster.bootstrap_servers, topic, batches,
                                                     use_flight=use_flight))
                    cpu[kind, path].append(process_cpu_s(cluster.procs[1].pid) - before)
        admin.close()
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    payloads = [R.encode_stream(b.schema, [b]).to_pybytes() for b in batches]
    crcs = [R.records_crc32c(p) for p in payloads]
    alone = {"validated": float("inf"), "trusted": float("inf")}
    for _ in range(5):
        t = time.perf_counter()
        for p, c in zip(payloads, crcs):
            produce_decoding.decode_produce_entries([(p, c, "bench")])
        alone["validated"] = min(alone["validated"], time.perf_counter() - t)
        t = time.perf_counter()
        for p in payloads:
            R.decode_stream(p)
        alone["trusted"] = min(alone["trusted"], time.perf_counter() - t)
    mb = sum(len(p) for p in payloads) / 1e6
    rows = []
    for path in paths:
        ratios = [t / v for v, t in zip(took["validated", path], took["trusted", path])]
        cpu_ratios = [t / v for v, t in zip(cpu["validated", path], cpu["trusted", path])]
        rows += [
            dict(bench="cluster", metric=f"produce acks=1 ({path}), leader validates vs skips it: records/s, "
                                         f"ratio = median of {len(ratios)} interleaved rounds (lowest-highest "
                                         f"{min(ratios):.2f}-{max(ratios):.2f})",
                 value=n / statistics.median(took["validated", path]), unit="records/s",
                 baseline=n / statistics.median(took["trusted", path]), ratio=statistics.median(ratios)),
            dict(bench="cluster", metric=f"  the same: broker CPU s per round (lowest-highest {min(cpu_ratios):.2f}-"
                                         f"{max(cpu_ratios):.2f})",
                 value=statistics.median(cpu["validated", path]), unit="s",
                 baseline=statistics.median(cpu["trusted", path]), ratio=statistics.median(cpu_ratios))]
    return rows + [
        dict(bench="cluster", metric="leader's validation alone, in this process (decode_produce_entries: CRC-32C + "
                                     "full Arrow validation)", value=mb / alone["validated"], unit="MB/s"),
        dict(bench="cluster", metric="  the same: its CPU for one round's payloads, as a share of the broker's CPU "
                                     "per trusted gRPC Produce round", unit="fraction",
             value=alone["validated"] / statistics.median(cpu["trusted", "gRPC Produce"])),
    ]


def _produce_to(bs: str, topic: str, batches, partition: int) -> None:
    with replikafka.Producer(bs, acks=1, linger_ms=0, batch_size=32 << 20) as p:
        for f in [p.send(topic, b, partition=partition) for b in batches]:
            f.result(timeout=120)


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
    print_table(validation_rows(S.make_batches()[: RECORDS // S.BATCH]) if sys.argv[1:] == ["validation"]
                else run())
