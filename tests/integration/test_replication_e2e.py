"""Issue 4, end to end with real ZooKeeper and broker processes: divergent logs
repaired by leader-epoch truncation (KIP-101, KIP-279), and an idempotent
producer's retry across a leader change after its acknowledgement was lost on
the wire.

Divergence is made for real: followers are SIGSTOPped for a moment (they stay
in the ISR and keep their ZooKeeper sessions), the leader takes ``acks=1``
records no follower has, and is SIGKILLed; a follower leads the next epoch
and writes other records at the same offsets. When the old leader comes back
it must truncate where the new leader's copy of its epoch ends, which its
broker log states (``... by leader epoch ...``), and end identical to the new
leader.

The lost acknowledgement is lost on the wire: every broker advertises a
loopback TCP proxy run by this test; the proxy in front of the leader stops
passing the leader's answers to this test process (HTTP/2 frames are counted,
so the test knows the Produce answer was sent and dropped), then the leader is
killed and the producer retries against the new leader.
"""
from __future__ import annotations

import glob
import os
import re
import socket
import threading
import time

import grpc
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

import replikafka
from cluster_helpers import kafka_batch, replica_values, wait_until
from replikafka.broker.zk_store import ZkStore
from replikafka.local_cluster import LocalCluster
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg

pytestmark = pytest.mark.integration

#: Cluster settings shared by these tests: a follower paused for a moment stays
#: in the ISR (long lag time), leadership never moves back by itself, and a
#: SIGTERM at the end of a test stops a broker at once.
QUIET = dict(replica_lag_time_max_ms=30000, auto_leader_rebalance_enable="false",
             controlled_shutdown_enable="false", zookeeper_session_timeout_ms=3000)


# ---------------------------------------------------------------- helpers
def replica_records(cluster, broker_id: int, topic: str, partition: int) -> list[tuple[int, int, bytes]]:
    """(offset, leader epoch, value) of every record in a replica's segment
    files, read with plain pyarrow and the batches' own header metadata."""
    d = os.path.join(cluster.base_dir, f"broker-{broker_id}-logs", f"{topic}-{partition}")
    out = []
    for path in sorted(glob.glob(os.path.join(d, "*.arrows"))):
        with open(path, "rb") as f:
            data = f.read()
        try:
            reader = ipc.open_stream(pa.py_buffer(data))
            while True:
                try:
                    batch, meta = reader.read_next_batch_with_custom_metadata()
                except StopIteration:
                    break
                base, epoch = int(meta[b"rk.base_offset"]), int(meta[b"rk.leader_epoch"])
                out.extend((base + i, epoch, v) for i, v in enumerate(batch.column("value").to_pylist()))
        except (pa.ArrowInvalid, OSError):
            pass  # a torn tail of the active segment ends the read
    return out


def create_topic_assigned(cluster, name: str, replicas: list[int], config: dict[str, str]) -> None:
    """One partition with this exact replica list (the first replica leads),
    through the CreateTopic RPC's explicit assignment; returns once every
    broker's metadata shows it with its leader."""
    req = pb.CreateTopicRequest(name=name, partitions=1, replication_factor=len(replicas), config=config,
                                assignment={0: pb.ReplicaList(replicas=replicas)}, timeout_ms=30_000)
    with grpc.insecure_channel(cluster.address(replicas[0])) as ch:
        resp = pbg.ReplikafkaStub(ch).CreateTopic(req, timeout=40)
    assert not resp.error.code, resp.error

    def everywhere():
        for b in cluster.ids:
            with grpc.insecure_channel(cluster.address(b)) as ch:
                md = pbg.ReplikafkaStub(ch).Metadata(pb.MetadataRequest(topics=[name]), timeout=10)
            ts = [t for t in md.topics if t.name == name and not t.error.code]
            if not ts or not ts[0].partitions or ts[0].partitions[0].leader != replicas[0]:
                return False
        return True
    wait_until(everywhere, 30, what=f"topic {name} in every broker's metadata")


