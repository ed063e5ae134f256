"""Pure controller decisions: replica assignment and leader election.

Functions of the controller's view of the cluster; no I/O. The controller
shell (``controller.py``) writes the results to ZooKeeper and sends them to
brokers. Unit tests call these directly and compare with ``==``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from replikafka.broker.zk_store import LeaderAndIsr
from replikafka.errors import InvalidPartitionsError, InvalidReplicationFactorError

log = logging.getLogger(__name__)
NO_LEADER = -1
TP = tuple[str, int]


def assign_replicas(n_partitions: int, replication_factor: int, brokers: list[int], *,
                    start_index: int, replica_shift: int, first_partition: int = 0) -> dict[int, list[int]]:
    """Kafka's round-robin assignment: leaders spread evenly over the brokers,
    followers shifted so that no two partitions share the same replica list
    pattern. The first replica is the preferred leader."""
    if n_partitions <= 0:
        raise InvalidPartitionsError(f"number of partitions must be at least 1, got {n_partitions}")
    if replication_factor <= 0:
        raise InvalidReplicationFactorError(f"replication factor must be at least 1, got {replication_factor}")
    n = len(brokers)
    if replication_factor > n:
        raise InvalidReplicationFactorError(
            f"replication factor {replication_factor} is larger than the {n} live broker(s) {sorted(brokers)}")
    brokers = sorted(brokers)
    out: dict[int, list[int]] = {}
    shift = replica_shift
    p = first_partition
    for _ in range(n_partitions):
        if p > 0 and p % n == 0:
            shift += 1
        first = (p + start_index) % n
        replicas = [brokers[first]]
        for j in range(replication_factor - 1):
            step = 1 + (shift + j) % (n - 1)
            replicas.append(brokers[(first + step) % n])
        out[p] = replicas
        p += 1
    return out


def initial_leader_and_isr(replicas: list[int], live: set[int], controller_epoch: int) -> LeaderAndIsr:
    """A new partition: the first live replica leads; the ISR is the live replicas."""
    live_replicas = tuple(r for r in replicas if r in live)
    leader = live_replicas[0] if live_replicas else NO_LEADER
    return LeaderAndIsr(leader, 0, live_replicas, controller_epoch)


@dataclass(frozen=True)
class Election:
    state: LeaderAndIsr
    unclean: bool = False


def elect_leader(replicas: list[int], current: LeaderAndIsr, live: set[int], controller_epoch: int,
                 unclean_allowed: bool) -> Election | None:
    """Offline-partition election: the first replica (assignment order) that is
    alive and in the ISR. With none: unclean election if allowed (data loss,
    logged loudly by the shell), else the partition stays offline keeping its
    last ISR so that member can lead when it returns. None = nothing to change."""
    live_isr = [r for r in current.isr if r in live]
    candidates = [r for r in replicas if r in live_isr]
    if candidates:
        leader = candidates[0]
        if leader == current.leader and tuple(live_isr) == current.isr:
            return None
        return Election(LeaderAndIsr(leader, current.leader_epoch + 1, tuple(live_isr), controller_epoch))
    live_replicas = [r for r in replicas if r in live]
    if unclean_allowed and live_replicas:
        leader = live_replicas[0]
        return Election(LeaderAndIsr(leader, current.leader_epoch + 1, (leader,), controller_epoch), unclean=True)
    if current.leader == NO_LEADER:
        return None
    # Offline: keep the ISR (its members are the only ones who may lead cleanly).
    return Election(LeaderAndIsr(NO_LEADER, current.leader_epoch + 1, current.isr, controller_epoch))


def remove_from_isr(current: LeaderAndIsr, dead: set[int], controller_epoch: int) -> LeaderAndIsr | None:
    """A follower died: take it out of the ISR (the leader stays). Never empties the ISR."""
    new_isr = tuple(r for r in current.isr if r not in dead)
    if new_isr == current.isr or not new_isr:
        return None
    return LeaderAndIsr(current.leader, current.leader_epoch, new_isr, controller_epoch)


def on_brokers_changed(assignments: dict[str, dict[int, list[int]]],
                       states: dict[TP, LeaderAndIsr], live: set[int], controller_epoch: int,
                       unclean_for) -> dict[TP, Election]:
    """Every state change the controller makes when the set of live brokers changes:
    partitions whose leader died (or that are offline and can now lead again) get a
    new leader; dead followers leave ISRs. ``unclean_for(topic) -> bool``."""
    out: dict[TP, Election] = {}
    for topic, parts in assignments.items():
        for p, replicas in parts.items():
            cur = states.get((topic, p))
            if cur is None:
                continue
            if cur.leader == NO_LEADER or cur.leader not in live:
                e = elect_leader(replicas, cur, live, controller_epoch, unclean_for(topic))
                if e is not None:
                    out[(topic, p)] = e
            else:
                s = remove_from_isr(cur, set(cur.isr) - live, controller_epoch)
                if s is not None:
                    out[(topic, p)] = Election(s)
    return out


def preferred_leader_election(replicas: list[int], current: LeaderAndIsr, live: set[int],
                              controller_epoch: int) -> LeaderAndIsr | None:
    preferred = replicas[0]
    if current.leader == preferred or preferred not in live or preferred not in current.isr:
        return None
    return LeaderAndIsr(preferred, current.leader_epoch + 1, current.isr, controller_epoch)
