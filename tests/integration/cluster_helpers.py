"""Helpers shared by the integration tests."""
from __future__ import annotations

import time


def wait_until(predicate, timeout_s=30.0, interval_s=0.05, what="condition"):
    deadline = time.time() + timeout_s
    last = None
    while time.time() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what} (last: {last!r})")


# ---------------------------------------------------------------- verification
import glob as _glob
import os as _os
import threading as _threading

import pyarrow as _pa
import pyarrow.ipc as _ipc


def kafka_batch(values: list[bytes]) -> _pa.RecordBatch:
    from replikafka.records import HEADER_TYPE
    n = len(values)
    return _pa.record_batch([_pa.array([None] * n, _pa.binary()), _pa.array(values, _pa.binary()),
                             _pa.array([None] * n, HEADER_TYPE)], names=["key", "value", "headers"])


def replica_values(cluster, broker_id: int, topic: str, partition: int) -> list[bytes]:
    """Every value in a replica's log, read from its segment files with plain
    pyarrow (a torn tail of the active segment ends the read)."""
    d = _os.path.join(cluster.base_dir, f"broker-{broker_id}-logs", f"{topic}-{partition}")
    out: list[bytes] = []
    for path in sorted(_glob.glob(_os.path.join(d, "*.arrows"))):
        with open(path, "rb") as f:
            data = f.read()
        try:
            reader = _ipc.open_stream(_pa.py_buffer(data))
            for batch in reader:
                out.extend(batch.column("value").to_pylist())
        except (_pa.ArrowInvalid, OSError):
            pass
    return out


class AckedLog:
    """Records every acknowledged (partition, offset, value) of a producer."""

    def __init__(self):
        self.lock = _threading.Lock()
        self.acked: dict[tuple[int, int], bytes] = {}
        self.errors: list[BaseException] = []

    def record(self, meta, values: list[bytes]) -> None:
        with self.lock:
            for i, v in enumerate(values):
                key = (meta.partition, meta.base_offset + i)
                assert key not in self.acked or self.acked[key] == v, f"offset {key} acked twice with different values"
                self.acked[key] = v


class BackgroundProducer:
    """Produces numbered values with acks=all in a thread until stopped; each
    send is a small batch; failures after the client's own retries are kept."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, batch: int = 20, idempotent: bool = True,
                 delivery_timeout_ms: int = 60_000):
        import replikafka
        self.producer = replikafka.Producer(bootstrap, acks="all", idempotent=idempotent, linger_ms=0,
                                            delivery_timeout_ms=delivery_timeout_ms)
        self.topic, self.partitions, self.batch = topic, partitions, batch
        self.log = AckedLog()
        self.stopped = _threading.Event()
        self.sent = 0
        self.thread = _threading.Thread(target=self._run, daemon=True)

    def start(self):
        self.thread.start()
        return self

    def _run(self):
        i = 0
        pending = []
        while not self.stopped.is_set():
            p = i % self.partitions
            values = [f"{self.topic}-{p}-{i}-{j}".encode() for j in range(self.batch)]
            pending.append((self.producer.send(self.topic, kafka_batch(values), partition=p), values))
            self.sent += len(values)
            i += 1
            if len(pending) >= 8:
                self._settle(pending.pop(0))
        for item in pending:
            self._settle(item)

    def _settle(self, item):
        fut, values = item
        try:
            self.log.record(fut.result(timeout=120), values)
        except Exception as exc:  # not acknowledged: may or may not be stored
            self.log.errors.append(exc)

    def stop(self):
        self.stopped.set()
        self.thread.join(timeout=180)
        self.producer.close()
        return self.log


def read_committed(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    """Everything below each partition's HW, through the consumer."""
    import replikafka
    c = replikafka.Consumer(bootstrap)
    tps = [(topic, p) for p in range(partitions)]
    c.assign(tps)
    ends = c.end_offsets(tps)
    out = {}
    for tp in tps:
        c.seek(tp, 0)
    for _ in range(10_000):
        if all(c.position(tp) >= ends[tp] for tp in tps):
            break
        t = c.poll(timeout_ms=500)
        for part, off, val in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                                  t.column("value").to_pylist()):
            assert (part, off) not in out, f"offset {(part, off)} delivered twice"
            out[(part, off)] = val
    c.close()
    return out


# ---------------------------------------------------------------- Arrow Flight appends
def flight_batch(values: list[bytes]) -> _pa.RecordBatch:
    """Records with these values, in a Kafka-schema topic's stored schema (DoPut's stream schema)."""
    from replikafka import records as R
    batch = R.to_record_batch([{"key": None, "value": v, "headers": None} for v in values], R.KAFKA_SCHEMA,
                              timestamp_ms=R.now_ms())
    return _pa.RecordBatch.from_arrays(batch.columns, schema=R.stored_schema(R.KAFKA_SCHEMA))


def flight_put(client, command: bytes, batches, schema: _pa.Schema, options=None) -> bytes:
    """One DoPut: ``batches`` under ``command``; the broker's answer (its app_metadata).
    A refusal raises the server's Flight error: when the broker refuses mid-stream, its
    error comes back at ``close()``, and that is the one raised."""
    import pyarrow.flight as fl
    writer, reader = client.do_put(fl.FlightDescriptor.for_command(command), schema, options)
    err = answer = None
    try:
        for b in batches:
            writer.write_batch(b)
        writer.done_writing()
        answer = reader.read()
    except Exception as exc:   # noqa: BLE001 - replaced by the server's error below when there is one
        err = exc
    try:
        writer.close()
    except Exception as exc:   # noqa: BLE001
        if err is None or not isinstance(err, fl.FlightError):
            err = exc
    if err is not None:
        raise err
    return answer.to_pybytes() if answer is not None else b""
