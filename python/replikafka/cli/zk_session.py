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
    zk = KazooClient(hosts=connect, timeout=timeout_s, logger=quiet)
    try:
        zk.start(timeout=timeout_s)
    except KazooTimeoutError:
        raise E.BrokerNotAvailableError(f"cannot connect to ZooKeeper at {connect}") from None
    try:
        yield zk
    finally:
        zk.stop()
        zk.close()
