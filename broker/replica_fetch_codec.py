"""The wire format of a follower's fetch response (``/replikafka.ReplicaData/Fetch``).

A follower fetch moves most of the bytes a cluster carries (each record once per
follower), so its response skips protobuf for the record data::

    uint32 little-endian  n = length of the header
    n bytes               FetchResponse (protobuf) with every ``records`` empty and
                          ``records_size`` set
    records_size bytes    for each partition, in header order: its stored batches,
                          verbatim (an Arrow IPC stream, as ``Log.read_raw`` returns)

On the leader the batches are copied once in Python: ``Log.read_raw`` hands them
over as zero-copy slices of the segment files' mappings (``StoredBytes``: a
mapping outlives a truncation or deletion while a slice of it lives), and
:func:`encode` joins header and batches into the response (gRPC's own copy into
its send buffer follows). The follower slices the batches out of the received
bytes without copying (``pyarrow.Buffer`` slices). The request is a plain
``FetchRequest``. Pure functions, thread-safe.
"""
from __future__ import annotations

import struct

import pyarrow as pa

from replikafka.broker.storage.log import StoredBytes
from replikafka.protocol import replikafka_pb2 as pb

SERVICE = "replikafka.ReplicaData"
METHOD = "Fetch"
PATH = f"/{SERVICE}/{METHOD}"
_LEN = struct.Struct("<I")


def encode(response_and_batches: tuple[pb.FetchResponse, list]) -> bytes:
    """(header with ``records_size`` per partition, the partitions' batches in order:
    each bytes-like or a ``StoredBytes``) -> wire bytes, in one join."""
    response, batches = response_and_batches
    header = response.SerializeToString()
    pieces = [_LEN.pack(len(header)), header]
    for b in batches:
        if isinstance(b, StoredBytes):
            pieces.extend(b.pieces)
        else:
            pieces.append(b)
    return b"".join(pieces)


class FollowerFetchPartition:
    """One partition of a decoded response: the protobuf fields, with ``records``
    a zero-copy ``pyarrow.Buffer`` slice (or None)."""

    __slots__ = ("_pb", "records")

    def __init__(self, header: pb.FetchPartitionResponse, records):
        self._pb = header
        self.records = records

    def __getattr__(self, name):
        return getattr(self._pb, name)


class FollowerFetchResponse:
    __slots__ = ("partitions", "session_id", "error")

    def __init__(self, partitions: list[FollowerFetchPartition], session_id: int = 0, error=None):
        self.partitions = partitions
        self.session_id = session_id
        self.error = error            # the header's whole-fetch Error (protobuf)


def decode(data) -> FollowerFetchResponse:
    """``data``: the response's bytes (gRPC) or a ``pyarrow.Buffer`` (a Flight action's body)."""
    if len(data) < _LEN.size:
        raise ValueError(f"follower fetch response of {len(data)} bytes has no header length")
    (n,) = _LEN.unpack_from(data, 0)
    end = _LEN.size + n
    if end > len(data):
        raise ValueError(f"follower fetch response header of {n} bytes overruns the {len(data)} received")
    header = pb.FetchResponse.FromString(bytes(memoryview(data)[_LEN.size:end]))
    body = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    out = []
    pos = end
    for p in header.partitions:
        size = p.records_size
        if pos + size > len(data):
            raise ValueError(f"{p.topic}-{p.partition}: {size} bytes of batches overrun the response")
        out.append(FollowerFetchPartition(p, body.slice(pos, size) if size else None))
        pos += size
    if pos != len(data):
        raise ValueError(f"follower fetch response has {len(data) - pos} bytes after its last partition")
    return FollowerFetchResponse(out, header.session_id, header.error)
