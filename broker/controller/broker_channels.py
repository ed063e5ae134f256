"""The controller's channels to brokers: one ordered sender per live broker.

Each broker gets a single worker thread with a bounded queue, so requests to
one broker arrive in the order the controller decided them and a slow or dead
broker never blocks the controller's event thread. A request to a broker that
is unreachable is retried with backoff until it succeeds or the broker is
removed (its death is the controller's next event anyway).

The controller hands the manager plain requests (``broker/replica/messages.py``)
and gets plain results back (``ControllerRequestResult``); the manager is its
RPC edge and encodes them through ``broker/controller_rpc.py``.
"""
from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time

import grpc

from replikafka.broker import controller_rpc
from replikafka.client.connection import open_channel, target_of
from replikafka.protocol import replikafka_pb2 as pb

log = logging.getLogger(__name__)
QUEUE_MAX = 10_000
_SERVICE = pb.DESCRIPTOR.services_by_name["Replikafka"].full_name
RETRY_BACKOFF_S = 0.1


class BrokerChannel:
    def __init__(self, broker_id: int, host: str, port: int, request_timeout_s: float,
                 credentials: grpc.ChannelCredentials | None = None):
        self.broker_id = broker_id
        self.target = target_of(host, port)
        self.channel = open_channel(self.target, credentials)
        # Requests arrive serialized (controller_rpc encodes each once, whatever the
        # number of brokers it goes to): sent as they are, answers parsed.
        self.calls = {method: self.channel.unary_unary(f"/{_SERVICE}/{method}", request_serializer=None,
                                                       response_deserializer=response.FromString)
                      for method, response in controller_rpc.RESPONSES.items()}
        self.timeout_s = request_timeout_s
        self.queue: queue.Queue = queue.Queue(maxsize=QUEUE_MAX)
        self.failing = False  # the last attempt failed (the broker is unreachable)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name=f"controller-to-broker-{broker_id}", daemon=True)
        self.thread.start()

    def send(self, method: str, request: bytes, on_response=None) -> None:
        """Queue the serialized protobuf ``request`` for ``method``; ``on_response(broker_id,
        resp)`` gets the protobuf response."""
        self.queue.put((method, request, on_response), timeout=self.timeout_s)

    def do_work(self, timeout_s: float = 0.5) -> bool:
        try:
            method, request, on_response = self.queue.get(timeout=timeout_s)
        except queue.Empty:
            return False
        try:
            return self._deliver(method, request, on_response)
        finally:
            self.queue.task_done()

    def _deliver(self, method: str, request, on_response) -> bool:
        while not self.stopped.is_set():
            try:
                resp = self.calls[method](request, timeout=self.timeout_s)
                self.failing = False
                if on_response is not None:
                    on_response(self.broker_id, resp)
                return True
            except grpc.RpcError as exc:
                log.debug("%s to broker %d failed: %s; retrying", method, self.broker_id, exc.code())
                self.failing = True
                time.sleep(RETRY_BACKOFF_S)
        return False

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.do_work()
            except Exception:  # a callback bug must not kill the channel
                log.exception("controller channel to broker %d", self.broker_id)

    def idle(self) -> bool:
        """Nothing left that could still be delivered (an unreachable broker counts as idle)."""
        return self.queue.unfinished_tasks == 0 or self.failing

    def close(self) -> None:
        self.stopped.set()
        self.channel.close()


class HeldSends:
    """The contract of ``ControllerChannelManager.held``, in one place (the channel
    manager and the tests' channel doubles share it): inside a block, sends are held in
    order and handed to ``queue(*entry)`` when the outermost block ends; a block that
    raises queues nothing; entries the caller removed from the yielded list are not
    queued. Not thread-safe: for the one thread that sends."""

    def __init__(self, queue):
        self._queue = queue
        self.entries: list | None = None     # inside a block: what it holds

    def add(self, *entry) -> bool:
        """Hold ``entry`` inside a block (True); outside one, False: the caller queues it."""
        if self.entries is None:
            return False
        self.entries.append(entry)
        return True

    @contextlib.contextmanager
    def block(self):
        if self.entries is not None:     # already holding: the outer block queues them
            yield self.entries
            return
        self.entries = []
        try:
            yield self.entries
        except BaseException:
            self.entries = None
            raise
        held, self.entries = self.entries, None
        for entry in held:
            self._queue(*entry)


