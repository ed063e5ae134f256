"""Operator tools of issue 6 against real broker processes and a real ZooKeeper:
``replica-verification`` (debugging fetches to every replica) and
``state-change-log-merger`` (the brokers' own state-change.log files)."""
from __future__ import annotations

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
from datetime import datetime

import pytest

import replikafka
from cluster_helpers import kafka_batch, wait_until
from replikafka.client.connection import ConnectionPool
from replikafka.protocol import replikafka_pb2 as pb

pytestmark = pytest.mark.integration

TOPIC = "tools.check-1"          # '.' and '-' in the name, on purpose
RECORDS = 600                    # per partition, in sends of 50


def cli(*argv, timeout=90):
    return subprocess.run([sys.executable, "-m", "replikafka", *argv], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def verify(cluster, *extra):
    return cli("replica-verification", "--bootstrap-server", cluster.bootstrap_servers,
               "--topic-white-list", r"tools\.check-.*", *extra)


def value(p: int, i: int) -> bytes:
    return f"value-{p}-{i:06d}".encode()


def produce(cluster, topic: str, partitions: int, first: int = 0, count: int = RECORDS) -> None:
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:
        futures = [prod.send(topic, kafka_batch([value(p, i) for i in range(start, start + 50)]), partition=p)
                   for start in range(first, first + count, 50) for p in range(partitions)]
        prod.flush()
        for f in futures:
            f.result(timeout=60)


def settled(admin, topic, brokers=3):
    """Every replica in the ISR and HW == LEO on every partition (as the leaders see it)."""
    return all(len(p.isr) == brokers and p.high_watermark is not None and p.high_watermark == p.log_end_offset
               for p in admin.describe_topic(topic).partitions)   # None: a new leader's HW not yet known (KIP-207)


def replicas_settled(cluster, admin, topic) -> bool:
    """settled(), and every replica itself knows: its own HW == LEO == the leader's
    LEO (a follower learns the HW one fetch later). Asked with debugging fetches."""
    if not settled(admin, topic, len(cluster.ids)):
        return False
    pool = ConnectionPool()
    try:
        for p in admin.describe_topic(topic).partitions:
            seen = set()
            for b in p.replicas:
                req = pb.FetchRequest(replica_id=-2, max_wait_ms=0, partitions=[pb.FetchPartition(
                    topic=topic, partition=p.partition, fetch_offset=1 << 62, current_leader_epoch=-1)])
                try:
                    r = pool.call(cluster.address(b), "Fetch", req, 10).partitions[0]
                except replikafka.ReplikafkaError:
                    return False
                if r.error.code:
                    return False
                seen.add((r.high_watermark, r.log_end_offset))
            if len(seen) != 1:
                return False
            hw, leo = seen.pop()
            if hw != leo:
                return False
        return True
    finally:
        pool.close()


def a_follower(admin, topic, partition) -> int:
    p = admin.describe_topic(topic).partitions[partition]
    return next(r for r in p.replicas if r != p.leader)


def flip_value_byte(cluster, broker: int, topic: str, partition: int, needle: bytes) -> str:
    """Change one byte of a stored value in a replica's segment file, in place
    (the batch's header and stored CRC stay as they were). Returns the file."""
    d = os.path.join(cluster.base_dir, f"broker-{broker}-logs", f"{topic}-{partition}")
    for path in sorted(glob.glob(os.path.join(d, "*.arrows"))):
        with open(path, "r+b") as f:
            data = f.read()
            at = data.find(needle)
            if at >= 0:
                f.seek(at + len(needle) - 1)
                f.write(bytes([data[at + len(needle) - 1] ^ 0x01]))
                f.flush()
                os.fsync(f.fileno())
                return path
    raise AssertionError(f"{needle!r} is in no segment of {d}")


def difference_offsets(out: str) -> list[tuple[str, int, int]]:
    """(topic, partition, offset) of each reported difference."""
    return [(t, int(p), int(o)) for t, p, o in
            re.findall(r"difference in topic (\S+) partition (\d+) at offset (\d+)", out)]


def test_replica_verification_agrees_then_finds_a_follower_corrupted_on_disk(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic(TOPIC, partitions=2, replication_factor=3)
    admin.create_topic("other", partitions=1, replication_factor=3)       # not in the white list
    produce(cluster, TOPIC, 2)
    wait_until(lambda: replicas_settled(cluster, admin, TOPIC), 30, what="full ISR, HW == LEO")

    r = verify(cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Verifying 2 partitions of 1 topic (tools.check-1)" in r.stdout
    assert "max lag is 0 for partition" in r.stdout
    assert re.search(r"Compared \d+ batches of 2 partitions .*: 0 differences", r.stdout), r.stdout
    assert not difference_offsets(r.stdout)

    # A follower of partition 0 stops cleanly; meanwhile it cannot be verified.
    victim = a_follower(admin, TOPIC, 0)
    assert cluster.stop_broker(victim) == 0
    r = verify(cluster)
    assert r.returncode == 3, r.stdout + r.stderr
    assert f"cannot read topic {TOPIC} partition 0 on replica {victim}" in r.stdout

    # A value byte changes on its disk. After a clean shutdown the broker trusts its
    # segments (no CRC scan), so it serves the changed bytes once it is back.
    flip_value_byte(cluster, victim, TOPIC, 0, value(0, 123))
    cluster.start_broker(victim)
    wait_until(lambda: replicas_settled(cluster, admin, TOPIC), 30, what=f"broker {victim} back in the ISR")
    r = verify(cluster)
    assert r.returncode == 1, r.stdout + r.stderr
    found = difference_offsets(r.stdout)
    assert len(found) == 1 and found[0][:2] == (TOPIC, 0), r.stdout
    assert found[0][2] <= 123, r.stdout           # the batch holding offset 123
    others = ",".join(str(b) for b in cluster.ids if b != victim)
    assert f"replica {victim} differs from replicas {others}" in r.stdout
    assert "corrupt" in r.stdout
    assert "1 difference" in r.stdout
    # the broker was not hurt by serving it
    assert cluster.alive(victim) and admin.describe_topic(TOPIC).partitions[0].leader > 0
    admin.close()


def test_replica_verification_sees_live_corruption_and_no_difference_after_recovery(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic(TOPIC, partitions=1, replication_factor=3)
    produce(cluster, TOPIC, 1)
    wait_until(lambda: replicas_settled(cluster, admin, TOPIC), 30, what="full ISR, HW == LEO")
    victim = a_follower(admin, TOPIC, 0)

    # Reads are memory-mapped: a byte changed under a running follower is what it serves.
    flip_value_byte(cluster, victim, TOPIC, 0, value(0, 517))
    r = verify(cluster)
    assert r.returncode == 1, r.stdout + r.stderr
    found = difference_offsets(r.stdout)
    assert len(found) == 1 and found[0][:2] == (TOPIC, 0) and found[0][2] <= 517, r.stdout
    assert f"replica {victim} differs" in r.stdout

    # kill -9: recovery checks every batch's CRC, cuts the log at the bad one, and
    # the follower fetches the rest again from the leader: the replicas agree again.
    cluster.kill(victim)
    produce(cluster, TOPIC, 1, first=RECORDS, count=100)
    cluster.start_broker(victim)
    wait_until(lambda: replicas_settled(cluster, admin, TOPIC), 30, what=f"broker {victim} back in the ISR")
    r = verify(cluster)
    assert r.returncode == 0, r.stdout + r.stderr
    assert re.search(r": 0 differences", r.stdout)
    assert "recovery of" in open(cluster.log_path(victim), errors="replace").read()

    # --report-interval-ms: keeps verifying new data, a max-lag line per interval, until interrupted.
    proc = subprocess.Popen([sys.executable, "-m", "replikafka", "replica-verification", "--bootstrap-server",
                             cluster.bootstrap_servers, "--topic-white-list", TOPIC, "--report-interval-ms", "200",
                             "--max-wait-ms", "100"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("Verifying 1 partitions of 1 topic"), first + proc.stderr.read()
        assert "max lag is 0 for partition tools.check-1-0 at offset 700" in proc.stdout.readline()
        produce(cluster, TOPIC, 1, first=RECORDS + 100, count=50)
        wait_until(lambda: settled(admin, TOPIC), 30, what="HW == LEO")
        seen = []
        while "max lag is 0 for partition tools.check-1-0 at offset 750" not in (seen or [""])[-1]:
            seen.append(proc.stdout.readline())       # a line every ~0.2 s
            assert seen[-1] and len(seen) < 200, seen
        assert not any("difference" in line for line in seen)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err
    assert out.splitlines()[-1] == "Stopped: 0 differences found" and "Traceback" not in err
    admin.close()


LOG_TIME = re.compile(r"^[^:]+: \[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})\]")


def entry_times(lines):
    return [datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f") for line in lines if (m := LOG_TIME.match(line))]


def test_state_change_log_merger_over_three_brokers(cluster_factory, tmp_path):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("orders", partitions=3, replication_factor=3)
    admin.create_topic("orders.eu-1", partitions=2, replication_factor=2)   # its tokens look like orders.eu-1-0
    # a leader change: more entries, from the controller and from the brokers
    leader = admin.describe_topic("orders").partitions[1].leader
    cluster.kill(leader)
    wait_until(lambda: admin.describe_topic("orders").partitions[1].leader not in (leader, -1), 30,
               what="a new leader of orders-1")
    cluster.start_broker(leader)
    wait_until(lambda: settled(admin, "orders"), 30, what="full ISR")
    admin.close()

    # The brokers keep writing: the checks read a copy of their logs taken now.
    logs = []
    for b in cluster.ids:
        os.makedirs(tmp_path / f"broker-{b}-logs")
        logs.append(str(tmp_path / f"broker-{b}-logs" / "state-change.log"))
        shutil.copyfile(os.path.join(cluster.base_dir, f"broker-{b}-logs", "state-change.log"), logs[-1])
    r = cli("state-change-log-merger", "--logs", ",".join(logs))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    total = sum(1 for path in logs for _ in open(path))
    assert len(lines) == total
    labels = {line.split(": ", 1)[0] for line in lines}
    assert labels == {f"broker-{b}-logs/state-change.log" for b in cluster.ids}
    times = entry_times(lines)
    assert len(times) == total and times == sorted(times), "not in time order"

    # --topic/--partitions: whole topic-partition tokens only
    r = cli("state-change-log-merger", "--logs-regex", os.path.join(re.escape(str(tmp_path)), r"broker-\d-logs",
                                                                    r"state-change\.log"),
            "--topic", "orders", "--partitions", "1")
    assert r.returncode == 0, r.stderr
    picked = r.stdout.splitlines()
    assert len({line.split(": ", 1)[0] for line in picked}) == 3, "every broker has entries about orders-1"
    assert any("becomes LEADER" in line for line in picked) and any("becomes FOLLOWER" in line for line in picked)
    for line in picked:
        assert re.search(r"(?<![\w.-])orders-1(?![\w.-])", line), line
    assert entry_times(picked) == sorted(entry_times(picked))
    expected = [line for line in lines if re.search(r"(?<![\w.-])orders-1(?![\w.-])", line)]
    assert picked == expected

    r = cli("state-change-log-merger", "--logs", ",".join(logs), "--topic", "orders.eu-1")
    assert r.returncode == 0 and r.stdout
    assert all(re.search(r"orders\.eu-1-[01]\b", line) for line in r.stdout.splitlines())

    # --start-time / --end-time: the entries of the restart only
    middle = times[len(times) // 2]
    start = middle.strftime("%Y-%m-%d %H:%M:%S,") + f"{middle.microsecond // 1000:03d}"
    r = cli("state-change-log-merger", "--logs", ",".join(logs), "--start-time", start)
    assert r.returncode == 0
    later = entry_times(r.stdout.splitlines())
    assert later and min(later) >= middle and len(later) == sum(1 for t in times if t >= middle)
    r = cli("state-change-log-merger", "--logs", ",".join(logs), "--end-time", middle.isoformat())
    assert entry_times(r.stdout.splitlines()) == [t for t in times if t <= middle]

    r = cli("state-change-log-merger", "--logs", logs[0] + ",/nonexistent/state-change.log")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr
