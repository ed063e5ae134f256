"""Helpers shared by the storage tests: a schema, deterministic batches, tiny configs."""
from __future__ import annotations

import pyarrow as pa

from replikafka.broker.storage import Log, LogConfig, ManualClock

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("timestamp", TS)])
T0 = 1_700_000_000_000

# Tiny segments: a 5-record batch is ~900 bytes, so every 2-3 batches roll a segment.
TINY = LogConfig(segment_bytes=2048, index_interval_bytes=256)


def value(offset: int, salt: str = "") -> bytes:
    return f"value-{salt}{offset}".encode()


def make_batch(first: int, n: int, *, ts0: int = T0, salt: str = "", ts=None) -> pa.RecordBatch:
    """n records whose value names their intended offset and whose timestamp is
    ts0 + offset (or the explicit `ts` list)."""
    offsets = range(first, first + n)
    keys = pa.array([None if o % 3 == 0 else f"k{o}".encode() for o in offsets], pa.binary())
    values = pa.array([value(o, salt) for o in offsets], pa.binary())
    stamps = pa.array([ts0 + o for o in offsets] if ts is None else ts, pa.int64()).view(TS)
    return pa.record_batch([keys, values, stamps], schema=SCHEMA)


def fill(log: Log, batches: int, per_batch: int = 5, epoch: int = 0, salt: str = "") -> None:
    """Append `batches` batches whose values match the offsets they will get."""
    for _ in range(batches):
        start = log.log_end_offset
        log.append([make_batch(start, per_batch, salt=salt)], leader_epoch=epoch)


def read_values(log: Log, start: int | None = None, end: int | None = None) -> list[bytes]:
    """Every value from `start` (default log start) to `end` (default LEO)."""
    offset = log.log_start_offset if start is None else start
    end = log.log_end_offset if end is None else end
    out: list[bytes] = []
    while offset < end:
        r = log.read(offset, 4096, end)
        assert r.first_offset == offset and r.record_count > 0
        for b in r.batches:
            out.extend(b.column("value").to_pylist())
        offset += r.record_count
    return out


def open_log(path, config: LogConfig = TINY, clock=None, **kw) -> Log:
    return Log.open(str(path), config, SCHEMA, clock=clock or ManualClock(T0), **kw)
