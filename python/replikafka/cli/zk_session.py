"""A short ZooKeeper session for command-line tools (``--zookeeper H:P[/chroot]``).

On a cluster with ``zookeeper.set.acl=true`` a tool that writes znodes must
authenticate as the brokers do: ``REPLIKAFKA_ZK_DIGEST=user:password`` in the
environment (Kafka's tools take the same identity from a JAAS file), or the
``zookeeper.digest.username``/``.password`` keys passed as ``digest``.
"""
from __future__ import annotations

import contextlib
import logging
import os

from replikafka import errors as E


DIGEST_ENV = "REPLIKAFKA_ZK_DIGEST"


def _digest_auth(digest: tuple[str, str] | None) -> dict:
    if digest is None:
        text = os.environ.get(DIGEST_ENV, "")
        if not text:
            return {}
        user, sep, password = text.partition(":")
        if not sep or not user or not password:
            raise E.InvalidConfigError(f"{DIGEST_ENV} must be 'user:password'")
        digest = (user, password)
    from replikafka.security.zk_security import kazoo_security
    return kazoo_security(digest[0], digest[1], set_acl=True)


@contextlib.contextmanager
def zk_session(connect: str, timeout_s: float = 10.0, digest: tuple[str, str] | None = None):
    """A started kazoo client, closed on exit; a clear error if ZooKeeper is unreachable.
    ``digest``: (username, password) to authenticate with (default: ``REPLIKAFKA_ZK_DIGEST``)."""
    from kazoo.client import KazooClient
    from kazoo.handlers.threading import KazooTimeoutError

    quiet = logging.getLogger("replikafka.cli.kazoo")  # kazoo's connection chatter is not for the terminal
    quiet.addHandler(logging.NullHandler())
    quiet.propagate = False
    from kazoo.exceptions import KazooException, NoAuthError

    try:
        zk = KazooClient(hosts=connect, timeout=timeout_s, logger=quiet, **_digest_auth(digest))
    except ValueError as exc:
        raise E.InvalidConfigError(f"--zookeeper {connect!r} is not HOST:PORT[,HOST:PORT...][/chroot]: {exc}") from None
    try:
        zk.start(timeout=timeout_s)
    except KazooTimeoutError:
        raise E.BrokerNotAvailableError(f"cannot connect to ZooKeeper at {connect}") from None
    try:
        yield zk
    except NoAuthError:
        raise E.AuthorizationError(f"ZooKeeper at {connect} refused the write: its znodes are writable only by "
                                   f"the brokers' identity (zookeeper.set.acl=true); set {DIGEST_ENV}=user:password"
                                   ) from None
    except KazooException as exc:
        raise E.BrokerNotAvailableError(f"ZooKeeper at {connect} failed: {type(exc).__name__} {exc}") from None
    finally:
        zk.stop()
        zk.close()
