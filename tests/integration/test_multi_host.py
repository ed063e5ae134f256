"""docs/multi-host.md checked on one machine: three brokers, each on its own
loopback address (127.0.0.2, .3, .4) and the same port, advertised as such;
clients bootstrap from one address and reach all three."""
from __future__ import annotations

import socket
import subprocess
import sys

import pyarrow as pa
import pytest

import replikafka
from cluster_helpers import wait_until

pytestmark = pytest.mark.integration

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")


def port_free_on_all(hosts) -> int:
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        try:
            for h in hosts:
                with socket.socket() as t:
                    t.bind((h, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every address")


def test_brokers_on_three_loopback_hosts_with_advertised_listeners(tmp_path, zk_connect):
    port = port_free_on_all(HOSTS)
    procs = []
    try:
        for i, host in enumerate(HOSTS, start=1):
            props = tmp_path / f"broker-{i}.properties"
            props.write_text(f"broker.id={i}\nlisteners=PLAINTEXT://{host}:{port}\n"
                             f"advertised.listeners=PLAINTEXT://{host}:{port}\n"
                             f"log.dirs={tmp_path / f'logs-{i}'}\nzookeeper.connect={zk_connect}\n"
                             "default.replication.factor=3\nmin.insync.replicas=2\n")
            procs.append(subprocess.Popen([sys.executable, "-m", "replikafka", "broker", str(props)],
                                          stdout=open(tmp_path / f"broker-{i}.log", "w"), stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))
        admin = replikafka.Admin(f"{HOSTS[0]}:{port}")

        def brokers_up() -> int:
            try:
                return len(admin.describe_cluster().brokers)
            except replikafka.BrokerNotAvailableError:  # still starting: nobody listens yet
                return 0
        wait_until(lambda: brokers_up() == 3, 60, what="three brokers")
        assert sorted((b.host, b.port) for b in admin.describe_cluster().brokers) == [(h, port) for h in HOSTS]
        admin.create_topic("spread", partitions=3, replication_factor=3)  # defaults come from the brokers
        with replikafka.Producer(f"{HOSTS[1]}:{port}", acks="all") as p:
            for part in range(3):
                p.send("spread", pa.record_batch([pa.array([b"v%d" % part])], names=["value"]), partition=part).result(30)
        leaders = {p.leader for p in admin.describe_topic("spread").partitions}
        assert len(leaders) == 3  # every host leads a partition and serves the clients
        c = replikafka.Consumer(f"{HOSTS[2]}:{port}")
        c.assign([("spread", p) for p in range(3)])
        for p in range(3):
            c.seek(("spread", p), 0)
        got = []
        wait_until(lambda: got.extend(c.poll(timeout_ms=200).column("value").to_pylist()) or len(got) >= 3, 30,
                   what="three records")
        assert sorted(got) == [b"v0", b"v1", b"v2"]
        c.close()
        admin.close()
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
