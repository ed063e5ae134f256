"""Offset planning: which ``[start, end)`` each Spark task reads. Pure, no I/O.

The reader asks the cluster for facts (partitions, log start offsets, high
watermarks, offsets for timestamps) and these functions turn facts plus the
user's options into ranges:

- :func:`resolve_offset` applies one :class:`~replikafka.spark.options.OffsetSpec`
  to one partition;
- :func:`plan_batch_ranges` fixes a batch read's ranges, refusing anything that
  would read at or beyond a high watermark (HW) or silently skip data;
- :func:`split_ranges` cuts ranges for ``minPartitions`` / ``maxRecordsPerPartition``
  the way Spark's ``KafkaOffsetRangeCalculator`` does;
- :func:`rate_limit` shares a streaming ``maxOffsetsPerTrigger`` out in proportion
  to each partition's backlog, never admitting more than the limit in total;
- :func:`offsets_to_json` / :func:`offsets_from_json` convert to and from the
  checkpoint's ``{"topic": {"partition": next_offset}}``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from replikafka.errors import ReplikafkaError
from replikafka.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, Subscription

TopicPartition = tuple[str, int]

#: The key of the stream offsets JSON that holds ``{"topic": topic_id}`` beside
#: Spark's ``{"topic": {"partition": offset}}``. ``@`` is not legal in a topic
#: name, so the key can never be a topic.
TOPIC_IDS_KEY = "@topicIds"

#: Spark's text after a data-loss reason (``KafkaSourceProvider.INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_*``).
DATA_LOSS_INSTRUCTION_FAIL = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was aged "
    "out by Kafka or the topic may have been deleted before all the data in the topic was processed. If you "
    "don't want your streaming query to fail on such cases, set the source option \"failOnDataLoss\" to \"false\".")
DATA_LOSS_INSTRUCTION_SKIP = (
    "Some data may have been lost because they are not available in Kafka any more; either the data was aged "
    "out by Kafka or the topic may have been deleted before all the data in the topic was processed. If you "
    "want your streaming query to fail on such cases, set the source option \"failOnDataLoss\" to \"true\".")


class DataLossError(ReplikafkaError):
    """Records a read was planned or asked to cover are gone: removed by
    retention, a deleted partition, or a topic deleted and re-created (Spark's
    ``KAFKA_DATA_LOSS``). Raised only with ``failOnDataLoss=true``; not a
    configuration error and not retriable: the same read would lose the same data."""

    code = "KAFKA_DATA_LOSS"

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"{reason}. {DATA_LOSS_INSTRUCTION_FAIL}")


class OffsetRangeError(OptionError):
    """A batch read's start resolved beyond its end (Spark's
    ``RESOLVED_START_OFFSET_GREATER_THAN_END_OFFSET``), naming the starting option."""


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one partition, read by one Spark task."""
    topic: str
    partition: int
    start: int
    end: int

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)

    @property
    def size(self) -> int:
        return max(self.end - self.start, 0)


@dataclass(frozen=True)
class PartitionBounds:
    """What a partition's leader said: log start offset and high watermark."""
    log_start: int
    high_watermark: int


# ---------------------------------------------------------------- partitions
def select_partitions(sub: Subscription, cluster: Mapping[str, Iterable[int]], *,
                      require_topics: bool = True) -> list[TopicPartition]:
    """The partitions a subscription covers, given the cluster's ``topic -> partitions``.

    A named topic or assigned partition that does not exist is an error naming
    the option (with ``require_topics``); a pattern may match nothing only when
    ``require_topics`` is false (a stream waiting for its topics).
    """
    out: list[TopicPartition] = []
    if sub.kind == "subscribe":
        for t in sub.topics:
            if t not in cluster:
                if require_topics:
                    raise OptionError("subscribe", f"topic {t!r} does not exist")
                continue
            out += [(t, p) for p in sorted(cluster[t])]
    elif sub.kind == "subscribePattern":
        topics = sorted(t for t in cluster if sub.matches(t))
        if not topics and require_topics:
            raise OptionError("subscribePattern", f"{sub.pattern!r} matches no topic")
        for t in topics:
            out += [(t, p) for p in sorted(cluster[t])]
    else:
        for t, parts in sub.assignment:
            if t not in cluster:
                if require_topics:
                    raise OptionError("assign", f"topic {t!r} does not exist")
                continue
            have = set(cluster[t])
            for p in parts:
                if p not in have:
                    raise OptionError("assign", f"topic {t!r} has no partition {p} (it has {len(have)})")
                out.append((t, p))
    return out


