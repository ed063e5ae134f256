"""Log dir failure (KIP-112) on real mounts: a log dir on a small tmpfs fills up while
an acks=all producer writes; the dir goes offline, the controller hears of it through
/log_dir_event_notification and moves leadership to the other in-sync replicas, the
producer continues there after a retriable error, and no acknowledged record is lost.
The tests run as root and mount tmpfs (skipped, with the reason, where mounting is
impossible)."""
from __future__ import annotations

import collections
import os
import shutil
import subprocess

import pytest

import replikafka
from cluster_helpers import BackgroundProducer, read_committed, wait_until
from replikafka.local_cluster import LocalCluster

pytestmark = pytest.mark.integration


def _mount_tmpfs(path: str, size: str) -> None:
    os.makedirs(path, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", path], capture_output=True,
                          text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip() or done.returncode}): needs root and mount")


def _umount(path: str) -> None:
    subprocess.run(["umount", "-l", path], capture_output=True)


def _scan_copy(partition_dir: str, dst: str, clean: bool = False) -> dict:
    """Open a copy of a partition's log with the storage engine (the original is untouched).
    Unclean (the default), every batch of every segment is validated (framing, CRC-32C,
    Arrow, contiguous offsets) and the file cut at the first invalid byte: ``truncated_bytes``
    says how many bytes a torn tail held. Clean, the segments are trusted only if their
    indexes pass their sanity checks and the last one's tail frames whole (``recovered_segments``
    counts those that did not). Returns the load stats, the log end and (offset, value) pairs."""
    from replikafka.broker.storage import Log, LogConfig
    shutil.copytree(partition_dir, dst, ignore=shutil.ignore_patterns("*.tmp"))
    log = Log.open(dst, LogConfig(max_message_bytes=64 << 20), None, recovery_point=0, clean=clean)
    try:
        pairs, offset = [], log.log_start_offset
        while offset < log.log_end_offset:
            r = log.read(offset, 8 << 20, log.log_end_offset)
            for b in r.batches:
                pairs.extend(enumerate(b.column("value").to_pylist(), start=offset))
                offset += b.num_rows
        return dict(log.load_stats, log_end_offset=log.log_end_offset, pairs=pairs)
    finally:
        log.close()


def test_a_full_log_dir_goes_offline_leadership_moves_and_the_restarted_replica_is_intact(tmp_path, zk_connect):
    """The log dir fills, goes offline (KIP-112), leadership moves, 0 acknowledged records are
    lost; then the broker stops, the dir gets room (remounted bigger) and the broker starts
    again: its replica's log has no torn tail (whatever the ENOSPC left is cut by recovery),
    every batch passes its CRC, its end agrees with its index and recovery-point checkpoint,
    it rejoins the ISR, and it holds every acknowledged record exactly once."""
    base = str(tmp_path / "cluster")
    small = os.path.join(base, "broker-1-small")
    _mount_tmpfs(small, "3m")
    try:
        cluster = LocalCluster(base, 3, zookeeper_connect=zk_connect, die_with_parent=True, overrides={
            "zookeeper.session.timeout.ms": "4000", "replica.lag.time.max.ms": "4000",
            "auto.leader.rebalance.enable": "false"},
            broker_overrides={1: {"log.dirs": f"{small},{os.path.join(base, 'broker-1-logs')}"}})
        try:
            cluster.start()
            admin = replikafka.Admin(cluster.bootstrap_servers)
            # Broker 1 leads it, its log in the first (small) dir; "steady" lives on the other dirs.
            admin.create_topic("filling", assignment={0: [1, 2, 3]})
            admin.create_topic("steady", assignment={0: [2, 3, 1]})
            # create_topic returns before every replica has its log: wait for broker 1's
            wait_until(lambda: os.path.isdir(os.path.join(small, "filling-0")), 30, what="filling-0 on the small dir")
            producer = BackgroundProducer(cluster.bootstrap_servers, "filling", 1, batch=200).start()
            try:
                wait_until(lambda: admin.describe_topic("filling").partitions[0].leader != 1, 120,
                           what="leadership to leave the broker whose log dir filled up")
                moved_at = len(producer.log.acked)
                wait_until(lambda: len(producer.log.acked) > moved_at + 2000, 60,
                           what="writes to continue on the new leader")
            finally:
                log = producer.stop()
            assert cluster.alive(1), "one failed log dir of two must not stop the broker"
            tail = cluster.tail(1, 2000)
            assert f"log dir {small} is offline" in tail, tail
            state = admin.describe_topic("filling").partitions[0]
            assert 1 not in state.isr and state.leader in (2, 3)
            got = read_committed(cluster.bootstrap_servers, "filling", 1)
            lost = {k: v for k, v in log.acked.items() if got.get(k) != v}
            assert not lost, f"{len(lost)} acknowledged records lost, e.g. {list(lost.items())[:3]}"
            assert len(log.acked) > 0
            # The broker's other dir still serves: a write to "steady" (it follows it there) is acknowledged by all.
            with replikafka.Producer(cluster.bootstrap_servers, acks="all") as p:
                from cluster_helpers import kafka_batch
                p.send("steady", kafka_batch([b"s"]), partition=0).result(timeout=30)
            assert 1 in admin.describe_topic("steady").partitions[0].isr

            # Restart after the disk has room again. What the ENOSPC left on disk, before the restart:
            filling_dir = os.path.join(small, "filling-0")
            assert cluster.stop_broker(1) == 0
            assert not [n for n in os.listdir(filling_dir) if n.endswith(".tmp")], \
                f"a partial copy holds space on the full disk: {os.listdir(filling_dir)}"
            before = _scan_copy(filling_dir, str(tmp_path / "before"))
            subprocess.run(["mount", "-o", "remount,size=64m", small], check=True)
            cluster.start_broker(1)
            wait_until(lambda: 1 in admin.describe_topic("filling").partitions[0].isr, 120,
                       what="the restarted replica to rejoin the ISR")
            consumer = replikafka.Consumer(cluster.bootstrap_servers)
            end = consumer.end_offsets([("filling", 0)])[("filling", 0)]
            consumer.close()
            # Nothing is produced now: an ISR member holds the whole log; the copies are a still picture.
            after = _scan_copy(filling_dir, str(tmp_path / "after"))
            trusted = _scan_copy(filling_dir, str(tmp_path / "trusted"), clean=True)
            assert after["truncated_bytes"] == 0, f"a torn tail after recovery: {after}"
            assert after["log_end_offset"] == end == trusted["log_end_offset"]
            assert trusted["recovered_segments"] == 0, f"index or tail inconsistent with the data: {trusted}"
            from replikafka.broker.storage import RECOVERY_POINT_CHECKPOINT, OffsetCheckpointFile
            checkpoint = OffsetCheckpointFile(os.path.join(small, RECOVERY_POINT_CHECKPOINT)).read()
            recovery_point = checkpoint.get(("filling", 0), 0)
            assert 0 <= recovery_point <= end
            stored = dict(after["pairs"])
            counts = collections.Counter(stored.values())
            missing = {k: v for k, v in log.acked.items() if stored.get(k[1]) != v}
            assert not missing, f"{len(missing)} acknowledged records not in the restarted replica, " \
                                f"e.g. {list(missing.items())[:3]}"
            twice = [v for v in log.acked.values() if counts[v] != 1]
            assert not twice, f"{len(twice)} acknowledged records stored more than once, e.g. {twice[:3]}"
            print(f"log dir restart: torn tail before the restart {before['truncated_bytes']} bytes "
                  f"(recovery cut it), log end {end}, {len(log.acked)} acknowledged records all present once")
            admin.close()
        finally:
            cluster.stop()
    finally:
        _umount(small)


