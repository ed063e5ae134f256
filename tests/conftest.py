"""Shared pytest set-up for the whole suite.

Options and markers
    ``--long`` runs the tests marked ``long`` (skipped otherwise). ``--seed N`` runs
    the deterministic simulation (``tests/sim``) for seed N only (a failure prints it). The markers
    ``long``, ``spark`` and ``integration`` are registered in pyproject.toml.

ZooKeeper (a real server, never a mock; helpers in ``tests/zk_harness.py``)
    ``zk_server``        session: one ZooKeeper for the whole run, on a free port
                         (``.connect_string``, ``.port``, ``.pid``); set
                         ``REPLIKAFKA_TEST_ZOOKEEPER=host:port`` to use a running one
    ``zk_chroot``        per test: a fresh chroot path, created, e.g. ``/t-test_x-1a2b3c4d``
    ``zk_connect``       per test: ``"127.0.0.1:PORT/t-..."``, the connect string into that chroot
    ``kazoo_client``     per test: a started KazooClient on ``zk_connect``, stopped afterwards
    ``kazoo_factory``    per test: ``kazoo_factory(hosts=zk_connect, **kw)`` -> more started clients
    ``expire_session``   the helper ``expire_session(client, timeout=15.0, wait_reconnect=True)``
"""
from __future__ import annotations

import pytest

import zk_harness


# ---------------------------------------------------------------- options, markers
def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the long fault-injection and fuzz tests (marked long)")
    parser.addoption("--seed", type=int, default=None,
                     help="run the deterministic simulation (tests/sim) for this one seed only")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--long"):
        return
    skip_long = pytest.mark.skip(reason="long test: run with --long")
    for item in items:
        if "long" in item.keywords:
            item.add_marker(skip_long)


# ---------------------------------------------------------------- ZooKeeper
@pytest.fixture(scope="session")
def zk_server(tmp_path_factory):
    """One real ZooKeeper for the whole test session."""
    server = zk_harness.start_test_zookeeper(str(tmp_path_factory.mktemp("zookeeper")))
    yield server
    server.close()


@pytest.fixture(scope="session")
def _zk_admin(zk_server):
    client = zk_harness.connected_client(zk_server.connect_string)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def zk_chroot(_zk_admin, request):
    """A fresh chroot znode for this test."""
    return zk_harness.new_chroot(_zk_admin, request.node.name)


@pytest.fixture
def zk_connect(zk_server, zk_chroot):
    """Connect string into this test's own chroot: ``127.0.0.1:PORT/t-...``."""
    return zk_server.connect_string + zk_chroot


@pytest.fixture
def kazoo_factory(zk_connect):
    """Make more started KazooClients (default: into this test's chroot); all stopped afterwards."""
    clients = []

    def make(hosts: str | None = None, **kwargs):
        client = zk_harness.connected_client(hosts or zk_connect, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def kazoo_client(kazoo_factory):
    """A started KazooClient rooted at this test's chroot."""
    return kazoo_factory()


@pytest.fixture
def expire_session():
    """The :func:`zk_harness.expire_session` helper."""
    return zk_harness.expire_session
