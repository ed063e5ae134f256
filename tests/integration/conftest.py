"""Integration fixtures: real ZooKeeper (session server, per-test chroot) and
real broker processes speaking gRPC over loopback."""
from __future__ import annotations

import pytest

from replikafka.local_cluster import LocalCluster


def _make_cluster(tmp_path, zk_connect, brokers, overrides=None):
    c = LocalCluster(str(tmp_path / "cluster"), brokers, zookeeper_connect=zk_connect,
                     overrides={"zookeeper.session.timeout.ms": "4000", "replica.lag.time.max.ms": "4000",
                                **(overrides or {})}, die_with_parent=True)
    try:
        c.start()
    except BaseException:
        c.stop()
        raise
    return c


@pytest.fixture
def cluster_factory(tmp_path, zk_connect):
    made = []

    def make(brokers=3, **overrides):
        c = _make_cluster(tmp_path / f"c{len(made)}", zk_connect, brokers,
                          {k.replace("_", "."): str(v) for k, v in overrides.items()})
        made.append(c)
        return c

    yield make
    for c in made:
        try:
            c.stop()
        finally:
            for bid in c.ids:
                print(f"---- broker {bid} log tail ----\n{c.tail(bid, 15)}")


@pytest.fixture
def cluster3(cluster_factory):
    return cluster_factory(3)


@pytest.fixture
def secure(tmp_path, zk_connect):
    """A 2-broker TLS + SASL_SSL cluster with the ACL authorizer, users admin (super
    user), alice and bob: ``(SecureSetup, LocalCluster)``."""
    from replikafka.security.local_setup import SecureSetup
    setup = SecureSetup(str(tmp_path / "pki"), users=("admin", "alice", "bob"))
    cluster = LocalCluster(str(tmp_path / "cluster"), 2, zookeeper_connect=zk_connect, security=setup,
                           die_with_parent=True,
                           overrides={"zookeeper.session.timeout.ms": "4000", "replica.lag.time.max.ms": "4000",
                                      "controlled.shutdown.enable": "false"})
    try:
        cluster.start()
        yield setup, cluster
    finally:
        cluster.stop()
        for bid in cluster.ids:
            print(f"---- broker {bid} log tail ----\n{cluster.tail(bid, 20)}")
