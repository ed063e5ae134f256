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
