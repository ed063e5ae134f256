"""Why a broker could not start, in one line.

A broker that cannot start prints one line naming the cause (ZooKeeper not
reachable, a listener's port in use, its broker.id held by another broker, a
log directory it cannot write) and exits; a traceback or a hang would hide
the cause. :func:`startup_failure_line` is pure: exception and config in, the
line out.
"""
from __future__ import annotations

import errno
import socket
from typing import Any

from replikafka.errors import InvalidConfigError, ReplikafkaError


def startup_failure_line(exc: BaseException, config: Any) -> str:
    """One line naming what stopped the broker's start-up."""
    name = type(exc).__name__
    if name == "KazooTimeoutError":  # kazoo's start() gave up connecting
        return (f"cannot connect to ZooKeeper at {config.get('zookeeper.connect')} within "
                f"{config.get('zookeeper.connection.timeout.ms')} ms (zookeeper.connect; is ZooKeeper running?)")
    if isinstance(exc, ReplikafkaError):
        return exc.message if isinstance(exc, InvalidConfigError) else str(exc)
    if isinstance(exc, OSError) and exc.filename:
        dirs = ", ".join(config.get("log.dirs"))
        return f"cannot use {exc.filename}: {exc.strerror} (log.dirs={dirs})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{name}: {first}" if first else name


def check_port_free(host: str, port: int, what: str) -> None:
    """Raise :class:`InvalidConfigError` naming ``what`` if ``host:port`` cannot
    be bound (another process listens there). gRPC's own bind failure is a raw
    log line on stderr; this check says which key to change. Port 0 is skipped."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            s.bind((host.strip("[]") or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
        except OSError as exc:
            reason = "the port is in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise InvalidConfigError(f"{what}: cannot bind {host}:{port}: {reason}") from None
