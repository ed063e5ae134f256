"""Streaming reads: ``spark.readStream.format("replikafka")``.

Offsets are Spark Kafka source's JSON, ``{"topic": {"partition": next_offset}}``,
so a checkpoint reads the same. Spark keeps one :class:`StreamReader` per query
run in a long-lived planner worker and calls, per micro-batch:
``latestOffset(start, limit)`` -> ``partitions(start, end)`` -> executors'
``read()`` -> ``commit(end)``.

- ``initialOffset``: ``startingOffsets`` (default ``latest``), or by timestamp.
- ``latestOffset``: the high watermarks now, limited by the read limit Spark
  passes. ``maxOffsetsPerTrigger`` becomes ``ReadMaxRows``, shared out in
  proportion to backlog (:func:`~replikafka.spark.offsets_planning.rate_limit`);
  ``minOffsetsPerTrigger`` holds a batch back until that many records wait or
  ``maxTriggerDelay`` passed since the last batch. ``ReadAllAvailable`` (e.g.
  ``Trigger.Once``) ignores both, as Spark requires.
- ``Trigger.AvailableNow``: ``prepareForTriggerAvailableNow`` records the high
  watermarks; later batches never go past them, so the query ends.
- A partition (or a topic matching ``subscribePattern``) that appears
  mid-stream first enters the offsets at its log start offset, admitting
  nothing in that batch; the next batches read it. So every batch's
  ``[start, end)`` is fully in the checkpoint and a replay after a restart
  reads exactly the same records.
- A partition that disappears (topic deleted), or offsets that retention
  removed before they were read, follow ``failOnDataLoss``.
"""
from __future__ import annotations

import time
from typing import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from replikafka.spark.arrow_convert import OutputLayout
from replikafka.spark.batch_reader import RangePartition, check_same_schema, read_partition
from replikafka.spark.cluster_access import ClusterClient, client_for, timestamp_type_of
from replikafka.spark.offsets_planning import (DataLossError, OffsetRange, TopicPartition, backlog_of,
                                               offsets_from_json, offsets_to_json, rate_limit, resolve_offset,
                                               split_ranges, timestamp_queries)
from replikafka.spark.options import SourceOptions


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):

    def __init__(self, opts: SourceOptions, layout: OutputLayout, topic_schema_bytes: bytes,
                 client: ClusterClient | None = None, clock=time.monotonic):
        self.opts = opts
        self.layout = layout
        self.topic_schema_bytes = topic_schema_bytes
        self._client = client
        self._clock = clock
        self._target: dict[TopicPartition, int] | None = None     # Trigger.AvailableNow
        self._last_trigger: float | None = None                    # for maxTriggerDelay
        self._latest: dict[TopicPartition, int] | None = None      # for reportLatestOffset
        self._ts_types: dict[str, int] = {}

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_client"] = None
        state["_clock"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._clock = time.monotonic

    @property
    def client(self) -> ClusterClient:
        return self._client or client_for(self.opts.bootstrap, self.opts.security)

    # ------------------------------------------------------------ cluster view
    def _current(self, *, require_topics: bool):
        from replikafka.records import schema_from_bytes
        tps, topics = self.client.subscribed(self.opts.subscription, require_topics=require_topics)
        check_same_schema(topics, schema_from_bytes(self.topic_schema_bytes), self.opts.subscription.option)
        self._ts_types.update({t: timestamp_type_of(info) for t, info in topics.items()})
        return tps

    # ------------------------------------------------------------ offsets
    def initialOffset(self) -> dict:
        opts = self.opts
        tps = self._current(require_topics=True)
        bounds = self.client.bounds(tps)
        by_ts = self.client.offsets_for_times(timestamp_queries(opts.starting, tps))
        start = {tp: resolve_offset(opts.starting, tp, bounds[tp], by_ts, is_start=True,
                                    timestamp_strategy=opts.timestamp_strategy) for tp in tps}
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps = self._current(require_topics=False)
        self._target = {tp: b.high_watermark for tp, b in self.client.bounds(tps).items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_json(start)
        tps = self._current(require_topics=False)
        gone = [tp for tp in begin if tp not in set(tps)]
        if gone:
            if self.opts.fail_on_data_loss:
                raise DataLossError(f"partition {gone[0][0]}-{gone[0][1]} (offset {begin[gone[0]]}) no longer exists; "
                                    f"{len(gone)} partition(s) of the stream are gone")
            for tp in gone:
                del begin[tp]
        bounds = self.client.bounds(tps)
        latest = {tp: b.high_watermark for tp, b in bounds.items()}
        self._latest = dict(latest)
        if self._target is not None:
            latest = {tp: min(hw, self._target[tp]) for tp, hw in latest.items() if tp in self._target}
        # Partitions new to the stream enter at their log start, admitting nothing yet.
        end = {tp: begin[tp] for tp in begin}
        fresh = {tp: bounds[tp].log_start for tp in latest if tp not in begin}
        known = {tp: max(latest[tp], begin[tp]) for tp in latest if tp in begin}
        if not isinstance(limit, ReadAllAvailable):
            min_rows = None
            if isinstance(limit, ReadMinRows):
                min_rows = limit.min_rows
            elif self.opts.min_offsets_per_trigger is not None:
                min_rows = self.opts.min_offsets_per_trigger
            if min_rows is not None and self._target is None and self._hold_back(begin, known, min_rows):
                return offsets_to_json({**end, **fresh}) if fresh else start
            if isinstance(limit, ReadMaxRows):
                known = rate_limit({tp: begin[tp] for tp in known}, known, limit.max_rows)
        end.update(known)
        end.update(fresh)
        if backlog_of(begin, {tp: end[tp] for tp in begin}) > 0:
            self._last_trigger = self._clock()
        return offsets_to_json(end)

    def _hold_back(self, begin, latest, min_rows: int) -> bool:
        """``minOffsetsPerTrigger``: wait for more records unless ``maxTriggerDelay`` passed."""
        now = self._clock()
        if self._last_trigger is None or (now - self._last_trigger) * 1000 >= self.opts.max_trigger_delay_ms:
            return False
        return backlog_of(begin, latest) < min_rows

    def reportLatestOffset(self):
        return offsets_to_json(self._latest) if self._latest is not None else None

    # ------------------------------------------------------------ planning and reading
    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        begin, finish = offsets_from_json(start), offsets_from_json(end)
        ranges = []
        for tp, hi in sorted(finish.items()):
            lo = begin.get(tp)
            if lo is None:          # only in checkpoints written by something else
                lo = self.client.log_start(tp)
            if lo > hi:
                if self.opts.fail_on_data_loss:
                    raise DataLossError(f"{tp[0]}-{tp[1]}: the stream's offset went back from {lo} to {hi}")
                continue
            ranges.append(OffsetRange(tp[0], tp[1], lo, hi))
        ranges = split_ranges(ranges, self.opts.min_partitions, self.opts.max_records_per_partition)
        missing = {r.topic for r in ranges} - set(self._ts_types)
        if missing:
            self._ts_types.update({t: timestamp_type_of(self.client.topic(t)) for t in missing})
        return [RangePartition(r.topic, r.partition, r.start, r.end, self._ts_types.get(r.topic, 0))
                for r in ranges]

    def read(self, partition: InputPartition) -> Iterator:
        return read_partition(self.opts, self.layout, partition)

    def commit(self, end: dict) -> None:
        """Nothing to release: the cluster keeps no consumer position for us."""

    def stop(self) -> None:
        """Nothing to stop: connections are per process and reused."""
