"""Kafka's default key partitioner: ``(murmur2(key) & 0x7fffffff) % partitions``.

Pure functions, safe from any thread. The same key lands on the same
partition as with Kafka's Java client for the same partition count.
"""
from __future__ import annotations

_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's murmur2 (``org.apache.kafka.common.utils.Utils.murmur2``), as a signed 32-bit int."""
    length = len(data)
    h = (0x9747B28C ^ length) & _MASK
    n4 = length & ~3
    for i in range(0, n4, 4):
        k = data[i] | (data[i + 1] << 8) | (data[i + 2] << 16) | (data[i + 3] << 24)
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    rest = length & 3
    if rest == 3:
        h ^= data[n4 + 2] << 16
    if rest >= 2:
        h ^= data[n4 + 1] << 8
    if rest >= 1:
        h ^= data[n4]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for_key(key: bytes | str, num_partitions: int) -> int:
    """The partition Kafka's default partitioner picks for a non-null key."""
    if num_partitions < 1:
        raise ValueError("num_partitions must be positive")
    if isinstance(key, str):
        key = key.encode()
    return (murmur2(bytes(key)) & 0x7FFFFFFF) % num_partitions
