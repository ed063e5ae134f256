"""One partition on this broker: its log, its role, and the shell around the
pure :class:`LeaderState` / :class:`FollowerState` (HW, ISR, assignment, znode
version) and :class:`ProducerStateManager`.

Each fact has one owner: while this replica leads, HW, ISR, replicas and the znode
version live in its ``LeaderState``; otherwise in its ``FollowerState``. A role
change hands them over; nothing here keeps a second copy.

Thread-safe: one lock per partition guards role, log mutations and state (lock
order: package docstring); ``cond`` is notified whenever the LEO or the HW moves,
which wakes acks=all waiters and long-polling fetches.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from replikafka import errors as E
from replikafka.broker.replica.partition_state import FollowerState, LeaderState
from replikafka.broker.replica.producer_state import NO_PRODUCER_ID, Duplicate, ProducerStateManager

LEADER, FOLLOWER, NONE = "leader", "follower", "none"
log = logging.getLogger("replikafka.partition")


@dataclass(frozen=True)
class ProduceResult:
    first_offset: int
    last_offset: int
    record_count: int
    duplicate: bool = False


@dataclass(frozen=True)
class ReplicaRead:
    """A read's outcome: ``data`` (stored batches for a consumer, raw bytes for a
    replica, None when there is nothing to return) and the offsets it was read at."""
    data: Any
    high_watermark: int
    log_end_offset: int
    log_start_offset: int


@dataclass(frozen=True)
class LeaderOffsets:
    """What a leader answers ListOffsets with; ``hw_known`` False while a new leader's
    HW may still be below what its predecessor showed (KIP-207, :meth:`LeaderState.client_hw`)."""
    high_watermark: int
    log_end_offset: int
    log_start_offset: int
    leader_epoch: int
    hw_known: bool


def _no_news(tp) -> None:
    pass


class Partition:
    def __init__(self, topic: str, partition: int, broker_id: int, log, clock, hw: int = 0):
        self.topic = topic
        self.partition = partition
        self.broker_id = broker_id
        self.log = log
        self.clock = clock
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self.role = NONE
        self._tp = (topic, partition)
        # Told this partition's tp whenever its LEO, HW, role or epoch moves as a leader sees
        # it (the replica manager's ChangeJournal: fetch sessions read only what moved).
        self.on_news = _no_news
        self.leader_id = -1
        self.leader_epoch = -1
        self.controller_epoch = -1
        self.state: LeaderState | FollowerState = FollowerState((), (), -1, min(hw, log.log_end_offset))
        # Rebuilt from the log's batch headers on first use, not here: a broker taking
        # up 50,000 partitions at start-up would read every batch header of every log.
        self._producers: ProducerStateManager | None = None

    @property
    def producers(self) -> ProducerStateManager:
        """Idempotent producers' state, rebuilt from the log on first use."""
        with self.lock:
            if self._producers is None:
                built = ProducerStateManager()
                now = self.clock.time_ms()
                for h in self.log.batch_headers(0):
                    # "Last seen" counts from when this replica saw the batch (not its
                    # producer-set timestamp, which may be old): expiry never comes early.
                    built.update(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count, h.base_offset,
                                 now)
                self._producers = built
            return self._producers

    @property
    def producers_if_built(self) -> ProducerStateManager | None:
        """The producers' state if something used it yet (maintenance skips the rest)."""
        return self._producers

    @property
    def tp(self) -> tuple[str, int]:
        return self._tp

    def _news(self) -> None:
        """The LEO, HW, role or epoch moved (under ``lock``): wake the waiters, tell the journal."""
        self.cond.notify_all()
        self.on_news(self._tp)

    # The facts, read from their one owner (``state``).
    @property
    def hw(self) -> int:
        return self.state.hw

    @property
    def isr(self) -> tuple[int, ...]:
        return self.state.isr

    @property
    def replicas(self) -> tuple[int, ...]:
        return self.state.replicas

    @property
    def zk_version(self) -> int:
        return self.state.zk_version

    @property
    def leader_state(self) -> LeaderState | None:
        return self.state if isinstance(self.state, LeaderState) else None

    def _hand_over(self, replicas, isr, zk_version: int) -> None:
        """Leave leadership (or stay a follower): the facts move to a FollowerState."""
        self.state = FollowerState(tuple(replicas), tuple(isr), zk_version, self.state.hw)

    # ------------------------------------------------------------ role changes
    def make_leader(self, leader_epoch: int, isr, replicas, zk_version: int, controller_epoch: int) -> bool:
        """Become (or stay) leader. Returns False for a stale request (older epoch)."""
        with self.lock:
            if leader_epoch < self.leader_epoch:
                return False
            now = self.clock.time_ms()
            if self.role == LEADER and leader_epoch == self.leader_epoch:
                # Same epoch: only the ISR or its znode version moved (a shrink can commit).
                st = self.state
                if zk_version < st.zk_version:
                    return True  # older than the ISR we wrote ourselves since: keep ours
                st.on_replicas_changed(tuple(replicas), now)
                st.on_isr_committed(tuple(isr), zk_version, self.log.log_end_offset)
                self._news()
                return True
            leo = self.log.log_end_offset
            self.log.leader_epoch_cache.assign(leader_epoch, leo)
            self.role, self.leader_id, self.leader_epoch = LEADER, self.broker_id, leader_epoch
            self.controller_epoch = controller_epoch
            self.state = LeaderState(self.broker_id, leader_epoch, tuple(replicas), tuple(isr), zk_version,
                                     hw=min(self.hw, leo), epoch_start_offset=leo, now_ms=now)
            self.state.maybe_advance_hw(leo)
            self._news()
            return True

    def make_follower(self, leader: int, leader_epoch: int, isr, replicas, zk_version: int,
                      controller_epoch: int) -> bool:
        """Become a follower of ``leader``. Returns True when fetching must (re)start
        (new leader or new epoch), False for a stale or repeated request."""
        with self.lock:
            if leader_epoch < self.leader_epoch:
                return False  # stale: its ISR is older than what we know
            if leader_epoch == self.leader_epoch and self.role == FOLLOWER and leader == self.leader_id:
                self.state.isr, self.state.zk_version = tuple(isr), zk_version   # a repeat: learn the ISR
                return False
            self.role, self.leader_id, self.leader_epoch = FOLLOWER, leader, leader_epoch
            self._hand_over(replicas, isr, zk_version)
            self.controller_epoch = controller_epoch
            self._news()
            return leader >= 0

    def stop(self) -> None:
        with self.lock:
            self.role = NONE
            self._hand_over(self.replicas, self.isr, self.zk_version)
            self._news()

    def check_epoch(self, current_leader_epoch: int) -> None:
        """KIP-320 fencing of a request carrying the caller's view of the epoch."""
        if current_leader_epoch < 0:
            return
        if current_leader_epoch < self.leader_epoch:
            raise E.FencedLeaderEpochError(
                f"{self.topic}-{self.partition}: request epoch {current_leader_epoch} < current {self.leader_epoch}")
        if current_leader_epoch > self.leader_epoch:
            raise E.UnknownLeaderEpochError(
                f"{self.topic}-{self.partition}: request epoch {current_leader_epoch} > known {self.leader_epoch}")

    def _require_leader(self) -> LeaderState:
        if self.role != LEADER or not isinstance(self.state, LeaderState):
            raise E.NotLeaderOrFollowerError(
                f"broker {self.broker_id} is not the leader of {self.topic}-{self.partition} "
                f"(leader is {self.leader_id})")
        return self.state

    # ------------------------------------------------------------ leader: produce
    def append_as_leader(self, batches, acks: int, min_insync: int, producer_id: int = -1,
                         producer_epoch: int = -1, base_sequence: int = -1,
                         body_crc32c=None, sent_messages=None) -> ProduceResult:
        """``body_crc32c``: the producer's CRC-32C per batch body (a Flight append), checked by the log;
        ``sent_messages``: per batch, the producer's IPC message the log may store verbatim, or None."""
        count = sum(b.num_rows for b in batches)
        with self.lock:
            st = self._require_leader()
            if acks == -1 and len(st.isr) < min_insync:
                raise E.NotEnoughReplicasError(
                    f"{self.topic}-{self.partition}: ISR {list(st.isr)} has fewer than "
                    f"min.insync.replicas={min_insync} members")
            # A plain (not idempotent) producer needs no producer state: it is not built for it.
            idempotent = producer_id != NO_PRODUCER_ID
            dup = self.producers.check(producer_id, producer_epoch, base_sequence, count) if idempotent else None
            if isinstance(dup, Duplicate):
                return ProduceResult(dup.first_offset, dup.last_offset, count, duplicate=True)
            info = self.log.append(batches, leader_epoch=self.leader_epoch, producer_id=producer_id,
                                   producer_epoch=producer_epoch, base_sequence=base_sequence,
                                   body_crc32c=body_crc32c, sent_messages=sent_messages)
            if idempotent:
                self.producers.update(producer_id, producer_epoch, base_sequence, count, info.first_offset,
                                      self.clock.time_ms())
            st.maybe_advance_hw(self.log.log_end_offset)
            self._news()
            return ProduceResult(info.first_offset, info.last_offset, count)

    def committed(self, offset_exclusive: int, min_insync: int) -> bool:
        """acks=all: has the HW reached ``offset_exclusive``? Raises if this broker no
        longer leads, or the ISR shrank below ``min_insync`` meanwhile."""
        with self.lock:
            st = self._require_leader()
            if st.hw < offset_exclusive:
                return False
            if len(st.isr) < min_insync:
                raise E.NotEnoughReplicasAfterAppendError(
                    f"{self.topic}-{self.partition}: ISR shrank to {list(st.isr)} below "
                    f"min.insync.replicas={min_insync}")
            return True

    def wait_committed(self, offset_exclusive: int, deadline_ms: int, min_insync: int) -> None:
        """acks=all: wait until the HW reaches ``offset_exclusive``."""
        with self.lock:
            while True:
                if self.committed(offset_exclusive, min_insync):
                    return
                st = self.state
                left = deadline_ms - self.clock.time_ms()
                if left <= 0:
                    raise E.RequestTimedOutError(
                        f"{self.topic}-{self.partition}: not replicated to the ISR {list(st.isr)} in time")
                self.cond.wait(min(left, 100) / 1000.0)

    # ------------------------------------------------------------ leader: reads
    def read_committed(self, offset: int, max_bytes: int, current_leader_epoch: int,
                       end: int | None = None) -> ReplicaRead:
        """Consumers (Fetch and Flight): the stored batches holding [offset, min(end, HW)),
        verbatim (``Log.read_stored``); [HW, LEO] gives None. While a new leader's HW is not known yet (:meth:`LeaderState.client_hw`)
        the answer is empty with HW -1: the reader waits and asks again, and never sees
        its HW go back."""
        with self.lock:
            st = self._require_leader()
            self.check_epoch(current_leader_epoch)
            hw, leo, lso = st.client_hw(), self.log.log_end_offset, self.log.log_start_offset
        if offset < lso or offset > leo:
            raise E.OffsetOutOfRangeError(
                f"{self.topic}-{self.partition}: offset {offset} is outside [{lso}, {leo}]")
        if offset >= hw:
            return ReplicaRead(None, hw, leo, lso)
        return ReplicaRead(self.log.read_stored(offset, max_bytes, hw if end is None else min(end, hw)), hw, leo, lso)

    def wait_committed_past(self, offset: int, timeout_s: float) -> None:
        """A reader's long poll (a Flight DoGet): return once the HW readers may see
        passes ``offset``, this broker stops leading, or ``timeout_s`` passed. Woken
        by ``cond``, which every HW move notifies: no polling."""
        deadline = time.monotonic() + timeout_s
        with self.cond:
            while True:
                st = self.leader_state
                if self.role != LEADER or st is None or st.client_hw() > offset:
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cond.wait(left)

    def read_for_follower(self, replica_id: int, offset: int, max_bytes: int, current_leader_epoch: int,
                          session=None) -> ReplicaRead:
        """A follower's fetch (in fetch ``session``, if any): records its LEO (may move
        the HW), returns raw batches."""
        with self.lock:
            st = self._require_leader()
            self.check_epoch(current_leader_epoch)
            leo, lso = self.log.log_end_offset, self.log.log_start_offset
            if offset > leo or offset < lso:
                raise E.OffsetOutOfRangeError(
                    f"{self.topic}-{self.partition}: follower offset {offset} is outside [{lso}, {leo}]")
            if st.on_follower_fetch(replica_id, offset, leo, self.clock.time_ms(), session):
                log.debug("%s-%d: follower %d fetched at %d (epoch %d): HW -> %d", self.topic, self.partition,
                          replica_id, offset, current_leader_epoch, st.hw)
                self._news()
            hw = st.hw
        raw = self.log.read_raw(offset, max_bytes) if offset < leo else None
        return ReplicaRead(raw, hw, leo, lso)

    def read_for_debugging(self, offset: int, max_bytes: int, current_leader_epoch: int) -> ReplicaRead:
        """A debugging fetch (replica id -2, as replica-verification sends): this
        replica's own stored batches, verbatim, from the one holding ``offset``
        (from the log start if ``offset`` is below it; none at or past the LEO),
        whatever its role, with its own HW, LEO and log start. Records nothing:
        no follower LEO, no HW or ISR change."""
        with self.lock:
            self.check_epoch(current_leader_epoch)
            hw, leo, lso = self.hw, self.log.log_end_offset, self.log.log_start_offset
        start = max(offset, lso)
        raw = self.log.read_raw(start, max_bytes) if start < leo else None
        return ReplicaRead(raw, hw, leo, lso)

    def leader_offsets(self, current_leader_epoch: int) -> LeaderOffsets:
        """As the leader, checking the caller's epoch."""
        with self.lock:
            st = self._require_leader()
            self.check_epoch(current_leader_epoch)
            return LeaderOffsets(st.hw, self.log.log_end_offset, self.log.log_start_offset, self.leader_epoch,
                                 st.client_hw() >= 0)

    def end_offset_for_epoch(self, epoch: int, current_leader_epoch: int) -> tuple[int, int]:
        """OffsetsForLeaderEpoch, as the leader (KIP-279)."""
        with self.lock:
            self._require_leader()
            self.check_epoch(current_leader_epoch)
            return self.log.leader_epoch_cache.end_offset_for(epoch, self.log.log_end_offset)

    # ------------------------------------------------------------ leader: ISR
    def isr_change_wanted(self, lag_time_ms_max: int):
        """An ISR change to write, as (new ISR, the LeaderState it was decided in, leader
        epoch, znode version, controller epoch), all read under one lock so a LeaderAndIsr
        arriving meanwhile cannot pair an old decision with a new epoch. None: no change."""
        with self.lock:
            st = self.leader_state
            if self.role != LEADER or st is None:
                return None
            leo = self.log.log_end_offset
            new = st.isr_to_shrink(self.clock.time_ms(), leo, lag_time_ms_max) or st.isr_to_expand()
            if new is None:
                return None
            st.pending_isr = new
            return new, st, self.leader_epoch, st.zk_version, self.controller_epoch

    def isr_change_done(self, isr, zk_version: int | None, decided_in=None) -> None:
        """Our ISR write of a change decided in ``decided_in`` was applied as ``zk_version``
        (None: refused). Also how a leader learns a newer version of its own epoch's ISR."""
        with self.lock:
            st = self.leader_state
            if st is None or (decided_in is not None and st is not decided_in):
                return  # a LeaderAndIsr replaced the state the change was decided in
            if zk_version is None:
                st.pending_isr = None
                return
            st.on_isr_committed(tuple(isr), zk_version, self.log.log_end_offset)
            self._news()

    # ------------------------------------------------------------ follower
    def append_as_follower(self, raw, leader_hw: int, expected_epoch: int, checked=None) -> int:
        """Append replicated batches verbatim; returns records appended. ``checked``:
        ``raw`` as `raw_streams.check_raw_streams` checked it, or None (see `Log.append_raw`)."""
        with self.lock:
            if self.role != FOLLOWER or self.leader_epoch != expected_epoch:
                return 0
            n = 0
            if raw is not None and len(raw):
                info = self.log.append_raw(raw, checked)
                n = info.record_count
                # As validated by the append: no second read. State not built yet is
                # built from the log, these batches included, when first used.
                for h in info.headers if self._producers is not None else ():
                    self._producers.update(h.producer_id, h.producer_epoch, h.base_sequence, h.record_count,
                                          h.base_offset, self.clock.time_ms())
            new_hw = min(leader_hw, self.log.log_end_offset)
            if new_hw > self.state.hw:
                self.state.hw = new_hw
            self.cond.notify_all()
            return n

    def truncate_to(self, offset: int, expected_epoch: int | None = None) -> bool:
        """A follower's truncation (by epoch, or to the HW). With ``expected_epoch``, only
        while still a follower in that epoch: a fetcher round that began before a
        LeaderAndIsr made us leader must not cut the leader's log. True if applied."""
        with self.lock:
            if expected_epoch is not None and (self.role != FOLLOWER or self.leader_epoch != expected_epoch):
                return False
            if offset < self.log.log_end_offset:
                self.log.truncate_to(offset)
                if self._producers is not None:
                    self._producers.truncate_to(offset)
            if self.leader_state is None:  # (a leader's HW is never above its LEO)
                self.state.hw = min(self.state.hw, self.log.log_end_offset)
            return True

    def reset_to(self, offset: int, expected_epoch: int | None = None) -> None:
        """The leader's log starts after our LEO (retention): start over at ``offset``."""
        with self.lock:
            if expected_epoch is not None and (self.role != FOLLOWER or self.leader_epoch != expected_epoch):
                return
            self.log.truncate_fully_and_start_at(offset)
            self._producers = ProducerStateManager()
            self.state.hw = offset
