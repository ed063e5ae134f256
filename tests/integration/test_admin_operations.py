"""Admin operations on a live cluster (issue 6): reassignment, preferred replica
election (manual and automatic), controlled shutdown, topic deletion while a
replica is down. Real ZooKeeper, real broker processes, producing and consuming
the whole time; every acknowledged record is checked at the end."""
from __future__ import annotations

import json
import os
import re
import threading
import time

import pytest

import replikafka
from replikafka import errors as E
from cluster_helpers import BackgroundProducer, wait_until
from replikafka.broker.zk_store import ZkStore
from replikafka.cli.main import main as cli
from test_failover import check_no_acked_loss_and_replicas_agree

pytestmark = pytest.mark.integration


class BackgroundConsumer:
    """Reads every partition from the start, the whole time; any error surfacing
    through the client (after its own retries) is a failed read."""

    def __init__(self, bootstrap: str, topic: str, partitions: int):
        self.consumer = replikafka.Consumer(bootstrap)
        self.tps = [(topic, p) for p in range(partitions)]
        self.consumer.assign(self.tps)
        for tp in self.tps:
            self.consumer.seek(tp, 0)
        self.errors: list[BaseException] = []
        self.seen: dict[tuple[int, int], bytes] = {}
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped.is_set():
            try:
                t = self.consumer.poll(timeout_ms=200)
            except Exception as exc:
                self.errors.append(exc)
                time.sleep(0.2)
                continue
            for p, o, v in zip(t.column("partition").to_pylist(), t.column("offset").to_pylist(),
                               t.column("value").to_pylist()):
                assert self.seen.setdefault((p, o), v) == v

    def stop(self):
        self.stopped.set()
        self.thread.join(30)
        self.consumer.close()
        return self


def run_cli(capsys, *args) -> tuple[int, str]:
    rc = cli(list(args))
    out = capsys.readouterr()
    return rc, out.out + out.err


def topic_on(cluster, admin, topic, partitions, brokers_down):
    """Create a topic whose replicas avoid ``brokers_down`` (stopped meanwhile)."""
    for b in brokers_down:
        cluster.stop_broker(b)
    wait_until(lambda: all(b not in live_ids(cluster) for b in brokers_down), 30, what="brokers gone")
    admin.create_topic(topic, partitions=partitions, replication_factor=3, config={"min.insync.replicas": "2"})
    wait_until(lambda: all(p.leader >= 0 for p in admin.describe_topic(topic).partitions), 30, what="leaders")
    for b in brokers_down:
        cluster.start_broker(b)


def live_ids(cluster) -> set[int]:
    zk = cluster.zk()
    try:
        return {int(c) for c in zk.get_children("/brokers/ids")}
    finally:
        zk.stop()
        zk.close()


def partition_dirs(cluster, broker_id, topic) -> list[str]:
    d = os.path.join(cluster.base_dir, f"broker-{broker_id}-logs")
    return sorted(n for n in os.listdir(d) if n.startswith(f"{topic}-")) if os.path.isdir(d) else []


def full_isr(admin, topic):
    return all(set(p.isr) == set(p.replicas) for p in admin.describe_topic(topic).partitions)


def write_plan(tmp_path, name, plan) -> str:
    path = str(tmp_path / name)
    with open(path, "w") as f:
        json.dump({"version": 1, "partitions": [{"topic": t, "partition": p, "replicas": r}
                                                for (t, p), r in plan.items()]}, f)
    return path


def test_reassign_a_topic_from_brokers_123_to_234_under_load(cluster_factory, tmp_path, capsys):
    cluster = cluster_factory(4)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    topic_on(cluster, admin, "moving", 4, brokers_down=[4])
    assert all(set(p.replicas) == {1, 2, 3} for p in admin.describe_topic("moving").partitions)
    prod = BackgroundProducer(cluster.bootstrap_servers, "moving", 4).start()
    cons = BackgroundConsumer(cluster.bootstrap_servers, "moving", 4)
    time.sleep(1.0)

    # --generate proposes a plan over 2,3,4 without changing anything.
    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": "moving"}]}))
    rc, out = run_cli(capsys, "reassign-partitions", "--zookeeper", cluster.zookeeper_connect,
                      "--topics-to-move-json-file", str(topics_file), "--broker-list", "2,3,4", "--generate")
    assert rc == 0, out
    proposed = json.loads(out.split("Proposed partition reassignment configuration\n", 1)[1])
    assert {b for e in proposed["partitions"] for b in e["replicas"]} == {2, 3, 4}
    plan = {("moving", p): [2 + (p + i) % 3 for i in range(3)] for p in range(4)}
    plan_file = write_plan(tmp_path, "plan.json", plan)

    # --execute and --verify through a broker (Kafka 3.x's --bootstrap-server), --generate above through ZooKeeper
    rc, out = run_cli(capsys, "reassign-partitions", "--bootstrap-server", cluster.bootstrap_servers,
                      "--reassignment-json-file", plan_file, "--execute", "--timeout-ms", "90000")
    assert rc == 0, out
    assert "Successfully started reassignment of 4 partitions" in out and "4/4 partitions done" in out
    rc, out = run_cli(capsys, "reassign-partitions", "--bootstrap-server", cluster.bootstrap_servers,
                      "--reassignment-json-file", plan_file, "--verify")
    assert rc == 0 and out.count("completed successfully") == 4, out
    time.sleep(1.0)  # keep producing under the new assignment
    log = prod.stop()
    cons.stop()
    assert not log.errors, f"produce failed: {log.errors[:3]}"
    assert not cons.errors, f"reads failed: {cons.errors[:3]}"
    assert {p.partition: list(p.replicas) for p in admin.describe_topic("moving").partitions} == \
        {p: r for (_, p), r in plan.items()}
    wait_until(lambda: partition_dirs(cluster, 1, "moving") == [], 30, what="broker 1's replicas deleted")
    committed = check_no_acked_loss_and_replicas_agree(cluster, "moving", 4, log.acked, brokers=[2, 3, 4])
    assert {k: v for k, v in cons.seen.items()} == {k: committed[k] for k in cons.seen}
    zk = cluster.zk()
    assert not zk.exists("/admin/reassign_partitions")
    zk.stop()
    admin.close()


