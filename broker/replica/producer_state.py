"""Idempotent-producer state of one partition (KIP-98), pure.

For each producer id the partition remembers its epoch and the last
``BATCHES_KEPT`` batches (first/last sequence and offsets), so a retried batch is
recognised and answered with its original offsets instead of being appended
twice. Leaders check; followers and log recovery only update, from the batch
headers they append or replay, so a new leader still deduplicates.

Not thread-safe: the partition's lock guards it.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from replikafka.errors import InvalidProducerEpochError, OutOfOrderSequenceError

BATCHES_KEPT = 5
NO_PRODUCER_ID = -1


@dataclass(frozen=True)
class BatchRecord:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass
class ProducerEntry:
    epoch: int
    batches: deque = field(default_factory=lambda: deque(maxlen=BATCHES_KEPT))
    last_ms: int = 0


@dataclass(frozen=True)
class Duplicate:
    first_offset: int
    last_offset: int


class ProducerStateManager:
    def __init__(self):
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, producer_id: int, epoch: int, first_seq: int, count: int) -> Duplicate | None:
        """Before a leader appends. Returns a :class:`Duplicate` for a retried batch,
        None for the next batch in sequence; raises on a gap or a fenced epoch."""
        if producer_id == NO_PRODUCER_ID:
            return None
        entry = self.producers.get(producer_id)
        if entry is None or not entry.batches:
            if entry is not None and epoch < entry.epoch:
                raise InvalidProducerEpochError(f"producer {producer_id} epoch {epoch} < {entry.epoch}")
            return None  # first batch we see from it (or after expiry): accept any sequence
        if epoch < entry.epoch:
            raise InvalidProducerEpochError(f"producer {producer_id} epoch {epoch} is older than {entry.epoch}")
        if epoch > entry.epoch:
            if first_seq != 0:
                raise OutOfOrderSequenceError(
                    f"producer {producer_id}: a new epoch {epoch} must start at sequence 0, got {first_seq}")
            return None
        last_seq = first_seq + count - 1
        for b in entry.batches:
            if b.first_seq == first_seq and b.last_seq == last_seq:
                return Duplicate(b.first_offset, b.last_offset)
        expected = entry.batches[-1].last_seq + 1
        if first_seq != expected:
            raise OutOfOrderSequenceError(
                f"producer {producer_id}: expected sequence {expected}, got {first_seq}")
        return None

    def update(self, producer_id: int, epoch: int, first_seq: int, count: int,
               first_offset: int, now_ms: int = 0) -> None:
        """After an append (leader or follower) or while replaying the log."""
        if producer_id == NO_PRODUCER_ID or first_seq < 0:
            return
        entry = self.producers.get(producer_id)
        if entry is None or epoch > entry.epoch:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        entry.batches.append(BatchRecord(first_seq, first_seq + count - 1, first_offset, first_offset + count - 1))
        entry.last_ms = now_ms

    def truncate_to(self, offset: int) -> None:
        """Forget batches at or beyond ``offset`` (the log was truncated)."""
        for pid in list(self.producers):
            entry = self.producers[pid]
            kept = [b for b in entry.batches if b.last_offset < offset]
            entry.batches.clear()
            entry.batches.extend(kept)
            if not kept:
                del self.producers[pid]

    def expire(self, now_ms: int, expiration_ms: int) -> None:
        for pid in [p for p, e in self.producers.items() if now_ms - e.last_ms > expiration_ms]:
            del self.producers[pid]