def timestamp_queries(spec: OffsetSpec, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
    """The ``ListOffsets`` timestamp (ms) each partition needs for ``spec`` (empty unless by time)."""
    if spec.kind == "timestamp":
        return {tp: spec.timestamp_ms for tp in tps}
    if spec.kind == "timestamps":
        given = spec.as_dict()
        out = {}
        for tp in tps:
            if tp not in given:
                raise OptionError(spec.option, f"gives no timestamp for {tp[0]}-{tp[1]}; name every partition read")
            out[tp] = given[tp]
        return out
    return {}


def resolve_offset(spec: OffsetSpec, tp: TopicPartition, bounds: PartitionBounds,
                   by_timestamp: Mapping[TopicPartition, int], *, is_start: bool,
                   timestamp_strategy: str = "error") -> int:
    """One partition's offset for ``spec``. ``by_timestamp[tp]`` is the broker's
    answer to the partition's timestamp query (-1: no record at or after it)."""
    if spec.kind == "earliest":
        return bounds.log_start
    if spec.kind == "latest":
        return bounds.high_watermark
    if spec.kind == "offsets":
        off = spec.offset_of(tp)
        if off is None:
            raise OptionError(spec.option, f"gives no offset for {tp[0]}-{tp[1]}; name every partition read "
                              "(-2 = earliest, -1 = latest), or the topic (\"earliest\" / \"latest\")")
        if off == EARLIEST:
            return bounds.log_start
        if off == LATEST:
            return bounds.high_watermark
        return off
    found = by_timestamp.get(tp, -1)
    if found >= 0:
        return found
    # No record at or after the timestamp.
    if is_start and timestamp_strategy == "error":
        ts = spec.timestamp_ms if spec.kind == "timestamp" else spec.as_dict().get(tp)
        raise OptionError(spec.option, f"{tp[0]}-{tp[1]} has no record at or after {ts} ms; set "
                          "startingOffsetsByTimestampStrategy=latest to start at the end instead")
    return bounds.high_watermark


def plan_batch_ranges(tps: Iterable[TopicPartition], starting: OffsetSpec, ending: OffsetSpec,
                      bounds: Mapping[TopicPartition, PartitionBounds],
                      start_by_ts: Mapping[TopicPartition, int], end_by_ts: Mapping[TopicPartition, int], *,
                      fail_on_data_loss: bool, timestamp_strategy: str = "error") -> list[OffsetRange]:
    """Fix a batch read's ``[start, end)`` per partition (empty ranges included).

    ``end`` never exceeds the HW seen now: asking for more is an error naming
    the option, never a short read later. A start below the log start offset is
    data loss (an error, or skipped with ``fail_on_data_loss`` false).
    """
    out = []
    for tp in tps:
        b = bounds[tp]
        start = resolve_offset(starting, tp, b, start_by_ts, is_start=True, timestamp_strategy=timestamp_strategy)
        end = resolve_offset(ending, tp, b, end_by_ts, is_start=False)
        if end > b.high_watermark:
            raise OptionError(ending.option, f"{tp[0]}-{tp[1]}: asks to read up to offset {end}, but only offsets "
                              f"below the high watermark {b.high_watermark} are committed")
        if start < b.log_start:
            if fail_on_data_loss:
                raise DataLossError(f"{tp[0]}-{tp[1]}: {starting.option} asks for offset {start}, but the log now "
                                    f"starts at {b.log_start}: offsets [{start}, {b.log_start}) were removed")
            start = b.log_start
        if start > end:
            raise resolved_start_after_end(starting, ending, tp, start, end)
        out.append(OffsetRange(tp[0], tp[1], start, end))
    return out


def resolved_start_after_end(starting: OffsetSpec, ending: OffsetSpec, tp: TopicPartition,
                             start: int, end: int) -> OffsetRangeError:
    """Spark's ``RESOLVED_START_OFFSET_GREATER_THAN_END_OFFSET`` for one partition
    (Spark refuses it for every mix of offsets, timestamps and latest)."""
    return OffsetRangeError(starting.option, f"The resolved start offset {start} is greater than the resolved end "
                            f"offset {end} for topic {tp[0]} partition {tp[1]} ({starting.option} resolved to "
                            f"{start}, {ending.option} to {end})")


# ---------------------------------------------------------------- splitting
def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """``parts`` contiguous pieces of nearly equal size (the last ones take the remainder)."""
    out = []
    remaining = r.size
    start = r.start
    for i in range(parts):
        this = remaining // (parts - i)
        remaining -= this
        end = min(start + this, r.end)
        out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return [x for x in out if x.size > 0]


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None = None,
                 max_records_per_partition: int | None = None) -> list[OffsetRange]:
    """Spark's ``KafkaOffsetRangeCalculator``: drop empty ranges; cut each range
    into pieces of at most ``max_records_per_partition``; then, if there are
    fewer than ``min_partitions`` pieces, cut the large ones in proportion to
    their size (small ranges stay whole)."""
    rs = [r for r in ranges if r.size > 0]
    if max_records_per_partition:
        rs = [piece for r in rs for piece in _divide(r, math.ceil(r.size / max_records_per_partition))]
    if not min_partitions or len(rs) >= min_partitions:
        return rs
    total = sum(r.size for r in rs)

    def part_count(size: int, total_size: int, min_parts: int) -> int:
        # Spark's math.round: half up (Python's round() would round half to even).
        return max(math.floor(size / total_size * min_parts + 0.5), 1) if total_size else 1

    unsplit = [r for r in rs if part_count(r.size, total, min_partitions) == 1]
    split_total = total - sum(r.size for r in unsplit)
    split_min = max(min_partitions - len(unsplit), 1)
    out = []
    for r in rs:
        out += _divide(r, part_count(r.size, split_total, split_min)) if r not in unsplit else [r]
    return out


