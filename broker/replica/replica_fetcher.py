"""Followers pull from leaders: one fetcher thread per (leader broker, fetcher id).

The fetcher talks to its leader only through a :class:`LeaderEndpoint` (fetch
and OffsetsForLeaderEpoch), so tests can script a leader. ``do_work()`` is one
round: truncate partitions that just became followers (by leader epoch,
KIP-101/279), then one long-polling Fetch for the rest, append what came back
verbatim, learn the HW.

The fetches run in an incremental fetch session (KIP-227, ``fetch_session.py``):
the first names every partition, later ones only those whose fetch fields may
have changed (``_dirty``: added, truncated, answered, delayed or back) and differ
from what the leader's session holds; a lost answer or a refused session makes
the next fetch full again.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from replikafka import errors as E
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.fetch_session import FetchSessionHandler
from replikafka.broker.replica.leader_epoch_truncation import AskAgain, Truncate, truncation_decision
from replikafka.broker.storage import raw_streams

log = logging.getLogger("replikafka.fetcher")
TRUNCATION_ROUNDS_MAX = 16


class LeaderEndpoint(Protocol):
    """A follower's way to its leader, in plain data (the gRPC one, with the follower
    wire codec, is ``broker/replica_rpc.py``'s). A call that cannot reach the leader
    raises a :class:`replikafka.errors.ReplikafkaError`."""
    def fetch(self, request: M.FetchRequest, timeout_s: float) -> M.FetchResponse: ...
    def offsets_for_leader_epoch(self, replica_id: int, queries: list[M.EpochQuery],
                                 timeout_s: float) -> list[M.EpochEndOffset]: ...
    def close(self) -> None: ...


@dataclass
class FetchState:
    leader_epoch: int
    truncating: bool = True
    # The leader's LEO in its last answer naming this partition (the fetcher's lag, for
    # metrics); an answer leaving it out says the leader's LEO is ours.
    leader_log_end: int = -1
    # A partition whose fetched data could not be appended (a corrupt batch, a disk
    # error) sits out until then (time.monotonic()), as Kafka's delayed partitions:
    # the other partitions keep replicating.
    delayed_until_s: float = 0.0


class ReplicaFetcher:
    """Thread-safe: partitions are added/removed under ``lock`` by the replica manager."""

    def __init__(self, broker_id: int, leader_id: int, endpoint: LeaderEndpoint, partitions_lookup,
                 *, max_wait_ms: int, min_bytes: int, max_bytes: int, backoff_ms: int, request_timeout_s: float,
                 response_max_bytes: int = 0, broker_epoch=lambda: -1, on_storage_error=lambda tp, exc: None):
        self.broker_id = broker_id
        self.leader_id = leader_id
        self.endpoint = endpoint
        self.lookup = partitions_lookup          # tp -> Partition | None
        self.max_wait_ms, self.min_bytes, self.max_bytes = max_wait_ms, min_bytes, max_bytes
        self.response_max_bytes = response_max_bytes or max_bytes   # over all partitions of one fetch
        self.backoff_s = backoff_ms / 1000.0
        self.broker_epoch = broker_epoch         # () -> our registration's czxid: sent with each fetch (KIP-380)
        self.on_storage_error = on_storage_error  # (tp, exc): the partition's log dir failed (KIP-112)
        self.timeout_s = request_timeout_s
        self.lock = threading.Lock()
        self.states: dict[tuple[str, int], FetchState] = {}
        # The fetch session (touched by this fetcher's round only), and the partitions
        # whose fetch entry may have changed since the last fetch (under ``lock``).
        self.session = FetchSessionHandler()
        self._dirty: set = set()
        self._delayed: dict = {}                 # tp -> time.monotonic() it may fetch again
        # The partitions that may be truncating (added, or out of range since): each round
        # looks at these, not at every partition (under ``lock``).
        self._maybe_truncating: set = set()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def add(self, tp, leader_epoch: int) -> None:
        self.add_many({tp: leader_epoch})

    def add_many(self, epochs: dict) -> None:
        with self.lock:
            for tp, leader_epoch in epochs.items():
                self.states[tp] = FetchState(leader_epoch)
                self._delayed.pop(tp, None)
            self._dirty.update(epochs)
            self._maybe_truncating.update(epochs)

    def remove(self, tp) -> None:
        self.remove_many([tp])

    def remove_many(self, tps) -> None:
        with self.lock:
            for tp in tps:
                if self.states.pop(tp, None) is not None:
                    self._dirty.add(tp)
                self._delayed.pop(tp, None)

    def partition_count(self) -> int:
        with self.lock:
            return len(self.states)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name=f"replica-fetcher-{self.leader_id}", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
        self.endpoint.close()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                if not self.do_work():
                    time.sleep(self.backoff_s)
            except E.ReplikafkaError as exc:   # the leader is unreachable (or refused the whole request)
                log.debug("fetch from broker %d failed: %s", self.leader_id, exc)
                time.sleep(self.backoff_s)
            except Exception:
                log.exception("replica fetcher for leader %d", self.leader_id)
                time.sleep(self.backoff_s)

    # ------------------------------------------------------------ one round
    def do_work(self) -> bool:
        """One round: truncations, then one fetch. Returns False when the fetcher
        should pause ``replica.fetch.backoff.ms`` (nothing to fetch, or every
        partition failed); an empty long poll is not a failure: fetch again at once."""
        with self.lock:
            if not self.states:
                return False
            truncating = {}
            for tp in self._maybe_truncating:
                s = self.states.get(tp)
                if s is not None and s.truncating:
                    truncating[tp] = s
            self._maybe_truncating = set(truncating)
        if truncating:
            self._truncate(truncating)
        now = time.monotonic()
        with self.lock:
            for tp in [tp for tp, until in self._delayed.items() if until <= now]:
                del self._delayed[tp]
                self._dirty.add(tp)
            if self.session.full_next:
                candidates = dict(self.states)
                self._dirty = set()
            else:
                candidates = {tp: self.states.get(tp) for tp in self._dirty}
                self._dirty = set()
            delayed = set(self._delayed)
        return self._fetch(candidates, delayed, bool(truncating))

    def _truncate(self, states: dict) -> None:
        """Ask the leader where our latest epoch ends; walk back while it names an
        epoch we do not have (KIP-279); truncate there."""
        asks = {}
        for tp, s in states.items():
            part = self.lookup(tp)
            if part is None:
                continue
            asks[tp] = part.log.leader_epoch_cache.latest_epoch
        for _round in range(TRUNCATION_ROUNDS_MAX):
            if not asks:
                return
            queries = [M.EpochQuery(t, p, e, states[(t, p)].leader_epoch) for (t, p), e in asks.items()]
            answers = self.endpoint.offsets_for_leader_epoch(self.broker_id, queries, self.timeout_s)
            next_asks = {}
            for r in answers:
                tp = (r.topic, r.partition)
                part = self.lookup(tp)
                if part is None or tp not in asks:
                    continue
                if r.error is not None:
                    log.debug("OffsetsForLeaderEpoch %s: %s", tp, r.error.code)
                    continue  # retried next round (new LeaderAndIsr may come)
                cache = part.log.leader_epoch_cache
                if asks[tp] < 0:
                    decision, how = Truncate(min(part.hw, part.log.log_end_offset)), "by high watermark"
                else:
                    decision = truncation_decision(r.leader_epoch, r.end_offset,
                                                   lambda e, c=cache, lg=part.log: c.end_offset_for(e, lg.log_end_offset),
                                                   part.log.log_end_offset, part.hw)
                    # truncation_decision falls back to the HW when the leader knows no epoch end.
                    how = "by high watermark" if r.end_offset < 0 else "by leader epoch"
                if isinstance(decision, AskAgain):
                    next_asks[tp] = decision.epoch
                    continue
                if decision.offset < part.log.log_end_offset:
                    log.info("follower %d truncating %s-%d from %d to %d %s (asked epoch %d; leader epoch %d "
                             "ends at %d; HW %d)", self.broker_id, tp[0], tp[1], part.log.log_end_offset,
                             decision.offset, how, asks[tp], r.leader_epoch, r.end_offset, part.hw)
                if not self._isolated(tp, part.truncate_to, decision.offset, states[tp].leader_epoch):
                    continue  # no longer a follower in that epoch (or it failed): the next round decides
                with self.lock:
                    s = self.states.get(tp)
                    if s is not None and s.leader_epoch == states[tp].leader_epoch:
                        s.truncating = False
                        self._dirty.add(tp)
            asks = next_asks

    def _fetch(self, candidates: dict, delayed: set, truncated: bool) -> bool:
        """One fetch in the session: ``candidates`` (tp -> FetchState, None if removed)
        are every partition for a full fetch, else those that may have changed."""
        entries: dict = {}
        dropped = []
        for tp, s in candidates.items():
            part = None if s is None or s.truncating or tp in delayed else self.lookup(tp)
            if part is None:
                dropped.append(tp)
                continue
            entries[tp] = M.FetchPartition(tp[0], tp[1], part.log.log_end_offset, s.leader_epoch, self.max_bytes,
                                           part.log.leader_epoch_cache.latest_epoch, part.hw)
        session = self.session
        if not entries and (session.full_next or not (session.sent or dropped)):
            return truncated
        parts, forgotten, session_id, session_epoch = session.request(entries, dropped)
        req = M.FetchRequest(self.broker_id, parts, max_wait_ms=self.max_wait_ms, min_bytes=self.min_bytes,
                             max_bytes=self.response_max_bytes, replica_epoch=self.broker_epoch(),
                             session_id=session_id, session_epoch=session_epoch, forgotten=forgotten)
        try:
            answer = self.endpoint.fetch(req, self.timeout_s + self.max_wait_ms / 1000.0)
        except BaseException:
            session.on_failure()     # the leader's session may have moved on: the next fetch is full
            raise
        session.on_answer(answer.session_id, answer.error)
        if answer.error is not None:
            log.info("follower %d: fetch from leader %d refused (%s): the next fetch names every partition",
                     self.broker_id, self.leader_id, answer.error)
            return True
        results = answer.partitions
        sent = session.sent
        touched = []
        failed = 0
        # The answer's streams checked together, before any is appended: one Arrow read
        # for many small ones (see raw_streams); a stream it leaves out is checked alone.
        appending = [i for i, r in enumerate(results) if r.error is None and r.record_count and r.records is not None]
        try:
            checked = dict(zip(appending, raw_streams.check_raw_streams([results[i].records for i in appending])))
        except Exception:   # a bug there must not stop replication: each stream is then checked alone
            log.exception("follower %d: checking the answer of leader %d together failed; each partition's "
                          "batches are checked alone", self.broker_id, self.leader_id)
            checked = {}
        for i, r in enumerate(results):
            tp = (r.topic, r.partition)
            part = self.lookup(tp)
            fp = entries.get(tp) or sent.get(tp)
            s = self.states.get(tp)
            if part is None or fp is None or s is None or s.leader_epoch != fp.current_leader_epoch:
                continue    # no longer fetched (or in another epoch: already marked changed)
            touched.append(tp)
            failed += r.error is not None
            if isinstance(r.error, E.OffsetOutOfRangeError):
                if part.log.log_end_offset < r.log_start_offset:
                    part.reset_to(r.log_start_offset, fp.current_leader_epoch)
                else:
                    with self.lock:
                        if self.states.get(tp) is s:
                            s.truncating = True
                            self._maybe_truncating.add(tp)
                continue
            if r.error is not None:
                # FENCED/UNKNOWN epoch, NOT_LEADER: wait for the controller's next LeaderAndIsr.
                continue
            if self._isolated(tp, part.append_as_follower, r.records if r.record_count else None,
                              r.high_watermark, fp.current_leader_epoch, checked.get(i)) is None:
                failed += 1
            s.leader_log_end = r.log_end_offset
        if touched:
            with self.lock:
                self._dirty.update(touched)
        # The leader leaves out the partitions it has no news for (ReplicaManager.fetch):
        # an answer naming none is a long poll that ended with nothing new.
        return not results or failed < len(results)

    def _isolated(self, tp, action, *args):
        """``action(*args)`` for one partition; if it raises, that partition alone sits
        out ``replica.fetch.backoff.ms`` (logged, the error named) and None is returned:
        one partition's corrupt batch or disk error never fails the round for the others."""
        try:
            return action(*args)
        except Exception as exc:  # anything: the other partitions of this leader must keep replicating
            log.error("follower %d: %s-%d from leader %d failed and waits %.1fs: %s: %s", self.broker_id, tp[0],
                      tp[1], self.leader_id, self.backoff_s, type(exc).__name__, exc)
            if isinstance(exc, (E.StorageError, OSError)):
                self.on_storage_error(tp, exc)
            with self.lock:
                st = self.states.get(tp)
                if st is not None:
                    st.delayed_until_s = time.monotonic() + max(self.backoff_s, 0.05)
                    self._delayed[tp] = st.delayed_until_s
                    self._dirty.add(tp)
            return None


