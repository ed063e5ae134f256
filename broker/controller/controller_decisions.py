"""Pure controller decisions: replica assignment and leader election.

Functions of the controller's view of the cluster; no I/O. The controller
shell (``controller.py``) writes the results to ZooKeeper and sends them to
brokers. Unit tests call these directly and compare with ``==``.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

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
                 unclean_allowed: bool, avoid=frozenset()) -> Election | None:
    """Offline-partition election: the first replica (assignment order) that is
    alive and in the ISR, brokers in ``avoid`` (shutting down) only if no other
    will do. With none: unclean election if allowed (data loss, logged loudly by
    the shell), else the partition stays offline with its last leader as its ISR,
    so that it leads when it returns. None = nothing to change."""
    live_isr = [r for r in current.isr if r in live]
    candidates = sorted((r for r in replicas if r in live_isr), key=lambda r: r in avoid)
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
    # Offline. Only the last leader stays in the ISR: it holds everything acknowledged,
    # while a follower that died with it may have crashed and lost unflushed records it
    # had already fetched (the simulation's seed 9976 elected such a follower, restarted
    # empty, and lost an acknowledged record the zombie leader still held). Kafka's replica
    # state machine likewise takes offline replicas out of the ISR, never emptying it.
    isr = (current.leader,) if current.leader in current.isr else current.isr
    return Election(LeaderAndIsr(NO_LEADER, current.leader_epoch + 1, isr, controller_epoch))


def remove_from_isr(current: LeaderAndIsr, dead: set[int], controller_epoch: int) -> LeaderAndIsr | None:
    """A follower died: take it out of the ISR (the leader stays). Never empties the ISR."""
    new_isr = tuple(r for r in current.isr if r not in dead)
    if new_isr == current.isr or not new_isr:
        return None
    return LeaderAndIsr(current.leader, current.leader_epoch, new_isr, controller_epoch)


def on_brokers_changed(assignments: dict[str, dict[int, list[int]]],
                       states: dict[TP, LeaderAndIsr], live: set[int], controller_epoch: int,
                       unclean_for, avoid=frozenset()) -> dict[TP, Election]:
    """Every state change the controller makes when the set of live brokers changes:
    partitions whose leader died (or that are offline and can now lead again) get a
    new leader, not one in ``avoid`` (shutting down) if another in-sync replica can;
    dead followers leave ISRs. A broker in ``avoid`` is alive: what it still leads
    stays with it. ``unclean_for(topic) -> bool``."""
    out: dict[TP, Election] = {}
    # Equal inputs decide equally, and at scale they take few values (a few brokers,
    # epochs and replica orders: tens for 50,000 partitions on 3 brokers), so each is
    # decided once and partitions share the (frozen) result.
    elected: tuple[dict, dict] = ({}, {})     # (state, replicas) -> Election or None; clean, unclean
    shrunk: dict = {}                         # state -> Election or None
    for topic, parts in assignments.items():
        unclean = None
        for p, replicas in parts.items():
            cur = states.get((topic, p))
            if cur is None:
                continue
            if cur.leader == NO_LEADER or cur.leader not in live:
                if unclean is None:
                    unclean = bool(unclean_for(topic))
                memo, key = elected[unclean], (cur, tuple(replicas))
                if key in memo:
                    e = memo[key]
                else:
                    e = memo[key] = elect_leader(replicas, cur, live, controller_epoch, unclean, avoid)
            else:
                if cur in shrunk:             # a live leader: only the ISR can change
                    e = shrunk[cur]
                else:
                    s = remove_from_isr(cur, set(cur.isr) - live, controller_epoch)
                    e = shrunk[cur] = None if s is None else Election(s)
            if e is not None:
                out[(topic, p)] = e
    return out


def moves_leadership(current: LeaderAndIsr, new: LeaderAndIsr) -> bool:
    """Whether a decided state gives the partition a new leader or leader epoch (its
    replicas must change roles: clients wait on it), not only a smaller ISR."""
    return new.leader != current.leader or new.leader_epoch != current.leader_epoch


def preferred_leader_election(replicas: list[int], current: LeaderAndIsr, live: set[int],
                              controller_epoch: int) -> LeaderAndIsr | None:
    preferred = replicas[0]
    if current.leader == preferred or preferred not in live or preferred not in current.isr:
        return None
    return LeaderAndIsr(preferred, current.leader_epoch + 1, current.isr, controller_epoch)


def preferred_elections(assignments: dict[str, dict[int, list[int]]], states: dict[TP, LeaderAndIsr],
                        tps, live: set[int], controller_epoch: int) -> dict[TP, LeaderAndIsr]:
    """Preferred-replica election for ``tps``: each partition whose first replica is
    alive and in the ISR but not leading gets it back as leader (epoch + 1)."""
    out: dict[TP, LeaderAndIsr] = {}
    for tp in tps:
        replicas = assignments.get(tp[0], {}).get(tp[1])
        cur = states.get(tp)
        if not replicas or cur is None:
            continue
        s = preferred_leader_election(replicas, cur, live, controller_epoch)
        if s is not None:
            out[tp] = s
    return out


def imbalanced_partitions(assignments: dict[str, dict[int, list[int]]], states: dict[TP, LeaderAndIsr],
                          live: set[int], imbalance_percentage: int) -> list[TP]:
    """Kafka's auto leader rebalance check. For each live broker, the imbalance is
    the share of the partitions it is preferred leader of that it does not lead;
    above ``imbalance_percentage`` percent, those partitions (where it is in the
    ISR) should have a preferred-replica election."""
    preferred_of: dict[int, list[TP]] = {}
    for topic, parts in assignments.items():
        for p, replicas in parts.items():
            if replicas and (topic, p) in states:
                preferred_of.setdefault(replicas[0], []).append((topic, p))
    out: list[TP] = []
    for broker, tps in preferred_of.items():
        if broker not in live:
            continue
        not_led = [tp for tp in tps if states[tp].leader != broker]
        if len(not_led) * 100 > imbalance_percentage * len(tps):
            out += [tp for tp in not_led if broker in states[tp].isr]
    return sorted(out)


@dataclass(frozen=True)
class ReassignmentStep:
    """What the controller does next for one partition being reassigned (seed 003's
    11 steps). ``assignment``: the AR to write (None: unchanged); ``state``: the
    leader/ISR to write; ``stop``: replicas to stop and delete (OAR - RAR);
    ``done``: remove the partition from ``/admin/reassign_partitions``."""
    assignment: tuple[int, ...] | None = None
    state: LeaderAndIsr | None = None
    stop: tuple[int, ...] = ()
    done: bool = False


def reassignment_step(ar: list[int], rar: list[int], current: LeaderAndIsr, live: set[int],
                      controller_epoch: int) -> ReassignmentStep:
    """The next step of moving a partition from its assigned replicas ``ar`` to the
    reassigned replicas ``rar``, from ZooKeeper's state alone, so that a new
    controller resumes where the old one stopped:

    * RAR not all in AR (steps 1-3): AR = OAR + RAR, leader epoch + 1 so the leader
      learns the new replica set and the new replicas start following;
    * some of RAR not in the ISR yet (step 4): wait (an ISR change wakes us);
    * all of RAR in sync (steps 5-10): the leader moves into RAR if it is not
      there (first live RAR member in the ISR), the ISR becomes ISR ∩ RAR, epoch
      + 1, OAR - RAR are stopped and deleted, then AR = RAR is written last;
    * AR == RAR: done (step 11)."""
    ar, rar = list(ar), list(rar)
    if ar == rar:
        return ReassignmentStep(done=True)
    if not set(rar) <= set(ar):
        new_ar = tuple(ar + [r for r in rar if r not in ar])
        return ReassignmentStep(assignment=new_ar,
                                state=LeaderAndIsr(current.leader, current.leader_epoch + 1, current.isr,
                                                   controller_epoch))
    if not set(rar) <= set(current.isr):
        return ReassignmentStep()
    leader = current.leader
    if leader not in rar or leader not in live:
        candidates = [r for r in rar if r in live and r in current.isr]
        if not candidates:
            return ReassignmentStep()
        leader = candidates[0]
    new_isr = tuple(r for r in current.isr if r in rar)
    return ReassignmentStep(assignment=tuple(rar),
                            state=LeaderAndIsr(leader, current.leader_epoch + 1, new_isr, controller_epoch),
                            stop=tuple(r for r in ar if r not in rar), done=True)


def controlled_shutdown_moves(assignments: dict[str, dict[int, list[int]]], states: dict[TP, LeaderAndIsr],
                              live: set[int], shutting_down: set[int], controller_epoch: int
                              ) -> tuple[dict[TP, LeaderAndIsr], list[TP]]:
    """Controlled shutdown of ``shutting_down``: every partition they lead (with
    another replica) moves to the first live ISR member that stays (epoch + 1,
    the shutting brokers leave the ISR); where they only follow, they leave the
    ISR. Returns (new states, partitions still led by them that a retry may move:
    another replica is live but not in the ISR yet). A partition whose other
    replicas are all down cannot move however long we wait, and is not returned."""
    eligible = live - shutting_down
    new: dict[TP, LeaderAndIsr] = {}
    remaining: list[TP] = []
    for topic, parts in assignments.items():
        for p, replicas in parts.items():
            cur = states.get((topic, p))
            if cur is None or len(replicas) < 2 or not shutting_down & set(replicas) or cur.leader not in live:
                continue  # offline, or its leader's death is the controller's next event
            isr = tuple(r for r in cur.isr if r not in shutting_down)
            if cur.leader in shutting_down:
                candidates = [r for r in replicas if r in isr and r in eligible]
                if candidates:
                    new[(topic, p)] = LeaderAndIsr(candidates[0], cur.leader_epoch + 1, isr, controller_epoch)
                elif any(r in eligible for r in replicas):
                    remaining.append((topic, p))  # a live replica may still catch up: worth a retry
            elif isr != cur.isr and isr:
                # Epoch + 1 fences the shutting follower's fetches, so the leader cannot
                # take it back into the ISR before it stops.
                new[(topic, p)] = LeaderAndIsr(cur.leader, cur.leader_epoch + 1, isr, controller_epoch)
    return new, sorted(remaining)


def partitions_to_remove(assigned: Iterable[int], requested: Iterable[int]) -> tuple[list[int], str | None]:
    """Which partitions a removal request (seed 000 H) takes away, or why it is refused.

    Only the highest-numbered partitions can go, so ids stay dense 0..n-1: the
    request must name every partition from its lowest one up to the topic's
    highest, and leave at least one. Partitions it names that are no longer
    assigned (a removal a failed controller half-finished) are removed again.
    Pure."""
    assigned, requested = set(assigned), set(requested)
    if not requested:
        return [], "no partitions named"
    low = min(requested)
    if low < 1:
        return [], "a topic keeps at least partition 0"
    missing = sorted(p for p in assigned if p >= low and p not in requested)
    if missing:
        return [], (f"only the highest-numbered partitions can be removed: removing from {low} needs "
                    f"{missing} removed too")
    return sorted(requested), None


@dataclass(frozen=True)
class BrokerSetChange:
    """What a BrokerChange event means, decided from the registrations read before and now.

    ``bounced``: live in both looks, under a new registration (its old session expired
    and it re-registered in between): it lost its in-memory state (its HW, its role),
    so it is handled as failed and then as started, as Kafka does with broker epochs.
    ``started`` includes the bounced."""
    started: frozenset[int]
    dead: frozenset[int]
    bounced: frozenset[int]

    @property
    def moved(self) -> bool:
        return bool(self.started or self.dead)

    def full_metadata_to(self) -> list[int]:
        return sorted(self.started)

    def changes_to(self, live: Iterable[int]) -> list[int]:
        """The other live brokers: they learn the changed partitions and the new brokers
        (and their epochs, KIP-380), since a broker that leads nothing is still one
        clients must be told of (as Kafka's onBrokerStartup/onBrokerFailure)."""
        return [b for b in live if b not in self.started]


def broker_set_change(old_live: Iterable[int], old_epochs: dict[int, int], live: Iterable[int],
                      epochs: dict[int, int]) -> BrokerSetChange:
    old, now = set(old_live), set(live)
    bounced = frozenset(b for b in now & old if epochs.get(b) != old_epochs.get(b))
    return BrokerSetChange(frozenset(now - old) | bounced, frozenset(old - now), bounced)


def assignments_of(topic_assignments: dict[str, dict[int, list[int]]], tps: Iterable[TP]
                   ) -> dict[str, dict[int, list[int]]]:
    """The assignments of just ``tps``, in the shape :func:`on_brokers_changed` takes."""
    out: dict[str, dict[int, list[int]]] = {}
    for t, p in tps:
        out.setdefault(t, {})[p] = topic_assignments[t][p]
    return out


def restarted_isr_members(states: dict[TP, LeaderAndIsr], live: Iterable[int], broker_epochs: dict[int, int],
                          written_at: dict[TP, int], deleting: Iterable[str] = ()
                          ) -> dict[frozenset[int], dict[TP, LeaderAndIsr]]:
    """A new controller's view of bounced brokers: partitions grouped by their live ISR
    members registered (czxid) after the partition's state was last written (they
    restarted since they were put in the ISR, and may have lost what they held).
    Partitions without such members, or of topics being deleted, are left out."""
    live, deleting = set(live), set(deleting)
    out: dict[frozenset[int], dict[TP, LeaderAndIsr]] = {}
    for tp, s in states.items():
        restarted = frozenset(b for b in s.isr if b in live and broker_epochs.get(b, -1) > written_at.get(tp, 1 << 62))
        if restarted and tp[0] not in deleting:
            out.setdefault(restarted, {})[tp] = s
    return out