class ZkView:
    """Leader, epoch and ISR as the controller wrote them to ZooKeeper (no RPC to
    a broker, which may be paused or dead)."""

    def __init__(self, cluster):
        self.zk = cluster.zk()
        self.store = ZkStore(self.zk)

    def state(self, topic: str, partition: int = 0):
        got = self.store.get_partition_state(topic, partition)
        return got[0] if got else None

    def wait_leader(self, topic: str, leader: int, min_epoch: int, timeout_s: float = 30):
        return wait_until(lambda: (s := self.state(topic)) is not None and s.leader == leader
                          and s.leader_epoch >= min_epoch and s, timeout_s,
                          what=f"broker {leader} to lead {topic} in epoch >= {min_epoch}")

    def close(self):
        self.zk.stop()
        self.zk.close()


def roles(cluster, n: int) -> tuple[list[int], int]:
    """``n`` brokers that are not the controller (so killing them is only a
    leader change), and the controller."""
    controller = wait_until(lambda: cluster.controller_id() if cluster.controller_id() > 0 else None,
                            30, what="a controller")
    others = [b for b in cluster.ids if b != controller]
    return others[:n], controller


def send_all(producer, topic: str, prefix: str, batches: int, per_batch: int) -> dict[int, bytes]:
    """Sends ``batches`` batches and waits for each; returns offset -> value."""
    acked = {}
    for i in range(batches):
        values = [f"{prefix}-{i * per_batch + j}".encode() for j in range(per_batch)]
        meta = producer.send(topic, kafka_batch(values), partition=0).result(timeout=60)
        acked.update({meta.base_offset + j: v for j, v in enumerate(values)})
    return acked


def wait_caught_up(cluster, zk, topic: str, followers, values: list[bytes]):
    """Every follower has ``values`` (the whole log so far) in its files and is in the ISR."""
    wait_until(lambda: all(replica_values(cluster, f, topic, 0) == values for f in followers)
               and set(followers) <= set(zk.state(topic).isr), 30, what=f"followers {list(followers)} caught up")


def pause_followers(cluster, *ids):
    """SIGSTOP followers, then let their pending long-poll fetches at the leader
    (``replica.fetch.wait.max.ms`` = 200 ms) expire empty, so that a record the
    leader takes next is not already on its way to a stopped follower. (Should
    one be, the tests below read where the new leader starts from its answers.)"""
    for x in ids:
        cluster.pause(x)
    time.sleep(0.5)


def log_size(cluster, broker_id: int) -> int:
    try:
        return os.path.getsize(cluster.log_path(broker_id))
    except OSError:
        return 0


