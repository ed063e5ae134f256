"""Per-log-dir offset checkpoint files, in Kafka's OffsetCheckpoint format.

Three files per log dir share the format: `replication-offset-checkpoint`
(high watermarks), `recovery-point-offset-checkpoint` and
`log-start-offset-checkpoint`. Text, one item per line::

    0                       version
    N                       number of entries
    <topic> <partition> <offset>     N lines

Every write goes through `atomic_write_bytes` (tmp, flush, fsync, rename over,
fsync the directory), so a reader sees the old or the new file, never a torn
one. A malformed file raises StorageError naming the file and line.

Thread-safety: an OffsetCheckpointFile serialises its own writes and reads
with a lock, so one instance may be shared by threads.
"""
from __future__ import annotations

import os
import threading
from typing import Mapping

from replikafka.errors import StorageError

from .fileio import atomic_write_bytes

REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CHECKPOINT_VERSION = 0

TopicPartition = tuple[str, int]


class OffsetCheckpointFile:
    """One offset checkpoint file (format: module doc). Thread-safe."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        # Each topic name is checked once (a broker's 50,000 entries name a few topics:
        # checking every entry's name was most of a 50,000-entry write's 0.3 s of CPU).
        for topic in {topic for topic, _partition in offsets}:
            if not topic or any(c.isspace() for c in topic):
                raise ValueError(f"topic name {topic!r} cannot be checkpointed")
        lines = [str(CHECKPOINT_VERSION), str(len(offsets))]
        lines.extend([f"{topic} {int(partition)} {int(offset)}"
                      for (topic, partition), offset in sorted(offsets.items())])
        data = ("\n".join(lines) + "\n").encode()
        with self._lock:
            atomic_write_bytes(self.path, data)

    def read(self) -> dict[TopicPartition, int]:
        """The checkpointed offsets; {} if the file does not exist."""
        with self._lock:
            try:
                with open(self.path, encoding="utf-8") as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                return {}
        return self._parse(lines)

    def _parse(self, lines: list[str]) -> dict[TopicPartition, int]:
        def bad(lineno: int, why: str) -> StorageError:
            return StorageError(f"malformed checkpoint {self.path} line {lineno}: {why}")

        if len(lines) < 2:
            raise bad(len(lines) + 1, "missing version or count")
        if lines[0].strip() != str(CHECKPOINT_VERSION):
            raise bad(1, f"unsupported version {lines[0]!r}")
        try:
            count = int(lines[1])
        except ValueError:
            raise bad(2, f"count {lines[1]!r} is not a number") from None
        entries = [ln for ln in lines[2:] if ln.strip()]
        if len(entries) != count:
            raise bad(2, f"count {count} but {len(entries)} entries")
        out: dict[TopicPartition, int] = {}
        for i, line in enumerate(entries, start=3):
            parts = line.split()
            if len(parts) != 3:
                raise bad(i, f"expected 'topic partition offset', got {line!r}")
            try:
                out[(parts[0], int(parts[1]))] = int(parts[2])
            except ValueError:
                raise bad(i, f"non-numeric partition or offset in {line!r}") from None
        return out

    def exists(self) -> bool:
        return os.path.exists(self.path)
