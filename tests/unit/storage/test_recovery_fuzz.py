"""Recovery fuzz: damage a log's files the way crashes and bad disks do, reopen it
uncleanly, and check that exactly the valid prefix survives.

Each case (seeded, reproducible: the seed is in the test id and in every
failure message) appends random batches with tiny segments, closes the log,
then applies one or two of:

- cut:      truncate a segment file at a random byte (or a batch boundary);
- garbage:  append junk to a segment: random bytes, a torn copy of a real
            message, a replayed earlier message, an end-of-stream marker + junk;
- cut+garbage: both;
- flip:     flip one byte inside a batch body (the CRC must catch it);
- index:    damage or delete index files (they must be rebuilt, no data lost);

to the active segment or to a sealed one. The expected survivors are computed
from the layout independently of the recovery code: a segment keeps the
batches before its first damaged byte; the log continues into the next
segment only if nothing of the segment's batches was lost. After reopening,
the records must equal the appended ones record for record, the log end must
be right, the epoch cache must not point past it, and appends must continue
at the right offset (also after a further clean reopen).

The default run has DEFAULT_CASES cases; `--long` adds LONG_CASES more.
"""
from __future__ import annotations

import os
import random
import shutil
from dataclasses import dataclass, field

import pytest

from replikafka.broker.storage import Log, LogConfig, ManualClock, batch_format as bf

from storage_testlib import SCHEMA, T0, make_batch, value

DEFAULT_CASES = 240
LONG_CASES = 4000
LONG_CHUNK = 250


@dataclass
class SegmentLayout:
    base: int
    path: str
    sealed: bool
    file_size: int
    schema_size: int
    batches: list[tuple[int, int, int, int]]     # (base offset, count, position, size)
    damaged_at: int | None = None                # first damaged byte (None: intact)

    @property
    def end(self) -> int:
        return self.base + sum(b[1] for b in self.batches)

    def surviving(self) -> tuple[int, bool]:
        """(records that survive, whether all of them do)."""
        if self.damaged_at is None:
            return self.end - self.base, True
        kept = [b for b in self.batches if b[2] + b[3] <= self.damaged_at]
        if self.damaged_at < self.schema_size:
            kept = []
        return sum(b[1] for b in kept), len(kept) == len(self.batches)

    def damage(self, at: int) -> None:
        self.damaged_at = at if self.damaged_at is None else min(self.damaged_at, at)


@dataclass
class Case:
    seed: int
    rng: random.Random
    notes: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        pytest.fail(f"recovery fuzz seed={self.seed}: {what}; damage: {'; '.join(self.notes)}")


def build_log(case: Case, path: str) -> tuple[Log, LogConfig, list[int]]:
    rng = case.rng
    config = LogConfig(segment_bytes=rng.choice([1500, 2500, 5000]),
                       index_interval_bytes=rng.choice([0, 300, 1500]))
    log = Log.open(path, config, SCHEMA, clock=ManualClock(T0))
    epochs: list[int] = []         # epoch of each appended record
    epoch = 0
    for _ in range(rng.randint(2, 14)):
        if rng.random() < 0.2:
            epoch += rng.randint(1, 3)
        n = rng.randint(1, 9)
        start = log.log_end_offset
        log.append([make_batch(start, n)], leader_epoch=epoch)
        epochs.extend([epoch] * n)
    if rng.random() < 0.2:
        log.roll()                 # leaves an empty active segment behind a sealed one
    return log, config, epochs


def layout_of(log: Log) -> list[SegmentLayout]:
    out = []
    for seg in log.segments():
        batches = [(r.base_offset, r.record_count, r.position, r.size) for r in seg.batches_from(seg.base_offset)]
        out.append(SegmentLayout(seg.base_offset, seg.path, seg.sealed, seg.size, seg.schema_size, batches))
    return out


# ---- damage -----------------------------------------------------------------------------
def cut(case: Case, seg: SegmentLayout) -> None:
    rng = case.rng
    if seg.batches and rng.random() < 0.3:
        b = rng.choice(seg.batches)
        at = b[2] + b[3]               # exactly after a batch (may drop only the EOS marker)
    else:
        at = rng.randrange(0, seg.file_size + 1)
    with open(seg.path, "r+b") as f:
        f.truncate(at)
    seg.file_size = at
    seg.damage(at)          # batches ending at or before `at` survive (surviving())
    case.notes.append(f"cut {os.path.basename(seg.path)} at {at}")


def garbage(case: Case, seg: SegmentLayout, messages: list[tuple[int, bytes]]) -> None:
    """Junk after the segment's data. A replayed message is one from an earlier
    segment: its offsets can never be the ones expected here (a copy of the very
    batch that belongs next would be valid data, not damage)."""
    rng = case.rng
    earlier = [m for base, m in messages if base < seg.base]
    kind = rng.choice(["random", "torn-copy", "replay", "eos+junk", "continuation+junk"])
    if kind == "random":
        junk = bytes(rng.randrange(256) for _ in range(rng.randint(1, 300)))
    elif kind == "torn-copy" and messages:
        msg = rng.choice(messages)[1]
        junk = msg[:rng.randrange(1, len(msg))]
    elif kind == "replay" and earlier:
        junk = rng.choice(earlier)                   # a whole valid message, wrong offsets
    elif kind == "eos+junk":
        junk = bf.END_OF_STREAM + bytes(rng.randrange(256) for _ in range(rng.randint(0, 50)))
    else:
        junk = b"\xff\xff\xff\xff" + bytes(rng.randrange(256) for _ in range(rng.randint(0, 100)))
    with open(seg.path, "ab") as f:
        f.write(junk)
    # Junk after the last batch loses no record (it is cut off, or follows the marker).
    case.notes.append(f"{kind} garbage ({len(junk)} bytes) on {os.path.basename(seg.path)}")


