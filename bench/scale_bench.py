"""`./build.sh bench scale`: N partitions, RF=3, on 3 local brokers.

N is REPLIKAFKA_BENCH_PARTITIONS (default 50,000, the issue's size; scale it
down for a quick check). Every broker holds N replicas and leads about N/3.
Figures, each with a baseline measured in the same run where one exists:

* create the topic: until CreateTopic returns, and until every broker has
  taken up its N replicas; baseline: N znode writes (pipelined) to the same
  ZooKeeper, the floor of any create that writes one state znode per partition;
* broker memory (RSS) and open file descriptors per 10,000 replicas, as the
  growth over the same broker before the topic existed;
* restart to serve after SIGTERM and after SIGKILL: from launching the process
  to it having taken up its N replicas (its LeaderAndIsr handled); baseline:
  the same broker's start with no partitions, at the beginning of the run;
* failover of the third led by one broker: the controller noticing -> all new
  leaders, -> every one of those partitions accepted a write. The writes go to
  every new leader at once (one thread per leader, one Produce of its partitions
  each, repeated for those not ready), as producers would: until 2026-11-23 17:30
  UTC the bench sent one leader's Produce after the other, and found the leaders
  by describe_topic (Metadata plus a ListOffsets of every partition) polled every
  2 s before writing, so that row's figures before then are not comparable (13.1 s
  at 20,000 then); then one acks=all write to each (answered once the other
  survivor has it: replication of the failed-over partitions under that load);
* ISR re-entry after each restart: until every ISR is full again (the leaders
  take the restarted follower back as it catches up), bounded by ISR_WAIT_S; a
  run that reaches the bound reports how many ISRs were still short and goes on;
* controller failover: the new controller's load + resend of N partitions.

REPLIKAFKA_BENCH_SKIP_SIGTERM_RESTART=1 leaves out the restart after SIGTERM and
its ISR wait (for a run after the failover rows alone; the victim then leads its
third since the topic's creation); set REPLIKAFKA_BENCH_ISR_WAIT_S low with it to
shorten the other ISR waits. The restart after SIGKILL stays: the controller
failover needs the three brokers back.

Leaders and ISRs are read from Metadata alone (``ClusterMetadata``), never with
describe_topic's ListOffsets of every partition, which loaded the brokers it polled.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import grpc

import replikafka
from bench.replication_bench import _first_line, _wait
from replikafka.client.connection import ConnectionPool, parse_bootstrap
from replikafka.client.metadata import ClusterMetadata
from replikafka.errors import RequestTimedOutError
from replikafka.local_cluster import LocalCluster
from replikafka.zookeeper_server import PRODUCTION_JVM_PERFORMANCE_OPTS
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

PARTITIONS = int(os.environ.get("REPLIKAFKA_BENCH_PARTITIONS", "50000"))
TOPIC = "scale"
#: The longest the bench waits for every ISR to be full again (s): past it, the row says
#: how many were still short and the run goes on to its later phases.
ISR_WAIT_S = float(os.environ.get("REPLIKAFKA_BENCH_ISR_WAIT_S", "600"))
#: Between two metadata reads of the whole topic while waiting (s): each answer costs a
#: broker seconds at 50,000 partitions, and polling faster slowed what it waited for.
POLL_S = 2.0
#: Where the brokers' logs are copied when the run ends (unset: not kept): the controller's
#: and brokers' log lines give each failover's phases.
LOGS_DIR = os.environ.get("REPLIKAFKA_BENCH_LOGS_DIR", "")
#: The bench's ZooKeeper: a 1 GB heap (see run()) and a server's JVM options, as
#: ``replikafka zookeeper`` starts it (not the tests' fast-start, C1-only JIT).
ZOOKEEPER_JVM_OPTS = ("-Xmx1g",) + PRODUCTION_JVM_PERFORMANCE_OPTS
#: Leave out the restart after SIGTERM (module docstring).
SKIP_SIGTERM_RESTART = os.environ.get("REPLIKAFKA_BENCH_SKIP_SIGTERM_RESTART", "") == "1"
_CHANNEL_OPTS = [("grpc.max_receive_message_length", 256 << 20), ("grpc.max_send_message_length", 256 << 20)]


def _proc_usage(pid: int) -> tuple[int, int]:
    """(RSS bytes, open fds) of a process."""
    with open(f"/proc/{pid}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def _zk_floor(cluster: LocalCluster, n: int) -> float:
    """Seconds to write n ~100-byte znodes, pipelined 1,000 at a time."""
    zk = cluster.zk()
    try:
        zk.ensure_path("/bench-floor")
        data = b"x" * 100
        t = time.perf_counter()
        for lo in range(0, n, 1000):
            for r in [zk.create_async(f"/bench-floor/p{i}", data) for i in range(lo, min(n, lo + 1000))]:
                r.get()
        took = time.perf_counter() - t
        for lo in range(0, n, 1000):
            for r in [zk.delete_async(f"/bench-floor/p{i}") for i in range(lo, min(n, lo + 1000))]:
                r.get()
        zk.delete("/bench-floor")
        return took
    finally:
        zk.stop()
        zk.close()


def _poll(predicate, timeout_s: float, what: str):
    """``_wait`` for predicates that read the whole topic's metadata: every POLL_S."""
    deadline = time.time() + timeout_s
    while True:
        v = predicate()
        if v:
            return v
        if time.time() > deadline:
            raise RuntimeError(f"bench scale: timed out waiting for {what}")
        time.sleep(POLL_S)


