"""gRPC channels to brokers, and bootstrap-list parsing.

A :class:`ConnectionPool` keeps one channel (and one stub) per ``"host:port"``.
gRPC channels and stubs are thread-safe, so one pool serves every thread of a
client; the pool's own map is guarded by a lock. Every failure of a call comes
out as an exception of :mod:`replikafka.errors`, never as ``grpc.RpcError``.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Iterable

import grpc

from replikafka import errors as E
from replikafka.protocol import replikafka_pb2_grpc as pb_grpc
from replikafka.protocol.rpc_errors import from_rpc_error

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
DIAGNOSIS_TTL_S = 5.0   # a TLS diagnosis of a broker is reused this long (it costs a handshake)

CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    # Keepalive only while calls are active, and rarely: servers with default
    # policies answer frequent pings with GOAWAY(too_many_pings).
    ("grpc.keepalive_time_ms", 60_000),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    # A restarted broker must be reachable again quickly (the default backoff
    # grows to two minutes).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1_000),
    # Brokers are reached directly, never through an HTTP proxy from the environment.
    ("grpc.enable_http_proxy", 0),
]


def open_channel(target: str, credentials: grpc.ChannelCredentials | None = None,
                 options: Iterable[tuple[str, Any]] = ()) -> grpc.Channel:
    """The one way replikafka opens a gRPC channel, for clients and brokers alike:
    our channel options (message sizes, keepalive, fast reconnect to a restarted
    broker), and TLS (plus any call credentials composed into ``credentials``)
    when ``credentials`` is given, plaintext otherwise."""
    opts = list(CHANNEL_OPTIONS) + list(options)
    if credentials is None:
        return grpc.insecure_channel(target, options=opts)
    return grpc.secure_channel(target, credentials, options=opts)


def parse_bootstrap(servers: str | Iterable[str]) -> list[str]:
    """``"h1:p1,h2:p2"`` (or a list of ``"host:port"``) -> ``["h1:p1", "h2:p2"]``.

    IPv6 hosts are written ``[::1]:9092``. Raises :class:`InvalidConfigError`
    naming the bad entry.
    """
    if isinstance(servers, str):
        items = servers.split(",")
    else:
        try:
            items = list(servers)
        except TypeError:
            raise E.InvalidConfigError(
                f"bootstrap servers must be 'host:port[,host:port...]', got {servers!r}") from None
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise E.InvalidConfigError(f"bootstrap server {raw!r} is not a 'host:port' string")
        item = raw.strip()
        if not item:
            continue
        host, sep, port = item.rpartition(":")
        if host.startswith("[") and host.endswith("]"):
            host_ok = len(host) > 2
        else:
            host_ok = bool(host) and ":" not in host and " " not in host
        if not sep or not host_ok or not port.isdigit() or not 0 < int(port) < 65536:
            raise E.InvalidConfigError(
                f"bootstrap server {item!r} is not 'host:port' (e.g. 127.0.0.1:9092)")
        if item not in out:
            out.append(item)
    if not out:
        raise E.InvalidConfigError(f"no bootstrap servers given ({servers!r}); use 'host:port[,host:port...]'")
    return out


def target_of(host: str, port: int) -> str:
    """The ``"host:port"`` key for a broker endpoint (brackets IPv6 literals)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


