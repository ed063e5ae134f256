"""Test helpers around a real ZooKeeper (never a mock).

The fixtures in ``tests/conftest.py`` use these; tests may import them directly
(``from zk_harness import expire_session``).

- :func:`start_test_zookeeper` starts one server tuned for tests (short ticks so
  session expiry is quick, no fsync).
- :func:`new_chroot` creates a fresh, unique chroot znode and returns its path.
- :func:`expire_session` expires a kazoo client's session *on the server*, the
  way kazoo's own harness used to: a second connection that presents the same
  session id and password, then closes the session.
"""
from __future__ import annotations

import os
import re
import threading
import time
import uuid

from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss, SessionExpiredError
from kazoo.protocol.states import KazooState

from replikafka.zookeeper_server import ZooKeeperServer

#: zoo.cfg keys for the test server: sessions from 1 s to 60 s, expiry checked every 0.5 s.
TEST_ZK_PROPERTIES = {
    "tickTime": "500",
    "minSessionTimeout": "1000",
    "maxSessionTimeout": "60000",
    "forceSync": "no",
}

#: Set to host:port to run the tests against an already running ZooKeeper.
EXTERNAL_ZK_ENV = "REPLIKAFKA_TEST_ZOOKEEPER"


class ExternalZooKeeper:
    """A ZooKeeper the tests did not start (``$REPLIKAFKA_TEST_ZOOKEEPER``): same read-only surface."""

    def __init__(self, connect_string: str):
        self.connect_string = connect_string
        host, _, port = connect_string.rpartition(":")
        self.host, self.port = host, int(port)
        self.pid = None

    def close(self) -> None:
        pass


def start_test_zookeeper(data_dir: str) -> ZooKeeperServer | ExternalZooKeeper:
    external = os.environ.get(EXTERNAL_ZK_ENV)
    if external:
        return ExternalZooKeeper(external)
    server = ZooKeeperServer(port=0, data_dir=data_dir, properties=TEST_ZK_PROPERTIES, die_with_parent=True)
    server.start(timeout_s=60)
    return server


def new_chroot(admin: KazooClient, label: str = "") -> str:
    """Create ``/t-<label>-<unique>`` with ``admin`` (a client without chroot) and return the path."""
    label = re.sub(r"[^A-Za-z0-9_.-]+", "_", label)[:60].strip("_")
    path = f"/t-{label}-{uuid.uuid4().hex[:8]}" if label else f"/t-{uuid.uuid4().hex[:12]}"
    # A test may have stopped and restarted the server: the shared admin client
    # then gets a new session, and calls fail until it has one.
    deadline = time.time() + 30
    while True:
        try:
            admin.create(path, makepath=True)
            return path
        except (SessionExpiredError, ConnectionLoss):
            if time.time() > deadline:
                raise
            time.sleep(0.2)


def connected_client(hosts: str, timeout: float = 15.0, **kwargs) -> KazooClient:
    """A started KazooClient (``stop()`` and ``close()`` it when done)."""
    client = KazooClient(hosts=hosts, timeout=kwargs.pop("session_timeout", 10.0), **kwargs)
    client.start(timeout=timeout)
    return client


def _host_string(client: KazooClient) -> str:
    return ",".join(f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in client.hosts)


def expire_session(client: KazooClient, timeout: float = 15.0, wait_reconnect: bool = True) -> None:
    """Expire ``client``'s ZooKeeper session for real, and wait until the client has noticed.

    A second connection presents the same session id and password (the server
    moves the session to it and drops the first connection), then closes the
    session. The first client reconnects, is told the session expired, and
    goes to ``KazooState.LOST``; its ephemeral nodes and watches are gone. With
    ``wait_reconnect`` this returns only once the client has a new session
    (``CONNECTED``), so it can be used again at once.

    Raises AssertionError if the client does not see the expiry within ``timeout``.
    """
    session_id, password = client.client_id or (None, None)
    if not session_id or not client.connected:
        raise AssertionError("expire_session: the client has no live session")
    lost = threading.Event()
    reconnected = threading.Event()

    def listener(state):
        if state == KazooState.LOST:
            lost.set()
        elif state == KazooState.CONNECTED and lost.is_set():
            reconnected.set()
            return True  # remove the listener
        return False

    client.add_listener(listener)
    try:
        other = KazooClient(hosts=_host_string(client), client_id=(session_id, password), timeout=10.0)
        try:
            other.start(timeout=timeout)
            if other.client_id[0] != session_id:
                raise AssertionError("expire_session: the second connection did not take over the session")
        finally:
            other.stop()  # closes the session on the server
            other.close()
        if not lost.wait(timeout):
            raise AssertionError(f"expire_session: the client did not see its session expire within {timeout:g}s")
        if wait_reconnect:
            deadline = time.monotonic() + timeout
            while not (reconnected.is_set() or client.connected and client.client_id and
                       client.client_id[0] not in (None, session_id)):
                if time.monotonic() > deadline:
                    raise AssertionError("expire_session: the client did not reconnect with a new session")
                reconnected.wait(0.05)
    finally:
        client.remove_listener(listener)