def _partitions(md: ClusterMetadata):
    """The topic's partitions (partition -> PartitionInfo) from one Metadata request."""
    md.refresh([TOPIC])
    return md.topic(TOPIC).partitions


def _isr_short(md: ClusterMetadata) -> list:
    """The partitions whose ISR is not full (all 3 replicas)."""
    return [p for p, info in _partitions(md).items() if len(info.isr) < len(info.replicas)]


def _wait_isr_full(md: ClusterMetadata, since: float, bound_s: float) -> tuple[float, int]:
    """(seconds from ``since`` until every ISR was full, or until the bound; ISRs still short)."""
    deadline = time.time() + bound_s
    while True:
        short = len(_isr_short(md))
        if not short or time.time() > deadline:
            return time.time() - since, short
        time.sleep(POLL_S)


#: A broker's log line once it handled a LeaderAndIsr (replica_manager.leader_and_isr).


def _took_up(cluster: LocalCluster, broker_id: int, n: int, after: float) -> float | None:
    """When the broker's log says it handled a LeaderAndIsr covering all n replicas."""
    got = _first_line(cluster, broker_id, rf"LeaderAndIsr from .*: {n} partitions in", after)
    return got[0] if got else None


def _restart(cluster: LocalCluster, broker_id: int, n: int) -> float:
    """Launch the broker; seconds until it has taken up its n replicas."""
    launched = time.time()
    cluster.start_broker(broker_id, wait=False)
    done = _wait(lambda: _took_up(cluster, broker_id, n, launched), 1800, f"broker {broker_id} to serve")
    return done - launched


def _one_record() -> tuple[bytes, int]:
    """A one-record IPC stream for the topic and its CRC-32C: made before the kill (its
    first making imports pandas, a second of the write phase at 300 partitions)."""
    from replikafka import records as R
    b = R.to_record_batch([{"value": b"x"}], R.parse_schema("value BINARY"), timestamp_ms=0)
    payload = R.encode_stream(b.schema, [b]).to_pybytes()
    return payload, R.records_crc32c(payload)


def _write_all(cluster: LocalCluster, md: ClusterMetadata, partitions: list[int], since: float,
               record: tuple[bytes, int], acks: int = 1) -> None:
    """One record to each partition: one Produce request to each leader, sent to every
    leader at once (a thread each, as producers write to their leaders in parallel),
    repeated for the partitions not ready yet: when it returns every one accepted a
    write. Raises naming how many never did (and how many have no leader) after 900 s.
    Each round's line says when it started, in seconds after ``since``; ``record``: from
    :func:`_one_record`; ``acks``: the Produce's (-1: all, each answer once the ISR has it)."""
    payload, crc = record
    todo = set(partitions)
    stubs: dict[int, pbg.ReplikafkaStub] = {}
    deadline = time.time() + 900

    def produce(leader: int, parts: list[int]) -> tuple[set[int], str]:
        t = time.time()
        resp = stubs[leader].Produce(pb.ProduceRequest(acks=acks, timeout_ms=30000, partitions=[
            pb.PartitionProduceData(topic=TOPIC, partition=p, records=payload, records_crc32c=crc)
            for p in parts]), timeout=300)
        codes: dict[str, int] = {}
        for r in resp.partitions:
            codes[r.error.code] = codes.get(r.error.code, 0) + 1
        return ({r.partition for r in resp.partitions if not r.error.code},
                f"produce to {leader}: {len(parts)} partitions in {time.time() - t:.2f}s, codes {codes}")

    while todo and time.time() < deadline:
        t = time.time()
        known = _partitions(md)
        leaders: dict[int, list[int]] = {}
        for p in todo:
            leader = known[p].leader
            if leader >= 0 and cluster.alive(leader):
                leaders.setdefault(leader, []).append(p)
        took = [f"at {t - since:.2f}s: metadata {time.time() - t:.2f}s"]
        for leader in leaders:
            if leader not in stubs:
                stubs[leader] = pbg.ReplikafkaStub(grpc.insecure_channel(cluster.address(leader),
                                                                         options=_CHANNEL_OPTS))
        if leaders:
            with ThreadPoolExecutor(len(leaders)) as pool:
                for accepted, line in pool.map(lambda item: produce(*item), leaders.items()):
                    todo -= accepted
                    took.append(line)
        # Where the time goes (the write phase's rounds), on stderr with the figures.
        print(f"scale: write round: {'; '.join(took)}; {len(todo)} left", file=sys.stderr, flush=True)
        if todo:
            time.sleep(0.1)
    if todo:
        known = _partitions(md)
        leaderless = sum(1 for p in todo if known[p].leader < 0)
        raise RuntimeError(f"{len(todo)} partitions never accepted a write ({leaderless} have no leader)")


