"""The embedded ZooKeeper: a real server from the pyspark jars, the test fixtures, and the CLI."""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import KazooState

from replikafka.errors import ReplikafkaError
from replikafka.zookeeper_server import (
    MAIN_CLASS, JavaNotFoundError, ZooKeeperServer, four_letter_word, free_port, pyspark_jars_dir,
)
from zk_harness import connected_client

pytestmark = pytest.mark.integration

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def _java_free_env() -> dict:
    """The environment without any java: JAVA_HOME unset, PATH without directories holding a java."""
    env = dict(os.environ)
    env.pop("JAVA_HOME", None)
    dirs = [d for d in env.get("PATH", "").split(os.pathsep)
            if d and not os.path.exists(os.path.join(d, "java"))]
    env["PATH"] = os.pathsep.join(dirs)
    assert shutil.which("java", path=env["PATH"]) is None
    return env


# ---------------------------------------------------------------- the server
def test_session_server_is_zookeeper_from_the_pyspark_jars(zk_server):
    if zk_server.pid is None:
        pytest.skip("using an external ZooKeeper")
    assert four_letter_word("127.0.0.1", zk_server.port, "ruok") == "imok"
    srvr = four_letter_word("127.0.0.1", zk_server.port, "srvr")
    assert "Zookeeper version: 3.9" in srvr and "Mode: standalone" in srvr
    with open(f"/proc/{zk_server.pid}/cmdline", "rb") as f:
        cmdline = f.read().split(b"\0")
    assert MAIN_CLASS.encode() in cmdline
    classpath = cmdline[cmdline.index(b"-cp") + 1].decode()
    jars = pyspark_jars_dir()
    assert jars.endswith(os.path.join("pyspark", "jars"))
    entries = classpath.split(os.pathsep)
    assert os.path.join(jars, "*") in entries
    zk_jars = glob.glob(os.path.join(jars, "zookeeper-3*.jar"))
    assert zk_jars and zk_jars[0] in entries


def test_serves_kazoo(kazoo_client):
    kazoo_client.create("/a/b", b"hello", makepath=True)
    kazoo_client.set("/a/b", b"world")
    data, stat = kazoo_client.get("/a/b")
    assert data == b"world" and stat.version == 1
    # conditional write on the znode version, as the partition state updates do
    from kazoo.exceptions import BadVersionError
    with pytest.raises(BadVersionError):
        kazoo_client.set("/a/b", b"stale", version=0)
    tx = kazoo_client.transaction()
    tx.create("/a/c", b"1")
    tx.set_data("/a/b", b"again", version=1)
    created, new_stat = tx.commit()
    assert created == "/a/c" and new_stat.version == 2
    assert kazoo_client.get("/a/b")[0] == b"again"
    assert sorted(kazoo_client.get_children("/a")) == ["b", "c"]


def test_restart_keeps_data_and_port(tmp_path):
    zk = ZooKeeperServer(port=0, data_dir=tmp_path / "zk", die_with_parent=True)
    try:
        zk.start()
        port, pid = zk.port, zk.pid
        assert port != 0 and pid
        c = connected_client(zk.connect_string)
        c.create("/persistent", b"kept", makepath=True)
        c.stop()
        c.close()
        zk.restart()
        assert zk.port == port and zk.pid != pid and not _alive(pid)
        c = connected_client(zk.connect_string)
        assert c.get("/persistent")[0] == b"kept"
        c.stop()
        c.close()
        assert os.path.isdir(tmp_path / "zk" / "version-2")
        assert os.path.isfile(zk.log_file)
    finally:
        zk.stop()
    assert zk.pid is None and not _alive(pid)


def test_stop_sigkills_a_jvm_that_ignores_sigterm(tmp_path):
    zk = ZooKeeperServer(port=0, data_dir=tmp_path / "zk", die_with_parent=True)
    zk.start()
    pid = zk.pid
    try:
        os.kill(pid, signal.SIGSTOP)  # a stopped JVM cannot run its SIGTERM handler
        t0 = time.monotonic()
        zk.stop(timeout_s=1.0)
        assert 0.9 < time.monotonic() - t0 < 10
        assert zk.returncode == -signal.SIGKILL and not _alive(pid)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_port_already_in_use_is_one_clear_error(zk_server, tmp_path):
    if zk_server.pid is None:
        pytest.skip("using an external ZooKeeper")
    other = ZooKeeperServer(port=zk_server.port, data_dir=tmp_path / "other")
    with pytest.raises(ReplikafkaError, match=f"port {zk_server.port} .* already in use"):
        other.start(timeout_s=10)
    assert other.pid is None


def test_missing_java_raises_one_line_replikafka_error(monkeypatch, tmp_path):
    env = _java_free_env()
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.delenv("JAVA_HOME", raising=False)
    zk = ZooKeeperServer(port=0, data_dir=tmp_path / "zk")
    with pytest.raises(JavaNotFoundError) as info:
        zk.start()
    assert isinstance(info.value, ReplikafkaError)
    msg = str(info.value)
    assert "Java 17+" in msg and "PATH" in msg and "JAVA_HOME" in msg and "\n" not in msg
    assert zk.pid is None


