"""Incremental fetch sessions (Kafka's KIP-227: ``FetchSession.scala`` on the leader,
``FetchSessionHandler.java`` on the follower), so that a replication round costs what
the partitions with news cost, not what the partitions named cost.

A follower's first fetch is full: it names every partition and opens a session (an
id, and an epoch each later fetch must carry, the next one 1). Later fetches of that
session name only the partitions whose fields (fetch offset, leader epoch, follower
HW, last fetched epoch, bytes) changed since the last, and in ``forgotten`` those the
follower stopped fetching; the leader keeps the rest as last named. The leader reads
only the partitions named, those whose own state moved since the session's last
fetch (``ChangeJournal``) and those that answered an error last time; the others
have nothing new and are left out (they would be left out of the answer anyway).

A session the leader does not hold (evicted, closed, the leader restarted, another
follower's) is refused whole with FETCH_SESSION_ID_NOT_FOUND, a wrong epoch (a lost
answer) with INVALID_FETCH_SESSION_EPOCH; either way the follower's next fetch is
full and opens a new session. The cache holds ``max.incremental.fetch.session.cache.slots``
sessions and evicts the least recently used; with no slot a full fetch is answered
without a session (id 0) and the follower keeps fetching in full.

Pure: no I/O, no threads, no clock (times come in as arguments). The leader's shell
(``ReplicaManager``) keeps its ``FetchSessionCache`` under its own lock; each
follower's fetcher owns one ``FetchSessionHandler``. ``ChangeJournal`` alone is
thread-safe (every partition of the leader appends to it).
"""
from __future__ import annotations

import random
import threading
from collections import OrderedDict

from replikafka import errors as E
from replikafka.broker.replica import messages as M

TP = tuple[str, int]
INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0        # a full fetch opening a session
FINAL_EPOCH = -1         # a full fetch closing one, opening none
EPOCH_MAX = (1 << 31) - 1
JOURNAL_ENTRIES_MAX = 1 << 18


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= EPOCH_MAX else epoch + 1


# ---------------------------------------------------------------- the leader's side
class FetchSession:
    """One follower's session on the leader: its partitions as last named
    (``M.FetchPartition`` by tp), the epoch its next fetch must carry, where in the
    leader's ``ChangeJournal`` its last fetch read up to, the partitions to read again
    whatever happens (they answered an error), and ``last_fetch_ms``: when its latest
    finished read pass began. A partition found caught up by a read of this session
    and left unread since stays caught up as of that time (``ReplicaProgress.parked_in``:
    the ISR credit of a partition with nothing new)."""

    __slots__ = ("id", "replica_id", "replica_epoch", "epoch", "partitions", "last_used_ms", "last_fetch_ms",
                 "journal_position", "retry")

    def __init__(self, session_id: int, replica_id: int, replica_epoch: int, partitions: dict, now_ms: int,
                 journal_position: int):
        self.id = session_id
        self.replica_id = replica_id
        self.replica_epoch = replica_epoch
        self.epoch = 1
        self.partitions: dict[TP, M.FetchPartition] = partitions
        self.last_used_ms = now_ms
        self.last_fetch_ms = 0
        self.journal_position = journal_position
        self.retry: set[TP] = set()

    def update(self, named, forgotten) -> None:
        """An incremental fetch's changes: ``named`` FetchPartitions replace (or add)
        theirs, ``forgotten`` tps leave."""
        parts = self.partitions
        for tp in forgotten:
            parts.pop(tp, None)
            self.retry.discard(tp)
        for fp in named:
            parts[(fp.topic, fp.partition)] = fp


class FetchSessionCache:
    """The leader's sessions, at most ``max_slots`` (0: none), least recently used first."""

    def __init__(self, max_slots: int, rng: random.Random | None = None):
        self.max_slots = max_slots
        self.sessions: OrderedDict[int, FetchSession] = OrderedDict()
        self.rng = rng or random.Random()
        self.evictions = 0          # IncrementalFetchSessionEvictions (cumulative)

    def __len__(self) -> int:
        return len(self.sessions)

    def new_session(self, replica_id: int, replica_epoch: int, partitions: dict, now_ms: int,
                    journal_position: int) -> FetchSession | None:
        """A full fetch's new session, or None when sessions are off (no slot)."""
        if self.max_slots <= 0:
            return None
        # The follower restarted (a new broker epoch): its earlier process's sessions are dead.
        for sid in [sid for sid, s in self.sessions.items()
                    if s.replica_id == replica_id and s.replica_epoch != replica_epoch]:
            self.remove(sid)
        while len(self.sessions) >= self.max_slots:
            self.sessions.popitem(last=False)
            self.evictions += 1
        sid = INVALID_SESSION_ID
        while sid == INVALID_SESSION_ID or sid in self.sessions:
            sid = self.rng.randrange(1, EPOCH_MAX)
        s = self.sessions[sid] = FetchSession(sid, replica_id, replica_epoch, partitions, now_ms, journal_position)
        return s

    def resume(self, session_id: int, epoch: int, replica_id: int, replica_epoch: int, now_ms: int) -> FetchSession:
        """An incremental fetch's session, its epoch moved on to the next fetch's; raises
        FetchSessionIdNotFoundError / InvalidFetchSessionEpochError."""
        s = self.sessions.get(session_id)
        if s is None or s.replica_id != replica_id or s.replica_epoch != replica_epoch:
            raise E.FetchSessionIdNotFoundError(
                f"fetch session {session_id} of replica {replica_id} (broker epoch {replica_epoch}) is not held "
                f"here: fetch in full")
        if epoch != s.epoch:
            raise E.InvalidFetchSessionEpochError(
                f"fetch session {session_id} of replica {replica_id}: epoch {epoch}, expected {s.epoch}: "
                f"fetch in full")
        s.epoch = next_epoch(epoch)
        s.last_used_ms = now_ms
        self.sessions.move_to_end(session_id)
        return s

    def remove(self, session_id: int) -> FetchSession | None:
        s = self.sessions.pop(session_id, None)
        if s is not None:
            s.partitions = {}      # a closed session keeps only its times (parked partitions' credit)
            s.retry = set()
        return s


