"""Storage engine throughput against raw pyarrow IPC on the same disk, same run.

Workload: 1,500,000 records of 100-byte values (plus a timestamp column) in
batches of 10,000 records.

- append: `Log.append([batch], leader_epoch)` per batch (offsets, epoch, CRC-32C,
  indexes, segment roll) vs `pa.ipc.new_stream(pa.OSFile(...))` writing the same
  batches. Neither side fsyncs (the log's flush interval is the default, never).
- read (committed range): `Log.read(offset, 8 MiB, end)` from offset 0 to the
  end vs iterating `pa.ipc.open_stream(pa.memory_map(path))`. Both sides map the
  files afresh (the log is reopened, untimed, with its clean flag) and both
  touch every value byte (CRC-32C of each batch's value data); a second pair of
  rows only materialises the batches. The log checks each stored batch's CRC
  once per mapping of its segment, so these fresh-open rows include that check;
  the "warm" rows time a second read of the same open log (checks already done)
  against pyarrow's read again.

Every figure is the best of ROUNDS rounds that alternate which side goes
first, in a temp dir on the same file system as this repository; an untimed
os.sync() precedes each timed append so neither side pays for the other's
dirty pages. Rows: bench, metric, value, unit,
baseline, ratio (ours / pyarrow).
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time

import crc32c
import numpy as np
import pyarrow as pa

from replikafka.broker.storage import Log, LogConfig

RECORDS = 1_500_000
BATCH = 10_000
VALUE_BYTES = 100
ROUNDS = 7
READ_MAX_BYTES = 8 << 20

# A 10,000 x 100-byte batch is ~1.1 MB, over the 1 MiB max.message.bytes default.
CONFIG = LogConfig(max_message_bytes=16 << 20)
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", pa.timestamp("ms", tz="UTC"))])


def make_batches() -> list[pa.RecordBatch]:
    rng = np.random.default_rng(7)
    out = []
    offsets = pa.py_buffer(np.arange(0, (BATCH + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32).tobytes())
    t0 = 1_700_000_000_000
    for i in range(RECORDS // BATCH):
        data = pa.py_buffer(rng.integers(0, 256, BATCH * VALUE_BYTES, dtype=np.uint8).tobytes())
        values = pa.Array.from_buffers(pa.binary(), BATCH, [None, offsets, data])
        ts = pa.array(np.arange(t0 + i * BATCH, t0 + (i + 1) * BATCH, dtype=np.int64)).view(SCHEMA.field(1).type)
        out.append(pa.record_batch([values, ts], schema=SCHEMA))
    return out


def _touch(batch: pa.RecordBatch) -> int:
    """Read every value byte (and nothing else of note)."""
    return crc32c.crc32c(batch.column(0).buffers()[2])


# ---- the two sides ---------------------------------------------------------------
def log_append(dir_: str, batches) -> float:
    log = Log.open(dir_, CONFIG, SCHEMA)
    t = time.perf_counter()
    for b in batches:
        log.append([b], leader_epoch=0)
    elapsed = time.perf_counter() - t
    log.close()
    return elapsed


def arrow_append(path: str, batches) -> float:
    t = time.perf_counter()
    with pa.OSFile(path, "wb") as f:
        with pa.ipc.new_stream(f, SCHEMA) as w:
            for b in batches:
                w.write_batch(b)
    return time.perf_counter() - t


def log_read(dir_: str, touch: bool, warm: bool = False) -> float:
    """Time one full read of a freshly opened log; with ``warm``, the second one
    (the first, untimed, has checked every stored batch's CRC under the mapping)."""
    log = Log.open(dir_, CONFIG, SCHEMA, recovery_point=RECORDS, clean=True)
    end = log.log_end_offset
    if warm:
        _read_all(log, end, touch)
    t = time.perf_counter()
    _read_all(log, end, touch)
    elapsed = time.perf_counter() - t
    log.close()
    return elapsed


def _read_all(log, end: int, touch: bool) -> None:
    offset = 0
    n = 0
    while offset < end:
        r = log.read(offset, READ_MAX_BYTES, end)
        if touch:
            for b in r.batches:
                _touch(b)
        n += sum(b.num_rows for b in r.batches)
        offset += r.record_count
    assert n == RECORDS, n


def arrow_read(path: str, touch: bool) -> float:
    t = time.perf_counter()
    n = 0
    with pa.memory_map(path) as source:
        for b in pa.ipc.open_stream(source):
            if touch:
                _touch(b)
            n += b.num_rows
    elapsed = time.perf_counter() - t
    assert n == RECORDS, n
    return elapsed


# ---- driver ----------------------------------------------------------------------
def _rows(name: str, ours: float, base: float, nbytes: int) -> list[dict]:
    rows = []
    for metric, unit, scale in (("records/s", "records/s", RECORDS), ("MB/s", "MB/s", nbytes / 1e6)):
        value, baseline = scale / ours, scale / base
        rows.append(dict(bench="storage", metric=f"{name} {metric}", value=value, unit=unit,
                         baseline=baseline, ratio=value / baseline))
    return rows


def run() -> list[dict]:
    batches = make_batches()
    nbytes = RECORDS * VALUE_BYTES
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    root = tempfile.mkdtemp(prefix="storage-bench-", dir=os.path.join(repo, "bench"))
    best = {k: float("inf") for k in ("log_append", "arrow_append", "log_read", "arrow_read",
                                       "log_read_open", "arrow_read_open", "log_read_warm",
                                       "arrow_read_warm", "log_read_open_warm", "arrow_read_open_warm")}
    try:
        for r in range(ROUNDS):
            log_dir = os.path.join(root, f"t-{r}")
            arrow_path = os.path.join(root, f"arrow-{r}.arrows")
            # Alternate which side goes first so neither always meets a busier page cache.
            sides = [("log_append", lambda: log_append(log_dir, batches)),
                     ("arrow_append", lambda: arrow_append(arrow_path, batches))]
            for key, fn in (sides if r % 2 == 0 else sides[::-1]):
                os.sync()    # start each side with no dirty pages left by the other
                best[key] = min(best[key], fn())
            for touch, warm, suffix in ((True, False, ""), (False, False, "_open"), (True, True, "_warm"),
                                        (False, True, "_open_warm")):
                reads = [("log_read" + suffix, lambda: log_read(log_dir, touch, warm)),
                         ("arrow_read" + suffix, lambda: arrow_read(arrow_path, touch))]
                for key, fn in (reads if r % 2 == 0 else reads[::-1]):
                    best[key] = min(best[key], fn())
            if r:
                shutil.rmtree(os.path.join(root, f"t-{r - 1}"), ignore_errors=True)
                os.unlink(os.path.join(root, f"arrow-{r - 1}.arrows"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return (_rows("append", best["log_append"], best["arrow_append"], nbytes)
            + _rows("read", best["log_read"], best["arrow_read"], nbytes)
            + _rows("read (batches only)", best["log_read_open"], best["arrow_read_open"], nbytes)
            + _rows("read, warm (CRCs already checked under this mapping)", best["log_read_warm"],
                    best["arrow_read_warm"], nbytes)
            + _rows("read (batches only), warm", best["log_read_open_warm"], best["arrow_read_open_warm"], nbytes))


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