# ---------------------------------------------------------------- fixtures
def test_zk_connect_is_a_created_chroot(zk_server, zk_connect, zk_chroot):
    assert zk_connect == zk_server.connect_string + zk_chroot
    assert zk_chroot.startswith("/t-test_zk_connect_is_a_created_chroot-")
    root = connected_client(zk_server.connect_string)
    try:
        assert root.exists(zk_chroot) is not None
    finally:
        root.stop()
        root.close()


def test_chroots_are_isolated(zk_server, kazoo_client, zk_chroot, kazoo_factory):
    import zk_harness

    root = kazoo_factory(zk_server.connect_string)
    other_chroot = zk_harness.new_chroot(root, "other")
    other = kazoo_factory(zk_server.connect_string + other_chroot)

    kazoo_client.create("/brokers/ids/1", b"mine", makepath=True)
    assert other.exists("/brokers") is None
    other.create("/brokers/ids/1", b"theirs", makepath=True)
    assert kazoo_client.get("/brokers/ids/1")[0] == b"mine"
    assert other.get("/brokers/ids/1")[0] == b"theirs"
    assert root.get(f"{zk_chroot}/brokers/ids/1")[0] == b"mine"
    assert root.get(f"{other_chroot}/brokers/ids/1")[0] == b"theirs"
    assert root.exists("/brokers") is None


def test_expire_session_really_expires(kazoo_client, kazoo_factory, expire_session):
    observer = kazoo_factory()
    kazoo_client.create("/controller", b"1", ephemeral=True)
    kazoo_client.create("/durable", b"x")
    gone = threading.Event()

    def watch(event):
        if event.type == "DELETED":
            gone.set()

    assert observer.exists("/controller", watch=watch) is not None
    states = []
    kazoo_client.add_listener(states.append)
    old_session = kazoo_client.client_id[0]

    expire_session(kazoo_client)

    assert KazooState.LOST in states
    assert gone.wait(10), "the ephemeral node of the expired session was not deleted"
    assert observer.exists("/controller") is None
    assert kazoo_client.connected and kazoo_client.client_id[0] != old_session
    assert kazoo_client.exists("/controller") is None
    assert kazoo_client.get("/durable")[0] == b"x"
    # the fresh session works and owns new ephemerals
    kazoo_client.create("/controller", b"2", ephemeral=True)
    assert observer.get("/controller")[0] == b"2"


def test_expire_session_without_waiting_for_reconnect(kazoo_client, expire_session):
    kazoo_client.create("/eph", ephemeral=True)
    expire_session(kazoo_client, wait_reconnect=False)
    deadline = time.monotonic() + 15
    while not kazoo_client.connected:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    with pytest.raises(NoNodeError):
        kazoo_client.get("/eph")


def test_expire_session_refuses_a_stopped_client(zk_connect, expire_session):
    c = KazooClient(zk_connect)
    with pytest.raises(AssertionError, match="no live session"):
        expire_session(c)


def test_long_tests_run_only_with_the_long_option(tmp_path):
    """The conftest's collection hook skips tests marked `long` unless --long is given."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for name in ("conftest.py", "zk_harness.py"):
        shutil.copy(os.path.join(here, name), tmp_path / name)
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_short():\n    pass\n"
        "@pytest.mark.long\n"
        "def test_long():\n    pass\n"
    )

    def run(*extra):
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
             "-W", "ignore::pytest.PytestUnknownMarkWarning", *extra, str(tmp_path)],
            cwd=tmp_path, capture_output=True, text=True, timeout=120)
        return out.stdout

    default = run()
    assert "1 passed, 1 skipped" in default and "run with --long" in default, default
    assert "2 passed" in run("--long")


# ---------------------------------------------------------------- the CLI
def _banner(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[str, int]:
    """The CLI's first stdout line and the JVM pid it names (fails instead of hanging)."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    assert lines and "serving on" in lines[0], (lines, proc.poll())
    return lines[0], int(lines[0].split("(pid ")[1].split(",")[0])