class ControllerChannelManager:
    """Thread-safe map broker id -> BrokerChannel; the controller's plain requests in,
    plain results out."""

    def __init__(self, request_timeout_s: float = 30.0, credentials: grpc.ChannelCredentials | None = None):
        self.timeout_s = request_timeout_s
        self.credentials = credentials   # inter-broker TLS / broker principal (None: plaintext)
        self.channels: dict[int, BrokerChannel] = {}
        self.lock = threading.Lock()
        # The last request encoded: one UpdateMetadata goes to every broker, encoded once
        # (at 50,000 partitions the encoding is a good part of a failover).
        self._last_encoded: tuple[object, str, object] | None = None
        self._states = controller_rpc.StateMemo()   # and its partition states once for the LeaderAndIsrs after it
        # Requests encoded inside held(): (channel, method, wire, callback), queued when it ends.
        self._held = HeldSends(lambda ch, method, wire, callback: ch.send(method, wire, callback))

    def set_brokers(self, live: dict[int, tuple[str, int]]) -> None:
        with self.lock:
            for bid in list(self.channels):
                ch = self.channels[bid]
                if bid not in live or live[bid] != tuple(ch.target.rsplit(":", 1)[0:1]) + (int(ch.target.rsplit(":", 1)[1]),):
                    ch.close()
                    del self.channels[bid]
            for bid, (host, port) in live.items():
                if bid not in self.channels:
                    self.channels[bid] = BrokerChannel(bid, host, port, self.timeout_s, self.credentials)

    def send(self, broker_id: int, request, on_response=None) -> None:
        """Queue the plain controller ``request`` for ``broker_id``; ``on_response(broker_id,
        result)`` gets its ``ControllerRequestResult``."""
        with self.lock:
            ch = self.channels.get(broker_id)
            last = self._last_encoded
        if ch is None:
            log.debug("no channel to broker %d for %s", broker_id, type(request).__name__)
            return
        if last is not None and last[0] is request:
            method, wire = last[1], last[2]
        else:
            with self.lock:   # one event thread sends; the lock keeps the memo whole regardless
                method, wire = controller_rpc.encode(request, self._states)
                self._last_encoded = (request, method, wire)
        callback = None if on_response is None else (
            lambda bid, resp: on_response(bid, controller_rpc.request_result(resp)))
        if not self._held.add(ch, method, wire, callback):
            ch.send(method, wire, callback)

    @contextlib.contextmanager
    def held(self):
        """Requests sent inside are encoded at once but queued to their channels only at
        the end, together and in order. A failover's full UpdateMetadata and its
        LeaderAndIsrs: once the first is queued the controller's own broker, in this
        process, decodes 50,000 partitions' metadata while the event thread encodes the
        second, and both hold the GIL. For the event thread only (as ``send``).
        A block that raises queues nothing: what it encoded may rest on state writes that
        failed (a controller that lost its epoch must not send it). Yields the held list
        of (channel, method, wire, callback): the caller may drop entries it encoded ahead
        and no longer wants sent (``del held[mark:]``)."""
        with self._held.block() as held:
            yield held

    def drain(self, timeout_s: float) -> bool:
        """Wait (bounded) until every queued request was delivered; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.lock:
                busy = [ch for ch in self.channels.values() if not ch.idle()]
            if not busy:
                return True
            time.sleep(0.02)
        return False

    def close(self) -> None:
        with self.lock:
            for ch in self.channels.values():
                ch.close()
            self.channels.clear()
            self._last_encoded = None
            self._states = controller_rpc.StateMemo()