def test_controller_killed_in_the_middle_of_a_reassignment_completes_under_the_new_one(cluster_factory, tmp_path,
                                                                                      capsys):
    cluster = cluster_factory(4, zookeeper_session_timeout_ms=6000)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    topic_on(cluster, admin, "resume", 2, brokers_down=[4])
    wait_until(lambda: cluster.controller_id() in (1, 2, 3), 30, what="a controller other than 4")
    old = cluster.controller_id()
    o1, o2 = sorted({1, 2, 3} - {old})
    prod = BackgroundProducer(cluster.bootstrap_servers, "resume", 2).start()
    time.sleep(0.5)
    # Broker 4 is paused: the reassignment stops at step 4 (waiting for it to catch up).
    cluster.pause(4)
    plan = {("resume", 0): [4, o1, o2], ("resume", 1): [o1, 4, o2]}   # the controller's replicas move away
    rc, out = run_cli(capsys, "reassign-partitions", "--zookeeper", cluster.zookeeper_connect,
                      "--reassignment-json-file", write_plan(tmp_path, "p.json", plan), "--execute", "--no-wait")
    assert rc == 0, out
    zk = cluster.zk()
    store = ZkStore(zk)
    wait_until(lambda: all(set(store.get_assignment("resume")[p]) == {1, 2, 3, 4} for p in (0, 1)), 30,
               what="AR = OAR + RAR (steps 1-3)")
    assert store.get_reassignment() == plan
    cluster.kill(old)
    cluster.resume(4)
    wait_until(lambda: cluster.controller_id() not in (-1, old), 30, what="a new controller")
    wait_until(lambda: not zk.exists("/admin/reassign_partitions"), 60, what="the reassignment to finish")
    assert {p: store.get_assignment("resume")[p] for p in (0, 1)} == {0: [4, o1, o2], 1: [o1, 4, o2]}
    log = prod.stop()
    assert not log.errors, f"produce failed: {log.errors[:3]}"
    cluster.start_broker(old)  # its replicas are no longer assigned: deleted when it starts
    wait_until(lambda: partition_dirs(cluster, old, "resume") == [], 30, what="old replicas deleted")
    check_no_acked_loss_and_replicas_agree(cluster, "resume", 2, log.acked, brokers=[4, o1, o2])
    zk.stop()
    admin.close()


def leaders(admin, topic):
    return {p.partition: (p.leader, p.replicas[0]) for p in admin.describe_topic(topic).partitions}


def unbalance(cluster, admin, topic, broker):
    """Bounce ``broker`` so that it leads nothing, then wait until it is back in every ISR."""
    cluster.stop_broker(broker)
    wait_until(lambda: all(l != broker for l, _ in leaders(admin, topic).values()), 30, what="leaders moved")
    cluster.start_broker(broker)
    wait_until(lambda: full_isr(admin, topic), 60, what="full ISR again")


