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
- A partition that disappears (topic deleted), offsets that retention
  removed before they were read, and a topic deleted and re-created follow
  ``failOnDataLoss`` (:func:`~replikafka.spark.offsets_planning.check_continuity`).
  The offsets carry each topic's id beside Spark's JSON (``"@topicIds"``), so a
  re-created topic is recognised even when its new high watermark is past the
  old offset, across restarts too. ``failOnDataLoss=true``: the query fails
  with Spark's "offset was changed from X to Y". ``false``: a warning, and the
  partition continues at the new topic's log start (its records are all read;
  that batch admits nothing of it, so each batch stays replayable); a high
  watermark that went backwards under the same topic id (truncation)
  continues at that high watermark, as Spark's source does.
"""
from __future__ import annotations

import logging
import time
from typing import Iterator

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (ReadAllAvailable, ReadLimit, ReadMaxRows, ReadMinRows,
                                              SupportsTriggerAvailableNow)

from replikafka.errors import UnknownTopicOrPartitionError
from replikafka.spark.arrow_convert import OutputLayout
from replikafka.spark.batch_reader import RangePartition, check_same_schema, read_partition
from replikafka.spark.cluster_access import ClusterClient, client_for, timestamp_type_of, topic_id_of
from replikafka.spark.offsets_planning import (DATA_LOSS_INSTRUCTION_SKIP, DataLossError, OffsetRange,
                                               TopicPartition, added_partition_reasons, backlog_of,
                                               check_continuity, offsets_from_json, offsets_to_json, rate_limit,
                                               resolve_offset, split_ranges, timestamp_queries,
                                               topic_ids_from_json)
from replikafka.spark.options import SourceOptions

log = logging.getLogger(__name__)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):

    def __init__(self, opts: SourceOptions, layout: OutputLayout, topic_schema_bytes: bytes,
                 client: ClusterClient | None = None, clock=time.monotonic, sleep=time.sleep):
        self.opts = opts
        self.layout = layout
        self.topic_schema_bytes = topic_schema_bytes
        self._client = client
        self._clock = clock
        self._sleep = sleep
        self._target: dict[TopicPartition, int] | None = None     # Trigger.AvailableNow
        self._target_ids: dict[str, str] = {}
        self._last_trigger: float | None = None                    # for maxTriggerDelay
        self._latest: dict[TopicPartition, int] | None = None      # for reportLatestOffset
        self._ts_types: dict[str, int] = {}
        self._ids: dict[str, str] = {}                             # topic ids seen by this run

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_client"] = None
        state["_clock"] = None
        state["_sleep"] = None
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._clock = time.monotonic
        self._sleep = time.sleep

    @property
    def client(self) -> ClusterClient:
        return self._client or client_for(self.opts.bootstrap, self.opts.security)

    # ------------------------------------------------------------ cluster view
    def _current(self, *, require_topics: bool) -> tuple[list[TopicPartition], dict[str, str]]:
        """The subscribed partitions now, and their topics' ids."""
        from replikafka.records import schema_from_bytes
        tps, topics = self.client.subscribed(self.opts.subscription, require_topics=require_topics)
        check_same_schema(topics, schema_from_bytes(self.topic_schema_bytes), self.opts.subscription.option)
        self._ts_types.update({t: timestamp_type_of(info) for t, info in topics.items()})
        ids = {t: topic_id_of(info) for t, info in topics.items()}
        return tps, {t: i for t, i in ids.items() if i}

    # ------------------------------------------------------------ offsets
    def initialOffset(self) -> dict:
        opts = self.opts
        tps, ids = self._current(require_topics=False)
        bounds = self.client.bounds(tps)
        by_ts = self.client.offsets_for_times(timestamp_queries(opts.starting, tps))
        start = {tp: resolve_offset(opts.starting, tp, bounds[tp], by_ts, is_start=True,
                                    timestamp_strategy=opts.timestamp_strategy) for tp in tps}
        self._ids.update(ids)
        return offsets_to_json(start, ids)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        tps, ids = self._current(require_topics=False)
        self._target = {tp: b.high_watermark for tp, b in self.client.bounds(tps).items()}
        self._target_ids = ids

    def _bounds_checked(self, begin, begin_ids, tps, ids):
        """Bounds of ``tps`` and how they continue ``begin``. A high watermark
        below the start under the same topic id may come from a leader that has
        not caught up yet: asked again up to ``fetchOffset.numRetries`` times,
        as Spark's source does, before it counts as lost data."""
        for attempt in range(self.opts.fetch_offset_retries + 1):
            if attempt:
                tps, ids = self._current(require_topics=False)     # a fresh view: ids and partitions too
            try:
                bounds = self.client.bounds(tps)
            except UnknownTopicOrPartitionError:
                # Partitions removed (or a topic deleted) while the view was taken, and
                # a broker that had not heard yet answered it: ask again on a fresh view.
                if attempt == self.opts.fetch_offset_retries:
                    raise
                self._sleep(self.opts.fetch_offset_retry_interval_ms / 1000)
                continue
            behind = [tp for tp, o in begin.items() if tp in bounds and bounds[tp].high_watermark < o
                      and not _changed(begin_ids, ids, tp[0])]
            if not behind or attempt == self.opts.fetch_offset_retries:
                break
            log.warning("replikafka: %s: high watermark %d below the stream's offset %d (attempt %d); asking again "
                        "in %d ms", f"{behind[0][0]}-{behind[0][1]}", bounds[behind[0]].high_watermark,
                        begin[behind[0]], attempt + 1, self.opts.fetch_offset_retry_interval_ms)
            self._sleep(self.opts.fetch_offset_retry_interval_ms / 1000)
        return tps, ids, bounds, check_continuity(begin, begin_ids, bounds, ids,
                                                  fail_on_data_loss=self.opts.fail_on_data_loss)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_json(start)
        begin_ids = {**self._ids, **topic_ids_from_json(start)}
        tps, ids = self._current(require_topics=False)
        tps, ids, bounds, cont = self._bounds_checked(begin, begin_ids, tps, ids)
        for reason in cont.reasons:
            log.warning("replikafka: %s. %s", reason, DATA_LOSS_INSTRUCTION_SKIP)
        for tp in cont.gone:
            del begin[tp]
        # Where each partition stands for this batch: a re-created topic's partitions
        # move to the new log start (admitting nothing of it in this batch), truncated
        # ones to their high watermark.
        moved = {**cont.truncated, **cont.recreated}
        latest = {tp: b.high_watermark for tp, b in bounds.items()}
        self._latest = dict(latest)
        self._ids.update(ids)
        if self._target is not None:
            latest = {tp: self._available_now_cap(tp, hw, begin, ids) for tp, hw in latest.items()
                      if tp in self._target}
        fresh = {tp: bounds[tp].log_start for tp in latest if tp not in begin}
        if fresh:
            lost = added_partition_reasons(fresh)
            if lost and self.opts.fail_on_data_loss:
                raise DataLossError(lost[0])
            for reason in lost:
                log.warning("replikafka: %s. %s", reason, DATA_LOSS_INSTRUCTION_SKIP)
        # Partitions new to the stream enter at their log start, admitting nothing yet.
        end = {tp: begin[tp] for tp in begin}
        end.update(moved)
        known = {tp: max(latest[tp], begin[tp]) for tp in latest if tp in begin and tp not in moved}
        if not isinstance(limit, ReadAllAvailable):
            min_rows = None
            if isinstance(limit, ReadMinRows):
                min_rows = limit.min_rows
            elif self.opts.min_offsets_per_trigger is not None:
                min_rows = self.opts.min_offsets_per_trigger
            if min_rows is not None and self._target is None and self._hold_back(begin, known, min_rows):
                return offsets_to_json({**end, **fresh}, ids) if (fresh or moved) else start
            if isinstance(limit, ReadMaxRows):
                known = rate_limit({tp: begin[tp] for tp in known}, known, limit.max_rows)
        end.update(known)
        end.update(fresh)
        if backlog_of(begin, {tp: end[tp] for tp in begin}) > 0:
            self._last_trigger = self._clock()
        return offsets_to_json(end, {**begin_ids, **ids})

    def _available_now_cap(self, tp: TopicPartition, hw: int, begin, ids) -> int:
        """``Trigger.AvailableNow`` reads up to the HW seen when it was prepared;
        a topic re-created since then had none of its records available then."""
        if _changed(self._target_ids, ids, tp[0]):
            return min(hw, begin.get(tp, hw))
        return min(hw, self._target[tp])

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
        begin_ids, end_ids = topic_ids_from_json(start), topic_ids_from_json(end)
        ranges = []
        for tp, hi in sorted(finish.items()):
            lo = begin.get(tp)
            if lo is None:          # only in checkpoints written by something else
                lo = self.client.log_start(tp)
            if _changed(begin_ids, end_ids, tp[0]):
                # The batch in which a re-created topic entered: nothing of it is read here.
                if self.opts.fail_on_data_loss:
                    raise DataLossError(f"Partition {tp[0]}-{tp[1]}'s offset was changed from {lo} to {hi}, some "
                                        f"data may have been missed (topic {tp[0]!r} was deleted and re-created)")
                continue
            if lo > hi:
                if self.opts.fail_on_data_loss:
                    raise DataLossError(f"Partition {tp[0]}-{tp[1]}'s offset was changed from {lo} to {hi}, some "
                                        "data may have been missed")
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


def _changed(before: dict, now: dict, topic: str) -> bool:
    """Both ids known and different: the topic was deleted and re-created in between."""
    old, new = before.get(topic, ""), now.get(topic, "")
    return bool(old and new and old != new)


class RefusedStreamReader(DataSourceStreamReader):
    """The stream reader of a query whose options or topics were refused: every
    call raises that error (see ``ReplikafkaDataSource.streamReader``)."""

    def __init__(self, error: Exception):
        self.error = error

    def _refuse(self, *args, **kwargs):
        raise self.error

    initialOffset = latestOffset = partitions = getDefaultReadLimit = reportLatestOffset = _refuse
    read = commit = _refuse

    def stop(self) -> None:
        """Nothing was started."""
