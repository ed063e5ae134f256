"""A real, standalone ZooKeeper server run from the jars inside the pyspark wheel.

pyspark ships ZooKeeper (``pyspark/jars/zookeeper-3.9.x.jar``) with everything it
needs on the classpath, so ``java -cp "<pyspark>/jars/*"
org.apache.zookeeper.server.ZooKeeperServerMain zoo.cfg`` is a complete server.
:class:`ZooKeeperServer` writes ``zoo.cfg`` and a quiet log4j2 configuration into
the data directory, starts the JVM, and returns once the server answers::

    zk = ZooKeeperServer(port=0, data_dir="/tmp/zk")   # port 0: pick a free port
    zk.start()
    KazooClient(zk.connect_string).start()
    zk.restart()                                          # same port, same data
    zk.stop()

``replikafka zookeeper`` (:mod:`replikafka.cli.zookeeper_cmd`) runs one in the
foreground; the test suite starts one per session (``tests/zk_harness.py``).
"""
from __future__ import annotations

import glob
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Mapping

from replikafka.errors import ReplikafkaError

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
MIN_JAVA = 17

#: JVM options: small heap and fast start-up (ZooKeeper needs little of either), for the
#: servers tests start by the hundred. The JIT stops at C1: a server under load
#: (a controller failover writing 50,000 states) spends twice the CPU of a full JIT.
DEFAULT_JVM_OPTS = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")

#: What Kafka's start scripts give ZooKeeper unless KAFKA_JVM_PERFORMANCE_OPTS says otherwise
#: (kafka-run-class.sh): the full JIT and G1 with short pauses. For a server that runs a
#: cluster (``replikafka zookeeper``, the scale bench): in the controller's failover at
#: 50,000 partitions ZooKeeper's CPU went from 1.1-1.4 s with the C1-only JIT to 0.5 s.
PRODUCTION_JVM_PERFORMANCE_OPTS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                                   "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                                   "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true")
#: The heap ``replikafka zookeeper`` starts with unless KAFKA_HEAP_OPTS says otherwise.
PRODUCTION_HEAP_OPTS = ("-Xmx256m",)

#: Written into every zoo.cfg unless the given properties say otherwise.
DEFAULT_PROPERTIES = {
    "tickTime": "2000",
    "maxClientCnxns": "0",
    "admin.enableServer": "false",
    "4lw.commands.whitelist": "*",
}

# Jars the server actually loads, put first on the classpath so the JVM finds
# its classes without opening the ~280 other jars of the pyspark wheel
# (start-up ~1 s instead of ~2.5 s). "<jars>/*" follows, so nothing is missing.
_FIRST_JARS = (
    "zookeeper-3*.jar", "zookeeper-jute-*.jar", "audience-annotations-*.jar", "slf4j-api-*.jar",
    "log4j-slf4j2-impl-*.jar", "log4j-api-2*.jar", "log4j-core-2*.jar", "commons-io-*.jar",
    "commons-cli-*.jar", "metrics-core-*.jar", "snappy-java-*.jar",
)

#: log4j2 configuration: WARN and above to ${zookeeper.log.dir}/zookeeper.log, nothing on the console.
LOG4J2_PROPERTIES = """\
# ZooKeeper's logging under replikafka: WARN and above to a file in the data directory.
status = error
name = replikafka-zookeeper
appender.file.type = File
appender.file.name = file
appender.file.fileName = ${sys:zookeeper.log.dir}/zookeeper.log
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{ISO8601} %-5p [%t] %c{1}: %m%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
"""


class JavaNotFoundError(ReplikafkaError):
    """Java 17+ is needed to run ZooKeeper and was not found."""

    code = "JAVA_NOT_FOUND"


class ZooKeeperStartError(ReplikafkaError):
    """The ZooKeeper server could not be started."""

    code = "ZOOKEEPER_START_FAILED"


# --------------------------------------------------------------------------
# Locating Java and the jars
# --------------------------------------------------------------------------
_JAVA_VERSIONS: dict[str, int] = {}


