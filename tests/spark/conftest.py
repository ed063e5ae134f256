"""Fixtures for the Spark source tests.

``spark_cluster``  session: one 3-broker cluster (real processes, real
                   ZooKeeper: the suite's session server, own chroot) shared
                   by the Spark tests; tests use their own topics and never
                   take its brokers down.
``own_cluster``    per test: ``own_cluster(**overrides)`` -> a separate cluster
                   for a test that kills brokers (never restarted).
Clusters run under a small keeper process (see ``spark_helpers.KeptCluster``
for why not in this process).
``spark``          session: ONE local SparkSession (local[2], 2 shuffle
                   partitions), made through ``replikafka.spark.local_session``
                   which sets PYSPARK_PYTHON to this interpreter and makes
                   ``pyspark_replikafka`` findable, so ``format("replikafka")``
                   works with no register call.
``topics``         per test: ``topics.new(partitions=3, schema=None, config=None)``
                   -> a fresh topic name; ``topics.produce(...)``.
"""
from __future__ import annotations

import os
import sys
import uuid

import pytest

import zk_harness
from spark_helpers import KeptCluster, TopicTool

SPARK_CLUSTER_OVERRIDES = {
    "zookeeper.session.timeout.ms": "4000",
    # Long enough that a test can hold followers back (SIGSTOP) and see a HW below the LEO.
    "replica.lag.time.max.ms": "15000",
    "num.partitions": "3",
}


@pytest.fixture(scope="session")
def spark_cluster(zk_server, _zk_admin, tmp_path_factory):
    chroot = zk_harness.new_chroot(_zk_admin, "spark")
    base = tmp_path_factory.mktemp("spark-cluster")
    cluster = KeptCluster(str(base / "cluster"), zk_server.connect_string + chroot, SPARK_CLUSTER_OVERRIDES)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    yield cluster
    ids = cluster.ids
    try:
        cluster.stop()
    finally:
        for bid in ids:
            print(f"---- broker {bid} log tail ----\n{cluster.tail(bid, 10)}")


@pytest.fixture
def own_cluster(tmp_path, zk_connect):
    """``own_cluster(**overrides)``: a separate 3-broker cluster for a test that
    takes brokers down in ways the shared one should not see."""
    made = []

    def make(**overrides):
        c = KeptCluster(str(tmp_path / f"own{len(made)}"), zk_connect, {**SPARK_CLUSTER_OVERRIDES, **overrides})
        made.append(c)
        c.start()
        return c

    yield make
    for c in made:
        c.stop()


@pytest.fixture(scope="session")
def bootstrap(spark_cluster) -> str:
    return spark_cluster.bootstrap_servers


@pytest.fixture
def topics(spark_cluster, request):
    tool = TopicTool(spark_cluster, request.node.name)
    yield tool
    tool.close()


@pytest.fixture(scope="session")
def spark():
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.errors import PySparkRuntimeError
    from replikafka.spark import local_session
    conf = {"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2",
            "spark.sql.streaming.stopTimeout": "10s"}
    # One SparkSession serves every Spark test, so a JVM that fails to launch once
    # (seen once in a CI run: JAVA_GATEWAY_EXITED, while a rerun started it at once)
    # would error all of them: launching it is retried once, loudly.
    try:
        session = local_session("replikafka-tests", "local[2]", conf)
    except PySparkRuntimeError as exc:
        print(f"SparkSession did not start ({exc}); retrying once", file=sys.stderr)
        session = local_session("replikafka-tests", "local[2]", conf)
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def checkpoint(tmp_path):
    return str(tmp_path / f"checkpoint-{uuid.uuid4().hex[:6]}")
