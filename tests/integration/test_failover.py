"""Replication under faults, against real processes (issue 4).

Each test records every acknowledged (partition, offset, value), then reads
everything back through the consumer and from every replica's files.
"""
from __future__ import annotations

import time

import pytest

import replikafka
from cluster_helpers import BackgroundProducer, kafka_batch, read_committed, replica_values, wait_until
from replikafka import errors as E

pytestmark = pytest.mark.integration


def describe(admin, topic):
    return admin.describe_topic(topic).partitions


def leader_of(admin, topic, p):
    return describe(admin, topic)[p].leader


class ZkIsrs:
    """Each partition's ISR as its state znode holds it: the truth, which a leader
    writes before it acts on a change. A broker's metadata cache may be behind it
    (a paused broker answers with the ISR it knew when it stopped), so checks that
    then read a replica's files must not take membership from ``describe``."""

    def __init__(self, cluster):
        from replikafka.broker.zk_store import ZkStore
        self.zk = cluster.zk()
        self.store = ZkStore(self.zk)

    def __call__(self, topic, partitions):
        return [tuple(self.store.get_partition_state(topic, p)[0].isr) for p in range(partitions)]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.zk.stop()
        self.zk.close()


def check_no_acked_loss_and_replicas_agree(cluster, topic, partitions, acked, brokers=None):
    admin = replikafka.Admin(cluster.bootstrap_servers)
    # Quiesce: wait until every replica is back in the ISR (as ZooKeeper holds it) and
    # HW == LEO. A new leader reports no HW (None) until its HW reaches its epoch's
    # start (KIP-207): None == None is not quiet.
    with ZkIsrs(cluster) as zk_isrs:
        def quiet():
            parts = describe(admin, topic)
            return all(p.high_watermark is not None and p.high_watermark == p.log_end_offset for p in parts) and \
                all(len(isr) == len(p.replicas) for isr, p in zip(zk_isrs(topic, partitions), parts))
        wait_until(quiet, 60, what="full ISR and HW == LEO")
    committed = read_committed(cluster.bootstrap_servers, topic, partitions)
    lost = {k: v for k, v in acked.items() if committed.get(k) != v}
    assert not lost, f"{len(lost)} acknowledged records lost or changed, e.g. {list(lost.items())[:3]}"
    parts = describe(admin, topic)
    for p in range(partitions):
        hw = parts[p].high_watermark
        expected = [committed[(p, o)] for o in range(hw)]
        for b in (brokers or cluster.ids):
            if b in parts[p].replicas:
                got = replica_values(cluster, b, topic, p)[:hw]
                assert got == expected, f"replica on broker {b} of {topic}-{p} differs below the HW {hw}"
    admin.close()
    return committed