def find_java() -> str:
    """Path of the ``java`` to use: ``$JAVA_HOME/bin/java``, else ``java`` on PATH (Java 17+)."""
    java_home = os.environ.get("JAVA_HOME")
    java = None
    if java_home:
        candidate = os.path.join(java_home, "bin", "java")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            java = candidate
    if java is None:
        java = shutil.which("java")
    if java is None:
        home = f"JAVA_HOME={java_home} has no bin/java" if java_home else "JAVA_HOME is not set"
        raise JavaNotFoundError(
            f"Java {MIN_JAVA}+ is needed to run ZooKeeper and was not found: no java on PATH and {home}; "
            f"install a JDK {MIN_JAVA}+ or set JAVA_HOME"
        )
    version = java_major_version(java)
    if version < MIN_JAVA:
        raise JavaNotFoundError(f"Java {MIN_JAVA}+ is needed to run ZooKeeper; {java} is Java {version}")
    return java


def java_major_version(java: str) -> int:
    """The major version of a ``java`` executable (8, 11, 17, 21, ...), cached per path."""
    real = os.path.realpath(java)
    if real not in _JAVA_VERSIONS:
        try:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise JavaNotFoundError(f"Java {MIN_JAVA}+ is needed to run ZooKeeper; {java} does not run: {exc}") from None
        m = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
        if not m:
            raise JavaNotFoundError(f"Java {MIN_JAVA}+ is needed to run ZooKeeper; cannot tell the version of {java}")
        major = int(m.group(1))
        if major == 1 and m.group(2):  # 1.8 -> 8
            major = int(m.group(2))
        _JAVA_VERSIONS[real] = major
    return _JAVA_VERSIONS[real]


def pyspark_jars_dir() -> str:
    """``<pyspark package>/jars`` (found without importing pyspark)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ZooKeeperStartError("the pyspark package is not installed; its jars carry ZooKeeper")
    for location in spec.submodule_search_locations:
        jars = os.path.join(location, "jars")
        if glob.glob(os.path.join(jars, "zookeeper-3*.jar")):
            return jars
    raise ZooKeeperStartError(
        f"no zookeeper-3*.jar in {os.path.join(list(spec.submodule_search_locations)[0], 'jars')}"
    )


def zookeeper_classpath(jars_dir: str | None = None) -> str:
    """The server's classpath: its own jars first, then ``<jars>/*``."""
    jars_dir = jars_dir or pyspark_jars_dir()
    first: list[str] = []
    for pattern in _FIRST_JARS:
        first.extend(sorted(glob.glob(os.path.join(jars_dir, pattern))))
    return os.pathsep.join(first + [os.path.join(jars_dir, "*")])


def zookeeper_version(jars_dir: str | None = None) -> str:
    """The ZooKeeper version shipped in the jars (e.g. ``"3.9.5"``)."""
    jars_dir = jars_dir or pyspark_jars_dir()
    for path in glob.glob(os.path.join(jars_dir, "zookeeper-3*.jar")):
        m = re.fullmatch(r"zookeeper-(\d+\.\d+\.\d+)\.jar", os.path.basename(path))
        if m:
            return m.group(1)
    return "unknown"


# --------------------------------------------------------------------------
# Small network helpers
# --------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """Would binding ``host:port`` (with SO_REUSEADDR, as ZooKeeper does) fail?"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def four_letter_word(host: str, port: int, word: str, timeout: float = 2.0) -> str:
    """Send a ZooKeeper four-letter word (``ruok``, ``srvr``, ``conf``, ...) and return the answer."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(word.encode("ascii"))
        chunks = []
        while True:
            data = s.recv(65536)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def _load_prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved here, in the parent: the child must not import or allocate between fork and exec.
_PRCTL = _load_prctl()
_PR_SET_PDEATHSIG = 1


def _set_pdeathsig() -> None:
    """``preexec_fn``: have the kernel SIGKILL this child when its parent dies (Linux)."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------