def run() -> list[dict]:
    n = PARTITIONS
    root = tempfile.mkdtemp(prefix="scale-bench-")
    rows: list[dict] = []

    def row(metric, value, unit, baseline=None):
        r = dict(bench="scale", metric=metric, value=value, unit=unit)
        if baseline is not None:
            r.update(baseline=baseline, ratio=value / baseline if baseline else float("nan"))
        rows.append(r)
        # As it goes: a long run that fails later still shows what it measured.
        print(f"scale: {metric}: {value:.3f} {unit}" + (f" (baseline {baseline:.3f})" if baseline else ""),
              file=sys.stderr, flush=True)

    def isr_rows(what, seconds, short):
        row(f"{what}" + (f" (bound {ISR_WAIT_S:.0f} s reached)" if short else ""), seconds, "s")
        if short:
            row(f"{what}: ISRs still short at the bound", short, "partitions")

    cluster = LocalCluster(os.path.join(root, "c"), 3, die_with_parent=True,
                           # ZooKeeper with 1 GB, not the 256 MB of its defaults (small for tests): at
                           # 50,000 partitions it ran out (old generation full, 30 full collections,
                           # 33 s of them, writes answered after minutes; once it died) while the
                           # leaders widened ISRs and the controller wrote 33,333 states.
                           zookeeper_jvm_opts=ZOOKEEPER_JVM_OPTS,
                           # Kafka's default session timeout: shorter ones expired under the GIL
                           # of a broker taking up 50,000 partitions on a loaded machine (the
                           # failover figures count from the controller noticing, not from the kill).
                           overrides={"zookeeper.session.timeout.ms": "18000",
                                      "replica.lag.time.max.ms": "60000",
                                      "controlled.shutdown.max.retries": "3",
                                      "message.max.bytes": str(64 << 20)})
    try:
        cluster.start()
        controller = _wait(lambda: cluster.controller_id() if cluster.controller_id() > 0 else None, 60,
                           "a controller")
        victim = next(b for b in cluster.ids if b != controller)
        # Baselines: an empty broker's restart, its RSS and fds, the ZooKeeper write floor.
        cluster.stop_broker(victim)
        launched = time.time()
        cluster.start_broker(victim)
        empty_start = time.time() - launched
        empty_rss, empty_fds = _proc_usage(cluster.procs[victim].pid)
        floor = _zk_floor(cluster, n)

        # 5 minutes a request: a 50,000-partition metadata answer on a loaded machine took over 30 s.
        admin = replikafka.Admin(cluster.bootstrap_servers, request_timeout_ms=300_000)
        md_pool = ConnectionPool()
        md = ClusterMetadata(md_pool, parse_bootstrap(cluster.bootstrap_servers),
                             request_timeout_ms=300_000)
        t0 = time.time()
        try:
            admin.create_topic(TOPIC, partitions=n, replication_factor=3, schema="value BINARY",
                               config={"min.insync.replicas": "2"}, timeout_ms=1_800_000)
        except RequestTimedOutError:
            # The broker waits at most 2 minutes for every partition to have a leader; the
            # creation goes on (as Kafka's CreateTopics after its timeout): wait for it here.
            _wait(lambda: (lambda ps: len(ps) == n and all(i.leader >= 0 for i in ps.values()))(_partitions(md)),
                  1800, "every partition led")
        created = time.time()
        taken = [_wait(lambda b=b: _took_up(cluster, b, n, t0), 1800, f"broker {b} to take up its replicas")
                 for b in cluster.ids]
        row(f"create topic, {n} partitions RF=3: CreateTopic returns", created - t0, "s", floor)
        row(f"create topic, {n} partitions RF=3: all replicas taken up", max(taken) - t0, "s", floor)
        isr_rows("create topic: every ISR full", *_wait_isr_full(md, t0, ISR_WAIT_S))

        rss, fds = _proc_usage(cluster.procs[victim].pid)
        row("broker RSS per 10,000 replicas", (rss - empty_rss) / n * 10_000 / 2**20, "MiB")
        row("broker open fds per 10,000 replicas", (fds - empty_fds) / n * 10_000, "fds")

        if not SKIP_SIGTERM_RESTART:
            # Restart after SIGTERM (controlled shutdown, clean-shutdown marker).
            t = time.time()
            cluster.stop_broker(victim, timeout_s=600)
            row(f"SIGTERM -> exited, {n} replicas", time.time() - t, "s")
            serving = _restart(cluster, victim, n)
            row(f"restart after SIGTERM -> serving {n} replicas", serving, "s", empty_start)
            isr_rows("after the SIGTERM restart: serving -> every ISR full",
                     *_wait_isr_full(md, cluster.launched_ms[victim] / 1000 + serving, ISR_WAIT_S))
        # Put the victim back at the head of its partitions so it leads a third.
        admin_led = lambda: [p for p, i in _partitions(md).items() if i.leader == victim]
        if not admin_led():
            _preferred_election(cluster)
            _poll(lambda: len(admin_led()) >= n // 3 - 1, 600, "preferred leaders back")
        # A partition whose ISR holds the victim alone cannot fail over (no clean
        # leader is left): the failover rows count the others and say how many.
        parts = _partitions(md)
        led = [p for p, i in parts.items() if i.leader == victim and len(i.isr) > 1]
        alone = sum(1 for i in parts.values() if i.leader == victim and len(i.isr) <= 1)
        if alone:
            row("failover: partitions left out (the victim alone in their ISR)", alone, "partitions")

        # Failover of the third it leads (SIGKILL), then its restart after SIGKILL.
        survivors = [b for b in cluster.ids if b != victim]
        record = _one_record()
        killed_at = time.time()
        cluster.kill(victim)
        noticed = _wait(lambda: _first_line(cluster, controller, rf"brokers \[{victim}\] failed", killed_at - 1),
                        60, "the controller noticing")[0]
        # Every new leader is in place once each survivor has handled the LeaderAndIsr
        # that failover sent it (its log line's time): a metadata read of the whole
        # topic takes seconds at this size, too coarse to time it by polling.
        # The LeaderAndIsr naming exactly the victim's partitions: any LeaderAndIsr line
        # after the kill matched before 2026-11-23 19:50 UTC, and on a loaded machine the
        # topic creation's 50,000-partition requests (retried after their timeout) were
        # still being handled then, so that row could read seconds when it took 45 s.
        handled = [_wait(lambda b=b: _took_up(cluster, b, len(led) + alone, noticed), 600,
                         f"broker {b} to handle the failover's LeaderAndIsr") for b in survivors]
        # The writes start at once, as a producer's retries would: a round skips the partitions
        # the metadata still gives the dead leader and the next round (0.1 s on) retries them
        # (polling the metadata every POLL_S for all new leaders first added up to 2 s).
        _write_all(cluster, md, led, noticed, record)
        all_written = time.time()
        # Then a write with acks=all (the producer's default) to each: answered once the
        # other survivor has it, so this times replication of the failed-over partitions
        # while the first writes are still being fetched.
        _write_all(cluster, md, led, all_written, record, acks=-1)
        all_replicated = time.time()
        row(f"failover of {len(led)} partitions: noticed -> all new leaders", max(handled) - noticed, "s")
        decided = _wait(lambda: _first_line(cluster, controller, r"partition states written and sent in", noticed),
                        600, "the controller's failover line")
        leaders_sent = re.search(r"new leaders in ([0-9.]+)s", decided[1])
        if leaders_sent:   # the controller's part: new leaders written and their LeaderAndIsr queued
            row("failover: controller noticed -> new leaders written and sent", float(leaders_sent.group(1)), "s")
        row(f"failover of {len(led)} partitions: noticed -> all accept writes", all_written - noticed, "s")
        row("failover: then a write with acks=all to each, until every one is acknowledged", all_replicated - all_written,
            "s")
        serving = _restart(cluster, victim, n)
        row(f"restart after SIGKILL -> serving {n} replicas", serving, "s", empty_start)
        isr_rows("after the SIGKILL restart: serving -> every ISR full",
                 *_wait_isr_full(md, cluster.launched_ms[victim] / 1000 + serving, ISR_WAIT_S))

        # Controller failover.
        killed_at = time.time()
        cluster.kill(controller)
        line = _wait(lambda: next((l for b in cluster.ids if b != controller and cluster.alive(b)
                                   for l in [_first_line(cluster, b, r"controller failover: loaded", killed_at)]
                                   if l), None), 120, "a new controller")
        row(f"controller failover, {n} partitions: load + resend",
            float(re.search(r"in ([0-9.]+)s", line[1]).group(1)), "s")
        admin.close()
        md_pool.close()
    finally:
        cluster.stop()
        if LOGS_DIR:
            os.makedirs(LOGS_DIR, exist_ok=True)
            for b in cluster.ids:
                shutil.copy(cluster.log_path(b), LOGS_DIR)
        shutil.rmtree(root, ignore_errors=True)
    return rows


def _preferred_election(cluster: LocalCluster) -> None:
    from replikafka.cli.main import main as cli
    cli(["preferred-replica-election", "--zookeeper", cluster.zookeeper_connect])


if __name__ == "__main__":
    from bench.__main__ import print_table
    print_table(run())
