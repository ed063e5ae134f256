"""Per-partition log settings: the broker's defaults with the topic's overrides applied.

Built by :func:`replikafka.broker.config.log_config_for_topic`; the storage
classes only ever see this frozen value object.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024          # roll when the active segment would exceed this (bytes)
    segment_ms: int = 7 * 24 * 3600 * 1000           # roll when the active segment is older than this (ms)
    retention_ms: int = 7 * 24 * 3600 * 1000         # delete sealed segments whose newest record is older (ms); -1 = forever
    retention_bytes: int = -1                        # delete oldest sealed segments while the log is larger (bytes); -1 = no limit
    flush_interval_messages: int = 2**63 - 1         # fsync after this many unflushed records (records)
    flush_interval_ms: int = 2**63 - 1               # fsync when the oldest unflushed data is older (ms)
    index_interval_bytes: int = 4096                 # add an offset-index entry at least every this many bytes (bytes)
    max_message_bytes: int = 1024 * 1024 + 12        # largest batch accepted in one append (bytes)
    message_timestamp_type: str = "CreateTime"       # CreateTime | LogAppendTime
    min_insync_replicas: int = 1                     # acks=all refused below this ISR size (replicas)
    unclean_leader_election_enable: bool = False     # may an out-of-sync replica become leader