# ---------------------------------------------------------------- admission control
def rate_limit(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               max_rows: int) -> dict[TopicPartition, int]:
    """End offsets admitting at most ``max_rows`` records in total, shared in
    proportion to each partition's backlog ``latest - start``.

    ``start`` must name every partition of ``latest``. Shares are floored, then
    the rows left over go one each first to partitions whose share floored to
    zero (so a small partition is not starved while there are rows to give),
    then to the largest fractional shares. The total admitted is exactly ``min(max_rows, total backlog)``;
    no partition moves backwards or past ``latest``.
    """
    backlog = {tp: latest[tp] - start[tp] for tp in latest if latest[tp] > start[tp]}
    end = {tp: start[tp] for tp in latest}
    total = sum(backlog.values())
    if total <= max_rows:
        for tp in backlog:
            end[tp] = latest[tp]
        return end
    shares = {tp: max_rows * size / total for tp, size in backlog.items()}
    granted = {tp: int(math.floor(s)) for tp, s in shares.items()}
    left = max_rows - sum(granted.values())
    order = sorted(backlog, key=lambda tp: (granted[tp] > 0, -(shares[tp] - granted[tp]), backlog[tp], tp))
    for tp in order:
        if left <= 0:
            break
        if granted[tp] < backlog[tp]:
            granted[tp] += 1
            left -= 1
    for tp, g in granted.items():
        end[tp] = start[tp] + g
    return end