def test_preferred_replica_election_restores_the_preferred_leaders(cluster_factory, capsys, tmp_path, monkeypatch):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("pref", partitions=6, replication_factor=3)
    prod = BackgroundProducer(cluster.bootstrap_servers, "pref", 6).start()
    unbalance(cluster, admin, "pref", 1)
    before = leaders(admin, "pref")
    assert any(l != pref for l, pref in before.values()), before
    # Only partition 0 first (a JSON file), then all.
    only = tmp_path / "one.json"
    only.write_text(json.dumps({"partitions": [{"topic": "pref", "partition": 0}]}))
    rc, out = run_cli(capsys, "preferred-replica-election", "--zookeeper", cluster.zookeeper_connect,
                      "--path-to-json-file", str(only))
    assert rc == 0 and "1 of 1 partitions are led by their preferred replica" in out, out
    # The command reads the leaders from ZooKeeper; the brokers' metadata caches, which
    # describe reads, learn them from the controller's UpdateMetadata a moment later.
    wait_until(lambda: leaders(admin, "pref")[0][0] == before[0][1], 10, what="partition 0's preferred leader "
               "in the metadata")
    after_one = leaders(admin, "pref")
    assert {p: v for p, v in after_one.items() if p != 0} == {p: v for p, v in before.items() if p != 0}
    # All, in rounds: the command splits a list one znode cannot hold (a limit of about
    # two partitions' entries here stands for jute.maxbuffer's 1 MiB against ~27,000).
    monkeypatch.setattr("replikafka.broker.zk_store.ZNODE_DATA_BYTES_MAX", 230)
    rc, out = run_cli(capsys, "preferred-replica-election", "--bootstrap-server", cluster.bootstrap_servers)
    assert rc == 0 and "6 of 6 partitions" in out, out
    rounds = re.findall(r"Started preferred replica election for (\d+) partitions \(round (\d+) of (\d+)", out)
    assert len(rounds) >= 2 and sum(int(n) for n, _, _ in rounds) == 6, out
    wait_until(lambda: all(l == pref for l, pref in leaders(admin, "pref").values()), 10,
               what="every preferred leader in the metadata")
    log = prod.stop()
    assert not log.errors, f"produce failed: {log.errors[:3]}"
    check_no_acked_loss_and_replicas_agree(cluster, "pref", 6, log.acked)
    admin.close()


def test_auto_leader_rebalance_restores_the_preferred_leaders(cluster_factory):
    cluster = cluster_factory(3, auto_leader_rebalance_enable="true", leader_imbalance_check_interval_seconds=1)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("auto", partitions=6, replication_factor=2)
    prod = BackgroundProducer(cluster.bootstrap_servers, "auto", 6).start()
    cluster.stop_broker(2)
    wait_until(lambda: all(l != 2 for l, _ in leaders(admin, "auto").values()), 30, what="leaders moved")
    cluster.start_broker(2)
    wait_until(lambda: all(l == pref for l, pref in leaders(admin, "auto").values()), 60,
               what="every partition led by its preferred replica again")
    log = prod.stop()
    assert not log.errors, f"produce failed: {log.errors[:3]}"
    check_no_acked_loss_and_replicas_agree(cluster, "auto", 6, log.acked)
    admin.close()


def test_sigterm_moves_leadership_away_first_no_partition_offline_no_failed_produce(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("calm", partitions=6, replication_factor=3, config={"min.insync.replicas": "2"})
    prod = BackgroundProducer(cluster.bootstrap_servers, "calm", 6).start()
    time.sleep(1.0)
    victim = max(range(1, 4), key=lambda b: sum(l == b for l, _ in leaders(admin, "calm").values()))
    assert any(l == victim for l, _ in leaders(admin, "calm").values())
    zk = cluster.zk()
    store = ZkStore(zk)
    offline: list = []
    watching = threading.Event()

    def watch():  # every state znode, the whole time: never leaderless
        while not watching.is_set():
            for tp, (s, _v) in store.get_partition_states([("calm", p) for p in range(6)]).items():
                if s.leader < 0:
                    offline.append((tp, s))
            time.sleep(0.02)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    rc = cluster.stop_broker(victim)
    moved = {p: l for p, (l, _) in leaders(admin, "calm").items()}
    time.sleep(1.0)
    watching.set()
    t.join(5)
    assert rc == 0
    assert not offline, f"partitions went offline: {offline[:3]}"
    assert all(l != victim for l in moved.values()), moved
    with open(cluster.log_path(victim)) as f:
        assert "controlled shutdown succeeded" in f.read()
    cluster.start_broker(victim)
    log = prod.stop()
    assert not log.errors, f"produce failed: {log.errors[:3]}"
    check_no_acked_loss_and_replicas_agree(cluster, "calm", 6, log.acked)
    zk.stop()
    admin.close()


def test_topic_deletion_waits_for_a_down_replica_and_completes_when_it_returns(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("doomed", partitions=3, replication_factor=3)
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as p:
        from cluster_helpers import kafka_batch
        for part in range(3):
            p.send("doomed", kafka_batch([b"x"] * 10), partition=part).result(timeout=30)
    cluster.kill(3)
    wait_until(lambda: 3 not in live_ids(cluster), 30, what="broker 3 gone")
    with pytest.raises(E.RequestTimedOutError, match="has not finished"):
        admin.delete_topic("doomed", timeout_ms=2000)
    zk = cluster.zk()
    wait_until(lambda: all(partition_dirs(cluster, b, "doomed") == [] for b in (1, 2)), 30,
               what="live replicas deleted")
    time.sleep(1.0)
    assert zk.exists("/admin/delete_topics/doomed"), "deletion must wait for broker 3"
    assert partition_dirs(cluster, 3, "doomed") != []
    cluster.start_broker(3)
    wait_until(lambda: not zk.exists("/admin/delete_topics/doomed") and not zk.exists("/brokers/topics/doomed"),
               30, what="deletion to complete")
    wait_until(lambda: partition_dirs(cluster, 3, "doomed") == [], 30, what="broker 3's replicas deleted")
    wait_until(lambda: "doomed" not in admin.list_topics(), 30, what="the deletion in the brokers' metadata")
    zk.stop()
    admin.close()