def _bind_read_only(path: str) -> None:
    for cmd in (["mount", "--bind", path, path], ["mount", "-o", "remount,bind,ro", path]):
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot bind-mount read-only here ({done.stderr.strip() or done.returncode})")


def test_a_log_dir_turning_read_only_at_runtime_goes_offline_with_no_acknowledged_loss(tmp_path, zk_connect):
    base = str(tmp_path / "cluster")
    ro = os.path.join(base, "broker-1-ro")
    os.makedirs(ro)
    cluster = LocalCluster(base, 3, zookeeper_connect=zk_connect, die_with_parent=True, overrides={
        "zookeeper.session.timeout.ms": "4000", "replica.lag.time.max.ms": "4000",
        "auto.leader.rebalance.enable": "false"},
        broker_overrides={1: {"log.dirs": f"{ro},{os.path.join(base, 'broker-1-logs')}"}})
    try:
        cluster.start()
        admin = replikafka.Admin(cluster.bootstrap_servers)
        admin.create_topic("frozen", assignment={0: [1, 2, 3]})
        wait_until(lambda: os.path.isdir(os.path.join(ro, "frozen-0")), 30, what="frozen-0 on the dir to turn read-only")
        producer = BackgroundProducer(cluster.bootstrap_servers, "frozen", 1, batch=20).start()
        try:
            wait_until(lambda: len(producer.log.acked) > 500, 60, what="some acknowledged writes")
            _bind_read_only(ro)
            wait_until(lambda: admin.describe_topic("frozen").partitions[0].leader != 1, 120,
                       what="leadership to leave the broker whose log dir turned read-only")
            moved_at = len(producer.log.acked)
            wait_until(lambda: len(producer.log.acked) > moved_at + 500, 60, what="writes on the new leader")
        finally:
            log = producer.stop()
        assert cluster.alive(1)
        assert f"log dir {ro} is offline" in cluster.tail(1, 2000)
        got = read_committed(cluster.bootstrap_servers, "frozen", 1)
        lost = {k: v for k, v in log.acked.items() if got.get(k) != v}
        assert not lost, f"{len(lost)} acknowledged records lost"
        admin.close()
    finally:
        cluster.stop()
        _umount(ro)


def test_a_read_only_log_dir_at_start_is_one_line_naming_it(tmp_path, zk_connect):
    import sys
    ro = str(tmp_path / "ro-logs")
    os.makedirs(ro)
    _bind_read_only(ro)
    try:
        props = tmp_path / "b.properties"
        props.write_text(f"broker.id=7\nlisteners=PLAINTEXT://127.0.0.1:0\nlog.dirs={ro}\nzookeeper.connect={zk_connect}\n")
        done = subprocess.run([sys.executable, "-m", "replikafka", "broker", str(props)], capture_output=True,
                              text=True, timeout=60)
        out = done.stdout + done.stderr
        assert done.returncode != 0 and ro in out and "Traceback" not in out, out
    finally:
        _umount(ro)
