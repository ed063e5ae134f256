"""Pure replication state of one partition as its leader sees it.

No I/O, no threads, no clock: events go in (a follower fetched, the leader
appended, time passed, an ISR change was committed), decisions come out (the HW
moved, the ISR should shrink or expand). The :class:`Partition` shell in
``partition.py`` owns the lock, the log and ZooKeeper.

Rules (seed 000 §3-§7, with what Kafka learnt later):
* a fetch at offset ``o`` acknowledges everything below ``o`` (the follower's LEO);
* HW = min LEO over the ISR, and never moves backwards;
* a follower is caught up when its fetch offset reached the leader's LEO; it
  falls out of the ISR when it has not been caught up for ``lag_time_ms_max``;
* an out-of-sync follower re-enters the ISR once its LEO reaches the HW and the
  start of the current leader epoch (Kafka's rule: the HW cannot go backwards);
* a follower fetching in a session (``fetch_session.py``) whose partition has nothing
  new is not read at all: found caught up by a read of that session, it stays caught up
  as of the session's latest fetch until read again (``ReplicaProgress.parked_in``), so
  it looks no more lagging than if it had been read every round.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FollowerState:
    """What a follower (or a stopped replica) knows of its partition: the assignment and
    ISR the controller last sent, their znode version, and its own HW (learnt from the
    leader's fetch answers, never above its LEO). :class:`LeaderState` holds the same
    facts while this replica leads: a partition has one or the other, never both."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    zk_version: int
    hw: int


@dataclass
class ReplicaProgress:
    leo: int = -1                    # unknown until the follower fetches under this epoch
    last_caught_up_ms: int = 0
    last_fetch_ms: int = 0
    last_fetch_leader_leo: int = -1  # the leader's LEO when the previous fetch was answered
    # The fetch session (anything with ``last_fetch_ms``) whose read last found this
    # follower caught up, while no read since: each of its fetches since then counts
    # as a fetch at the leader's LEO (it left the partition unread: nothing had moved).
    parked_in: object = None

    def caught_up_ms(self) -> int:
        parked = self.parked_in
        if parked is not None and parked.last_fetch_ms > self.last_caught_up_ms:
            return parked.last_fetch_ms
        return self.last_caught_up_ms


@dataclass
class LeaderState:
    broker_id: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    zk_version: int
    hw: int
    epoch_start_offset: int
    now_ms: int
    progress: dict[int, ReplicaProgress] = field(default_factory=dict)
    pending_isr: tuple[int, ...] | None = None   # an ISR write in flight

    def __post_init__(self):
        for r in self.replicas:
            if r != self.broker_id and r not in self.progress:
                # Followers get a full lag window from the moment we lead.
                self.progress[r] = ReplicaProgress(last_caught_up_ms=self.now_ms, last_fetch_ms=self.now_ms)

    # ---------------------------------------------------------------- events
    def on_follower_fetch(self, replica: int, fetch_offset: int, leader_leo: int, now_ms: int,
                          session=None) -> bool:
        """A follower fetched at ``fetch_offset`` (in ``session``, if it fetches in one).
        Returns True when the HW advanced."""
        p = self.progress.get(replica)
        if p is None:
            return False  # not a replica of this partition (stale assignment): ignore
        parked = p.parked_in
        if parked is not None:   # the session's fetches since the last read: fetches at our LEO then
            t = parked.last_fetch_ms
            if t > p.last_fetch_ms:
                p.last_fetch_ms = t
            if t > p.last_caught_up_ms:
                p.last_caught_up_ms = t
        p.parked_in = session if fetch_offset >= leader_leo else None
        if fetch_offset >= leader_leo:
            p.last_caught_up_ms = now_ms
        elif fetch_offset >= p.last_fetch_leader_leo >= 0:
            p.last_caught_up_ms = max(p.last_caught_up_ms, p.last_fetch_ms)
        p.leo = fetch_offset
        p.last_fetch_ms = now_ms
        p.last_fetch_leader_leo = leader_leo
        return self.maybe_advance_hw(leader_leo)

    def maybe_advance_hw(self, leader_leo: int) -> bool:
        leos = [leader_leo]
        for r in self.isr:
            if r == self.broker_id:
                continue
            p = self.progress.get(r)
            leos.append(p.leo if p is not None else -1)
        new_hw = min(leos)
        if new_hw > self.hw:
            self.hw = new_hw
            return True
        return False

    def client_hw(self) -> int:
        """The HW readers may see, or -1 while it is not known (KIP-207). A new leader
        starts from its follower HW, which may lag the HW its predecessor reported;
        until that HW reaches the start of this epoch (every record before it was
        written by an earlier leader, so it is committed once the ISR has it), the HW
        a reader saw before the change could be above it: reporting it would move the
        reader's HW backwards."""
        return self.hw if self.hw >= self.epoch_start_offset else -1

    # ---------------------------------------------------------------- ISR decisions
    def isr_to_shrink(self, now_ms: int, leader_leo: int, lag_time_ms_max: int) -> tuple[int, ...] | None:
        """The ISR without followers that have not caught up for ``lag_time_ms_max``."""
        if self.pending_isr is not None:
            return None
        out = [r for r in self.isr if r != self.broker_id
               and self.progress[r].leo < leader_leo
               and now_ms - self.progress[r].caught_up_ms() > lag_time_ms_max]
        if not out:
            return None
        return tuple(r for r in self.isr if r not in out)

    def isr_to_expand(self) -> tuple[int, ...] | None:
        """The ISR plus out-of-sync followers whose LEO reached the HW and this epoch's start."""
        if self.pending_isr is not None:
            return None
        back = [r for r in self.replicas if r not in self.isr and r != self.broker_id
                and self.progress[r].leo >= max(self.hw, self.epoch_start_offset)]
        if not back:
            return None
        return tuple(r for r in self.replicas if r in self.isr or r in back)

    def on_replicas_changed(self, replicas: tuple[int, ...], now_ms: int) -> None:
        """The assignment changed under the same epoch (a reassignment resent by a new
        controller): track new followers from now, forget removed ones."""
        self.replicas = tuple(replicas)
        for r in replicas:
            if r != self.broker_id and r not in self.progress:
                self.progress[r] = ReplicaProgress(last_caught_up_ms=now_ms, last_fetch_ms=now_ms)
        for r in [r for r in self.progress if r not in replicas and r not in self.isr]:
            del self.progress[r]

    def on_isr_committed(self, isr: tuple[int, ...], zk_version: int, leader_leo: int) -> bool:
        """An ISR change (our write, or the controller's) is in ZooKeeper.
        Returns True when the HW advanced (a shrink can do that)."""
        for r in set(self.isr) - set(isr):
            # Forget what a removed follower had: only a fresh fetch may bring it back.
            if r in self.progress:
                self.progress[r].leo = -1
                self.progress[r].parked_in = None
        self.isr = tuple(isr)
        self.zk_version = zk_version
        self.pending_isr = None
        return self.maybe_advance_hw(leader_leo)