class ConnectionPool:
    """One gRPC channel per broker address, shared by all threads of a client."""

    def __init__(self, options: list[tuple[str, Any]] | None = None,
                 credentials: grpc.ChannelCredentials | None = None, security: Any = None):
        """``security``: librdkafka-style keys (``security.protocol``, ``ssl.*``, ``sasl.*``) or a
        :class:`~replikafka.security.tls.ClientSecurity`; ``credentials``: ready gRPC credentials
        (brokers' own inter-broker channels). Neither: plaintext."""
        from replikafka.security.tls import ClientSecurity
        self.security = security if isinstance(security, ClientSecurity) else ClientSecurity.from_config(security)
        self.protocol = self.security.protocol      # the listener this client uses on every broker
        self._options = list(options or [])
        self._credentials = credentials if credentials is not None else self.security.channel_credentials()
        self._diagnosed: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()
        self._channels: dict[str, tuple[grpc.Channel, pb_grpc.ReplikafkaStub]] = {}
        self._raw: dict[tuple[str, str], Any] = {}
        self._closed = False

    def stub(self, target: str) -> pb_grpc.ReplikafkaStub:
        with self._lock:
            if self._closed:
                raise E.ReplikafkaError("the client is closed", code="CLIENT_CLOSED")
            entry = self._channels.get(target)
            if entry is None:
                channel = open_channel(target, self._credentials, self._options)
                entry = (channel, pb_grpc.ReplikafkaStub(channel))
                self._channels[target] = entry
            return entry[1]

    def call(self, target: str, method: str, request, timeout_s: float):
        """Blocking unary call; raises the error tree on any failure."""
        fn = getattr(self.stub(target), method)
        deadline = time.monotonic() + timeout_s
        try:
            return fn(request, timeout=max(timeout_s, 0.001))
        except grpc.RpcError as exc:
            raise self._explained(from_rpc_error(exc, target), target, deadline) from None

    def _explained(self, err: E.ReplikafkaError, target: str, deadline: float) -> E.ReplikafkaError:
        """A transport failure that is really a TLS problem (untrusted or expired certificate,
        TLS spoken to a plaintext port or the reverse) becomes a non-retriable
        SSL_AUTHENTICATION_FAILED naming the cause; anything else is returned as is.
        The diagnosis (a handshake) stays within the call's ``deadline``: a hung
        broker must not hold the caller past the time it gave the call."""
        if not (isinstance(err, E.BrokerNotAvailableError) and err.message.startswith("broker unavailable")):
            return err
        from replikafka.security.tls import DIAGNOSE_TIMEOUT_S, diagnose
        now = time.monotonic()
        when, cause = self._diagnosed.get(target, (-DIAGNOSIS_TTL_S, None))
        if now - when >= DIAGNOSIS_TTL_S:
            if deadline - now <= 0:
                return err
            cause = diagnose(target, self.security, min(DIAGNOSE_TIMEOUT_S, deadline - now))
            self._diagnosed[target] = (now, cause)
        return E.SslAuthenticationError(cause) if cause else err

    def call_bytes(self, target: str, path: str, request: bytes, response_parser, timeout_s: float):
        """Blocking unary call of ``path`` with an already serialized request."""
        self.stub(target)  # the channel, created if needed
        deadline = time.monotonic() + timeout_s
        with self._lock:
            fn = self._raw.get((target, path))
            if fn is None:
                fn = self._channels[target][0].unary_unary(path, response_deserializer=response_parser)
                self._raw[(target, path)] = fn
        try:
            return fn(request, timeout=max(timeout_s, 0.001))
        except grpc.RpcError as exc:
            raise self._explained(from_rpc_error(exc, target), target, deadline) from None

    def call_async(self, target: str, method: str, request, timeout_s: float) -> grpc.Future:
        """Starts a unary call and returns its grpc future; read it with :func:`result_of`."""
        fn = getattr(self.stub(target), method)
        return fn.future(request, timeout=max(timeout_s, 0.001))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            channels, self._channels = list(self._channels.values()), {}
            self._raw.clear()
        for channel, _ in channels:
            channel.close()


def result_of(future: grpc.Future, target: str = ""):
    """The response of a call started by :meth:`ConnectionPool.call_async`,
    or the error-tree exception it failed with (blocks until done)."""
    try:
        return future.result()
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, target) from None


def error_of(future: grpc.Future, target: str = "") -> E.ReplikafkaError | None:
    """For a finished call: its failure as an error-tree exception, or None."""
    if future.cancelled():
        return E.BrokerNotAvailableError(f"request cancelled ({target})")
    exc = future.exception()
    if exc is None:
        return None
    if isinstance(exc, grpc.RpcError):
        return from_rpc_error(exc, target)
    if isinstance(exc, E.ReplikafkaError):
        return exc
    return E.ReplikafkaError(f"{type(exc).__name__}: {exc} ({target})")


def annotated(err: E.ReplikafkaError, where: str) -> E.ReplikafkaError:
    """The same error (class, code) with ``where`` prefixed to its message."""
    return E.error_for_code(err.code, f"{where}: {err.message}")
