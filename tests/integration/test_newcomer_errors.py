"""What a new user runs into first, against real processes: a second
`cluster start` on a running directory, wrong addresses, missing topics,
`--if-exists`, and local errors that are not server errors."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

import replikafka
from replikafka import errors as E
from replikafka.local_cluster import LocalCluster, pid_alive
from replikafka.zookeeper_server import free_port

pytestmark = pytest.mark.integration


def cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "replikafka", *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def test_a_second_cluster_start_on_a_running_dir_is_refused_and_stop_stops_the_first(tmp_path):
    d = str(tmp_path / "rk")
    first = cli("cluster", "start", "--brokers", "1", "--dir", d)
    try:
        assert first.returncode == 0, first.stderr
        with open(os.path.join(d, "cluster.json")) as f:
            state = json.load(f)
        pids = [state["zookeeper_pid"]] + [b["pid"] for b in state["brokers"].values()]
        assert all(pid_alive(p) for p in pids)

        second = cli("cluster", "start", "--brokers", "1", "--dir", d)
        assert second.returncode == 1
        assert f"a cluster is already running in {d}" in second.stderr, second.stderr
        assert "UNKNOWN_SERVER_ERROR" not in second.stderr and "Traceback" not in second.stderr
        with open(os.path.join(d, "cluster.json")) as f:
            assert json.load(f) == state  # the first cluster's state is untouched
        assert all(pid_alive(p) for p in pids)
    finally:
        stop = cli("cluster", "stop", "--dir", d)
    assert stop.returncode == 0, stop.stderr
    time.sleep(0.2)
    assert not any(pid_alive(p) for p in pids), "cluster stop left processes of the first start running"


def test_start_waits_out_an_old_incarnations_registration_at_the_advertised_address(
        tmp_path, zk_connect, kazoo_factory):
    """The old broker 1's ephemeral znode, at the very address the new one
    advertises (a proxy's, not its bound port), is still there: start does not
    take it for the new broker's registration (the broker waits for it to go),
    and returns once the new process has registered."""
    advertised = free_port()
    old = kazoo_factory()
    old.create("/brokers/ids/1", json.dumps({"host": "127.0.0.1", "port": advertised, "endpoints": [],
                                             "timestamp": str(int(time.time() * 1000) - 60_000)}).encode(),
               ephemeral=True, makepath=True)
    cluster = LocalCluster(str(tmp_path / "c"), 1, zookeeper_connect=zk_connect, die_with_parent=True,
                           overrides={"zookeeper.session.timeout.ms": "3000"},
                           broker_overrides={1: {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{advertised},"
                                                                         f"FLIGHT://127.0.0.1:0"}})
    failures = []
    starting = threading.Thread(target=lambda: failures.append(_raised(cluster.start)), daemon=True)
    try:
        starting.start()
        starting.join(3)                  # the broker waits up to 2 x 3 s + 5 s for the old node
        assert starting.is_alive(), f"start returned while only the old znode was there: {failures}"
        old.stop()                        # the old incarnation's session ends: its znode goes
        starting.join(60)
        assert not starting.is_alive() and failures == [None], failures
        reg = json.loads(kazoo_factory().get("/brokers/ids/1")[0])
        assert (reg["host"], reg["port"]) == ("127.0.0.1", advertised)
        assert int(reg["timestamp"]) >= cluster.launched_ms[1]
    finally:
        starting.join(60)
        cluster.stop()


def _raised(fn):
    try:
        fn()
    except Exception as exc:  # reported by the test's assertion
        return exc
    return None


def test_a_wrong_address_fails_in_seconds_naming_it():
    port = free_port()
    for args in (["--list"], ["--delete", "--topic", "t"], ["--describe", "--topic", "t"],
                 ["--create", "--topic", "t", "--partitions", "1", "--replication-factor", "1"]):
        t0 = time.monotonic()
        r = cli("topics", "--bootstrap-server", f"127.0.0.1:{port}", *args)
        took = time.monotonic() - t0
        assert r.returncode == 1 and f"127.0.0.1:{port}" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        assert took < 15, f"{args}: {took:.1f}s"  # 5 s of retrying plus interpreter start
    t0 = time.monotonic()
    with pytest.raises(E.BrokerNotAvailableError, match=f"127.0.0.1:{port}"):
        replikafka.Admin(f"127.0.0.1:{port}").delete_topic("t")
    assert time.monotonic() - t0 < 10


def test_missing_topics_are_answered_at_once_and_if_exists_works(cluster3):
    bs = cluster3.bootstrap_servers
    admin = replikafka.Admin(bs)
    for op in (lambda: admin.delete_topic("nosuch"), lambda: admin.create_partitions("nosuch", 3),
               lambda: admin.describe_topic("nosuch")):
        t0 = time.monotonic()
        with pytest.raises(E.UnknownTopicOrPartitionError):
            op()
        assert time.monotonic() - t0 < 5
    admin.close()
    for args in (["--delete", "--topic", "nosuch"], ["--alter", "--topic", "nosuch", "--partitions", "3"],
                 ["--describe", "--topic", "nosuch"]):
        t0 = time.monotonic()
        r = cli("topics", "--bootstrap-server", bs, *args)
        assert r.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in r.stderr and "nosuch" in r.stderr, r.stderr
        r = cli("topics", "--bootstrap-server", bs, *args, "--if-exists")
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - t0 < 20, args
    r = cli("topics", "--bootstrap-server", bs, "--create", "--topic", "twice", "--partitions", "1",
            "--replication-factor", "1")
    assert r.returncode == 0, r.stderr
    r = cli("topics", "--bootstrap-server", bs, "--create", "--topic", "twice", "--partitions", "1",
            "--replication-factor", "1", "--if-not-exists")
    assert r.returncode == 0, r.stderr


def test_local_cli_errors_are_not_labelled_as_server_errors(tmp_path):
    r = cli("cluster", "status", "--dir", str(tmp_path / "none"))
    assert r.returncode == 1 and "no cluster is running" in r.stderr
    r = cli("cluster", "start", "--brokers", "0", "--dir", str(tmp_path / "x"))
    assert r.returncode == 1 and "--brokers must be at least 1" in r.stderr
    for out in (r.stderr,):
        assert "UNKNOWN_SERVER_ERROR" not in out