class ChangeJournal:
    """The leader's partitions whose state moved (LEO, HW, role, epoch), in order: a
    session reads what moved since its last fetch instead of every partition it holds.
    ``append`` takes no lock (a list append is atomic) and runs on every append and HW
    move; ``since`` and ``trim`` take ``lock``. Bounded: past ``max_entries`` the oldest
    half goes, and a reader that had not seen it gets None (look at everything)."""

    def __init__(self, max_entries: int = JOURNAL_ENTRIES_MAX):
        self.max_entries = max_entries
        self._entries: list = []
        self._base = 0
        self.lock = threading.Lock()

    def append(self, tp) -> None:
        entries = self._entries
        entries.append(tp)
        if len(entries) > self.max_entries:
            with self.lock:
                if len(self._entries) > self.max_entries:
                    self._drop(len(self._entries) - self.max_entries // 2)

    def position(self) -> int:
        with self.lock:
            return self._base + len(self._entries)

    def since(self, position: int) -> tuple[set | None, int]:
        """(the tps appended from ``position`` on, or None if some are gone; the position now)."""
        with self.lock:
            end = len(self._entries)
            if position < self._base:
                return None, self._base + end
            return set(self._entries[position - self._base:end]), self._base + end

    def trim(self, position: int) -> None:
        """Every reader is at ``position`` or past it: drop what is before."""
        with self.lock:
            self._drop(min(position - self._base, len(self._entries)))

    def _drop(self, n: int) -> None:
        if n > 0:
            del self._entries[:n]
            self._base += n


# ---------------------------------------------------------------- the follower's side
class FetchSessionHandler:
    """A follower fetcher's side of its session (Kafka's FetchSessionHandler): the
    session's id, its next epoch, and ``sent``: the partitions as the leader's session
    holds them. ``request`` makes the next fetch's partitions, ``on_answer`` /
    ``on_failure`` learn how it went."""

    def __init__(self):
        self.session_id = INVALID_SESSION_ID
        self.epoch = INITIAL_EPOCH
        self.sent: dict[TP, M.FetchPartition] = {}
        self._pending: tuple | None = None

    @property
    def full_next(self) -> bool:
        """The next fetch must name every partition (no session yet, or it was lost)."""
        return self.epoch == INITIAL_EPOCH

    def request(self, entries: dict, dropped=()) -> tuple[tuple, tuple, int, int]:
        """(partitions to name, tps to forget, session id, session epoch) of the next
        fetch. Full (``full_next``): ``entries`` are every partition to fetch. Else the
        entries of the partitions that may have changed, and ``dropped`` those no longer
        fetched: only what differs from ``sent`` is named."""
        if self.full_next:
            self._pending = (True, entries, ())
            return tuple(entries.values()), (), self.session_id, INITIAL_EPOCH
        sent = self.sent
        changed = {tp: fp for tp, fp in entries.items() if sent.get(tp) != fp}
        forgotten = tuple(tp for tp in dropped if tp in sent and tp not in entries)
        self._pending = (False, changed, forgotten)
        return tuple(changed.values()), forgotten, self.session_id, self.epoch

    def on_answer(self, session_id: int, error: E.ReplikafkaError | None) -> None:
        full, changed, forgotten = self._pending
        self._pending = None
        if isinstance(error, E.FetchSessionIdNotFoundError):
            self.session_id, self.epoch, self.sent = INVALID_SESSION_ID, INITIAL_EPOCH, {}
        elif error is not None:   # a wrong epoch (or anything else refusing the whole fetch): close it, start over
            self.epoch, self.sent = INITIAL_EPOCH, {}
        elif full:
            if session_id == INVALID_SESSION_ID:   # the leader holds no session for us: every fetch is full
                self.session_id, self.epoch, self.sent = INVALID_SESSION_ID, INITIAL_EPOCH, {}
            else:
                self.session_id, self.epoch, self.sent = session_id, 1, dict(changed)
        else:
            self.epoch = next_epoch(self.epoch)
            self.sent.update(changed)
            for tp in forgotten:
                self.sent.pop(tp, None)

    def on_failure(self) -> None:
        """The fetch or its answer was lost: the leader's session may have moved on or
        not, so the next fetch is full (and closes this session)."""
        self._pending = None
        self.epoch, self.sent = INITIAL_EPOCH, {}