class ReplicaFetcherManager:
    """Thread-safe: one fetcher per (leader id, fetcher index)."""

    def __init__(self, broker_id: int, num_fetchers: int, partitions_lookup, endpoint_factory, *,
                 start_threads: bool = True, **fetch_opts):
        """``start_threads=False``: fetchers are made but not started; whoever made the
        manager runs their ``do_work()`` (the deterministic simulation does)."""
        self.broker_id = broker_id
        self.start_threads = start_threads
        self.num_fetchers = max(1, num_fetchers)
        self.lookup = partitions_lookup
        self.endpoint_factory = endpoint_factory   # (leader_id) -> LeaderEndpoint
        self.fetch_opts = fetch_opts
        self.fetchers: dict[tuple[int, int], ReplicaFetcher] = {}
        self.owner: dict[tuple[str, int], tuple[int, int]] = {}
        self.lock = threading.Lock()

    def add_partition(self, tp, leader_id: int, leader_epoch: int) -> None:
        self.add_partitions({tp: (leader_id, leader_epoch)})

    def add_partitions(self, partitions: dict) -> None:
        """Fetch ``{tp: (leader id, leader epoch)}`` from those leaders: one pass for a
        whole LeaderAndIsr (thousands of partitions), each fetcher's lock taken once."""
        if not partitions:
            return
        adds: dict[tuple[int, int], dict] = {}
        removes: dict[tuple[int, int], list] = {}
        with self.lock:
            for tp, (leader_id, leader_epoch) in partitions.items():
                key = (leader_id, hash(tp) % self.num_fetchers)
                old = self.owner.get(tp)
                if old is not None and old != key:
                    removes.setdefault(old, []).append(tp)
                adds.setdefault(key, {})[tp] = leader_epoch
                self.owner[tp] = key
            for key, tps in removes.items():
                if key in self.fetchers:
                    self.fetchers[key].remove_many(tps)
            for key, epochs in adds.items():
                f = self.fetchers.get(key)
                if f is None:
                    f = ReplicaFetcher(self.broker_id, key[0], self.endpoint_factory(key[0]), self.lookup,
                                       **self.fetch_opts)
                    self.fetchers[key] = f
                    if self.start_threads:
                        f.start()
                f.add_many(epochs)
        self._stop_idle()

    def remove_partition(self, tp) -> None:
        self.remove_partitions([tp])

    def remove_partitions(self, tps) -> None:
        """Stop fetching these partitions (one pass for a whole request)."""
        removes: dict[tuple[int, int], list] = {}
        with self.lock:
            for tp in tps:
                key = self.owner.pop(tp, None)
                if key is not None:
                    removes.setdefault(key, []).append(tp)
            for key, group in removes.items():
                if key in self.fetchers:
                    self.fetchers[key].remove_many(group)
        if removes:
            self._stop_idle()

    def _stop_idle(self) -> None:
        with self.lock:
            idle = [k for k, f in self.fetchers.items() if f.partition_count() == 0]
            stopping = [self.fetchers.pop(k) for k in idle]
        for f in stopping:
            if self.start_threads:
                threading.Thread(target=f.stop, daemon=True).start()
            else:
                f.stop()

    def shutdown(self) -> None:
        with self.lock:
            fs = list(self.fetchers.values())
            self.fetchers.clear()
            self.owner.clear()
        for f in fs:
            f.stop()
