"""Batch reads: ``spark.read.format("replikafka")``.

Planning (``partitions()``, in a Spark planner worker) asks the cluster for the
subscribed partitions, their log start offsets and high watermarks, and fixes
one ``[start, end)`` per partition — ``end`` defaults to the HW *now*, so a read
never includes records committed after it was planned, and never anything at
or beyond a HW. Ranges are split for ``minPartitions`` /
``maxRecordsPerPartition`` and narrowed by pushed filters. Each range becomes a
picklable :class:`RangePartition`; ``read()`` (in an executor worker) returns
exactly that range as ``pyarrow.RecordBatch``es of Spark's Arrow schema (see
:mod:`replikafka.spark.range_fetcher` for how it survives leader changes).

Filter pushdown. Spark's planner refuses a reader that implements
``pushFilters`` while ``spark.sql.python.filterPushdown.enabled`` is false
(``DATA_SOURCE_PUSHDOWN_DISABLED``) — it checks whether the method is
overridden. So :class:`BatchReader` has no ``pushFilters``; its subclass
:class:`FilteringBatchReader` has. ``DataSource.reader()`` returns the
filtering one unless it is being called by Spark's planner with pushdown off
(:func:`pushdown_enabled_by_planner` reads the flag Spark passed to that
planner). Either way the query runs; with pushdown on, fewer bytes move.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Iterator

from pyspark.sql.datasource import DataSourceReader, InputPartition

from replikafka.spark.arrow_convert import BatchConverter, OutputLayout
from replikafka.spark.cluster_access import ClusterClient, client_for, timestamp_type_of
from replikafka.spark.filters import Constraints, push
from replikafka.spark.offsets_planning import (OffsetRange, plan_batch_ranges, split_ranges, timestamp_queries)
from replikafka.spark.options import SourceOptions
from replikafka.spark.range_fetcher import ClusterTransport, ReadStats, read_range


class RangePartition(InputPartition):
    """One Spark task: offsets ``[start, end)`` of one topic partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int, timestamp_type: int = 0):
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end
        self.timestamp_type = timestamp_type

    @property
    def range(self) -> OffsetRange:
        return OffsetRange(self.topic, self.partition, self.start, self.end)


def read_partition(opts: SourceOptions, layout: OutputLayout, partition: InputPartition,
                   *, client: ClusterClient | None = None, stats: ReadStats | None = None) -> Iterator:
    """The batches of one planned range (nothing for Spark's placeholder partition)."""
    if not isinstance(partition, RangePartition) or partition.start >= partition.end:
        return iter(())
    client = client or client_for(opts.bootstrap, opts.security, stream_window_bytes=opts.fetch_max_bytes)
    converter = BatchConverter(layout, partition.topic, partition.partition, partition.timestamp_type)
    stats = stats if stats is not None else ReadStats()
    batches = read_range(ClusterTransport(client), partition.range, columns=layout.fetch_columns,
                         convert=converter.convert, fetch_timeout_s=opts.fetch_timeout_ms / 1000,
                         fail_on_data_loss=opts.fail_on_data_loss, max_bytes=opts.fetch_max_bytes, stats=stats)
    if os.environ.get("REPLIKAFKA_SPARK_DEBUG"):
        return _logged(batches, partition, stats)
    return batches


def _logged(batches: Iterator, partition: "RangePartition", stats: ReadStats) -> Iterator:
    """``REPLIKAFKA_SPARK_DEBUG=1``: one line per task on the worker's stderr (Spark's executor log)."""
    started = time.perf_counter()
    yield from batches
    took = time.perf_counter() - started
    print(f"replikafka read {partition.topic}-{partition.partition} [{partition.start}, {partition.end}): "
          f"{stats.records} records, {stats.bytes} bytes, {stats.fetches} fetches, {took:.3f}s "
          f"({stats.wait_s:.3f}s waiting for the broker), {stats.retries} retries, {stats.waits} HW waits, "
          f"leaders {sorted(stats.leaders)}", file=sys.stderr, flush=True)


def check_same_schema(topics: dict, expected, option: str) -> None:
    """Every topic read must share one schema (the DataFrame has one)."""
    from replikafka.spark.arrow_convert import SchemaError
    for name, info in topics.items():
        if not info.schema.remove_metadata().equals(expected.remove_metadata()):
            raise SchemaError(option, f"topic {name!r} has schema ({', '.join(info.schema.names)}), different from "
                              f"the other topics read ({', '.join(expected.names)}); read them separately")


