"""Incremental fetch sessions (KIP-227): the pure session logic on both sides, the
leader reading only the partitions that may have news, the ISR credit of partitions
left unread, and a follower that recovers at once from a session the leader lost.
Real partitions and logs; the follower's fetcher reaches the leader's ReplicaManager
through the RPC layer's plain-data calls."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from replikafka import errors as E
from replikafka.broker.replica import fetch_session as FS
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import Partition
from replikafka.broker.replica.partition_state import LeaderState
from replikafka.broker.storage import ManualClock
from test_follower_fetch_news import T0, TPS, batch, follower_fetcher, leader_manager


def fp(tp, offset=0, epoch=3, hw=0):
    return M.FetchPartition(tp[0], tp[1], offset, epoch, 1 << 20, -1, hw)


# ---------------------------------------------------------------- the leader's cache
def test_a_session_is_resumed_only_by_its_follower_at_the_expected_epoch():
    cache = FS.FetchSessionCache(10, random.Random(1))
    s = cache.new_session(2, 200, {TPS[0]: fp(TPS[0])}, now_ms=0, journal_position=0)
    assert s.id != FS.INVALID_SESSION_ID and s.epoch == 1
    assert cache.resume(s.id, 1, 2, 200, now_ms=1) is s and s.epoch == 2
    with pytest.raises(E.InvalidFetchSessionEpochError) as wrong:
        cache.resume(s.id, 1, 2, 200, now_ms=2)            # a repeated (or lost) fetch
    assert wrong.value.retriable and s.epoch == 2
    for sid, replica, broker_epoch in ((s.id + 1, 2, 200), (s.id, 3, 300), (s.id, 2, 201)):
        with pytest.raises(E.FetchSessionIdNotFoundError):
            cache.resume(sid, 2, replica, broker_epoch, now_ms=3)
    assert cache.resume(s.id, 2, 2, 200, now_ms=4).epoch == 3
    assert FS.next_epoch(FS.EPOCH_MAX) == 1                 # wraps past the largest epoch, never to 0


def test_the_cache_is_bounded_and_evicts_the_least_recently_used():
    cache = FS.FetchSessionCache(2, random.Random(1))
    a = cache.new_session(2, 200, {}, 0, 0)
    b = cache.new_session(3, 300, {}, 0, 0)
    cache.resume(a.id, 1, 2, 200, now_ms=5)                 # a used last: b goes first
    c = cache.new_session(4, 400, {}, 10, 0)
    assert list(cache.sessions) == [a.id, c.id] and cache.evictions == 1
    with pytest.raises(E.FetchSessionIdNotFoundError):
        cache.resume(b.id, 1, 3, 300, now_ms=11)
    assert FS.FetchSessionCache(0).new_session(2, 200, {}, 0, 0) is None   # no slots: no sessions


def test_a_follower_restarted_with_a_new_broker_epoch_drops_its_earlier_sessions():
    cache = FS.FetchSessionCache(10, random.Random(1))
    old1, old2 = cache.new_session(2, 200, {}, 0, 0), cache.new_session(2, 200, {}, 0, 0)
    other = cache.new_session(3, 300, {}, 0, 0)
    new = cache.new_session(2, 201, {}, 0, 0)
    assert set(cache.sessions) == {other.id, new.id} and old1.partitions == old2.partitions == {}
    assert cache.evictions == 0


def test_the_change_journal_gives_what_moved_since_a_position_and_stays_bounded():
    j = FS.ChangeJournal(max_entries=8)
    start = j.position()
    j.append(TPS[0]); j.append(TPS[1]); j.append(TPS[0])
    moved, at = j.since(start)
    assert moved == {TPS[0], TPS[1]} and at == start + 3
    assert j.since(at) == (set(), at)
    j.trim(at)
    assert j.since(at) == (set(), at)
    for _ in range(9):
        j.append(TPS[2])                                    # past its bound: the oldest half goes
    moved, end = j.since(at)
    assert moved is None and end == at + 9                  # what was not seen is gone: look at everything
    assert len(j._entries) <= 8


# ---------------------------------------------------------------- the follower's handler
def test_the_handler_names_everything_first_then_only_what_changed():
    h = FS.FetchSessionHandler()
    entries = {tp: fp(tp) for tp in TPS}
    parts, forgotten, sid, epoch = h.request(entries)
    assert (len(parts), forgotten, sid, epoch) == (3, (), 0, FS.INITIAL_EPOCH)
    h.on_answer(77, None)
    assert (h.session_id, h.epoch, h.full_next) == (77, 1, False)
    moved = {TPS[0]: fp(TPS[0], offset=5), TPS[1]: fp(TPS[1])}     # t-1 may have changed, but did not
    parts, forgotten, sid, epoch = h.request(moved, dropped=[TPS[2]])
    assert (parts, forgotten, sid, epoch) == ((fp(TPS[0], offset=5),), (TPS[2],), 77, 1)
    h.on_answer(77, None)
    assert h.epoch == 2 and h.sent == {TPS[0]: fp(TPS[0], offset=5), TPS[1]: fp(TPS[1])}
    assert h.request({}, dropped=[TPS[2]])[:2] == ((), ())  # forgotten already
    h.on_failure()                                          # the answer was lost: full, closing 77
    parts, _f, sid, epoch = h.request(entries)
    assert (len(parts), sid, epoch) == (3, 77, FS.INITIAL_EPOCH)
    h.on_answer(0, None)                                    # the leader keeps no session for us
    assert h.full_next and h.session_id == 0 and h.sent == {}


def test_a_refused_session_makes_the_next_fetch_full():
    h = FS.FetchSessionHandler()
    h.request({TPS[0]: fp(TPS[0])})
    h.on_answer(5, None)
    h.request({})
    h.on_answer(0, E.InvalidFetchSessionEpochError("x"))
    assert h.full_next and h.session_id == 5               # closes 5 as it opens the next
    h.request({TPS[0]: fp(TPS[0])})
    h.on_answer(6, None)
    h.request({})
    h.on_answer(0, E.FetchSessionIdNotFoundError("x"))
    assert h.full_next and h.session_id == FS.INVALID_SESSION_ID


# ---------------------------------------------------------------- the ISR credit of unread partitions
def test_a_partition_left_unread_in_a_session_stays_caught_up_as_of_its_last_fetch():
    s = LeaderState(broker_id=1, leader_epoch=3, replicas=(1, 2, 3), isr=(1, 2, 3), zk_version=0, hw=0,
                    epoch_start_offset=0, now_ms=0)
    session = SimpleNamespace(last_fetch_ms=0)
    s.on_follower_fetch(2, 100, leader_leo=100, now_ms=1_000, session=session)
    s.on_follower_fetch(3, 100, leader_leo=100, now_ms=1_000, session=session)
    session.last_fetch_ms = 20_000          # the session fetched until then, this partition unread (nothing new)
    # An append at 20,500: both followers are behind now, but were caught up at 20,000.
    assert s.isr_to_shrink(now_ms=25_000, leader_leo=101, lag_time_ms_max=10_000) is None
    # Read again (the append is news): it was caught up as of the session's last fetch.
    s.on_follower_fetch(2, 100, leader_leo=101, now_ms=26_000, session=session)
    assert s.progress[2].parked_in is None
    assert s.isr_to_shrink(now_ms=29_000, leader_leo=101, lag_time_ms_max=10_000) is None
    # Followers that stop fetching fall out as ever: the credit stops at their last fetch.
    assert s.isr_to_shrink(now_ms=30_001, leader_leo=101, lag_time_ms_max=10_000) == (1,)


# ---------------------------------------------------------------- the leader's shell
def session_fetch(rm, parts, session_id=0, session_epoch=0, forgotten=()):
    return rm.follower_fetch(M.FetchRequest(2, tuple(parts), replica_epoch=200, session_id=session_id,
                                            session_epoch=session_epoch, forgotten=tuple(forgotten)))


def counting_reads(monkeypatch) -> list:
    reads = []
    original = Partition.read_for_follower

    def read_for_follower(self, *args, **kw):
        reads.append(self.tp)
        return original(self, *args, **kw)
    monkeypatch.setattr(Partition, "read_for_follower", read_for_follower)
    return reads


def test_an_incremental_fetch_reads_only_what_was_named_moved_or_failed(tmp_path, monkeypatch):
    clock = ManualClock(T0)
    rm = leader_manager(tmp_path, clock)
    reads = counting_reads(monkeypatch)
    full = session_fetch(rm, [fp(tp) for tp in TPS])
    assert full.error is None and full.session_id and full.partitions == [] and sorted(reads) == TPS
    sid = full.session_id
    reads.clear()
    assert session_fetch(rm, [], sid, 1).partitions == [] and reads == []     # nothing new: nothing read
    rm.partitions[TPS[1]].append_as_leader([batch(3)], acks=1, min_insync=1)
    answer = session_fetch(rm, [], sid, 2)
    assert reads == [TPS[1]] and [(r.partition, r.record_count) for r in answer.partitions] == [(1, 3)]
    reads.clear()
    answer = session_fetch(rm, [fp(TPS[1], offset=3)], sid, 3)             # the follower has them: HW news
    assert reads == [TPS[1]] and [(r.partition, r.high_watermark) for r in answer.partitions] == [(1, 3)]
    reads.clear()
    # An error is read (and answered) again every fetch until something changes.
    answer = session_fetch(rm, [fp(TPS[1], offset=3, hw=3), fp(TPS[2], epoch=9)], sid, 4)
    assert [r.error.code for r in answer.partitions] == ["UNKNOWN_LEADER_EPOCH"]
    reads.clear()
    assert [r.partition for r in session_fetch(rm, [], sid, 5).partitions] == [2] and reads == [TPS[2]]
    reads.clear()
    session_fetch(rm, [], sid, 6, forgotten=[TPS[2]])                      # forgotten: read no more
    assert reads == []
    assert session_fetch(rm, [], sid, 6).error.code == "INVALID_FETCH_SESSION_EPOCH"
    assert session_fetch(rm, [], sid + 1, 7).error.code == "FETCH_SESSION_ID_NOT_FOUND"
    refused = session_fetch(rm, [fp(TPS[0])], sid, -5)                      # malformed: refused, nothing read
    assert refused.error.code == "INVALID_FETCH_SESSION_EPOCH" and "expected 7" in refused.error.message
    assert refused.partitions == [] and refused.error.retriable
    # Without a session (no session epoch), every partition named is read, as before.
    reads.clear()
    rm.follower_fetch(M.FetchRequest(2, tuple(fp(tp) for tp in TPS), replica_epoch=200))
    assert sorted(reads) == TPS


def test_partitions_left_unread_for_longer_than_the_lag_time_stay_in_the_isr(tmp_path):
    """The leader reads nothing of an idle session's partitions; when one is written to
    after more than replica.lag.time.max.ms of that, its followers were caught up as of
    their last fetch, not as of the last read: the ISR pass keeps them."""
    clock = ManualClock(T0)
    rm = leader_manager(tmp_path, clock)
    sid = session_fetch(rm, [fp(tp) for tp in TPS]).session_id
    for epoch in range(1, 31):                 # 30 s of fetches, every partition idle: none read
        clock.advance(1_000)
        assert session_fetch(rm, [], sid, epoch).partitions == []
    part = rm.partitions[TPS[0]]
    part.append_as_leader([batch(1)], acks=1, min_insync=1)
    clock.advance(500)
    assert part.isr_change_wanted(10_000) is None
    assert part.isr == (1, 2)
    clock.advance(10_000)                      # and a follower that stopped fetching still leaves
    assert part.isr_change_wanted(10_000)[0] == (1,)


# ---------------------------------------------------------------- the follower's fetcher
class SessionLeader:
    """The follower's LeaderEndpoint: the leader's ReplicaManager, in sessions; keeps each request and answer."""

    def __init__(self, rm):
        self.rm, self.requests, self.answers = rm, [], []

    def fetch(self, request, timeout_s):
        self.requests.append(request)
        answer = self.rm.follower_fetch(request)
        self.answers.append(answer)
        return answer

    def offsets_for_leader_epoch(self, replica_id, queries, timeout_s):
        return []

    def close(self):
        pass


def follower_setup(tmp_path, clock):
    rm = leader_manager(tmp_path, clock)
    leader = SessionLeader(rm)
    followers, fetcher = follower_fetcher(tmp_path, clock, leader)
    return rm, followers, leader, fetcher


def test_a_follower_names_only_what_changed_and_recovers_at_once_from_a_lost_session(tmp_path):
    clock = ManualClock(T0)
    rm, followers, leader, fetcher = follower_setup(tmp_path, clock)
    assert fetcher.do_work() is True
    assert len(leader.requests[-1].partitions) == 3 and leader.requests[-1].session_epoch == 0
    assert fetcher.do_work() is True
    assert leader.requests[-1].partitions == () and leader.requests[-1].session_epoch == 1
    rm.partitions[TPS[1]].append_as_leader([batch(5)], acks=1, min_insync=1)
    fetcher.do_work()                                      # the records
    fetcher.do_work()                                      # names t-1 at 5: its HW moves
    assert [p.partition for p in leader.requests[-1].partitions] == [1]
    fetcher.do_work()                                      # names t-1's HW
    assert (followers[TPS[1]].log.log_end_offset, followers[TPS[1]].hw) == (5, 5)
    # The leader loses every session (a restart, evictions): one refused fetch, then a full one.
    for sid in list(rm.fetch_sessions.sessions):
        rm.fetch_sessions.remove(sid)
    rm.partitions[TPS[2]].append_as_leader([batch(2)], acks=1, min_insync=1)
    assert fetcher.do_work() is True                       # refused: no backoff
    assert leader.answers[-1].error.code == "FETCH_SESSION_ID_NOT_FOUND"
    assert fetcher.do_work() is True
    assert len(leader.requests[-1].partitions) == 3 and leader.answers[-1].session_id
    fetcher.do_work()
    assert [(followers[tp].log.log_end_offset, followers[tp].hw) for tp in TPS] == [(0, 0), (5, 5), (2, 2)]
    # A partition the fetcher no longer follows is forgotten; back, it is named again.
    fetcher.remove(TPS[0])
    fetcher.do_work()
    assert leader.requests[-1].forgotten == (TPS[0],)
    fetcher.add(TPS[0], 3)
    fetcher.states[TPS[0]].truncating = False
    fetcher._dirty.add(TPS[0])
    fetcher.do_work()
    assert [p.partition for p in leader.requests[-1].partitions] == [0]


def test_a_lost_answer_makes_the_next_fetch_full_and_closes_the_session(tmp_path):
    clock = ManualClock(T0)
    rm, followers, leader, fetcher = follower_setup(tmp_path, clock)
    fetcher.do_work()
    sid = leader.answers[-1].session_id
    real = leader.fetch

    def lost(request, timeout_s):
        real(request, timeout_s)
        raise E.BrokerNotAvailableError("answer lost")
    leader.fetch = lost
    rm.partitions[TPS[0]].append_as_leader([batch(4)], acks=1, min_insync=1)
    with pytest.raises(E.BrokerNotAvailableError):
        fetcher.do_work()
    leader.fetch = real
    fetcher.do_work()
    assert (leader.requests[-1].session_id, leader.requests[-1].session_epoch) == (sid, 0)
    assert sid not in rm.fetch_sessions.sessions and len(rm.fetch_sessions) == 1
    assert followers[TPS[0]].log.log_end_offset == 4


def test_a_partition_out_of_range_truncates_again_and_is_forgotten_meanwhile(tmp_path):
    clock = ManualClock(T0)
    rm, followers, leader, fetcher = follower_setup(tmp_path, clock)
    followers[TPS[0]].log.append([batch(2)], leader_epoch=3)     # records the leader does not have
    asked = []
    leader.offsets_for_leader_epoch = lambda replica_id, queries, timeout_s: asked.append(queries) or []
    fetcher.do_work()                                            # full: t-0 at 2 is out of range
    assert [r.error.code for r in leader.answers[-1].partitions] == ["OFFSET_OUT_OF_RANGE"]
    assert fetcher.states[TPS[0]].truncating
    fetcher.do_work()
    assert [(q.topic, q.partition) for q in asked[-1]] == [TPS[0]]    # truncates by epoch again
    assert leader.requests[-1].forgotten == (TPS[0],)           # and leaves the session meanwhile
    fetcher.do_work()
    assert len(asked) == 2 and leader.requests[-1].forgotten == ()
