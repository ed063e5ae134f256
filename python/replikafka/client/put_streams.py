"""The producer's open Flight appends: one long-lived ``DoPut`` per partition leader.

Opening a DoPut costs a gRPC call's set-up on both sides (most of a small send's
client CPU when every send opened one), so a producer keeps one call open per
(leader's Flight address, partition) and sends each further group of appends on
it, announced by its first batch's metadata
(:mod:`replikafka.protocol.flight_produce`); the leader answers each group with one
``PutResult`` before it reads the next, so one group is outstanding per call.

Limits: at most ``max_streams`` calls kept open (the least recently used idle one
is closed to open another, and calls past the limit, opened while the others were
busy, are closed once answered); a request to one leader naming more than
:data:`REQUEST_PARTITIONS_MAX` partitions goes as one gRPC Produce instead (the
producer's choice); a call unused for ``idle_s`` is closed; every call has a
deadline (``lifetime_s``) and takes new groups only while at least ``wait_s``
(the wait one group may need) is left of it, so a group's wait is bounded without a
timer: a hung leader costs at most the call's deadline. A call that failed in any
way is closed and forgotten; the next group opens a new one.

Thread-safety: the map is guarded by one lock; each call by its own, held while a
group is written and answered (the producer keeps one append in flight per
partition, so it is never contended in practice).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.flight as fl

from replikafka import errors as E
from replikafka.protocol import flight_produce
from replikafka.protocol.flight_produce import ProduceCommand

#: Open appends per producer, over all leaders and partitions.
STREAMS_MAX = 256
#: A request to one leader naming more partitions than this goes as one gRPC Produce, not
#: one DoPut per partition: every DoPut of a request is open at once and holds a thread on
#: the leader, and after a failover (or with many cold partitions) a producer opened 2,800
#: at once for 3,000 partitions, far past STREAMS_MAX.
REQUEST_PARTITIONS_MAX = 32
#: An open append unused this long is closed (it holds a thread on the leader).
STREAM_IDLE_S = 30.0


@dataclass
class PutStream:
    """One open DoPut: its writer and reader, what its command fixed, its deadline.
    ``kept``: in the map, reused by later groups (else closed after its answer);
    ``reused``: this group is not the call's first (a failure may be the call's age,
    not the leader's: the caller retries on a new call before judging the leader)."""
    key: tuple
    writer: object
    reader: object
    schema: pa.Schema
    header: tuple                  # (acks, timeout_ms, producer_id, producer_epoch) of its command
    usable_until_s: float          # monotonic: no new group after this
    last_used_s: float
    kept: bool = True
    reused: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close(self) -> None:
        for close in (self.writer.done_writing, self.writer.close):
            try:
                close()
            except (fl.FlightError, pa.ArrowException, OSError):
                pass


