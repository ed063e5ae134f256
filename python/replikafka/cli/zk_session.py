"""A short ZooKeeper session for command-line tools (``--zookeeper H:P[/chroot]``)."""
from __future__ import annotations

import contextlib
import logging

from replikafka import errors as E


@contextlib.contextmanager
def zk_session(connect: str, timeout_s: float = 10.0):
    """A started kazoo client, closed on exit; a clear error if ZooKeeper is unreachable."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    quiet = logging.getLogger("replikafka.cli.kazoo")  # kazoo's connection chatter is not for the terminal
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    from kazoo.exceptions import KazooException

    try:
        zk = KazooClient(hosts=connect, timeout=timeout_s, logger=quiet)
    except ValueError as exc:
        raise E.InvalidConfigError(f"--zookeeper {connect!r} is not HOST:PORT[,HOST:PORT...][/chroot]: {exc}") from None
    try:
        zk.start(timeout=timeout_s)
    except KazooTimeoutError:
        raise E.BrokerNotAvailableError(f"cannot connect to ZooKeeper at {connect}") from None
    try:
        yield zk
    except KazooException as exc:
        raise E.BrokerNotAvailableError(f"ZooKeeper at {connect} failed: {type(exc).__name__} {exc}") from None
    finally:
        zk.stop()
        zk.close()