def _cli(*args: str, env=None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "replikafka", "zookeeper", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_cli_serves_and_stops_on_sigterm(tmp_path):
    port = free_port()
    data_dir = tmp_path / "zkdata"
    proc = _cli("conf/zookeeper.properties", "--port", str(port), "--data-dir", str(data_dir))
    try:
        banner, jvm_pid = _banner(proc)
        assert f"serving on 127.0.0.1:{port}" in banner
        assert _alive(jvm_pid)
        c = connected_client(f"127.0.0.1:{port}")
        c.create("/from-cli", b"ok")
        assert c.get("/from-cli")[0] == b"ok"
        c.stop()
        c.close()
        conf = four_letter_word("127.0.0.1", port, "conf")
        assert f"dataDir={data_dir}" in conf  # --data-dir overrode the file's dataDir
        assert "tickTime=2000" in conf        # the file's keys were used

        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "stopped" in out and "Traceback" not in err
        deadline = time.monotonic() + 10
        while _alive(jvm_pid):
            assert time.monotonic() < deadline, "the JVM outlived the CLI"
            time.sleep(0.05)
        with pytest.raises(OSError):
            four_letter_word("127.0.0.1", port, "ruok", timeout=1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_cli_sigkill_takes_the_jvm_down_too(tmp_path):
    proc = _cli("--port", "0", "--data-dir", str(tmp_path / "zk"))
    try:
        _, jvm_pid = _banner(proc)
        assert _alive(jvm_pid)
        proc.kill()
        proc.communicate(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(jvm_pid):
            assert time.monotonic() < deadline, "the JVM outlived a SIGKILLed CLI"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_cli_without_java_is_one_line_error(tmp_path):
    proc = _cli("--port", "0", "--data-dir", str(tmp_path / "zk"), env=_java_free_env())
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Java 17+" in lines[0] and "not found" in lines[0]


@pytest.mark.parametrize("args,expect", [
    (["--port", "abc"], "invalid port 'abc'"),
    (["--port", "70000"], "invalid port '70000'"),
    (["missing.properties"], "missing.properties"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_cli_bad_arguments_are_one_line_errors(args, expect, tmp_path):
    proc = _cli(*args, "--data-dir", str(tmp_path / "zk"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert expect in err


def test_cli_heap_from_kafka_heap_opts(tmp_path):
    """KAFKA_HEAP_OPTS sets the JVM's heap, as Kafka's start script; a value that is
    not a heap option is one clear error naming the variable."""
    env = dict(os.environ, KAFKA_HEAP_OPTS="-Xmx300m -Xms64m")
    proc = _cli("--port", "0", "--data-dir", str(tmp_path / "zk"), env=env)
    try:
        _, jvm_pid = _banner(proc)
        with open(f"/proc/{jvm_pid}/cmdline", "rb") as f:
            args = f.read().split(b"\0")
        assert b"-Xmx300m" in args and b"-Xms64m" in args and b"-Xmx256m" not in args, args
        # A server's JIT and collector by default (Kafka's KAFKA_JVM_PERFORMANCE_OPTS), not the tests' fast start.
        assert b"-XX:+UseG1GC" in args and not any(a.startswith(b"-XX:TieredStopAtLevel") for a in args), args
    finally:
        proc.kill()
        proc.communicate()
    bad = dict(os.environ, KAFKA_HEAP_OPTS="1g")
    proc = _cli("--port", "0", "--data-dir", str(tmp_path / "zk2"), env=bad)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1 and "KAFKA_HEAP_OPTS" in err and "'1g'" in err, err


def test_cli_jvm_options_as_kafkas_start_scripts():
    """``replikafka zookeeper``'s JVM: the heap from KAFKA_HEAP_OPTS, the collector and JIT
    from KAFKA_JVM_PERFORMANCE_OPTS, each defaulting to Kafka's server options (the full
    JIT, G1), never to the tests' fast-start ones; a word that is no JVM option is an error
    naming the variable."""
    from replikafka.cli.zookeeper_cmd import jvm_opts
    from replikafka.errors import ReplikafkaError
    from replikafka.zookeeper_server import DEFAULT_JVM_OPTS, PRODUCTION_JVM_PERFORMANCE_OPTS

    default = jvm_opts({})
    assert default == ("-Xmx256m",) + PRODUCTION_JVM_PERFORMANCE_OPTS
    assert "-XX:TieredStopAtLevel=1" in DEFAULT_JVM_OPTS and "-XX:TieredStopAtLevel=1" not in default
    assert jvm_opts({"KAFKA_HEAP_OPTS": "-Xmx1g -Xms1g"}) == ("-Xmx1g", "-Xms1g") + PRODUCTION_JVM_PERFORMANCE_OPTS
    assert jvm_opts({"KAFKA_JVM_PERFORMANCE_OPTS": " -XX:+UseSerialGC  -XX:TieredStopAtLevel=1 "}) == (
        "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
    with pytest.raises(ReplikafkaError, match="KAFKA_JVM_PERFORMANCE_OPTS: 'G1' is not a JVM option"):
        jvm_opts({"KAFKA_JVM_PERFORMANCE_OPTS": "-server G1"})


def test_cli_refuses_an_ensemble_config(tmp_path):
    cfg = tmp_path / "zk.properties"
    cfg.write_text("clientPort=0\nserver.1=a:2888:3888\n")
    proc = _cli(str(cfg), "--data-dir", str(tmp_path / "zk"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err
    assert "server.1" in err and len(err.strip().splitlines()) == 1
