"""OffsetIndex and TimeIndex: lookups, persistence, truncation, sanity checks."""
from __future__ import annotations

import os

import numpy as np

from replikafka.broker.storage import OffsetIndex, TimeIndex


# ---- offset index ---------------------------------------------------------------------
def test_offset_index_lookup_finds_largest_entry_at_or_below(tmp_path):
    idx = OffsetIndex(str(tmp_path / "x.index"), base_offset=100)
    for off, pos in [(110, 500), (125, 1300), (140, 2100)]:
        idx.append(off, pos)
    assert idx.lookup(99) is None          # below the segment
    assert idx.lookup(100) is None         # before the first entry: caller scans from the start
    assert idx.lookup(110) == (110, 500)
    assert idx.lookup(124) == (110, 500)
    assert idx.lookup(125) == (125, 1300)
    assert idx.lookup(10**12) == (140, 2100)
    assert idx.last_entry() == (140, 2100)
    assert len(idx) == 3


def test_offset_index_file_format_and_reload(tmp_path):
    path = str(tmp_path / "x.index")
    idx = OffsetIndex(path, base_offset=1000)
    idx.append(1005, 320)
    idx.append(1010, 960)
    assert os.path.getsize(path) == 0 if os.path.exists(path) else True   # buffered until write_pending
    idx.write_pending()
    raw = open(path, "rb").read()
    assert raw == (5).to_bytes(4, "little") + (320).to_bytes(4, "little") + \
        (10).to_bytes(4, "little") + (960).to_bytes(4, "little")
    again = OffsetIndex(path, base_offset=1000)
    again.load()
    assert again.entries() == [(1005, 320), (1010, 960)]
    assert again.sanity_check(data_start=200, data_end=2000) is None
    idx.close()


def test_offset_index_grows_past_its_initial_capacity(tmp_path):
    idx = OffsetIndex(str(tmp_path / "x.index"), base_offset=0)
    for i in range(1, 500):
        idx.append(i * 3, i * 100)
    assert idx.lookup(301) == (300, 10000)
    idx.close()
    again = OffsetIndex(idx.path, 0)
    again.load()
    assert len(again) == 499


def test_offset_index_truncate_to_position(tmp_path):
    idx = OffsetIndex(str(tmp_path / "x.index"), base_offset=0)
    for i in range(1, 6):
        idx.append(i * 10, i * 1000)
    idx.truncate_to_position(3000)
    assert idx.entries() == [(10, 1000), (20, 2000)]
    idx.append(25, 2500)
    idx.close()
    again = OffsetIndex(idx.path, 0)
    again.load()
    assert again.entries() == [(10, 1000), (20, 2000), (25, 2500)]


def test_offset_index_sanity_check_rejects_bad_files(tmp_path):
    path = str(tmp_path / "x.index")
    idx = OffsetIndex(path, base_offset=0)

    def with_file(data: bytes) -> str | None:
        with open(path, "wb") as f:
            f.write(data)
        idx.load()
        return idx.sanity_check(data_start=100, data_end=5000)

    entries = lambda pairs: np.array(pairs, dtype="<u4").tobytes()   # noqa: E731
    assert with_file(entries([[1, 200], [5, 900]])) is None
    assert "multiple" in with_file(entries([[1, 200]]) + b"\x01\x02")
    assert "increasing" in with_file(entries([[5, 200], [5, 900]]))
    assert "increasing" in with_file(entries([[1, 900], [5, 200]]))
    assert "outside" in with_file(entries([[1, 50]]))          # before the first batch
    assert "outside" in with_file(entries([[1, 6000]]))        # past the data


# ---- time index -----------------------------------------------------------------------
def test_time_index_appends_only_when_the_max_grows(tmp_path):
    ti = TimeIndex(str(tmp_path / "x.timeindex"), base_offset=50)
    assert ti.max_timestamp_ms == -1
    assert ti.maybe_append(1000, 50)
    assert not ti.maybe_append(900, 55)      # older: no entry
    assert not ti.maybe_append(1000, 58)     # equal: no entry
    assert ti.maybe_append(1500, 60)
    assert not ti.maybe_append(-1, 70)       # no timestamps
    assert ti.entries() == [(1000, 50), (1500, 60)]
    assert ti.max_timestamp_ms == 1500


def test_time_index_lookup(tmp_path):
    ti = TimeIndex(str(tmp_path / "x.timeindex"), base_offset=0)
    for ts, off in [(100, 0), (200, 10), (300, 20)]:
        ti.maybe_append(ts, off)
    assert ti.lookup(99) is None
    assert ti.lookup(100) == (100, 0)
    assert ti.lookup(250) == (200, 10)
    assert ti.lookup(10**15) == (300, 20)


def test_time_index_file_format_reload_and_truncate(tmp_path):
    path = str(tmp_path / "x.timeindex")
    ti = TimeIndex(path, base_offset=7)
    ti.maybe_append(123456789012, 7)
    ti.maybe_append(123456789999, 12)
    ti.close()
    raw = open(path, "rb").read()
    assert len(raw) == 24
    assert raw[:12] == (123456789012).to_bytes(8, "little") + (0).to_bytes(4, "little")
    again = TimeIndex(path, base_offset=7)
    again.load()
    assert again.entries() == [(123456789012, 7), (123456789999, 12)]
    assert again.sanity_check(next_offset=20) is None
    again.truncate_to(12)
    assert again.entries() == [(123456789012, 7)]
    third = TimeIndex(path, base_offset=7)
    third.load()
    assert third.entries() == [(123456789012, 7)]


def test_time_index_sanity_check(tmp_path):
    path = str(tmp_path / "x.timeindex")
    ti = TimeIndex(path, base_offset=0)
    dtype = np.dtype([("ts", "<i8"), ("rel", "<u4")])

    def with_entries(pairs, extra=b"") -> str | None:
        with open(path, "wb") as f:
            f.write(np.array(pairs, dtype=dtype).tobytes() + extra)
        ti.load()
        return ti.sanity_check(next_offset=100)

    assert with_entries([(10, 0), (20, 5)]) is None
    assert "multiple" in with_entries([(10, 0)], b"\x00")
    assert "increasing" in with_entries([(20, 0), (10, 5)])
    assert "outside" in with_entries([(10, 0), (20, 100)])