def log_since(cluster, broker_id: int, start: int) -> str:
    with open(cluster.log_path(broker_id), "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


TRUNCATION = re.compile(r"follower (\d+) truncating (\S+)-(\d+) from (\d+) to (\d+) (by leader epoch|by high watermark)"
                        r" \(asked epoch (-?\d+); leader epoch (-?\d+) ends at (-?\d+); HW (\d+)\)")


def truncations(text: str, topic: str) -> list[dict]:
    return [dict(broker=int(m[1]), frm=int(m[4]), to=int(m[5]), how=m[6], asked=int(m[7]),
                 leader_epoch=int(m[8]), end=int(m[9]), hw=int(m[10]))
            for m in TRUNCATION.finditer(text) if m[2] == topic]


def wait_converged(cluster, topic: str, replicas: list[int], expected_len: int, timeout_s: float = 40):
    """Every replica back in the ISR, HW == LEO == ``expected_len`` and the same
    records in every replica's files."""
    admin = replikafka.Admin(cluster.bootstrap_servers)
    try:
        def done():
            p = admin.describe_topic(topic).partitions[0]
            if sorted(p.isr) != sorted(replicas) or p.high_watermark != p.log_end_offset \
                    or p.log_end_offset != expected_len:
                return False
            logs = [replica_records(cluster, b, topic, 0) for b in replicas]
            return all(lg == logs[0] for lg in logs) and len(logs[0]) == expected_len
        try:
            wait_until(done, timeout_s, interval_s=0.2, what=f"{topic}: replicas {replicas} converged")
        except AssertionError as exc:
            logs = {b: replica_records(cluster, b, topic, 0) for b in replicas}
            first = logs[replicas[0]]
            diff = {b: next((i for i, (x, y) in enumerate(zip(first, lg)) if x != y), min(len(first), len(lg)))
                    for b, lg in logs.items()}
            raise AssertionError(f"{exc}; lengths {({b: len(lg) for b, lg in logs.items()})}, first offset "
                                 f"differing from broker {replicas[0]}: {diff}") from None
    finally:
        admin.close()


def check_log(records, acked_all: dict[int, bytes], produced: set[bytes], expected: list[bytes]):
    offsets = [o for o, _, _ in records]
    values = [v for _, _, v in records]
    assert offsets == list(range(len(records))), "offsets are not dense from 0"
    lost = {o: v for o, v in acked_all.items() if o >= len(values) or values[o] != v}
    assert not lost, f"records acknowledged with acks=all lost or moved: {sorted(lost.items())[:5]}"
    foreign = [v for v in values if v not in produced]
    assert not foreign, f"records the test never produced: {foreign[:5]}"
    assert len(set(values)) == len(values), "a record is stored twice"
    assert values == expected


# ---------------------------------------------------------------- KIP-101
def test_restarted_old_leader_truncates_its_divergent_tail_by_leader_epoch(cluster_factory):
    """The old leader comes back with a tail (acks=1) the new leader never had
    and a stale high watermark (no HW checkpoint before its crash, as after a
    crash right after a commit): truncating to the HW would throw away
    committed records too, the epoch cuts exactly the divergent tail."""
    cluster = cluster_factory(3, **QUIET, replica_high_watermark_checkpoint_interval_ms=3_600_000)
    (a, b), _controller = roles(cluster, 2)
    topic = "kip101"
    create_topic_assigned(cluster, topic, [a, b], {"min.insync.replicas": "1"})
    zk = ZkView(cluster)
    e0 = zk.state(topic).leader_epoch
    produced: set[bytes] = set()
    with replikafka.Producer(cluster.bootstrap_servers, acks="all", linger_ms=0) as p:
        committed = send_all(p, topic, "committed", 4, 25)                      # [0, 100) on a and b
    n0 = len(committed)
    produced |= set(committed.values())
    wait_caught_up(cluster, zk, topic, [b], list(committed.values()))

    # The leader alone takes a tail: its follower is stopped (still in the ISR).
    with replikafka.Producer(cluster.address(a), acks="1", idempotent=False, linger_ms=0) as p:
        p.partitions_for(topic)
        pause_followers(cluster, b)
        try:
            tail = send_all(p, topic, "old-leader-tail", 3, 10)                 # [100, 130) on a only
            produced |= set(tail.values())
            cluster.kill(a)
        finally:
            cluster.resume(b)
    assert sorted(tail) == list(range(n0, n0 + 30))

    e1 = zk.wait_leader(topic, b, e0 + 1).leader_epoch
    with replikafka.Producer(cluster.address(b), acks="all", linger_ms=0) as p:
        new = send_all(p, topic, "new-leader", 2, 25)                           # [100, 150) in epoch e1
    produced |= set(new.values())
    m = min(new)            # where epoch e1 starts: b's log end when it took over (100 unless a fetch was in flight)
    assert n0 <= m < n0 + 30, f"no divergence to repair: the new leader starts at {m}"
    acked_all = {**committed, **new}

    before = log_size(cluster, a)
    cluster.start_broker(a)
    wait_converged(cluster, topic, [a, b], m + 50)

    recs_a, recs_b = replica_records(cluster, a, topic, 0), replica_records(cluster, b, topic, 0)
    assert recs_a == recs_b
    expected = ([committed[o] for o in range(n0)] + [tail[o] for o in range(n0, m)]
                + [new[o] for o in range(m, m + 50)])
    check_log(recs_a, acked_all, produced, expected)
    assert not any(v in tail.values() for o, _, v in recs_a if o >= m), "the old leader's divergent tail survived"
    assert [e for _, e, _ in recs_a] == [e0] * m + [e1] * 50

    # How: asked about its own latest epoch e0, the new leader said e0 ends at m: truncate there.
    cuts = truncations(log_since(cluster, a, before), topic)
    assert cuts, f"broker {a} logged no truncation of {topic}:\n{log_since(cluster, a, before)[-3000:]}"
    assert cuts[0] == dict(broker=a, frm=n0 + 30, to=m, how="by leader epoch", asked=e0, leader_epoch=e0,
                           end=m, hw=0), cuts          # HW 0: truncating to it would have dropped [0, m)
    assert all(c["how"] == "by leader epoch" for c in cuts), cuts
    zk.close()


def test_unclean_leader_then_old_leader_whose_hw_covers_its_tail_truncates_by_epoch(cluster_factory):
    """KIP-101's divergence in its sharpest form: the old leader's *high
    watermark* covers its divergent tail (it was alone in the ISR), and the new
    leader was elected uncleanly. Truncating to the HW would keep that tail and
    the two replicas would hold different records at the same committed offsets;
    only the epoch says where to cut."""
    cluster = cluster_factory(3, **{**QUIET, "replica_lag_time_max_ms": 1000,
                                    "replica_high_watermark_checkpoint_interval_ms": 200,
                                    "zookeeper_session_timeout_ms": 6000})
    (a, b), _controller = roles(cluster, 2)
    topic = "kip101u"
    create_topic_assigned(cluster, topic, [a, b], {"min.insync.replicas": "1",
                                                   "unclean.leader.election.enable": "true"})
    zk = ZkView(cluster)
    e0 = zk.state(topic).leader_epoch
    with replikafka.Producer(cluster.bootstrap_servers, acks="all", linger_ms=0) as p:
        committed = send_all(p, topic, "both", 2, 25)                           # [0, 50) on a and b
    n0 = len(committed)
    wait_caught_up(cluster, zk, topic, [b], list(committed.values()))
    hw_file = os.path.join(cluster.base_dir, f"broker-{a}-logs", "replication-offset-checkpoint")

    def checkpointed_hw():
        try:
            with open(hw_file) as f:
                return next((int(ln.split()[2]) for ln in f if ln.startswith(f"{topic} 0 ")), None)
        except OSError:
            return None

    with replikafka.Producer(cluster.address(a), acks="all", idempotent=False, linger_ms=0) as p:
        p.partitions_for(topic)
        pause_followers(cluster, b)
        try:
            wait_until(lambda: list(zk.state(topic).isr) == [a], 10, what="the ISR to shrink to the leader")
            tail = send_all(p, topic, "old-leader-tail", 3, 10)                 # [50, 80), committed on a alone
            wait_until(lambda: checkpointed_hw() == n0 + 30, 10, what="the old leader's HW checkpoint")
            cluster.kill(a)
        finally:
            cluster.resume(b)
    assert sorted(tail) == list(range(n0, n0 + 30))

    e1 = zk.wait_leader(topic, b, e0 + 1).leader_epoch                         # unclean: b was not in the ISR
    with replikafka.Producer(cluster.address(b), acks="all", linger_ms=0) as p:
        new = send_all(p, topic, "new-leader", 2, 25)                           # [50, 100) in epoch e1
    m = min(new)
    assert n0 <= m < n0 + 30, f"no divergence to repair: the new leader starts at {m}"

    before = log_size(cluster, a)
    cluster.start_broker(a)
    wait_converged(cluster, topic, [a, b], m + 50)
    recs_a, recs_b = replica_records(cluster, a, topic, 0), replica_records(cluster, b, topic, 0)
    assert recs_a == recs_b, "the replicas diverge"
    produced = set(committed.values()) | set(tail.values()) | set(new.values())
    expected = ([committed[o] for o in range(n0)] + [tail[o] for o in range(n0, m)]
                + [new[o] for o in range(m, m + 50)])
    # The tail acknowledged by the old leader alone is the loss unclean election accepts.
    check_log(recs_a, {**committed, **new}, produced, expected)
    assert [e for _, e, _ in recs_a] == [e0] * m + [e1] * 50

    cuts = truncations(log_since(cluster, a, before), topic)
    assert cuts and (cuts[0]["how"], cuts[0]["frm"], cuts[0]["to"]) == ("by leader epoch", n0 + 30, m), cuts
    assert cuts[0]["hw"] == n0 + 30, f"the old leader should have restarted with its HW over its tail: {cuts}"
    assert "UNCLEAN leader election" in "".join(cluster.tail(x, 2000) for x in cluster.ids)
    zk.close()


# ---------------------------------------------------------------- KIP-279
def test_fast_repeated_failover_with_divergent_tails_converges_by_epoch(cluster_factory):
    """Two leader changes in quick succession (a -> b -> c), each old leader left
    with a tail no one else has, neither of them caught up when the next change
    comes. Epochs: a led e0, b led e1 (part of which c has), c leads e2. Then a
    and b restart together: a must cut where e0 ends on c, b where e1 ends on c
    (keeping the e1 records c has), and all three must end identical."""
    cluster = cluster_factory(3, **QUIET)
    (a, b), c = roles(cluster, 2)           # c, the controller, is never killed
    topic = "kip279"
    create_topic_assigned(cluster, topic, [a, b, c], {"min.insync.replicas": "1"})
    zk = ZkView(cluster)
    e0 = zk.state(topic).leader_epoch
    with replikafka.Producer(cluster.bootstrap_servers, acks="all", linger_ms=0) as p:
        committed = send_all(p, topic, "e0", 4, 20)                             # [0, 80) everywhere
    n0 = len(committed)
    wait_caught_up(cluster, zk, topic, [b, c], list(committed.values()))

    # e0: a alone takes a tail, dies.
    with replikafka.Producer(cluster.address(a), acks="1", idempotent=False, linger_ms=0) as p:
        p.partitions_for(topic)
        pause_followers(cluster, b, c)
        try:
            tail_a = send_all(p, topic, "a-tail", 3, 10)                        # [80, 110) on a only
            cluster.kill(a)
        finally:
            cluster.resume(b)
            cluster.resume(c)
    e1 = zk.wait_leader(topic, b, e0 + 1).leader_epoch

    # e1: b commits some records with c, then alone takes a tail, and dies at once.
    with replikafka.Producer(cluster.address(b), acks="all", linger_ms=0) as p:
        shared_b = send_all(p, topic, "b-shared", 2, 10)                        # [80, 100) on b and c
    wait_caught_up(cluster, zk, topic, [c], replica_values(cluster, b, topic, 0))
    with replikafka.Producer(cluster.address(b), acks="1", idempotent=False, linger_ms=0) as p:
        p.partitions_for(topic)
        pause_followers(cluster, c)
        try:
            tail_b = send_all(p, topic, "b-tail", 2, 10)                        # [100, 120) on b only
            cluster.kill(b)
        finally:
            cluster.resume(c)
    e2 = zk.wait_leader(topic, c, e1 + 1).leader_epoch

    # e2: c writes over both tails' offsets.
    with replikafka.Producer(cluster.address(c), acks="all", linger_ms=0) as p:
        new_c = send_all(p, topic, "c", 3, 20)                                  # [100, 160) in e2
    # Where each epoch starts (80 and 100 unless a fetch was in flight when a follower stopped):
    m1, m2, end_b = min(shared_b), min(new_c), max(tail_b) + 1
    assert n0 <= m1 < n0 + 30 and m1 + 20 <= m2 < end_b == m1 + 40, (n0, m1, m2, end_b)

    before = {x: log_size(cluster, x) for x in (a, b)}
    cluster.start_broker(a, wait=False)
    cluster.start_broker(b, wait=False)
    cluster.wait_registered([a, b])
    wait_converged(cluster, topic, [a, b, c], m2 + 60)

    recs = {x: replica_records(cluster, x, topic, 0) for x in (a, b, c)}
    assert recs[a] == recs[c] and recs[b] == recs[c]
    by_b = {**shared_b, **tail_b}
    produced = set(committed.values()) | set(tail_a.values()) | set(by_b.values()) | set(new_c.values())
    expected = ([committed[o] for o in range(n0)] + [tail_a[o] for o in range(n0, m1)]
                + [by_b[o] for o in range(m1, m2)] + [new_c[o] for o in range(m2, m2 + 60)])
    check_log(recs[c], {**committed, **shared_b, **new_c}, produced, expected)
    assert [e for _, e, _ in recs[c]] == [e0] * m1 + [e1] * (m2 - m1) + [e2] * 60

    cut_a = truncations(log_since(cluster, a, before[a]), topic)
    cut_b = truncations(log_since(cluster, b, before[b]), topic)
    # a asked about e0, which on c ends where e1 starts.
    assert cut_a and (cut_a[0]["how"], cut_a[0]["frm"], cut_a[0]["to"]) == ("by leader epoch", n0 + 30, m1) \
        and (cut_a[0]["asked"], cut_a[0]["leader_epoch"], cut_a[0]["end"]) == (e0, e0, m1), cut_a
    # b asked about e1: c has e1 only up to where its own e2 starts, so b keeps the e1 records c has.
    assert cut_b and (cut_b[0]["how"], cut_b[0]["frm"], cut_b[0]["to"]) == ("by leader epoch", end_b, m2) \
        and (cut_b[0]["asked"], cut_b[0]["leader_epoch"], cut_b[0]["end"]) == (e1, e1, m2), cut_b
    zk.close()


# ---------------------------------------------------------------- lost acknowledgement
def _client_socket_inode(client_port: int, server_port: int) -> str | None:
    """Inode of the TCP socket whose local port is ``client_port`` and remote
    port ``server_port`` (the connecting end, seen from the kernel)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == client_port and \
                    int(fields[2].rsplit(":", 1)[1], 16) == server_port:
                return fields[9]
    return None


def _socket_inodes_of_this_process() -> set[str]:
    out = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(target[8:-1])
    return out


class Http2ResponseDropper:
    """Loopback TCP proxy in front of one broker (the broker advertises it).

    Bytes are passed through both ways, except that while ``armed`` the bytes
    the broker sends on connections opened *by this test process* (the
    producer; brokers' own connections are other processes) are discarded.
    Those bytes are HTTP/2 frames; a HEADERS frame with END_STREAM ends one
    gRPC answer, so ``answers_dropped`` counts the answers that were produced
    by the broker and never reached the client. When the broker side closes,
    the client side is closed too (the client sees the connection fail)."""

    def __init__(self, upstream):
        self.upstream = upstream            # () -> (host, port), read at each connection
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.armed = False
        self.answers_dropped = 0
        self.lock = threading.Lock()
        self.sockets: list[socket.socket] = []
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name=f"proxy-{self.port}").start()

    def _accept(self):
        while not self.closed:
            try:
                client, (_, client_port) = self.listener.accept()
            except OSError:
                return
            ours = _client_socket_inode(client_port, self.port) in _socket_inodes_of_this_process()
            try:
                server = socket.create_connection(self.upstream(), timeout=2)
                server.settimeout(None)
            except OSError:
                client.close()              # the broker is down: the client sees the connection fail
                continue
            with self.lock:
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, False, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True, ours), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, from_broker: bool, ours: bool):
        pending = bytearray()   # broker -> this process: bytes of a frame not complete yet
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if not (from_broker and ours):
                    dst.sendall(data)
                    continue
                # Whole HTTP/2 frames (the server's side has no preface), each passed or dropped.
                pending += data
                while len(pending) >= 9 and len(pending) >= 9 + int.from_bytes(pending[0:3], "big"):
                    size = 9 + int.from_bytes(pending[0:3], "big")
                    frame, pending = bytes(pending[:size]), pending[size:]
                    if not self.armed:
                        dst.sendall(frame)
                    elif frame[3] == 0x1 and frame[4] & 0x1:    # HEADERS + END_STREAM: an answer's end
                        with self.lock:
                            self.answers_dropped += 1
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()

    def close(self):
        self.closed = True
        self.listener.close()
        with self.lock:
            socks, self.sockets = self.sockets, []
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def proxied_cluster(tmp_path, zk_connect):
    """Three brokers, each advertising (in ZooKeeper, hence in metadata) a
    pass-through proxy run by this test; clients bootstrap at the brokers'
    own ports and then follow the metadata, through the proxies."""
    made = {}
    proxies = {bid: Http2ResponseDropper(lambda bid=bid: ("127.0.0.1", made["c"].ports[bid])) for bid in (1, 2, 3)}
    overrides = {"zookeeper.session.timeout.ms": "3000", "replica.lag.time.max.ms": "30000",
                 "auto.leader.rebalance.enable": "false", "controlled.shutdown.enable": "false"}
    cluster = LocalCluster(str(tmp_path / "cluster"), 3, zookeeper_connect=zk_connect, overrides=overrides,
                           broker_overrides={bid: {"advertised.listeners": f"PLAINTEXT://127.0.0.1:{px.port},"
                                                                           f"FLIGHT://127.0.0.1:0"}
                                             for bid, px in proxies.items()},
                           die_with_parent=True)
    made["c"] = cluster
    try:
        cluster.start()
        yield cluster, proxies
    finally:
        try:
            cluster.stop()
        finally:
            for px in proxies.values():
                px.close()
            for bid in cluster.ids:
                print(f"---- broker {bid} log tail ----\n{cluster.tail(bid, 15)}")


def test_idempotent_retry_after_lost_ack_is_deduplicated_by_the_new_leader(proxied_cluster):
    cluster, proxies = proxied_cluster
    (a, b), c = roles(cluster, 2)
    topic = "retry"
    create_topic_assigned(cluster, topic, [a, b, c], {"min.insync.replicas": "2"})
    zk = ZkView(cluster)
    e0 = zk.state(topic).leader_epoch
    others = f"{cluster.address(b)},{cluster.address(c)}"
    # gRPC Produce: the proxies stand on the gRPC listeners (the Flight append's dedupe is
    # the same broker code, ReplicaManager._append_batches).
    producer = replikafka.Producer(others, acks="all", idempotent=True, linger_ms=0, request_timeout_ms=10_000,
                                   delivery_timeout_ms=60_000, retry_backoff_ms=100, use_flight=False)
    try:
        first = [f"first-{i}".encode() for i in range(10)]
        lost = [f"lost-ack-{i}".encode() for i in range(10)]
        after = [f"after-{i}".encode() for i in range(10)]
        assert producer.send(topic, kafka_batch(first), partition=0).result(timeout=30).base_offset == 0

        proxies[a].armed = True             # the leader's answers to this process go nowhere
        fut = producer.send(topic, kafka_batch(lost), partition=0)
        # The leader appended, every replica has the batch, the acks=all answer was sent ... and dropped.
        wait_until(lambda: proxies[a].answers_dropped >= 1, 30, what="the leader's answer (dropped)")
        for x in (a, b, c):
            assert replica_values(cluster, x, topic, 0) == first + lost, f"broker {x} lacks the batch"
        time.sleep(0.5)
        assert not fut.done(), "the producer got an answer the proxy should have dropped"

        cluster.kill(a)                     # the connection closes: the producer retries, same sequence
        meta = fut.result(timeout=60)       # ... against the new leader
        state = zk.state(topic)
        assert state.leader == b and state.leader_epoch > e0
        assert (meta.base_offset, meta.record_count) == (10, 10), meta
        assert producer.send(topic, kafka_batch(after), partition=0).result(timeout=30).base_offset == 20
    finally:
        producer.close()
        proxies[a].armed = False

    cluster.start_broker(a)
    wait_converged(cluster, topic, [a, b, c], 30)
    for x in (a, b, c):
        values = replica_values(cluster, x, topic, 0)
        assert values == first + lost + after, f"broker {x}: {[v.decode() for v in values]}"
    zk.close()