def backlog_of(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> int:
    return sum(max(latest[tp] - start.get(tp, latest[tp]), 0) for tp in latest)


# ---------------------------------------------------------------- checkpoint JSON
def offsets_to_json(offsets: Mapping[TopicPartition, int],
                    topic_ids: Mapping[str, str] | None = None) -> dict:
    """``{(t, p): o}`` -> ``{"t": {"p": o}}`` in a stable order (what Spark
    checkpoints), plus ``{"@topicIds": {"t": id}}`` for the topics whose id is
    known (how a deleted and re-created topic is told from the old one)."""
    out: dict = {}
    for (t, p), o in sorted(offsets.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    ids = {t: topic_ids[t] for t in sorted(out) if topic_ids and topic_ids.get(t)}
    if ids:
        out[TOPIC_IDS_KEY] = ids
    return out


def offsets_from_json(doc: Mapping | None) -> dict[TopicPartition, int]:
    """The offsets of :func:`offsets_to_json`'s JSON (a plain Spark Kafka
    source JSON too); refuses anything else with a clear message."""
    out: dict[TopicPartition, int] = {}
    if not doc:
        return out
    if not isinstance(doc, Mapping):
        raise ValueError(f"replikafka stream offsets must be {{\"topic\": {{\"partition\": offset}}}}, got {doc!r}")
    for t, parts in doc.items():
        if t == TOPIC_IDS_KEY:
            continue
        if not isinstance(parts, Mapping):
            raise ValueError(f"replikafka stream offsets: topic {t!r} maps to {parts!r}, not an object")
        for p, o in parts.items():
            if not str(p).isdigit() or isinstance(o, bool) or not isinstance(o, int) or o < 0:
                raise ValueError(f"replikafka stream offsets: {t}-{p} -> {o!r} is not a partition and offset")
            out[(str(t), int(p))] = o
    return out


def topic_ids_from_json(doc: Mapping | None) -> dict[str, str]:
    """``{"topic": topic_id}`` recorded beside the offsets (empty for a Spark
    JSON or a checkpoint written before topic ids were recorded)."""
    ids = (doc or {}).get(TOPIC_IDS_KEY) if isinstance(doc, Mapping) else None
    if ids is None:
        return {}
    if not isinstance(ids, Mapping) or not all(isinstance(v, str) for v in ids.values()):
        raise ValueError(f"replikafka stream offsets: {TOPIC_IDS_KEY} must map topics to ids, got {ids!r}")
    return {str(t): v for t, v in ids.items()}


# ---------------------------------------------------------------- stream continuity
@dataclass(frozen=True)
class Continuity:
    """What happened to a stream's partitions since its start offsets were
    fixed (:func:`check_continuity`), and what the stream does about it."""
    #: Partitions whose topic was deleted and re-created: the new topic's log
    #: start, where the stream continues (``failOnDataLoss=false``).
    recreated: dict
    #: Partitions whose high watermark went below the start with the same
    #: topic id (truncated): the HW, where the stream continues, as Spark's does.
    truncated: dict
    #: Partitions in the start offsets that no longer exist.
    gone: tuple
    #: Data-loss reasons, in Spark's words (logged as warnings when not failing).
    reasons: tuple


def check_continuity(begin: Mapping[TopicPartition, int], begin_ids: Mapping[str, str],
                     bounds: Mapping[TopicPartition, PartitionBounds], ids: Mapping[str, str], *,
                     fail_on_data_loss: bool) -> Continuity:
    """Compare a micro-batch's start offsets (and the topic ids recorded with
    them) with the partitions there are now. Pure.

    - a topic id that changed: the topic was deleted and re-created; its old
      records are gone, and the new topic's records are read from its start;
    - a high watermark below the start offset with the same (or an unknown)
      topic id: the partition lost records at its end (Spark's "offset was
      changed from X to Y"); reading continues at the HW, as Spark's does;
    - a partition that no longer exists: Spark's "are gone".

    With ``fail_on_data_loss`` any of these raises :class:`DataLossError`
    with Spark's message; without, the result says where each partition goes on.
    """
    recreated: dict[TopicPartition, int] = {}
    truncated: dict[TopicPartition, int] = {}
    reasons: list[str] = []
    gone = tuple(sorted(tp for tp in begin if tp not in bounds))
    if gone:
        reasons.append(f"Partitions {_names(gone)} are gone. Some data may have been missed")
    for tp, offset in sorted(begin.items()):
        b = bounds.get(tp)
        if b is None:
            continue
        old_id, new_id = begin_ids.get(tp[0], ""), ids.get(tp[0], "")
        if old_id and new_id and old_id != new_id:
            recreated[tp] = b.log_start
            to = b.high_watermark if b.high_watermark < offset else b.log_start
            reasons.append(f"Partition {tp[0]}-{tp[1]}'s offset was changed from {offset} to {to}, some data may "
                           f"have been missed (topic {tp[0]!r} was deleted and re-created: its topic id changed "
                           f"from {old_id} to {new_id})")
        elif b.high_watermark < offset:
            truncated[tp] = b.high_watermark
            reasons.append(f"Partition {tp[0]}-{tp[1]}'s offset was changed from {offset} to {b.high_watermark}, "
                           "some data may have been missed")
    if reasons and fail_on_data_loss:
        raise DataLossError(reasons[0] + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""))
    return Continuity(recreated, truncated, gone, tuple(reasons))


def added_partition_reasons(fresh: Mapping[TopicPartition, int]) -> list[str]:
    """Spark's data-loss reason for a partition that joins a stream at a log
    start other than 0 (its first records were removed before it was seen)."""
    return [f"Added partition {t}-{p} starts from {o} instead of 0. Some data may have been missed"
            for (t, p), o in sorted(fresh.items()) if o != 0]


def _names(tps) -> str:
    return "[" + ", ".join(f"{t}-{p}" for t, p in tps) + "]"