def test_kill_leader_during_acks_all_then_five_hard_bounces(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("durable", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    prod = BackgroundProducer(cluster.bootstrap_servers, "durable", 2).start()
    time.sleep(1.0)
    for bounce in range(6):  # the first kill, then 5 hard bounces of whoever leads partition 0
        victim = leader_of(admin, "durable", 0)
        before = prod.sent
        cluster.kill(victim)
        wait_until(lambda: leader_of(admin, "durable", 0) not in (victim, -1), 30, what="a new leader")
        cluster.start_broker(victim)
        wait_until(lambda: prod.sent > before + 200, 60, what="produce to continue")
    log = prod.stop()
    assert len(log.acked) > 1000
    committed = check_no_acked_loss_and_replicas_agree(cluster, "durable", 2, log.acked)
    # Offsets are dense: nothing reused, no holes below the HW.
    for p in range(2):
        offs = sorted(o for (pp, o) in committed if pp == p)
        assert offs == list(range(len(offs)))
    admin.close()


def test_idempotent_producer_writes_no_duplicates_across_leader_changes(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("once", partitions=1, replication_factor=3)
    prod = BackgroundProducer(cluster.bootstrap_servers, "once", 1, idempotent=True).start()
    time.sleep(0.5)
    for _ in range(2):
        victim = leader_of(admin, "once", 0)
        cluster.kill(victim)
        wait_until(lambda: leader_of(admin, "once", 0) not in (victim, -1), 30, what="a new leader")
        cluster.start_broker(victim)
        time.sleep(0.5)
    log = prod.stop()
    committed = check_no_acked_loss_and_replicas_agree(cluster, "once", 1, log.acked)
    values = list(committed.values())
    assert len(values) == len(set(values)), "a value was written twice"
    admin.close()


def test_isr_below_min_insync_refuses_acks_all_and_heals(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("strict", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    leader = leader_of(admin, "strict", 0)
    others = [b for b in cluster.ids if b != leader]
    with replikafka.Producer(cluster.bootstrap_servers, acks="all", delivery_timeout_ms=4000,
                             request_timeout_ms=2000) as prod:
        first = prod.send("strict", kafka_batch([b"a"] * 10)).result(timeout=30)
        for b in others:
            cluster.kill(b)
        wait_until(lambda: describe(admin, "strict")[0].isr == (leader,) or list(describe(admin, "strict")[0].isr)
                   == [leader], 30, what="ISR = leader only")
        with pytest.raises(E.ReplikafkaError) as info:
            print("unexpected:", prod.send("strict", kafka_batch([b"b"] * 10)).result(timeout=30))
        assert "NOT_ENOUGH_REPLICAS" in str(info.value) or isinstance(info.value, E.NotEnoughReplicasError)
    for b in others:
        cluster.start_broker(b)
    wait_until(lambda: len(describe(admin, "strict")[0].isr) == 3, 60, what="ISR to heal")
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:
        after = prod.send("strict", kafka_batch([b"c"] * 10)).result(timeout=30)
    committed = read_committed(cluster.bootstrap_servers, "strict", 1)
    assert [committed[(0, o)] for o in range(first.base_offset, first.base_offset + 10)] == [b"a"] * 10
    assert [committed[(0, o)] for o in range(after.base_offset, after.base_offset + 10)] == [b"c"] * 10
    admin.close()


def test_paused_follower_leaves_the_isr_and_rejoins_after_catching_up(cluster_factory):
    # A long session timeout so that the leader's lag check, not ZooKeeper, removes it.
    cluster = cluster_factory(3, zookeeper_session_timeout_ms=30000, replica_lag_time_max_ms=2000)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("lag", partitions=1, replication_factor=3)
    leader = leader_of(admin, "lag", 0)
    slow = next(b for b in cluster.ids if b != leader)
    with ZkIsrs(cluster) as zk_isrs:
        with replikafka.Producer(cluster.bootstrap_servers, acks="1") as prod:
            cluster.pause(slow)
            try:
                for i in range(30):
                    prod.send("lag", kafka_batch([f"x{i}".encode()] * 50)).result(timeout=30)
                    time.sleep(0.1)
                wait_until(lambda: slow not in zk_isrs("lag", 1)[0], 30, what="ISR to shrink")
            finally:
                cluster.resume(slow)
        wait_until(lambda: slow in zk_isrs("lag", 1)[0], 30, what="ISR to re-expand")
    check_no_acked_loss_and_replicas_agree(cluster, "lag", 1, {})
    admin.close()


def test_zombie_leader_paused_past_its_session_cannot_commit(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("zombie", partitions=1, replication_factor=3, config={"min.insync.replicas": "2"})
    old = leader_of(admin, "zombie", 0)
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:
        prod.send("zombie", kafka_batch([b"before"] * 5)).result(timeout=30)
    cluster.pause(old)
    try:
        wait_until(lambda: leader_of(admin, "zombie", 0) not in (old, -1), 40, what="a new leader")
    finally:
        cluster.resume(old)
    # The resumed old leader must refuse (or redirect) writes; clients land on the new leader.
    with replikafka.Producer(cluster.address(old), acks="all") as prod:
        meta = prod.send("zombie", kafka_batch([b"after"] * 5)).result(timeout=60)
    new = leader_of(admin, "zombie", 0)
    assert new != old or describe(admin, "zombie")[0].leader_epoch >= 2
    wait_until(lambda: len(describe(admin, "zombie")[0].isr) == 3, 60, what="old leader back in the ISR")
    committed = read_committed(cluster.bootstrap_servers, "zombie", 1)
    assert [committed[(0, o)] for o in range(5)] == [b"before"] * 5
    assert [committed[(0, o)] for o in range(meta.base_offset, meta.base_offset + 5)] == [b"after"] * 5
    check_no_acked_loss_and_replicas_agree(cluster, "zombie", 1, {})
    admin.close()


@pytest.mark.parametrize("unclean", [False, True])
def test_all_isr_members_dead(cluster_factory, unclean):
    cluster = cluster_factory(3, replica_lag_time_max_ms=1500)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("fragile", partitions=1, replication_factor=2,
                       config={"unclean.leader.election.enable": str(unclean).lower()})
    leader = leader_of(admin, "fragile", 0)
    follower = next(b for b in describe(admin, "fragile")[0].replicas if b != leader)
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:
        prod.send("fragile", kafka_batch([b"both"] * 10)).result(timeout=30)
        # Stop the follower; the leader shrinks the ISR to itself and takes more writes.
        cluster.kill(follower)
        wait_until(lambda: list(describe(admin, "fragile")[0].isr) == [leader], 30, what="ISR shrink")
        prod.send("fragile", kafka_batch([b"leader-only"] * 10)).result(timeout=30)
    cluster.kill(leader)
    cluster.start_broker(follower)
    if not unclean:
        # Offline (once the controller has seen the leader's session end), and it
        # stays offline: the stale follower never leads.
        wait_until(lambda: leader_of(admin, "fragile", 0) == -1, 30, what="the partition to go offline")
        time.sleep(2)
        assert leader_of(admin, "fragile", 0) == -1
        cluster.start_broker(leader)
        wait_until(lambda: leader_of(admin, "fragile", 0) == leader, 30, what="the ISR member to lead again")
        committed = read_committed(cluster.bootstrap_servers, "fragile", 1)
        assert list(committed.values()) == [b"both"] * 10 + [b"leader-only"] * 10
    else:
        wait_until(lambda: leader_of(admin, "fragile", 0) == follower, 30, what="unclean election")
        committed = read_committed(cluster.bootstrap_servers, "fragile", 1)
        assert list(committed.values()) == [b"both"] * 10  # the loss, measured
        controller_logs = "".join(cluster.tail(b, 400) for b in cluster.ids)
        assert "UNCLEAN leader election" in controller_logs
    admin.close()


def _registration_czxid(cluster, broker_id):
    zk = cluster.zk()
    try:
        stat = zk.exists(f"/brokers/ids/{broker_id}")
        return stat.czxid if stat else None
    finally:
        zk.stop()
        zk.close()


def test_broker_whose_zookeeper_session_expires_reregisters_and_carries_on(cluster_factory):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("expiry", partitions=1, replication_factor=3)
    controller = wait_until(lambda: cluster.controller_id() if cluster.controller_id() > 0 else None)
    leader = leader_of(admin, "expiry", 0)
    victim = next(b for b in cluster.ids if b not in (leader, controller))
    before = _registration_czxid(cluster, victim)
    cluster.pause(victim)            # silent past its 4 s session: ZooKeeper expires it
    try:
        wait_until(lambda: _registration_czxid(cluster, victim) is None, 30, what="the session to expire")
    finally:
        cluster.resume(victim)
    # Same process, new session: it registers again and rejoins the ISR, no restart.
    wait_until(lambda: _registration_czxid(cluster, victim) not in (None, before), 30, what="re-registration")
    assert cluster.alive(victim)
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as prod:
        meta = prod.send("expiry", kafka_batch([b"after-expiry"] * 3)).result(timeout=30)
    wait_until(lambda: victim in describe(admin, "expiry")[0].isr, 60, what="the broker back in the ISR")
    committed = check_no_acked_loss_and_replicas_agree(cluster, "expiry", 1, {(0, meta.base_offset): b"after-expiry"})
    assert len(committed) == 3
    admin.close()


def test_zookeeper_outage_loses_nothing_and_the_cluster_recovers(cluster_factory, zk_server):
    cluster = cluster_factory(3)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("zk-outage", partitions=2, replication_factor=3, config={"min.insync.replicas": "2"})
    prod = BackgroundProducer(cluster.bootstrap_servers, "zk-outage", 2).start()
    time.sleep(1)
    zk_server.stop()
    try:
        time.sleep(3)                # leaders keep serving without ZooKeeper
    finally:
        zk_server.restart()          # same port, same data
    time.sleep(2)
    log = prod.stop()
    wait_until(lambda: cluster.controller_id() > 0, 30, what="a controller after the outage")
    zk = cluster.zk()
    try:
        wait_until(lambda: sorted(int(b) for b in zk.get_children("/brokers/ids")) == cluster.ids, 60,
                   what="every broker registered")
    finally:
        zk.stop()
        zk.close()
    with replikafka.Producer(cluster.bootstrap_servers, acks="all") as p:
        p.send("zk-outage", kafka_batch([b"after"] * 2), partition=0).result(timeout=60)
    assert len(log.acked) > 0
    check_no_acked_loss_and_replicas_agree(cluster, "zk-outage", 2, log.acked)
    admin.close()


def test_controller_killed_while_another_broker_is_failing(cluster_factory):
    cluster = cluster_factory(4)
    admin = replikafka.Admin(cluster.bootstrap_servers)
    admin.create_topic("double", partitions=4, replication_factor=3, config={"min.insync.replicas": "2"})
    prod = BackgroundProducer(cluster.bootstrap_servers, "double", 4).start()
    time.sleep(1)
    controller = wait_until(lambda: cluster.controller_id() if cluster.controller_id() > 0 else None)
    other = next(b for b in cluster.ids if b != controller and
                 any(p.leader == b for p in describe(admin, "double")))
    cluster.kill(other)
    time.sleep(0.5)                  # the controller is busy with the first failure
    cluster.kill(controller)
    wait_until(lambda: cluster.controller_id() not in (-1, controller), 30, what="a new controller")
    wait_until(lambda: all(p.leader not in (-1, other, controller) for p in describe(admin, "double")), 60,
               what="leaders on the two live brokers")
    cluster.start_broker(other)
    cluster.start_broker(controller)
    time.sleep(1)
    log = prod.stop()
    check_no_acked_loss_and_replicas_agree(cluster, "double", 4, log.acked)
    admin.close()
