"""Spark reads and writes a secure cluster through TLS + SASL (kafka.security.protocol,
kafka.ssl.*, kafka.sasl.* as Spark's Kafka source takes them); the password is in
no plan string."""
import os
import re
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "replikafka", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture
def secure_cluster(tmp_path):
    d = str(tmp_path / "c")
    r = _cli("cluster", "start", "--secure", "--brokers", "1", "--dir", d)
    try:
        assert r.returncode == 0, r.stderr
        yield r.stdout
    finally:
        _cli("cluster", "stop", "--dir", d)


def _props(path):
    out = {}
    with open(path) as f:
        for line in f:
            k, _, v = line.strip().partition("=")
            out[k] = v
    return out


def test_spark_write_and_read_over_sasl_ssl(spark, secure_cluster):
    from replikafka import Admin
    out = secure_cluster
    sasl_bs = re.search(r"SASL_SSL bootstrap servers: (\S+)", out).group(1)
    ssl_bs = re.search(r"SSL \(mTLS\) bootstrap servers: (\S+)", out).group(1)
    sasl = _props(re.search(r"over SASL_SSL \(password\): (\S+)", out).group(1))
    ssl = _props(re.search(r"over SSL \(certificate\): (\S+)", out).group(1))
    with Admin({"bootstrap.servers": ssl_bs, **ssl}) as admin:
        admin.create_topic("secure_events", partitions=2, replication_factor=1)
    options = {"kafka.bootstrap.servers": sasl_bs, **{f"kafka.{k}": v for k, v in sasl.items()}}
    df = spark.createDataFrame([(f"k{i}".encode(), f"v{i}".encode()) for i in range(500)], "key binary, value binary")
    df.write.format("replikafka").mode("append").options(**options).option("topic", "secure_events").save()

    read = spark.read.format("replikafka").options(**options).option("subscribe", "secure_events").load()
    rows = read.select("value").collect()
    assert sorted(r.value for r in rows) == sorted(f"v{i}".encode() for i in range(500))
    plan = read._jdf.queryExecution().toString() + read._jdf.queryExecution().simpleString()
    assert sasl["sasl.password"] not in plan

    # without credentials the same read fails, naming the cause
    with pytest.raises(Exception, match="SASL_AUTHENTICATION_FAILED|needs sasl.username"):
        bad = {**options, "kafka.sasl.password": "wrong"}
        spark.read.format("replikafka").options(**bad).option("subscribe", "secure_events").load().count()
