"""`replikafka zookeeper [conf/zookeeper.properties] [--port N] [--data-dir D]`.

Runs a real standalone ZooKeeper (from the jars inside the pyspark wheel) in
the foreground. Ctrl-C or SIGTERM stops the JVM and exits 0.

As with Kafka's ``zookeeper-server-start.sh``, the environment variable
``KAFKA_HEAP_OPTS`` sets the JVM's heap (e.g. ``"-Xmx1g -Xms1g"``), in place of
the default ``-Xmx256m``: enough for a few thousand partitions, while at 50,000
partitions on 3 brokers a 256 MB heap filled during ISR changes (30 full
collections in 33 s, once an out-of-memory exit) and 1 GB did not; and
``KAFKA_JVM_PERFORMANCE_OPTS`` the collector and JIT options, by default Kafka's
(G1, the full JIT: a server's options, where the tests' servers start fast with
a C1-only JIT that took twice the CPU in a 50,000-partition controller failover).
"""
from __future__ import annotations

import argparse
import os
import signal
import threading

from replikafka.errors import ReplikafkaError

DEFAULT_PORT = 2181
DEFAULT_DATA_DIR = "/tmp/replikafka-zookeeper"
HEAP_OPTS_ENV = "KAFKA_HEAP_OPTS"
PERFORMANCE_OPTS_ENV = "KAFKA_JVM_PERFORMANCE_OPTS"


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected an integer 0..65535") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}: expected an integer 0..65535")
    return value


def add_parser(subparsers, name: str = "zookeeper"):
    p = subparsers.add_parser(
        name,
        help="run a real ZooKeeper (from the pyspark jars) in the foreground",
        description="Run a standalone ZooKeeper 3.9 from the jars inside the pyspark wheel, in the "
                    "foreground; Ctrl-C or SIGTERM stops it. Needs Java 17+.",
    )
    p.add_argument("config", nargs="?", metavar="zookeeper.properties",
                   help="ZooKeeper configuration (ZooKeeper's own keys: clientPort, dataDir, tickTime, ...)")
    p.add_argument("--port", type=_port, default=None,
                   help=f"client port, overrides clientPort (default {DEFAULT_PORT}; 0 = any free port)")
    p.add_argument("--data-dir", default=None,
                   help=f"data directory, overrides dataDir (default {DEFAULT_DATA_DIR})")
    p.set_defaults(func=run)
    return p


def jvm_opts(env) -> tuple[str, ...]:
    """The JVM options, as Kafka's start scripts make them: the heap from ``KAFKA_HEAP_OPTS``
    (default ``-Xmx256m``), then the collector and JIT from ``KAFKA_JVM_PERFORMANCE_OPTS``
    (default Kafka's: G1 and the full JIT, not the tests' fast-start C1-only JIT)."""
    from replikafka.zookeeper_server import PRODUCTION_HEAP_OPTS, PRODUCTION_JVM_PERFORMANCE_OPTS

    heap = tuple(env.get(HEAP_OPTS_ENV, "").split()) or PRODUCTION_HEAP_OPTS
    for opt in heap:
        if not opt.startswith(("-Xmx", "-Xms", "-Xss", "-XX:")):
            raise ReplikafkaError(f"{HEAP_OPTS_ENV}: {opt!r} is not a JVM heap option "
                                  f"(expected e.g. \"-Xmx1g -Xms1g\")", code="INVALID_CONFIG")
    performance = tuple(env.get(PERFORMANCE_OPTS_ENV, "").split()) or PRODUCTION_JVM_PERFORMANCE_OPTS
    for opt in performance:
        if not opt.startswith("-"):
            raise ReplikafkaError(f"{PERFORMANCE_OPTS_ENV}: {opt!r} is not a JVM option "
                                  f"(expected e.g. \"-XX:+UseG1GC -XX:MaxGCPauseMillis=20\")", code="INVALID_CONFIG")
    return heap + performance


def _load_properties(path: str | None) -> dict[str, str]:
    if path is None:
        return {}
    if not os.path.isfile(path):
        raise ReplikafkaError(f"configuration file {path!r} does not exist", code="INVALID_CONFIG")
    from replikafka.cluster_admin import read_properties

    return read_properties(path)


def run(args) -> int:
    from replikafka.zookeeper_server import ZooKeeperServer, zookeeper_version

    props = _load_properties(args.config)
    opts = jvm_opts(os.environ)
    port = args.port
    if port is None:
        raw = props.get("clientPort", str(DEFAULT_PORT))
        try:
            port = _port(raw)
        except argparse.ArgumentTypeError as exc:
            raise ReplikafkaError(f"clientPort in {args.config}: {exc}", code="INVALID_CONFIG") from None
    data_dir = args.data_dir or props.get("dataDir") or DEFAULT_DATA_DIR

    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame):
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    server = ZooKeeperServer(port=port, data_dir=data_dir, properties=props, jvm_opts=opts, die_with_parent=True)
    try:
        server.start()
        print(
            f"ZooKeeper {zookeeper_version()} serving on {server.connect_string} "
            f"(pid {server.pid}, data {server.data_dir}, log {server.log_file}); Ctrl-C or SIGTERM stops it",
            flush=True,
        )
        while not stop.wait(0.5):
            if not server.running:
                raise ReplikafkaError(
                    f"ZooKeeper exited on its own with code {server.returncode}; see {server.log_file}",
                    code="ZOOKEEPER_EXITED",
                )
        server.stop()
        name = signal.Signals(received[0]).name if received else "signal"
        print(f"ZooKeeper stopped ({name})", flush=True)
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)