# The server
# --------------------------------------------------------------------------
class ZooKeeperServer:
    """One standalone ZooKeeper server process.

    :param port: client port; 0 picks a free one (kept across :meth:`restart`).
    :param data_dir: snapshots, transaction log, ``zoo.cfg``, ``zookeeper.log`` and
        ``zookeeper.out`` (the JVM's own stdout/stderr). ``None``: a temporary
        directory, removed by :meth:`close`.
    :param properties: extra ``zoo.cfg`` keys (ZooKeeper's names: ``tickTime``,
        ``maxSessionTimeout``, ...); ``clientPort`` and ``dataDir`` come from
        ``port`` and ``data_dir``.
    :param host: the address to bind and to connect to (``clientPortAddress``
        in ``properties`` wins).
    :param die_with_parent: on Linux, the JVM is killed when this process dies,
        even by SIGKILL (tests and foreground commands want this).
    """

    def __init__(
        self,
        port: int = 0,
        data_dir: str | os.PathLike | None = None,
        *,
        properties: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS,
        die_with_parent: bool = False,
    ):
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise ZooKeeperStartError(f"invalid port {port!r}: expected 0..65535 (0 = any free port)")
        props = {str(k): str(v) for k, v in (properties or {}).items()}
        for key in props:
            if key.startswith("server.") or key.startswith("group."):
                raise ZooKeeperStartError(
                    f"{key} configures a replicated ensemble; replikafka zookeeper runs one standalone server"
                )
        props.pop("clientPort", None)
        props.pop("dataDir", None)
        self.host = props.get("clientPortAddress", host) or host
        props["clientPortAddress"] = self.host
        self.properties = props
        self._auto_port = port == 0
        self.port = port
        self._owns_data_dir = data_dir is None
        self.data_dir = os.path.abspath(
            os.fspath(data_dir) if data_dir is not None else tempfile.mkdtemp(prefix="replikafka-zk-")
        )
        self.jvm_opts = tuple(jvm_opts)
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen | None = None
        self._out = None

    # ---- properties -------------------------------------------------------
    @property
    def connect_host(self) -> str:
        if self.host in ("0.0.0.0", "", "::"):
            return "127.0.0.1"
        return f"[{self.host}]" if ":" in self.host else self.host

    @property
    def connect_string(self) -> str:
        """``host:port`` for kazoo / ``zookeeper.connect`` (append ``/chroot`` as needed)."""
        return f"{self.connect_host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    @property
    def running(self) -> bool:
        return self.pid is not None

    @property
    def config_file(self) -> str:
        return os.path.join(self.data_dir, "zoo.cfg")

    @property
    def log_file(self) -> str:
        return os.path.join(self.data_dir, "zookeeper.log")

    @property
    def out_file(self) -> str:
        return os.path.join(self.data_dir, "zookeeper.out")

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def command(self) -> list[str]:
        """The JVM command line (Java located now)."""
        return [
            find_java(), *self.jvm_opts,
            f"-Dzookeeper.log.dir={self.data_dir}",
            f"-Dlog4j2.configurationFile={os.path.join(self.data_dir, 'log4j2.properties')}",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-cp", zookeeper_classpath(),
            MAIN_CLASS, self.config_file,
        ]

    # ---- lifecycle --------------------------------------------------------
    def start(self, timeout_s: float = 60.0) -> "ZooKeeperServer":
        """Start the JVM; return once the server answers clients. Idempotent."""
        if self.running:
            return self
        attempts = 3 if self._auto_port else 1
        for attempt in range(attempts):
            if self._auto_port and (self.port == 0 or attempt > 0):
                self.port = free_port(self.connect_host.strip("[]"))
            try:
                self._start_once(timeout_s)
                return self
            except _PortTaken:
                if attempt + 1 == attempts:
                    raise ZooKeeperStartError(
                        f"port {self.port} on {self.host} is already in use"
                    ) from None
        return self

    def _start_once(self, timeout_s: float) -> None:
        cmd = self.command()  # raises JavaNotFoundError before anything is written
        bind_host = "" if self.host in ("0.0.0.0", "::") else self.host
        if port_in_use(bind_host, self.port):
            raise _PortTaken()
        os.makedirs(self.data_dir, exist_ok=True)
        self._write_files()
        self._out = open(self.out_file, "ab")
        self._out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
        self._out.flush()
        log_size = os.path.getsize(self.log_file) if os.path.exists(self.log_file) else 0
        # die_with_parent: util-linux's setpriv sets the parent-death signal and
        # execs the JVM. A preexec_fn would run Python in a child forked from a
        # process that may run gRPC, which can abort the child.
        setpriv = shutil.which("setpriv") if self.die_with_parent else None
        if setpriv:
            cmd = [setpriv, "--pdeathsig", "KILL", *cmd]
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=self._out, stderr=subprocess.STDOUT,
            cwd=self.data_dir, start_new_session=True,
            preexec_fn=_set_pdeathsig if self.die_with_parent and not setpriv and _PRCTL is not None else None,
        )
        try:
            self._wait_serving(timeout_s, log_size)
        except BaseException:
            self.stop()
            raise

    def _wait_serving(self, timeout_s: float, log_size: int) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self._proc.poll()
            if code is not None:
                self._close_out()
                new_log = self._log_since(log_size)
                if "Address already in use" in new_log or "BindException" in new_log:
                    raise _PortTaken()
                raise ZooKeeperStartError(
                    f"ZooKeeper exited with code {code} while starting; "
                    f"{self._last_error(new_log) or 'see ' + self.out_file}"
                )
            if self._serving():
                return
            if time.monotonic() > deadline:
                raise ZooKeeperStartError(
                    f"ZooKeeper did not answer on {self.connect_string} within {timeout_s:g}s; see {self.log_file}"
                )
            time.sleep(0.05)

    def _serving(self) -> bool:
        """True once *our* server answers ``ruok`` and serves from our data directory."""
        host = self.connect_host.strip("[]")
        try:
            if four_letter_word(host, self.port, "ruok", timeout=1.0).strip() != "imok":
                return False
            conf = four_letter_word(host, self.port, "conf", timeout=1.0)
        except OSError:
            return False
        m = re.search(r"^dataDir=(.*)$", conf, re.M)
        if not m:
            return False  # answered, but not serving yet
        served = os.path.realpath(m.group(1).strip())
        if not (served == os.path.realpath(self.data_dir) or served.startswith(os.path.realpath(self.data_dir) + os.sep)):
            raise ZooKeeperStartError(
                f"another ZooKeeper (data dir {m.group(1).strip()}) already serves {self.connect_string}"
            )
        return True

    def _write_files(self) -> None:
        props = dict(DEFAULT_PROPERTIES)
        props.update(self.properties)
        props["dataDir"] = self.data_dir
        props["clientPort"] = str(self.port)
        allowed = [w.strip() for w in props["4lw.commands.whitelist"].split(",") if w.strip()]
        if "*" not in allowed:  # start() needs ruok and conf to see the server is up
            props["4lw.commands.whitelist"] = ",".join(allowed + [w for w in ("ruok", "conf") if w not in allowed])
        text = "# written by replikafka.zookeeper_server; rewritten at every start\n"
        text += "".join(f"{k}={_escape_prop(v)}\n" for k, v in props.items())
        with open(self.config_file, "w", encoding="utf-8") as f:
            f.write(text)
        with open(os.path.join(self.data_dir, "log4j2.properties"), "w", encoding="utf-8") as f:
            f.write(LOG4J2_PROPERTIES)

    def _log_since(self, offset: int) -> str:
        text = ""
        try:
            with open(self.log_file, "rb") as f:
                f.seek(offset)
                text = f.read().decode("utf-8", "replace")
        except OSError:
            pass
        return text + "\n" + _tail(self.out_file, 20)

    @staticmethod
    def _last_error(text: str) -> str:
        for line in reversed(text.splitlines()):
            if re.search(r"\b(ERROR|FATAL|Exception|Error)\b", line):
                return line.strip()[:300]
        return ""

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the JVM to exit; its exit code (None on timeout or when not started)."""
        if self._proc is None:
            return None
        try:
            return self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s``. Keeps the data. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            try:
                proc.terminate()
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            except ProcessLookupError:
                pass
        self._close_out()

    def kill(self) -> None:
        """SIGKILL the JVM at once (a crash, for fault-injection tests)."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self._close_out()

    def restart(self, timeout_s: float = 60.0) -> "ZooKeeperServer":
        """Stop and start again on the same port with the same data."""
        self.stop()
        self._auto_port = False  # keep the address clients know
        return self.start(timeout_s)

    def close(self) -> None:
        """Stop, and remove the data directory if it was a temporary one made here."""
        self.stop()
        if self._owns_data_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _close_out(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    def __enter__(self) -> "ZooKeeperServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid {self.pid}" if self.running else "stopped"
        return f"ZooKeeperServer({self.connect_string}, data_dir={self.data_dir!r}, {state})"


class _PortTaken(Exception):
    pass


def _escape_prop(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


__all__ = [
    "ZooKeeperServer", "JavaNotFoundError", "ZooKeeperStartError", "find_java", "java_major_version",
    "pyspark_jars_dir", "zookeeper_classpath", "zookeeper_version", "free_port", "port_in_use",
    "four_letter_word", "DEFAULT_PROPERTIES", "DEFAULT_JVM_OPTS", "PRODUCTION_JVM_PERFORMANCE_OPTS",
    "PRODUCTION_HEAP_OPTS",
]