class PutStreams:
    def __init__(self, wait_s: float, max_streams: int = STREAMS_MAX, idle_s: float = STREAM_IDLE_S):
        """``wait_s``: the longest one group of appends may take (the request timeout
        plus slack); a call lives twice that and takes groups during its first half."""
        self.wait_s = wait_s
        self.lifetime_s = 2 * wait_s
        self.max_streams = max_streams
        self.idle_s = idle_s
        self._streams: dict[tuple, PutStream] = {}
        self._lock = threading.Lock()
        self._closed = False

    def append(self, client: fl.FlightClient, options_for, address: str, cmd: ProduceCommand,
               batches: list[pa.RecordBatch]) -> PutStream:
        """Write ``cmd``'s appends (``batches``, one per CRC) on the partition's open call,
        opening one if there is none fit for them; read the answer with :meth:`answer`.
        ``options_for(timeout_s)`` gives the call options. Raises the Flight error if a
        call could not be opened (nothing is kept then); a failed write is left for
        :meth:`answer` (the leader may have refused the call: its error is read there)."""
        key = (address, cmd.topic, cmd.partition)
        header = (cmd.acks, cmd.timeout_ms, cmd.producer_id, cmd.producer_epoch)
        schema = batches[0].schema
        stream = self._take(key, header, schema)
        try:
            if stream is None or not stream.kept:
                now = time.monotonic()
                writer, reader = client.do_put(fl.FlightDescriptor.for_command(cmd.encode()), schema,
                                               options_for(self.lifetime_s))
                stream = PutStream(key, writer, reader, schema, header, now + self.lifetime_s - self.wait_s, now,
                                   kept=stream is None)
                stream.lock.acquire()
                if stream.kept:
                    self._keep(stream)
                for rb in batches:
                    stream.writer.write_batch(rb)
            else:
                stream.writer.write_with_metadata(batches[0], pa.py_buffer(
                    flight_produce.encode_next_appends(cmd.appends)))
                for rb in batches[1:]:
                    stream.writer.write_batch(rb)
        except (fl.FlightError, pa.ArrowException, OSError):
            if stream is None or not stream.lock.locked():
                raise
        return stream

    def answer(self, stream: PutStream, appends: int) -> list:
        """The leader's answer to the group just written on ``stream``: per append, a
        result dict or an error of the tree. Raises the call's error (Flight's, or
        CorruptRecordError for an unreadable answer), closing the call."""
        try:
            got = stream.reader.read()
            if got is None:     # the leader ended the call: closing it raises the call's error
                stream.writer.close()
                raise E.BrokerNotAvailableError("the leader ended the append call without an answer")
            results = flight_produce.decode_results(got, appends)
        except BaseException:
            self._drop(stream)
            raise
        if not stream.kept:
            stream.close()
        stream.last_used_s = time.monotonic()
        stream.lock.release()
        if stream.kept and len(self._streams) > self.max_streams:
            self._trim()   # opened while the others were busy: back to the limit
        return results

    def close(self) -> None:
        """Close every idle call; calls in use close after their answer."""
        with self._lock:
            self._closed = True
            streams, self._streams = list(self._streams.values()), {}
        for s in streams:
            if s.lock.acquire(False):
                s.close()
                s.lock.release()
            else:
                s.kept = False

    # ------------------------------------------------------------ internals
    def _take(self, key: tuple, header: tuple, schema: pa.Schema) -> PutStream | None:
        """The open call for ``key``, locked and marked reused, if it is fit for this
        group; None to open one kept for later groups; a stand-in with ``kept`` False
        when the kept one is busy (this group then goes on a call of its own)."""
        with self._lock:
            stream = self._streams.get(key)
            if stream is None:
                return None
            if not stream.lock.acquire(False):
                return PutStream(key, None, None, schema, header, 0.0, 0.0, kept=False)
            if stream.header == header and time.monotonic() < stream.usable_until_s and stream.schema.equals(schema):
                stream.reused = True
                return stream
            del self._streams[key]
        stream.close()
        stream.lock.release()
        return None

    def _keep(self, stream: PutStream) -> None:
        """Remember a newly opened call; close the idle ones and, over the limit, the
        least recently used idle ones."""
        with self._lock:
            if self._closed:
                stream.kept = False
                return
            self._streams[stream.key] = stream
        self._trim(stream)

    def _trim(self, opened: PutStream | None = None) -> None:
        """Close the idle calls and, over the limit, the least recently used idle ones
        (never ``opened``, just opened for a group)."""
        closing: list[PutStream] = []
        with self._lock:
            now = time.monotonic()
            over = len(self._streams) - self.max_streams
            for s in sorted(self._streams.values(), key=lambda s: s.last_used_s):
                if s is opened or not (over > 0 or now - s.last_used_s > self.idle_s):
                    continue
                if s.lock.acquire(False):
                    del self._streams[s.key]
                    closing.append(s)
                    over -= 1
        for s in closing:
            s.close()
            s.lock.release()

    def _drop(self, stream: PutStream) -> None:
        with self._lock:
            if self._streams.get(stream.key) is stream:
                del self._streams[stream.key]
        stream.close()
        stream.lock.release()