class BatchReader(DataSourceReader):
    """Reads the planned ranges. Picklable: holds options, layout and (after
    filter pushdown) constraints only."""

    def __init__(self, opts: SourceOptions, layout: OutputLayout, topic_schema_bytes: bytes):
        self.opts = opts
        self.layout = layout
        self.topic_schema_bytes = topic_schema_bytes
        self.constraints = Constraints()

    # ------------------------------------------------------------ planning
    def plan(self, client: ClusterClient | None = None) -> list[OffsetRange]:
        """The ranges to read (after splitting), in partition order."""
        return [p.range for p in self._plan(client)]

    def _plan(self, client: ClusterClient | None = None) -> list[RangePartition]:
        from replikafka.records import schema_from_bytes
        opts = self.opts
        client = client or client_for(opts.bootstrap, opts.security)
        tps, topics = client.subscribed(opts.subscription)
        check_same_schema(topics, schema_from_bytes(self.topic_schema_bytes), opts.subscription.option)
        c = self.constraints
        if c.any:
            tps = [tp for tp in tps if c.allows(*tp)]
        if not tps:
            return []
        bounds = client.bounds(tps)
        start_ts = client.offsets_for_times(timestamp_queries(opts.starting, tps))
        end_ts = client.offsets_for_times(timestamp_queries(opts.ending, tps))
        ranges = plan_batch_ranges(tps, opts.starting, opts.ending, bounds, start_ts, end_ts,
                                   fail_on_data_loss=opts.fail_on_data_loss,
                                   timestamp_strategy=opts.timestamp_strategy)
        ts_types = {t: timestamp_type_of(info) for t, info in topics.items()}
        if c.any:
            ranges = self._apply_constraints(client, ranges, ts_types)
        ranges = split_ranges(ranges, opts.min_partitions, opts.max_records_per_partition)
        return [RangePartition(r.topic, r.partition, r.start, r.end, ts_types.get(r.topic, 0)) for r in ranges]

    def _apply_constraints(self, client: ClusterClient, ranges: list[OffsetRange],
                           ts_types: dict[str, int]) -> list[OffsetRange]:
        c = self.constraints
        out = []
        for r in ranges:
            s, e = c.clip(r.start, r.end)
            out.append(OffsetRange(r.topic, r.partition, s, e))
        live = [r for r in out if r.size]
        if c.ts_lo_ms is not None and live:
            found = client.offsets_for_times({r.tp: c.ts_lo_ms for r in live})
            out = [OffsetRange(r.topic, r.partition, *_at_least(r, found.get(r.tp, -1))) if r.size else r
                   for r in out]
        live = [r for r in out if r.size and ts_types.get(r.topic) == 1]
        if c.ts_hi_ms is not None and live:
            found = client.offsets_for_times({r.tp: c.ts_hi_ms for r in live})
            out = [OffsetRange(r.topic, r.partition, *_at_most(r, found.get(r.tp, -1)))
                   if r.tp in found else r for r in out]
        return out

    def partitions(self) -> list[InputPartition]:
        return list(self._plan())

    # ------------------------------------------------------------ reading
    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self.opts, self.layout, partition)


def _at_least(r: OffsetRange, first_at_or_after: int) -> tuple[int, int]:
    """Start at the first record whose timestamp reaches the bound (-1: none does)."""
    if first_at_or_after < 0:
        return r.start, r.start
    s = max(r.start, first_at_or_after)
    return (s, r.end) if s < r.end else (r.start, r.start)


def _at_most(r: OffsetRange, first_at_or_after: int) -> tuple[int, int]:
    """End before the first record whose timestamp reaches the bound (monotonic topics)."""
    if first_at_or_after < 0:
        return r.start, r.end
    e = min(r.end, first_at_or_after)
    return (r.start, e) if e > r.start else (r.start, r.start)


class FilteringBatchReader(BatchReader):
    """:class:`BatchReader` plus ``pushFilters`` (see the module docstring)."""

    def pushFilters(self, filters):
        self.constraints, remaining = push(filters, self.layout.names)
        return remaining


def pushdown_enabled_by_planner() -> bool | None:
    """The ``spark.sql.python.filterPushdown.enabled`` value Spark's planner
    worker is running with, when ``DataSource.reader()`` is called from it.

    pyspark 4.3 builds a batch reader in one of two planner entry points:
    ``data_source_pushdown_filters`` (only used with pushdown on) and
    ``plan_data_source_read._main``, which holds the conf in its local
    ``enable_pushdown`` and fails a reader that overrides ``pushFilters`` when
    it is false. None: not called from a Spark planner (plain Python).
    """
    frame = sys._getframe(1)
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith("data_source_pushdown_filters.py"):
            return True
        if filename.endswith("plan_data_source_read.py") and frame.f_code.co_name == "_main":
            flag = frame.f_locals.get("enable_pushdown")
            if isinstance(flag, bool):
                return flag
        frame = frame.f_back
    return None