def flip(case: Case, seg: SegmentLayout) -> None:
    present = [b for b in seg.batches if b[2] + b[3] <= seg.file_size]
    if not present:
        return
    base, count, pos, size = case.rng.choice(present)
    data = bytearray(open(seg.path, "rb").read())
    meta_len = int.from_bytes(data[pos + 4:pos + 8], "little")
    body_start = pos + 8 + meta_len
    at = case.rng.randrange(body_start, pos + size)
    data[at] ^= 1 << case.rng.randrange(8)
    open(seg.path, "wb").write(bytes(data))
    seg.damage(pos)
    case.notes.append(f"flip byte {at} of batch {base} in {os.path.basename(seg.path)}")


def damage_index(case: Case, seg: SegmentLayout) -> None:
    rng = case.rng
    stem = seg.path[:-len(".arrows")]
    target = stem + rng.choice([".index", ".timeindex"])
    how = rng.choice(["delete", "junk", "odd-size"])
    if how == "delete":
        if os.path.exists(target):
            os.unlink(target)
    elif how == "junk":
        open(target, "wb").write(bytes(rng.randrange(256) for _ in range(rng.choice([8, 12, 24, 96]))))
    else:
        open(target, "ab").write(b"\x01")
    case.notes.append(f"{how} {os.path.basename(target)}")


def messages_of(layout: list[SegmentLayout]) -> list[tuple[int, bytes]]:
    """(base offset, message bytes) of every stored batch."""
    out = []
    for seg in layout:
        data = open(seg.path, "rb").read()
        out += [(base, data[pos:pos + size]) for base, _, pos, size in seg.batches]
    return out


# ---- one case ---------------------------------------------------------------------------------
def expected_end(layout: list[SegmentLayout]) -> int:
    end = layout[0].base
    for seg in layout:
        if seg.base != end:
            break
        kept, complete = seg.surviving()
        end = seg.base + kept
        if not complete:
            break
    return end


def run_case(seed: int, root: str) -> None:
    case = Case(seed, random.Random(seed))
    rng = case.rng
    path = os.path.join(root, f"fuzz-{seed}")
    log, config, epochs = build_log(case, path)
    layout = layout_of(log)
    log.close()
    originals = messages_of(layout)
    damaged_bases = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        seg = layout[-1] if rng.random() < 0.4 else rng.choice(layout)
        kind = rng.choice(["cut", "garbage", "cut+garbage", "flip", "index"])
        if kind in ("cut", "cut+garbage"):
            cut(case, seg)
        if kind in ("garbage", "cut+garbage"):
            garbage(case, seg, originals)
        if kind == "flip":
            flip(case, seg)
        if kind == "index":
            damage_index(case, seg)
        damaged_bases.append(seg.base)
    end = expected_end(layout)
    # Recovery starts at a checkpointed recovery point at or below the damage.
    recovery_point = rng.randint(0, min(damaged_bases))
    recovered = Log.open(path, config, SCHEMA, recovery_point=recovery_point, clock=ManualClock(T0))
    check_log(case, recovered, end, epochs)
    # Appends continue at the right offset, and survive a clean reopen.
    n = rng.randint(1, 6)
    info = recovered.append([make_batch(end, n, salt="after")], leader_epoch=1000)
    if info.first_offset != end:
        case.fail(f"append after recovery got offset {info.first_offset}, expected {end}")
    recovered.close()
    again = Log.open(path, config, SCHEMA, recovery_point=end + n, clock=ManualClock(T0), clean=True)
    check_log(case, again, end + n, epochs[:end] + [1000] * n, salt_from=end)
    again.close()
    shutil.rmtree(path)


def check_log(case: Case, log: Log, end: int, epochs: list[int], salt_from: int | None = None) -> None:
    if log.log_end_offset != end:
        case.fail(f"log end offset {log.log_end_offset}, expected {end}")
    want = [value(o, "after" if salt_from is not None and o >= salt_from else "") for o in range(end)]
    got = []
    offset = log.log_start_offset
    while offset < end:
        r = log.read(offset, case.rng.choice([1, 700, 10**6]), None)
        for b in r.batches:
            got.extend(b.column("value").to_pylist())
        offset += r.record_count
    if got != want:
        first_bad = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
        case.fail(f"records differ from offset {first_bad}: {len(got)} read, {len(want)} expected")
    headers = list(log.batch_headers())
    if sum(h.record_count for h in headers) != end or any(
            h.leader_epoch != epochs[h.base_offset] for h in headers):
        case.fail("batch headers do not match what was appended")
    entries = log.leader_epoch_cache.entries()
    if any(e.start_offset >= end for e in entries):
        case.fail(f"epoch cache {entries} points at or past the log end {end}")
    if end and entries and entries[-1].epoch != epochs[end - 1]:
        case.fail(f"latest cached epoch {entries[-1].epoch}, last record has {epochs[end - 1]}")
    for seg in log.segments()[:-1]:
        if not open(seg.path, "rb").read().endswith(bf.END_OF_STREAM):
            case.fail(f"sealed segment {seg.path} lacks its end-of-stream marker")


# ---- the runs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(DEFAULT_CASES), ids=lambda s: f"seed-{s}")
def test_recovery_fuzz(seed, tmp_path):
    run_case(seed, str(tmp_path))


@pytest.mark.long
@pytest.mark.parametrize("chunk", range(LONG_CASES // LONG_CHUNK), ids=lambda c: f"seeds-{c}")
def test_recovery_fuzz_long(chunk, tmp_path):
    first = DEFAULT_CASES + chunk * LONG_CHUNK
    for seed in range(first, first + LONG_CHUNK):
        run_case(seed, str(tmp_path))
