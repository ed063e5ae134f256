"""The controller's side of the scale bench's failover rows, in one process, no brokers.

A real ZooKeeper (tests/zk_harness.py) holds N partition states (RF=3 over brokers
1-3, written by the real controller code); the real Controller runs its events
through ``do_work()`` with a channel manager whose channels keep what they are given
(the requests are encoded as the real manager encodes them, on the event thread;
their wire bytes are made after the event, timed apart as "wire"). Two scenarios,
each repeated:

* controller failover: broker 1 (the controller, in every ISR, leading a third) is
  gone; broker 2's controller is elected and loads, decides, writes and sends;
* broker failure: broker 2's controller sees broker 3 (leading a third) die.

Between rounds the states are written back as they were. ``--root DIR`` loads the
package from another worktree (DIR/python/replikafka, DIR/broker) to compare an
older commit with this one in one driver, rounds interleaved. Usage::

    python bench/controller_inproc.py --partitions 50000 --rounds 3 [--root /work/wt-old ...]

Prints one line per round and scenario: phases in seconds (wall), the event's CPU
seconds in this process (every thread: the event thread and kazoo's) and in
ZooKeeper, and the 1-minute load. On a shared machine the CPU figures vary less.
Each round starts with the next version in turn; at the end, each version's medians
over the rounds after the first (round 0 warms ZooKeeper's JIT up).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import queue
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _load_from(root: str) -> None:
    """Import replikafka (and replikafka.broker) from the worktree at ``root``."""
    for name, path in (("replikafka", f"{root}/python/replikafka"), ("replikafka.broker", f"{root}/broker")):
        spec = importlib.util.spec_from_file_location(name, f"{path}/__init__.py", submodule_search_locations=[path])
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        if "." in name:
            setattr(sys.modules[name.rsplit(".", 1)[0]], name.rsplit(".", 1)[1], mod)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def child(args) -> None:
    """One process per code version: set up (or reuse) the states, then run rounds on command."""
    if args.root:
        _load_from(args.root[0])
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from kazoo.client import KazooClient
    from replikafka.broker import zk_store as Z
    from replikafka.broker.controller import controller as C
    from replikafka.broker.controller import controller_events as V
    from replikafka.broker.controller.broker_channels import ControllerChannelManager
    from replikafka import records as R

    lines = _Lines()
    logging.getLogger("replikafka.controller").addHandler(lines)
    logging.getLogger("replikafka.controller").setLevel(logging.INFO)

    # --broker-load: what else runs in a broker's process, sharing the GIL with its
    # controller (py-spy of a real 20,000-partition controller failover: the event thread
    # had a tenth of the samples of the housekeeping, fetcher and RPC threads).
    own_broker = []                 # the new controller's broker id, while an event runs
    decoded = []                    # (seconds) an UpdateMetadata to the own broker took to decode
    work: "queue.Queue" = queue.Queue()

    def own_broker_thread():
        """The controller's own broker takes what is queued to it as a broker does
        (replica_rpc decodes it, the metadata cache applies it), as soon as it is queued."""
        from replikafka.broker import replica_rpc
        from replikafka.broker.metadata_cache import MetadataCache
        from replikafka.protocol import replikafka_pb2 as pb
        cache = MetadataCache()
        while True:
            method, req = work.get()
            if method == "UpdateMetadata":
                t = time.perf_counter()
                cache.update(replica_rpc.update_metadata_request(pb.UpdateMetadataRequest.FromString(bytes(req))))
                decoded.append(time.perf_counter() - t)
            work.task_done()

    class Housekeeping:
        """A broker's periodic scans of every partition (ISR checks every 500 ms, log
        maintenance every 1000 ms), as BrokerServer runs them: skipped while the
        controller is busy where the code has Controller.busy. A pass holds the GIL
        6 us per partition, as the real ISR pass did at 20,000 (py-spy: 0.12 s a pass)."""
        PER_PARTITION_S = 6e-6

        def __init__(self, n, interval_s):
            self.items = [[i, i % 7, None] for i in range(n)]
            self.interval_s = interval_s
            self.controller = None
            t = time.perf_counter()
            self.one_pass()
            self.repeat = max(1, round(self.PER_PARTITION_S * n / (time.perf_counter() - t)))

        def one_pass(self):
            for item in self.items:
                if item[1] > 3 and item[2] is None:
                    item[0] += 1

        def run(self):
            while event_running.wait():   # between events they only load the shared machine
                time.sleep(self.interval_s)
                c = self.controller
                if c is not None and hasattr(c, "busy") and c.busy(10.0):
                    continue
                for _ in range(self.repeat):
                    self.one_pass()

    event_running = threading.Event()

    def busy_thread():
        """A thread of the broker's that does not wait for its controller (a replica
        fetcher, an RPC handler): Python code that wants the GIL all the time, while an
        event runs (idle otherwise: the other versions' processes run their events meanwhile)."""
        x = 0
        while event_running.wait():
            for i in range(1000):
                x += i
    for _ in range(args.gil_load):
        threading.Thread(target=busy_thread, daemon=True).start()
    if args.multi_ops:
        Z.MULTI_OPS_MAX = args.multi_ops
    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)

    housekeepers = []
    if args.broker_load:
        threading.Thread(target=own_broker_thread, daemon=True).start()
        for interval in (0.5, 1.0):
            h = Housekeeping(args.partitions, interval)
            housekeepers.append(h)
            threading.Thread(target=h.run, daemon=True).start()

    class KeptChannel:
        def __init__(self, bid):
            self.broker_id, self.kept = bid, []

        def send(self, method, request, on_response=None):
            self.kept.append((method, request))
            if self.broker_id in own_broker:
                work.put((method, request))

        def idle(self):
            return True

        def close(self):
            pass

    class KeepingChannels(ControllerChannelManager):
        def set_brokers(self, live):
            with self.lock:
                self.channels = {b: self.channels.get(b) or KeptChannel(b) for b in live}

        def wire(self) -> tuple[float, int]:
            t, n = time.perf_counter(), 0
            seen: dict[int, int] = {}
            for ch in self.channels.values():
                for _m, req in ch.kept:
                    if id(req) not in seen:
                        seen[id(req)] = len(req if isinstance(req, (bytes, bytearray, memoryview))
                                            else req.SerializeToString())
                    n += seen[id(req)]
                ch.kept.clear()
            return time.perf_counter() - t, n

    zk_hosts, chroot, n = args.zk, args.chroot, args.partitions

    def client(read_only=False):
        zk = KazooClient(hosts=zk_hosts + chroot, timeout=60)
        zk.start()
        return zk

    admin = client()
    regs = {}

    def register(b):
        zk = client()
        Z.ZkStore(zk).register_broker(b, "127.0.0.1", 9000 + b)
        regs[b] = zk

    def unregister(b):
        regs.pop(b).stop()

    store = Z.ZkStore(admin)
    store.ensure_paths()
    for b in (1, 2, 3):
        register(b)
    schema = R.schema_to_bytes(R.stored_schema(R.KAFKA_SCHEMA))
    if not admin.retry(admin.exists, Z.topic_path("scale")):
        assignment = C.random_assignment(n, 3, [1, 2, 3])
        store.create_topic("scale", assignment, schema, {"topic.id": "x"})
        boot = C.Controller(1, Z.ZkStore(regs[1]))
        boot.channels = KeepingChannels()
        boot.enqueue(V.Elect())
        while boot.do_work():
            pass
        boot.active = False
    assignment = admin.retry(store.get_assignment, "scale")
    tps = [("scale", p) for p in sorted(assignment)]
    # The states every round starts from: the preferred replica leads, all in sync.
    initial = {tp: Z.LeaderAndIsr(assignment[tp[1]][0], 0, tuple(assignment[tp[1]]), 1) for tp in tps}

    def restore():
        for b in (1, 2, 3):   # first: a registration newer than a state is a restarted ISR member
            if b not in regs:
                register(b)
        cur = admin.retry(store.get_partition_states, tps)
        _epoch, version = admin.retry(store.controller_epoch)
        Z.guarded_state_writes(admin, version, {tp: (initial[tp], cur[tp][1]) for tp in tps})
        if admin.retry(admin.exists, Z.CONTROLLER):
            admin.retry(admin.delete, Z.CONTROLLER)

    def new_controller(b):
        c = C.Controller(b, Z.ZkStore(regs[b]))
        c.channels = KeepingChannels()
        return c

    def zk_cpu() -> float:
        if not args.zk_pid:
            return 0.0
        with open(f"/proc/{args.zk_pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    cpu = {}

    def run_event(c, event):
        lines.lines.clear()
        decoded.clear()
        own_broker[:] = [c.broker_id]
        for h in housekeepers:
            h.controller = c
        c.enqueue(event)
        spy = None
        if args.py_spy:   # the event alone, sampled from outside (py-spy in this interpreter's venv)
            spy_out = os.path.join(args.py_spy, f"{type(event).__name__}-{time.time():.0f}.txt")
            spy = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "py-spy"), "record", "--pid",
                                    str(os.getpid()), "--rate", "500", "--threads", "--idle", "--format", "raw",
                                    "-o", spy_out], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(2.0)      # attached before the event starts
        event_running.set()
        t, p, z = time.perf_counter(), time.process_time(), zk_cpu()
        while c.do_work():
            pass
        total = time.perf_counter() - t
        event_running.clear()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        cpu.update(cpu_s=time.process_time() - p, zk_cpu_s=zk_cpu() - z)
        if args.broker_load:
            work.join()          # the own broker's decode, after the event (not counted in its time)
            own_broker.clear()
            cpu.update(own_um_s=sum(decoded))
        wire_s, wire_n = c.channels.wire()
        return total, wire_s, wire_n, list(lines.lines)

    print("ready", flush=True)
    for line in sys.stdin:
        what = line.strip()
        if what == "quit":
            break
        restore()
        out = {}
        if what == "failover":
            unregister(1)
            time.sleep(0.2)
            c = new_controller(2)
            total, wire_s, wire_n, got = run_event(c, V.Elect())
            m = next((re.search(r"in ([\d.]+)s \(read ([\d.]+)s, decided and wrote (\d+) states .* in ([\d.]+)s, "
                                r"sent ([\d.]+)s\)", l) for l in got if "controller failover: loaded" in l), None)
            out = {"total": total, "read": float(m.group(2)), "decide_write": float(m.group(4)),
                   "send": float(m.group(5)), "written": int(m.group(3)), "wire": wire_s, "wire_mb": wire_n / 1e6}
        elif what == "brokerfail":
            c = new_controller(2)
            run_event(c, V.Elect())
            c.channels.wire()
            unregister(3)
            time.sleep(0.2)
            total, wire_s, wire_n, got = run_event(c, V.BrokerChange())
            m = next((re.search(r"written and sent in ([\d.]+)s \((\d+) new leaders in ([\d.]+)s", l)
                      for l in got if "written and sent in" in l), None)
            out = {"total": total, "leaders": float(m.group(3)), "all": float(m.group(1)),
                   "new_leaders": int(m.group(2)), "wire": wire_s, "wire_mb": wire_n / 1e6}
        c.active = False
        c.channels.close()
        out.update(cpu)
        print(json.dumps(out), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", action="append", default=[], help="another worktree to compare (repeatable)")
    ap.add_argument("--scenarios", default="failover,brokerfail")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--zk", default="")
    ap.add_argument("--chroot", default="")
    ap.add_argument("--zk-pid", type=int, default=0)
    ap.add_argument("--zk-full-jit", action="store_true", help="ZooKeeper without -XX:TieredStopAtLevel=1")
    ap.add_argument("--zk-production-jvm", action="store_true",
                    help="ZooKeeper with the scale bench's JVM options (replikafka zookeeper's, 1 GB heap)")
    ap.add_argument("--broker-load", action="store_true",
                    help="run the controller among a broker's other work: its own broker decodes what is sent to "
                         "it, and two threads scan N partitions every 0.5 s and 1 s (skipped while the "
                         "controller is busy, where the code has Controller.busy)")
    ap.add_argument("--gil-load", type=int, default=0, metavar="N",
                    help="N threads running Python code all the time beside the controller (a broker's fetchers "
                         "and RPC handlers, which do not wait for it)")
    ap.add_argument("--multi-ops", type=int, default=0, help="ops per ZooKeeper multi (zk_store.MULTI_OPS_MAX)")
    ap.add_argument("--switch-interval-ms", type=float, default=0.0,
                    help="the process's sys.setswitchinterval (default Python's 5 ms)")
    ap.add_argument("--py-spy", default="", metavar="DIR",
                    help="record each event with py-spy (raw stacks with thread names, idle ones too, 500 Hz) "
                         "into DIR; py-spy pauses the process to sample it, so read shares, not seconds")
    ap.add_argument("--zk-no-sync", action="store_true",
                    help="ZooKeeper with forceSync=no (the tests' setting) instead of its default fsync of each "
                         "transaction log write (as in the scale bench's cluster)")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    sys.path.insert(0, os.path.join(HERE, "..", "tests"))
    from zk_harness import TEST_ZK_PROPERTIES, connected_client, new_chroot
    from replikafka.zookeeper_server import DEFAULT_JVM_OPTS, PRODUCTION_JVM_PERFORMANCE_OPTS, ZooKeeperServer
    with tempfile.TemporaryDirectory() as d:
        # A larger heap than the default 256 MB: one chroot per code version holds N
        # partitions' znodes, and 256 MB ran out with two of 50,000.
        jvm = ("-Xmx1g",) + tuple(o for o in DEFAULT_JVM_OPTS if not o.startswith("-Xmx")
                                  and not (args.zk_full_jit and o.startswith("-XX:TieredStopAtLevel")))
        if args.zk_production_jvm:
            jvm = ("-Xmx1g",) + PRODUCTION_JVM_PERFORMANCE_OPTS
        props = dict(TEST_ZK_PROPERTIES)
        if not args.zk_no_sync:
            props.pop("forceSync")
        server = ZooKeeperServer(port=0, data_dir=d, properties=props, die_with_parent=True,
                                 jvm_opts=jvm)
        server.start(timeout_s=60)
        try:
            hosts = f"{server.host}:{server.port}"
            admin = connected_client(hosts)
            roots = [""] + args.root
            procs = []
            for root in roots:
                chroot = new_chroot(admin, "ctl")
                cmd = [sys.executable, os.path.abspath(__file__), "--child", "--zk", hosts, "--chroot", chroot,
                       "--zk-pid", str(server.pid or 0),
                       "--partitions", str(args.partitions)] + (["--root", root] if root else []) + (
                           ["--broker-load"] if args.broker_load else []) + (
                           ["--py-spy", args.py_spy] if args.py_spy else []) + [
                           "--gil-load", str(args.gil_load), "--multi-ops", str(args.multi_ops),
                           "--switch-interval-ms", str(args.switch_interval_ms)]
                procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
                assert procs[-1].stdout.readline().strip() == "ready"   # set up one at a time
            results: dict = {}
            for r in range(args.rounds):
                for scenario in args.scenarios.split(","):
                    # each round starts with the next version: none is always first after another's writes
                    order = [(roots[(r + i) % len(roots)], procs[(r + i) % len(roots)]) for i in range(len(roots))]
                    for root, p in order:
                        p.stdin.write(scenario + "\n")
                        p.stdin.flush()
                        res = json.loads(p.stdout.readline())
                        if r > 0:      # round 0 warms ZooKeeper's JIT up
                            results.setdefault((scenario, root), []).append(res)
                        print(f"round {r} {scenario:10s} {root or 'this':24s} load {os.getloadavg()[0]:5.2f} "
                              + " ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in res.items()), flush=True)
            for (scenario, root), runs in results.items():
                print(f"median of rounds 1-{args.rounds - 1} {scenario:10s} {root or 'this':24s} "
                      + " ".join(f"{k}={statistics.median(run[k] for run in runs):.3f}" for k in runs[0]
                                 if isinstance(runs[0][k], float)), flush=True)
            for p in procs:
                p.stdin.write("quit\n")
                p.stdin.flush()
                p.wait(timeout=60)
            admin.stop()
        finally:
            server.close()


if __name__ == "__main__":
    main()
