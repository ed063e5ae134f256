"""A broker that cannot start says why in one line and exits; a Kafka
server.properties loads (Kafka's inapplicable keys ignored with one warning);
a broker on port 0 logs the port it bound. Real broker processes and ZooKeeper."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from cluster_helpers import wait_until
from replikafka.zookeeper_server import free_port

pytestmark = pytest.mark.integration


def write_props(path, **props):
    with open(path, "w") as f:
        for k, v in props.items():
            f.write(f"{k.replace('_', '.')}={v}\n")
    return str(path)


def run_broker(props_path, timeout=60, extra=()):
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "replikafka", "broker", props_path, *extra], capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    return r, time.monotonic() - t0


def assert_one_line_cause(r, cause):
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    lines = [l for l in r.stderr.splitlines() if cause in l]
    assert len(lines) == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == lines[0], r.stderr  # the last word is the cause


def base_props(tmp_path, zk, broker_id=1, port=None, **more):
    return dict(broker_id=broker_id, listeners=f"PLAINTEXT://127.0.0.1:{port or free_port()}",
                log_dirs=str(tmp_path / f"logs-{broker_id}"), zookeeper_connect=zk,
                zookeeper_session_timeout_ms=6000, **more)


def test_zookeeper_unreachable_is_one_line_and_exits(tmp_path):
    zk = f"127.0.0.1:{free_port()}"
    path = write_props(tmp_path / "b.properties",
                       **base_props(tmp_path, zk, zookeeper_connection_timeout_ms=2000))
    r, took = run_broker(path)
    assert_one_line_cause(r, f"cannot connect to ZooKeeper at {zk} within 2000 ms")
    assert took < 20


def test_port_in_use_is_one_line_and_exits(tmp_path, zk_connect):
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        path = write_props(tmp_path / "b.properties", **base_props(tmp_path, zk_connect, port=port))
        r, took = run_broker(path)
    finally:
        holder.close()
    assert_one_line_cause(r, f"cannot bind 127.0.0.1:{port}: the port is in use")
    assert "listeners" in r.stderr.splitlines()[-1]
    assert took < 20


def test_a_log_dir_that_cannot_be_used_is_one_line_and_exits(tmp_path, zk_connect):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    path = write_props(tmp_path / "b.properties",
                       **{**base_props(tmp_path, zk_connect), "log_dirs": str(not_a_dir)})
    r, took = run_broker(path)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert "could not start" in last and str(not_a_dir) in last, r.stderr
    assert took < 20


def test_a_duplicate_broker_id_is_refused_at_once_and_the_process_exits(tmp_path, zk_connect):
    first = subprocess.Popen([sys.executable, "-m", "replikafka", "broker",
                              write_props(tmp_path / "b1.properties", **base_props(tmp_path, zk_connect))],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    try:
        wait_until(lambda: "started on" in (first.stdout.readline() or ""), 60, what="first broker up")
        dup = base_props(tmp_path, zk_connect)
        dup["log_dirs"] = str(tmp_path / "logs-dup")
        r, took = run_broker(write_props(tmp_path / "dup.properties", **dup))
        assert_one_line_cause(r, "broker.id=1 is already registered in ZooKeeper by a broker at 127.0.0.1:")
        assert took < 20, f"the duplicate took {took:.0f}s to exit"
        assert first.poll() is None  # the first one keeps serving
    finally:
        first.terminate()
        first.wait(30)


def test_kafka_server_properties_load_with_one_warning_and_port_0_logs_the_bound_port(tmp_path, zk_connect):
    kafka_only = dict(num_network_threads=3, socket_send_buffer_bytes=102400, socket_receive_buffer_bytes=102400,
                      offsets_topic_replication_factor=1,
                      transaction_state_log_replication_factor=1, log_cleaner_enable="true",
                      group_initial_rebalance_delay_ms=0)
    props = {**base_props(tmp_path, zk_connect), "listeners": "PLAINTEXT://127.0.0.1:0", **kafka_only,
             "socket_request_max_bytes": 104857600}     # honoured (the largest request read), not ignored
    proc = subprocess.Popen([sys.executable, "-m", "replikafka", "broker", write_props(tmp_path / "k.properties", **props)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    seen = []
    try:
        def started():
            line = proc.stdout.readline()
            seen.append(line)
            return "started on" in line or proc.poll() is not None
        wait_until(started, 60, what="the broker to start")
        out = "".join(seen)
        assert proc.poll() is None, out
        warnings = [l for l in out.splitlines() if "ignoring Kafka config keys" in l]
        assert len(warnings) == 1, out
        for key in kafka_only:
            assert key.replace("_", ".") in warnings[0]
        serving = next(l for l in out.splitlines() if "serving on" in l)
        port = int(serving.rsplit(":", 1)[1].split()[0])
        assert port > 0, serving
    finally:
        proc.terminate()
        proc.wait(30)


def test_unknown_keys_and_bad_log_levels_are_refused(tmp_path, zk_connect):
    path = write_props(tmp_path / "b.properties", **base_props(tmp_path, zk_connect, replica_lag_tme_max_ms=5))
    r, _ = run_broker(path)
    assert r.returncode == 1 and "did you mean replica.lag.time.max.ms" in r.stderr, r.stderr
    path = write_props(tmp_path / "ok.properties", **base_props(tmp_path, zk_connect))
    r, _ = run_broker(path, extra=("--log-level", "LOUD"))
    assert r.returncode == 2 and "'LOUD' is not a log level" in r.stderr, r.stderr
