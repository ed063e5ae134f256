"""A local cluster on this machine: one embedded ZooKeeper and N broker processes.

Used by ``replikafka cluster start|stop|status``, by ``./build.sh demo`` and by
the integration tests (which pass their own ZooKeeper chroot). Brokers are real
OS processes (``python -m replikafka broker``) so tests can SIGKILL, SIGSTOP
and restart them. State lives in ``<dir>/cluster.json`` so ``stop`` and
``status`` work from another process.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from kazoo.client import KazooClient

from replikafka.errors import CommandError, ReplikafkaError
from replikafka.zookeeper_server import ZooKeeperServer, free_port

STATE_FILE = "cluster.json"
#: Set by LocalCluster(die_with_parent=True): the broker exits when this process dies.
PARENT_PID_ENV = "REPLIKAFKA_DIE_WITH_PARENT_PID"
START_TIMEOUT_S = 60.0

#: Settings that make a local cluster react quickly; users may override any.
LOCAL_DEFAULTS = {
    "zookeeper.session.timeout.ms": "6000",
    "replica.lag.time.max.ms": "10000",
    "replica.fetch.wait.max.ms": "200",
    "replica.high.watermark.checkpoint.interval.ms": "1000",
    "num.partitions": "1",
    # A local cluster is often stopped as a whole: do not wait 3 x 5 s for a
    # controller that is stopping too.
    "controlled.shutdown.retry.backoff.ms": "500",
}


def _free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


class LocalCluster:
    def __init__(self, base_dir: str, brokers: int = 3, *, zookeeper_connect: str | None = None,
                 overrides: dict[str, str] | None = None, broker_overrides: dict[int, dict[str, str]] | None = None,
                 first_broker_id: int = 1, die_with_parent: bool = False, security=None,
                 protocols: tuple[str, ...] | None = None, zookeeper_jvm_opts: tuple[str, ...] | None = None):
        self.base_dir = os.path.abspath(base_dir)
        self.n = brokers
        self.external_zk = zookeeper_connect
        # The JVM options of the ZooKeeper it starts (None: ZooKeeperServer's small-heap defaults).
        self.zookeeper_jvm_opts = zookeeper_jvm_opts
        self.zk_server: ZooKeeperServer | None = None
        self.overrides = {**LOCAL_DEFAULTS, **(overrides or {})}
        self.broker_overrides = broker_overrides or {}
        self.ids = list(range(first_broker_id, first_broker_id + brokers))
        self.ports: dict[int, int] = {}          # broker -> port of its first listener (bootstrap)
        # A SecureSetup (replikafka.security.local_setup): SSL + SASL_SSL listeners, ACLs, ZooKeeper ACLs.
        self.security = security
        # Every broker also serves Arrow Flight; FLIGHT last: the first protocol's ports are the bootstrap.
        self.protocols = tuple(p for p in (protocols or (("SSL", "SASL_SSL") if security is not None
                                                         else ("PLAINTEXT",))) if p != "FLIGHT") + ("FLIGHT",)
        self.listener_ports: dict[int, dict[str, int]] = {}
        self.metrics_ports: dict[int, int] = {}   # each broker's metrics.listener (HTTP) port
        # broker -> (host, port) its registration must name: its advertised address (a proxy's, say).
        self.registration_addresses: dict[int, tuple[str, int] | None] = {}
        self.launched_ms: dict[int, int] = {}     # broker -> when its process was started (wall clock, ms)
        self.procs: dict[int, subprocess.Popen] = {}
        # broker -> its command line, properties file excluded, where not `python -m replikafka broker`
        # (a benchmark starts a variant broker beside a normal one)
        self.broker_commands: dict[int, list[str]] = {}
        self.zookeeper_connect = zookeeper_connect or ""
        # Tests want their processes gone if the test run dies; `cluster start` does not.
        self.die_with_parent = die_with_parent
        self._owns_state = False  # set by start(): only then may stop() remove the state file

    # ------------------------------------------------------------ start / stop
    def start(self, timeout_s: float = START_TIMEOUT_S) -> "LocalCluster":
        """Start ZooKeeper (unless external) and the brokers; refuses (with
        :class:`CommandError`, touching nothing) a directory whose cluster is
        running. The state file is written as each process starts, so ``stop``
        reaches whatever a failed or interrupted start left running."""
        os.makedirs(self.base_dir, exist_ok=True)
        refuse_if_running(self.base_dir)
        self._owns_state = True
        if not self.external_zk:
            extra = {} if self.zookeeper_jvm_opts is None else {"jvm_opts": self.zookeeper_jvm_opts}
            self.zk_server = ZooKeeperServer(port=free_port(), data_dir=os.path.join(self.base_dir, "zookeeper"),
                                             die_with_parent=self.die_with_parent, **extra)
            self.zk_server.start(timeout_s=timeout_s)
            self.zookeeper_connect = self.zk_server.connect_string
            self._save_state()
        if self.security is not None:
            zk = self.zk(digest=self.security.zk_digest)
            try:
                self.security.prepare_zookeeper(zk)
            finally:
                zk.stop()
                zk.close()
        ports = iter(_free_ports(len(self.ids) * len(self.protocols)))
        # FLIGHT binds port 0 (any free port; brokers publish the bound one): one port fewer to race for.
        self.listener_ports = {b: {proto: 0 if proto == "FLIGHT" else next(ports) for proto in self.protocols}
                               for b in self.ids}
        self.ports = {b: self.listener_ports[b][self.protocols[0]] for b in self.ids}
        self.metrics_ports = {b: next(ports) for b in self.ids}
        for bid in self.ids:
            self.start_broker(bid, wait=False)
        self._save_state()
        self.wait_registered(self.ids, timeout_s)
        return self

    def properties_path(self, broker_id: int) -> str:
        return os.path.join(self.base_dir, f"broker-{broker_id}.properties")

    def log_path(self, broker_id: int) -> str:
        return os.path.join(self.base_dir, f"broker-{broker_id}.log")

    def _write_properties(self, broker_id: int) -> str:
        props = {
            "broker.id": str(broker_id),
            "listeners": ",".join(f"{proto}://127.0.0.1:{port}"
                                  for proto, port in self.listener_ports[broker_id].items()),
            **(self.security.broker_overrides() if self.security is not None else {}),
            "log.dirs": os.path.join(self.base_dir, f"broker-{broker_id}-logs"),
            "zookeeper.connect": self.zookeeper_connect,
            "metrics.listener": self.metrics_url(broker_id),
            **self.overrides,
            **self.broker_overrides.get(broker_id, {}),
        }
        path = self.properties_path(broker_id)
        with open(path, "w") as f:
            f.write("# written by replikafka LocalCluster\n")
            for k, v in props.items():
                f.write(f"{k}={v}\n")
        return path

    def start_broker(self, broker_id: int, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
        path = self._write_properties(broker_id)
        self.registration_addresses[broker_id] = _registration_address(path)
        self.launched_ms[broker_id] = int(time.time() * 1000)
        out = open(self.log_path(broker_id), "ab")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.die_with_parent:
            # The broker asks the kernel itself (no preexec_fn: forking a process
            # that runs gRPC and running Python in the child can abort the child).
            env[PARENT_PID_ENV] = str(os.getpid())
        else:
            env.pop(PARENT_PID_ENV, None)
        command = self.broker_commands.get(broker_id, [sys.executable, "-m", "replikafka", "broker"])
        self.procs[broker_id] = subprocess.Popen(
            [*command, path], stdout=out, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        out.close()
        if wait:
            self.wait_registered([broker_id], timeout_s)
            self._save_state()

    def wait_registered(self, ids, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait until each broker in ``ids`` is registered *by the process this
        cluster started*: the znode names the advertised address of its
        properties and was written after the process started (its timestamp,
        from this machine's clock). An old incarnation's ephemeral node, still
        there until its session expires, does not count, even at the same address."""
        zk = self.zk()
        try:
            deadline = time.time() + timeout_s
            while True:
                live = set(zk.get_children("/brokers/ids")) if zk.exists("/brokers/ids") else set()
                if all(self._registered_by_us(zk, i) for i in ids):
                    return
                for i in ids:
                    p = self.procs.get(i)
                    if p is not None and p.poll() is not None:
                        raise CommandError(f"broker {i} exited with {p.returncode} during start-up; "
                                              f"see {self.log_path(i)}:\n{self.tail(i)}")
                if time.time() > deadline:
                    raise CommandError(f"brokers {sorted(ids)} did not register within {timeout_s:.0f}s; "
                                          f"registered: {sorted(live)}")
                time.sleep(0.05)
        finally:
            zk.stop()
            zk.close()

    def _registered_by_us(self, zk: KazooClient, broker_id: int) -> bool:
        p = self.procs.get(broker_id)
        if p is None or p.poll() is not None:
            return False
        try:
            data, _ = zk.get(f"/brokers/ids/{broker_id}")
            reg, (host, port) = json.loads(data), self.registration_addresses[broker_id]
            # Port 0: the listener binds any free port and the broker registers the one it got.
            return (reg.get("host") == host and (port == 0 or reg.get("port") == port)
                    and int(reg.get("timestamp", -1)) >= self.launched_ms[broker_id])
        except Exception:  # not there (yet), or not ours
            return False

    def tail(self, broker_id: int, lines: int = 30) -> str:
        try:
            with open(self.log_path(broker_id), "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    def signal_broker(self, broker_id: int, sig: int) -> None:
        p = self.procs.get(broker_id)
        if p is not None and p.poll() is None:
            os.kill(p.pid, sig)

    def kill(self, broker_id: int) -> None:
        """kill -9: nothing acknowledged may be lost."""
        self.signal_broker(broker_id, signal.SIGKILL)
        self.procs[broker_id].wait(10)

    def stop_broker(self, broker_id: int, timeout_s: float = 30.0) -> int:
        p = self.procs.get(broker_id)
        if p is None or p.poll() is not None:
            return p.returncode if p else 0
        p.terminate()
        try:
            return p.wait(timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            return p.wait(10)

    def pause(self, broker_id: int) -> None:
        self.signal_broker(broker_id, signal.SIGSTOP)

    def resume(self, broker_id: int) -> None:
        self.signal_broker(broker_id, signal.SIGCONT)

    def alive(self, broker_id: int) -> bool:
        p = self.procs.get(broker_id)
        return p is not None and p.poll() is None

    def stop(self) -> None:
        for bid in list(self.procs):
            self.resume(bid)
            p = self.procs[bid]
            if p.poll() is None:
                p.terminate()
        for bid, p in self.procs.items():
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if self.zk_server is not None:
            self.zk_server.stop()
        if self._owns_state:
            try:
                os.unlink(os.path.join(self.base_dir, STATE_FILE))
            except FileNotFoundError:
                pass

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    # ------------------------------------------------------------ info
    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{self.ports[b]}" for b in self.ids)

    def metrics_url(self, broker_id: int) -> str:
        """The broker's HTTP port: /metrics, the status page at /, /loggers (HTTPS on a secure cluster)."""
        scheme = "https" if self.security is not None else "http"
        return f"{scheme}://127.0.0.1:{self.metrics_ports[broker_id]}"

    def address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.ports[broker_id]}"

    def bootstrap_for(self, protocol: str) -> str:
        """Bootstrap servers of the ``protocol`` listeners (e.g. ``"SASL_SSL"``)."""
        return ",".join(f"127.0.0.1:{self.listener_ports[b][protocol]}" for b in self.ids)

    def zk(self, digest: tuple[str, str] | None = None) -> KazooClient:
        """A started ZooKeeper client (anonymous, or as the digest user: needed to write on a secure cluster)."""
        from replikafka.security.zk_security import kazoo_security
        extra = kazoo_security(*digest, set_acl=True) if digest else {}
        zk = KazooClient(hosts=self.zookeeper_connect, timeout=10, **extra)
        zk.start(timeout=15)
        return zk

    def controller_id(self) -> int:
        zk = self.zk()
        try:
            if not zk.exists("/controller"):
                return -1
            return int(json.loads(zk.get("/controller")[0])["brokerid"])
        finally:
            zk.stop()
            zk.close()

    def _save_state(self) -> None:
        state = {"zookeeper": self.zookeeper_connect,
                 "zookeeper_pid": self.zk_server.pid if self.zk_server else None,
                 "brokers": {str(b): {"pid": p.pid, "port": self.ports[b], "listeners": self.listener_ports.get(b, {}),
                                     "metrics_url": self.metrics_url(b)}
                             for b, p in self.procs.items()},
                 "bootstrap_servers": ",".join(f"127.0.0.1:{self.ports[b]}" for b in self.ids if b in self.ports)}
        with open(os.path.join(self.base_dir, STATE_FILE), "w") as f:
            json.dump(state, f, indent=1)


def _registration_address(properties_path: str) -> tuple[str, int] | None:
    """The (host, port) a broker started with these properties registers: its
    advertised listener for brokers (advertised.listeners if set, else
    listeners), which the broker itself computes the same way. None if the
    properties are invalid: the broker exits naming why, which start reports."""
    from replikafka.broker.config import BrokerConfig
    try:
        endpoint = BrokerConfig.load(properties_path).advertised_endpoint()
    except ReplikafkaError:
        return None
    return endpoint.host, endpoint.port


def load_state(base_dir: str) -> dict:
    path = os.path.join(base_dir, STATE_FILE)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise CommandError(f"no cluster is running in {base_dir} (no {STATE_FILE})") from None


def running_pids(state: dict) -> dict[str, int]:
    """The processes of a cluster state that are still alive, by name."""
    procs = {"zookeeper": state.get("zookeeper_pid")}
    procs.update({f"broker {bid}": b.get("pid") for bid, b in state.get("brokers", {}).items()})
    return {name: pid for name, pid in procs.items() if pid_alive(pid)}


def refuse_if_running(base_dir: str) -> None:
    """Raise :class:`CommandError` naming ``base_dir`` and its live processes
    if a cluster started there is still running."""
    try:
        state = load_state(base_dir)
    except (ReplikafkaError, ValueError):
        return  # no state, or a torn one: nothing to protect
    alive = running_pids(state)
    if alive:
        listed = ", ".join(f"{name} pid {pid}" for name, pid in alive.items())
        raise CommandError(f"a cluster is already running in {os.path.abspath(base_dir)} ({listed}); "
                           f"stop it first: replikafka cluster stop --dir {base_dir}")


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
