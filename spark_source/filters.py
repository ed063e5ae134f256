"""Filter pushdown for batch reads: ``topic``, ``partition``, ``offset``, ``timestamp``.

Spark hands :meth:`BatchReader.pushFilters` the conjunction of the query's
simple predicates (``spark.sql.python.filterPushdown.enabled=true`` only).
:func:`push` turns those on the metadata columns into :class:`Constraints`
that planning applies before any byte is fetched:

- ``topic`` and ``partition`` predicates (=, <=>, <, <=, >, >=, IN, string
  prefix/suffix/contains on topic, NOT of any of these, IS [NOT] NULL) decide
  per partition, exactly: they are consumed (Spark does not re-check them).
- ``offset`` =, <, <=, >, >= narrow each range to ``[lo, hi)``, exactly:
  consumed. ``offset IN (...)`` narrows to ``[min, max]`` but is returned to
  Spark, which keeps only the listed offsets.
- ``timestamp`` >, >=, = move each range's start to the first offset whose
  timestamp reaches the bound (the broker's time index; every earlier record
  is older, so nothing qualifying is skipped); <, <=, = also cut the end, but
  only on ``LogAppendTime`` topics, whose timestamps never decrease. Timestamp
  predicates are always returned to Spark too: bounds are rounded to
  milliseconds outward, and Spark re-checks each row.

Everything else is returned untouched. Every returned object is one Spark gave
(Spark requires that).
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Iterable

from pyspark.sql.datasource import (EqualNullSafe, EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In,
                                    IsNotNull, IsNull, LessThan, LessThanOrEqual, Not, StringContains,
                                    StringEndsWith, StringStartsWith)

PUSHABLE_COLUMNS = ("topic", "partition", "offset", "timestamp")


@dataclass(frozen=True)
class Constraints:
    """What the pushed filters allow. ``where`` holds exact per-partition tests
    as picklable ``(column, op, value, negated)`` tuples."""
    where: tuple[tuple[str, str, Any, bool], ...] = ()
    offset_lo: int | None = None        # inclusive
    offset_hi: int | None = None        # exclusive
    ts_lo_ms: int | None = None         # records older than this may be skipped
    ts_hi_ms: int | None = None         # records at or after this may be cut (LogAppendTime topics only)
    empty: bool = False                 # the predicates contradict: no row can match

    def allows(self, topic: str, partition: int) -> bool:
        if self.empty:
            return False
        values = {"topic": topic, "partition": partition}
        return all(_test(op, values[col], v) != neg for col, op, v, neg in self.where)

    def clip(self, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` narrowed by the offset bounds (possibly empty: start == end)."""
        orig = start
        if self.offset_lo is not None:
            start = max(start, self.offset_lo)
        if self.offset_hi is not None:
            end = min(end, self.offset_hi)
        return (start, end) if start < end else (orig, orig)

    @property
    def any(self) -> bool:
        return bool(self.where) or self.empty or any(
            v is not None for v in (self.offset_lo, self.offset_hi, self.ts_lo_ms, self.ts_hi_ms))


def _test(op: str, value: Any, target: Any) -> bool:
    if op == "eq":
        return value == target
    if op == "in":
        return value in target
    if op == "lt":
        return value < target
    if op == "le":
        return value <= target
    if op == "gt":
        return value > target
    if op == "ge":
        return value >= target
    if op == "startswith":
        return value.startswith(target)
    if op == "endswith":
        return value.endswith(target)
    if op == "contains":
        return target in value
    raise ValueError(op)


_OPS = {EqualTo: "eq", EqualNullSafe: "eq", In: "in", LessThan: "lt", LessThanOrEqual: "le",
        GreaterThan: "gt", GreaterThanOrEqual: "ge", StringStartsWith: "startswith",
        StringEndsWith: "endswith", StringContains: "contains"}


def _column(f: Filter) -> str | None:
    attr = getattr(f, "attribute", None)
    if isinstance(attr, tuple) and len(attr) == 1 and attr[0] in PUSHABLE_COLUMNS:
        return attr[0]
    return None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _epoch_us(v: Any) -> int | None:
    """A timezone-aware datetime -> microseconds since the epoch (None otherwise:
    a naive time is ambiguous, so it is never used to skip data)."""
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        delta = v - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None


def _key_ok(col: str, op: str, value: Any) -> bool:
    """Is ``value`` of the right kind for an exact per-partition test?"""
    def kind_ok(x):
        return isinstance(x, str) if col == "topic" else _is_int(x)
    if op in ("startswith", "endswith", "contains"):
        return col == "topic" and isinstance(value, str)
    if op == "in":
        return isinstance(value, (tuple, list)) and all(kind_ok(x) for x in value)
    return kind_ok(value)


def push(filters: Iterable[Filter], output_columns: Iterable[str]) -> tuple[Constraints, list[Filter]]:
    """Split ``filters`` into constraints for planning and the filters Spark must still apply."""
    present = set(output_columns)
    where: list[tuple[str, str, Any, bool]] = []
    lo = hi = ts_lo = ts_hi = None
    empty = False
    remaining: list[Filter] = []
    for f in filters:
        negated = False
        inner = f
        if isinstance(f, Not):
            negated, inner = True, f.child
        col = _column(inner)
        if col is None or col not in present:
            remaining.append(f)
            continue
        if isinstance(inner, IsNotNull):           # these columns are never null
            if negated:
                empty = True
            continue
        if isinstance(inner, IsNull):
            if not negated:
                empty = True
            continue
        op = _OPS.get(type(inner))
        value = getattr(inner, "value", None)
        if op is None:
            remaining.append(f)
            continue
        if isinstance(inner, EqualNullSafe) and value is None:
            if not negated:
                empty = True
            continue
        if col in ("topic", "partition"):
            if not _key_ok(col, op, value):
                remaining.append(f)
                continue
            where.append((col, op, tuple(value) if op == "in" else value, negated))
            continue
        if negated:
            remaining.append(f)
            continue
        if col == "offset":
            if op == "in" and isinstance(value, (tuple, list)) and value and all(_is_int(x) for x in value):
                lo = max(lo, min(value)) if lo is not None else min(value)
                hi = min(hi, max(value) + 1) if hi is not None else max(value) + 1
                remaining.append(f)
                continue
            if not _is_int(value) or op not in ("eq", "lt", "le", "gt", "ge"):
                remaining.append(f)
                continue
            new_lo = {"eq": value, "gt": value + 1, "ge": value}.get(op)
            new_hi = {"eq": value + 1, "lt": value, "le": value + 1}.get(op)
            if new_lo is not None:
                lo = new_lo if lo is None else max(lo, new_lo)
            if new_hi is not None:
                hi = new_hi if hi is None else min(hi, new_hi)
            continue
        # timestamp: used to prune, always re-checked by Spark
        remaining.append(f)
        us = _epoch_us(value)
        if us is None or op not in ("eq", "lt", "le", "gt", "ge"):
            continue
        if op in ("eq", "gt", "ge"):
            bound = us // 1000                        # floor: never above the true bound
            ts_lo = bound if ts_lo is None else max(ts_lo, bound)
        if op in ("eq", "lt", "le"):
            bound = us // 1000 + 1                    # exclusive, rounded up
            ts_hi = bound if ts_hi is None else min(ts_hi, bound)
    if lo is not None and hi is not None and lo >= hi:
        empty = True
    return Constraints(tuple(where), lo, hi, ts_lo, ts_hi, empty), remaining
