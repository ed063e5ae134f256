"""The storage engine: partition logs as Arrow IPC stream segments.

See `log` for the partition directory layout, `segment` for the segment
file, `batch_format` for the stored-batch message, `log_manager` for the
per-log-dir files. Every class documents its own format and thread-safety.
"""
from .batch_format import BatchEncoder, BatchHeader, DecodedBatch, decode_batch, encode_batch
from .checkpoints import (LOG_START_OFFSET_CHECKPOINT, RECOVERY_POINT_CHECKPOINT,
                          REPLICATION_OFFSET_CHECKPOINT, OffsetCheckpointFile)
from .clock import ManualClock, SystemClock
from .leader_epoch_cache import (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET, EpochEntry,
                                 LeaderEpochFileCache)
from .log import (AppendInfo, ClippedBatch, Log, LogReadResult, RawReadResult, StoredBatch, StoredBytes, StoredReadResult,
                  clip_stored, validate_schema)
from .log_config import LogConfig
from .log_manager import CLEAN_SHUTDOWN_FILE, LogManager
from .offset_index import OffsetIndex
from .segment import LogSegment
from .time_index import TimeIndex

__all__ = [
    "AppendInfo", "BatchEncoder", "BatchHeader", "CLEAN_SHUTDOWN_FILE", "DecodedBatch",
    "EpochEntry", "LOG_START_OFFSET_CHECKPOINT", "LeaderEpochFileCache", "Log", "LogConfig",
    "LogManager", "LogReadResult", "LogSegment", "ManualClock", "OffsetCheckpointFile",
    "OffsetIndex", "RECOVERY_POINT_CHECKPOINT", "REPLICATION_OFFSET_CHECKPOINT", "RawReadResult",
    "ClippedBatch", "StoredBatch", "StoredBytes", "StoredReadResult", "clip_stored",
    "SystemClock", "TimeIndex", "UNDEFINED_EPOCH", "UNDEFINED_EPOCH_OFFSET", "decode_batch",
    "encode_batch", "validate_schema",
]
