"""The broker's partitions and everything done to them: LeaderAndIsr and
StopReplica from the controller, Produce / Fetch / ListOffsets /
OffsetsForLeaderEpoch from clients and followers, ISR maintenance as a leader
(conditional ZooKeeper writes), HW checkpoints.

Takes and returns the plain data of ``messages.py`` (the RPC layer,
``broker/replica_rpc.py``, converts protobuf). Thread-safe: ``lock`` guards the
partition map and the controller epoch; each Partition has its own lock; the
lock order is in the package docstring. Long-polling fetches wait on
``data_arrived``.
"""
from __future__ import annotations

import logging
import os
import threading
import time

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker import state_change_log
from replikafka.broker.metrics import ReplicaStats
from replikafka.broker.replica import fetch_session as FS
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import LEADER, Partition
from replikafka.broker.storage.log import clip_stored
from replikafka.broker.storage.open_logs import is_resource_exhaustion
from replikafka.broker.zk_store import LeaderAndIsr

log = logging.getLogger("replikafka.replica_manager")
state_log = logging.getLogger("replikafka.state.change")
TP = tuple[str, int]
FETCH_WAIT_SLICE_S = 0.05
#: Kafka's DEBUGGING_CONSUMER id: a fetch any replica serves with its own stored batches (replica-verification).
DEBUGGING_REPLICA_ID = -2
#: Topic schemas parsed once, not once per partition a LeaderAndIsr names (keyed by their bytes).
SCHEMA_CACHE_ENTRIES_MAX = 1000


def partition_read_error(topic: str, partition: int, exc: Exception) -> E.ReplikafkaError:
    """The named error for an unexpected failure reading one partition (logged once here)."""
    log.error("%s-%d: read failed: %s: %s", topic, partition, type(exc).__name__, exc)
    if isinstance(exc, OSError):
        return E.StorageError(f"{topic}-{partition}: {type(exc).__name__}: {exc}")
    if isinstance(exc, R.ARROW_DECODE_ERRORS):
        return E.CorruptRecordError(f"{topic}-{partition}: a stored batch cannot be read: {type(exc).__name__}: {exc}")
    return E.ReplikafkaError(f"{topic}-{partition}: {type(exc).__name__}: {exc}")


class ReplicaManager:
    def __init__(self, broker_id: int, config, log_manager, store, metadata, fetchers, clock,
                 stats: ReplicaStats | None = None):
        self.broker_id = broker_id
        self._schemas: dict[bytes, object] = {}     # schema bytes -> pa.Schema (bounded)
        self.config = config
        self.logs = log_manager
        self.store = store
        self.metadata = metadata
        self.fetchers = fetchers
        self.clock = clock
        self.lock = threading.RLock()
        self.role_change_lock = threading.Lock()   # one LeaderAndIsr at a time (Kafka's replicaStateChangeLock)
        self.role_change_ended_ms: int | None = None   # clock.time_ms() when the last LeaderAndIsr was handled
        self.partitions: dict[TP, Partition] = {}
        self.controller_epoch = -1
        self.data_arrived = threading.Condition(threading.Lock())
        # Bumped (under data_arrived) by every notify_data: a long poll waits only if
        # nothing was notified since it last looked (a notification between its read
        # and its wait is never lost).
        self.data_version = 0
        self.topic_ids: dict[str, str] = {}
        # Set once a controlled shutdown handed our roles away: later LeaderAndIsr
        # (e.g. a new controller's full state) must not make us lead or fetch again.
        self.shutting_down = False
        # KIP-112: partitions whose log dir failed (until restart), and what to do when none is left.
        self.offline: set[TP] = set()
        self.on_all_dirs_offline = lambda: None
        self.stats = stats or ReplicaStats()   # bytes/messages per topic, ISR changes (broker/metrics.py)
        # Our registration's czxid (KIP-380), set by whoever registers us: controller
        # requests addressed to an earlier registration (queued for us before we
        # restarted) are refused. -1 until registered.
        self.registered_epoch = -1
        # ISR maintenance (do_isr_work) looks at every leader only once per half
        # replica.lag.time.max.ms (Kafka's isr-expiration period: a follower is dropped
        # lag to 1.5 lag after it stopped keeping up); between those passes only at the
        # leaders here, where something may want an ISR change at once: a follower out of
        # the ISR fetched (it may be back), or a change was not written. Both under ``lock``.
        # A pass over 25,000 leaders every 0.5 s held a quarter of the GIL at 50,000 partitions.
        self._isr_pass_due_ms = 0
        self._isr_candidates: set[Partition] = set()
        self._producer_expiry_due_ms = 0     # expire_producers walks again from then (under ``lock``)
        # ISR changes written but not yet announced to the controller (the isr_change
        # notification failed): sent again with the next pass's, as Kafka keeps its
        # isrChangeSet until propagated, so no metadata cache keeps a stale ISR. Under ``lock``.
        self._isr_changes_unannounced: set[TP] = set()
        # Followers' incremental fetch sessions (KIP-227, fetch_session.py), under
        # ``_sessions_lock``; every partition tells ``change_journal`` when it moves.
        self.fetch_sessions = FS.FetchSessionCache(
            config.get("max.incremental.fetch.session.cache.slots") if config is not None else 1000)
        self.change_journal = FS.ChangeJournal()
        self._journal_append = self.change_journal.append   # (one bound method: compared by identity)
        self._sessions_lock = threading.Lock()

    # ------------------------------------------------------------ lookups
    def get(self, tp: TP) -> Partition | None:
        # Without ``lock``: one dict lookup is atomic, and the map is only changed under
        # the lock (a caller sees the partition before or after a change, as it would
        # just after taking the lock). Produce, Fetch and the fetchers look up every
        # partition they name; under the lock each waited for whole-map passes holding
        # it (the HW checkpoint's, ISR maintenance's), and its acquire was 8% of a failover
        # survivor's GIL-held samples (py-spy --gil, 15,000 partitions).
        return self.partitions.get(tp)

    def _partition_or_error(self, topic: str, partition: int) -> Partition:
        p = self.get((topic, partition))
        if p is not None:
            return p
        entry = self.metadata.topic(topic)
        if entry is None:
            raise E.UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        if entry.partitions and partition not in entry.partitions:
            raise E.UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition} "
                                                 f"(it has {len(entry.partitions)})")
        raise E.NotLeaderOrFollowerError(f"broker {self.broker_id} does not host {topic}-{partition}")

    def notify_data(self) -> None:
        with self.data_arrived:
            self.data_version += 1
            self.data_arrived.notify_all()

    # ------------------------------------------------------------ controller requests
    def check_controller_epoch(self, epoch: int) -> None:
        with self.lock:
            if epoch < self.controller_epoch:
                raise E.StaleControllerEpochError(
                    f"controller epoch {epoch} is older than {self.controller_epoch} already seen by broker "
                    f"{self.broker_id}")
            self.controller_epoch = epoch

    def check_broker_epoch(self, broker_epoch: int) -> None:
        """KIP-380: a controller request decided for an earlier registration of this
        broker (a LeaderAndIsr queued before it crashed and restarted, delivered by the
        controller's retrying channel) would hand the new process roles decided for a
        log it may no longer have (an unflushed tail lost in the crash)."""
        if broker_epoch > 0 and self.registered_epoch > 0 and broker_epoch != self.registered_epoch:
            raise E.StaleBrokerEpochError(
                f"controller request for broker {self.broker_id} epoch {broker_epoch}, but this broker "
                f"registered as epoch {self.registered_epoch}")

    def leader_and_isr(self, req: M.LeaderAndIsrRequest, accepted=lambda: None) -> M.ControllerRequestResult:
        """Take up the roles in ``req``. ``accepted()`` runs once the request passed the
        epoch checks, before any role changes (the RPC layer applies it to the metadata
        cache there). A failover hands one broker thousands of partitions at once, so
        the fetcher changes and the state-change log lines are done once per request,
        not once per partition. As in Kafka, partitions that become leaders leave their
        fetchers before they lead, and requests are handled one at a time (a
        controller's retry of a slow request waits for the first)."""
        started = time.monotonic()
        self.check_controller_epoch(req.controller_epoch)
        try:
            self.check_broker_epoch(req.broker_epoch)
        except E.StaleBrokerEpochError as exc:
            log.info("LeaderAndIsr from controller %d refused: %s", req.controller_id, exc)
            return M.ControllerRequestResult(error=exc)
        out = M.ControllerRequestResult()
        if self.shutting_down:
            accepted()
            log.info("LeaderAndIsr from controller %d ignored: this broker is shutting down", req.controller_id)
            return out
        logging_on = state_change_log.enabled()
        lines: list[str] = []
        with self.role_change_lock:
            accepted()
            mine: list[tuple[M.PartitionRole, Partition]] = []
            for s in req.partitions:
                if self.broker_id not in s.replicas:
                    continue
                try:
                    mine.append((s, self._get_or_create(s.tp, req.topics.get(s.topic))))
                except E.ReplikafkaError as exc:
                    out.partition_errors.append((s.tp, exc))
            # Not stale (make_leader refuses an older epoch): stop following first.
            self.fetchers.remove_partitions([part.tp for s, part in mine if s.leader == self.broker_id
                                             and s.leader_epoch >= part.leader_epoch])
            follow: dict[TP, tuple[int, int]] = {}
            unfollow: list[TP] = []
            try:
                for s, part in mine:
                    tp = part.tp
                    try:
                        if s.leader == self.broker_id:
                            if part.make_leader(s.leader_epoch, s.isr, s.replicas, s.zk_version, s.controller_epoch) \
                                    and logging_on:
                                lines.append(f"broker {self.broker_id}: {tp[0]}-{tp[1]} becomes LEADER epoch "
                                             f"{s.leader_epoch} isr {list(s.isr)} "
                                             f"(controller epoch {req.controller_epoch})")
                        elif self._become_follower(part, s.leader, s.leader_epoch, s.isr, s.replicas, s.zk_version,
                                                   s.controller_epoch, follow, unfollow) and logging_on:
                            lines.append(f"broker {self.broker_id}: {tp[0]}-{tp[1]} becomes FOLLOWER of {s.leader} "
                                         f"epoch {s.leader_epoch} (controller epoch {req.controller_epoch})")
                    except E.ReplikafkaError as exc:
                        out.partition_errors.append((tp, exc))
            finally:  # the roles taken so far get their fetchers even if one partition failed oddly
                self.fetchers.remove_partitions(unfollow)
                self.fetchers.add_partitions(follow)
                self.role_change_ended_ms = self.clock.time_ms()
        state_change_log.log_lines(lines)
        self.notify_data()
        log.info("LeaderAndIsr from controller %d (epoch %d): %d partitions in %.3fs", req.controller_id,
                 req.controller_epoch, len(req.partitions), time.monotonic() - started)
        return out

    def role_changes_recent(self, within_s: float) -> bool:
        """Whether a LeaderAndIsr is being handled or was handled less than ``within_s``
        ago (any thread may ask). The broker's scans of every partition (log maintenance,
        HW checkpoints) wait meanwhile: what follows a failover's role changes here (the
        new leaders' first writes, the followers' truncations and first fetches) shares
        this process's GIL and the machine's cores with them."""
        ended = self.role_change_ended_ms
        return self.role_change_lock.locked() or (ended is not None and self.clock.time_ms() - ended < within_s * 1000)

    def _become_follower(self, part: Partition, leader: int, leader_epoch: int, isr, replicas, zk_version: int,
                         controller_epoch: int, follow: dict[TP, tuple[int, int]], unfollow: list[TP]) -> bool:
        """The one way a partition becomes a follower (a LeaderAndIsr, or a leader that
        found its state znode moved on): the role change and the fetcher change it needs
        go together, added to ``follow`` / ``unfollow`` for the caller to apply. Returns
        True when the role changed. Called under ``role_change_lock``."""
        if part.make_follower(leader, leader_epoch, isr, replicas, zk_version, controller_epoch):
            follow[part.tp] = (leader, leader_epoch)
            return True
        if leader < 0 and leader_epoch >= part.leader_epoch:
            # No leader in this epoch: nothing to fetch from. A stale request (an older
            # epoch, delivered late) changes nothing, its fetcher change included:
            # dropping the current epoch's fetcher left a follower that never caught up.
            unfollow.append(part.tp)
        return False

    def _get_or_create(self, tp: TP, info: M.TopicInfo | None) -> Partition:
        with self.lock:
            part = self.partitions.get(tp)
            if part is not None:
                return part
            if tp in self.offline:
                raise E.StorageError(f"{tp[0]}-{tp[1]}: its log dir on broker {self.broker_id} is offline")
            if info is None:
                entry = self.metadata.topic(tp[0])
                if entry is None:
                    raise E.UnknownTopicOrPartitionError(f"no schema known for topic {tp[0]!r}")
                schema, config, topic_id = entry.schema, entry.config, entry.topic_id
            else:
                schema, config, topic_id = info.schema, dict(info.config), info.topic_id
            parsed = self._schemas.get(schema)
            if parsed is None:
                if len(self._schemas) >= SCHEMA_CACHE_ENTRIES_MAX:
                    self._schemas.clear()
                parsed = self._schemas[schema] = R.schema_from_bytes(schema)
            log_ = self.logs.get_or_create(tp[0], tp[1], parsed, config, topic_id)
            part = Partition(tp[0], tp[1], self.broker_id, log_, self.clock, hw=self.logs.checkpointed_hw(tp))
            part.on_news = self._journal_append
            self.partitions[tp] = part
            return part

    def remove_unassigned(self, assignments: dict[TP, tuple[int, ...]], controller_id: int, controller_epoch: int,
                          deletable=lambda tps: tps) -> None:
        """Metadata naming a partition's replicas (``assignments``) without us: a
        reassignment moved it away (its StopReplica may have been lost with a failed
        controller). Stop and delete it, if ``deletable`` (ZooKeeper, through the
        control-plane guard) agrees."""
        moved = [tp for tp, replicas in assignments.items()
                 if replicas and self.broker_id not in replicas and tp in self.partitions]
        agreed = set(deletable(moved)) if moved else set()
        for tp in [tp for tp in assignments if tp in agreed]:
            state_log.info("broker %d: %s-%d is no longer assigned here (replicas %s): deleting it "
                           "(controller epoch %d)", self.broker_id, tp[0], tp[1], list(assignments[tp]),
                           controller_epoch)
            self.stop_replica(M.StopReplicaRequest(controller_id, controller_epoch, -1, True, (tp,)))

    def stop_replica(self, req: M.StopReplicaRequest) -> M.ControllerRequestResult:
        self.check_controller_epoch(req.controller_epoch)
        try:
            self.check_broker_epoch(req.broker_epoch)
        except E.StaleBrokerEpochError as exc:
            log.info("StopReplica from controller %d refused: %s", req.controller_id, exc)
            return M.ControllerRequestResult(error=exc)
        started = time.monotonic()
        lines: list[str] = []   # one state-change record and one broker-log line per request, not per partition
        for tp in req.partitions:
            self.fetchers.remove_partition(tp)
            with self.lock:
                part = self.partitions.pop(tp, None) if req.delete_partitions else self.partitions.get(tp)
            if part is not None:
                part.stop()
            if req.delete_partitions:
                self.logs.delete(tp[0], tp[1])
            lines.append(f"broker {self.broker_id}: {tp[0]}-{tp[1]} StopReplica delete={req.delete_partitions} "
                         f"(controller epoch {req.controller_epoch})")
        state_change_log.log_lines(lines)
        self.notify_data()
        log.info("StopReplica from controller %d (epoch %d): %d partitions, delete=%s, in %.3fs", req.controller_id,
                 req.controller_epoch, len(req.partitions), req.delete_partitions, time.monotonic() - started)
        return M.ControllerRequestResult()

    # ------------------------------------------------------------ produce
    def produce(self, req: M.ProduceRequest) -> list[M.ProducePartitionResult]:
        """Append, then (acks=all) wait until each partition's HW passes what was appended."""
        timeout_ms = req.timeout_ms if req.timeout_ms > 0 else self.config.get("request.timeout.ms")
        out, waits = self.append_records(req)
        deadline = self.clock.time_ms() + timeout_ms
        for w in waits:
            try:
                w.partition.wait_committed(w.end_offset, deadline, w.min_insync)
            except E.ReplikafkaError as exc:
                w.result.error = exc
        return out

    def append_records(self, req: M.ProduceRequest) -> tuple[list[M.ProducePartitionResult], list[M.ProduceWait]]:
        """The produce's appends: (one result per partition entry, in order, and for
        acks=all the waits still to complete). A caller without threads (the
        simulation) completes them with ``Partition.committed``."""
        if req.acks not in (0, 1, -1):
            raise E.InvalidRequestError(f"acks must be 0, 1 or -1 (all), got {req.acks}")
        out: list[M.ProducePartitionResult] = []
        waits: list[M.ProduceWait] = []
        failed: dict[TP, E.ReplikafkaError] = {}
        for d in req.partitions:
            r = M.ProducePartitionResult(d.topic, d.partition)
            out.append(r)
            tp = (d.topic, d.partition)
            if tp in failed:
                # A partition's batches are appended in order: after one fails, the
                # ones behind it are not appended (they would leave a gap).
                r.error = failed[tp]
                continue
            try:
                part, result, min_isr = self._append_one(d, req.acks)
                r.base_offset, r.record_count = result.first_offset, result.record_count
                r.log_start_offset = part.log.log_start_offset
                if req.acks == -1:
                    waits.append(M.ProduceWait(r, part, result.last_offset + 1, min_isr))
            except E.ReplikafkaError as exc:
                r.error = exc
                failed[tp] = exc
        self.notify_data()
        return out, waits

    def _append_one(self, d: M.ProducePartition, acks: int):
        R.validate_topic_name(d.topic)
        part = self._partition_or_error(d.topic, d.partition)
        if d.decode_error is not None:   # the RPC layer refused its bytes (CRC, framing)
            raise d.decode_error
        # The request may hold several batches; max.message.bytes limits each stored
        # batch (checked by the log as it encodes them), as in Kafka.
        kept = [j for j, b in enumerate(d.batches) if b.num_rows]
        sent = None if d.sent_messages is None else [d.sent_messages[j] for j in kept]
        result, min_isr = self._append_batches(part, [d.batches[j] for j in kept], acks, d.producer_id,
                                               d.producer_epoch, d.base_sequence, d.size_bytes,
                                               sent_messages=sent)
        return part, result, min_isr

    def append_flight(self, cmd, batches: list) -> list:
        """A Flight append (``DoPut``, :mod:`replikafka.protocol.flight_produce`): the
        batches as Arrow read them from the stream (zero-copy), fully validated here,
        appended as the command's appends in order (each with its own sequence; after
        one fails, the ones behind it are not appended and carry its error, as in
        Produce); the producer's per-batch body CRC-32C is checked by the log against
        the CRC it stores. acks=all then waits, once, as Produce does. Returns per
        append a dict of ``flight_produce.RESULT_KEYS`` or the error."""
        R.validate_topic_name(cmd.topic)
        part = self._partition_or_error(cmd.topic, cmd.partition)
        R.validate_untrusted_batches(batches, f"{cmd.topic}-{cmd.partition}")
        results: list = []
        waits = []
        failed = None
        at = 0
        for a in cmd.appends:
            group = batches[at:at + len(a.batch_crc32c)]
            at += len(group)
            if failed is not None:
                results.append(failed)
                continue
            try:
                result, min_isr = self._append_batches(part, group, cmd.acks, cmd.producer_id, cmd.producer_epoch,
                                                       a.base_sequence, sum(b.nbytes for b in group),
                                                       a.batch_crc32c)
            except E.ReplikafkaError as exc:
                failed = exc
                results.append(exc)
                continue
            results.append(dict(base_offset=result.first_offset, record_count=result.record_count,
                                log_append_time_ms=-1, log_start_offset=part.log.log_start_offset))
            waits.append((len(results) - 1, result.last_offset + 1, min_isr))
        self.notify_data()
        if cmd.acks == -1:
            timeout_ms = cmd.timeout_ms if cmd.timeout_ms > 0 else self.config.get("request.timeout.ms")
            deadline = self.clock.time_ms() + timeout_ms
            for i, end, min_isr in waits:
                try:
                    part.wait_committed(end, deadline, min_isr)
                except E.ReplikafkaError as exc:
                    results[i] = exc
        return results

    def _append_batches(self, part: Partition, batches: list, acks: int, producer_id: int, producer_epoch: int,
                        base_sequence: int, nbytes: int, body_crc32c=None, sent_messages=None):
        """The one leader append of both produce paths: idempotence, the log append
        (which checks the schema and stamps LogAppendTime, once); a failed log dir goes
        offline. ``sent_messages``: per batch, the producer's IPC message or None (see
        ``Log.append``). Returns (ProduceResult, min ISR)."""
        cfg = part.log.config
        if not batches:
            raise E.InvalidRequestError(f"{part.topic}-{part.partition}: produce request holds no records")
        min_isr = cfg.min_insync_replicas
        # Producer ids start at 1: 0 is protobuf's "unset".
        pid = producer_id if producer_id > 0 else -1
        try:
            # LogAppendTime: the log stamps the timestamps (after checking body_crc32c).
            result = part.append_as_leader(batches, acks, min_isr, pid, producer_epoch if pid > 0 else -1,
                                           base_sequence if pid > 0 else -1, body_crc32c, sent_messages)
        except (E.StorageError, OSError) as exc:
            if is_resource_exhaustion(exc):
                self._out_of_resources(exc)
                raise E.StorageError(f"{part.topic}-{part.partition}: broker {self.broker_id} is out of open "
                                     f"files or memory maps ({exc}); nothing was written, retry") from None
            self.handle_storage_failure(part.tp, exc)
            raise E.StorageError(f"{part.topic}-{part.partition}: its log dir on broker {self.broker_id} failed "
                                 f"({exc}); retry on the new leader") from None
        self.stats.produced(part.topic, nbytes, result.record_count)
        return result, min_isr

    # ------------------------------------------------------------ fetch
    def fetch(self, req: M.FetchRequest, context_active=lambda: True) -> list[M.FetchPartitionResult]:
        """Fetch, long-polling up to ``max_wait_ms``: one result per partition, in order,
        except that a follower's partition naming its ``follower_high_watermark`` is left
        out while the leader has nothing it does not know (no records: its LEO is the
        fetch offset; no error; that high watermark)."""
        answer: list[M.FetchPartitionResult] = []

        def read_pass() -> tuple[int, bool]:
            nonlocal answer
            answer, size, any_error = self._fetch_once(req)
            return size, any_error      # each pass reads every partition again
        self._long_poll(req, self.clock.time_ms(), context_active, read_pass)
        return answer

    def _long_poll(self, req: M.FetchRequest, now_ms: int, context_active, read_pass) -> None:
        """Fetch's long poll, for plain fetches and fetch sessions alike: ``read_pass()``
        reads and returns (bytes, an error met) of what the answer holds now (a plain
        fetch: its last pass; a session: all its passes); it is called again, after
        waiting for an append or HW move, until ``min_bytes`` (at least 1) were read,
        an error was met, ``max_wait_ms`` (at most 30 s) passed, or the caller is gone."""
        deadline = now_ms + max(0, min(req.max_wait_ms, 30_000))
        min_bytes = max(req.min_bytes, 1)
        while True:
            # Read before looking: an append (or HW move) notified while this fetch reads
            # wakes it at once, not after the slice (an acks=all produce waits on it).
            seen = self.data_version
            size, any_error = read_pass()
            left = deadline - self.clock.time_ms()
            if size >= min_bytes or any_error or left <= 0 or not context_active():
                return
            with self.data_arrived:
                if self.data_version == seen:
                    self.data_arrived.wait(min(left / 1000.0, FETCH_WAIT_SLICE_S * 10))

    def follower_fetch(self, req: M.FetchRequest, context_active=lambda: True) -> M.FetchResponse:
        """A follower's Fetch, in a fetch session when it asks for one (KIP-227,
        ``fetch_session.py``): a full fetch (session epoch 0) opens one, an incremental
        fetch names only what changed and reads only the partitions named, those that
        moved here since its last fetch (``change_journal``) and those that answered an
        error; a session not held or a wrong epoch refuses the whole fetch."""
        if req.session_epoch is None or req.replica_id < 0:
            return M.FetchResponse(self.fetch(req, context_active))
        now = self.clock.time_ms()
        full = req.session_epoch in (FS.INITIAL_EPOCH, FS.FINAL_EPOCH)
        with self._sessions_lock:
            cache = self.fetch_sessions
            if full:
                if req.session_id != FS.INVALID_SESSION_ID:
                    cache.remove(req.session_id)
                session = None
                if req.session_epoch == FS.INITIAL_EPOCH and self._follower_fetch_error(req) is None:
                    session = cache.new_session(req.replica_id, req.replica_epoch,
                                                {(fp.topic, fp.partition): fp for fp in req.partitions}, now,
                                                self.change_journal.position())
            else:
                try:
                    session = cache.resume(req.session_id, req.session_epoch, req.replica_id, req.replica_epoch, now)
                    session.update(req.partitions, req.forgotten)
                except (E.FetchSessionIdNotFoundError, E.InvalidFetchSessionEpochError) as exc:
                    refused = exc
                    session = None
        if session is not None:
            return M.FetchResponse(self._session_fetch(req, session, full, now, context_active), session.id)
        if full:   # without a session (none asked for, no slot, or a follower not in its epoch)
            return M.FetchResponse(self.fetch(req, context_active))
        log.info("follower %d's fetch refused: %s", req.replica_id, refused)
        return M.FetchResponse(error=refused)

    def _session_fetch(self, req: M.FetchRequest, session, full: bool, now: int,
                       context_active) -> list[M.FetchPartitionResult]:
        """The long poll (:meth:`_long_poll`) over a session: each pass reads only what may have news
        (a full fetch's first pass: everything), then the session's ``last_fetch_ms``
        becomes the pass's start: partitions it found caught up and left unread since
        are caught up as of then (ReplicaProgress.parked_in)."""
        journal = self.change_journal
        held = session.partitions
        answered: dict[TP, M.FetchPartitionResult] = {}
        position = session.journal_position
        todo = None
        total, any_error = 0, False

        def read_pass() -> tuple[int, bool]:
            # Each pass reads what may have news since the last one (the first of a full
            # fetch: everything; of an incremental one: what moved since the session's
            # last fetch, what it names, and what answered an error). The long poll read
            # data_version before this looks at the journal: an append journalled after
            # it wakes the poll at once.
            nonlocal position, todo, total, any_error
            first = todo is None
            started = now if first else self.clock.time_ms()
            if first and full:
                todo = list(held)
            else:
                moved, position = journal.since(position)
                todo = set(held) if moved is None else self._in_session(moved, held)
                if first:
                    todo.update((fp.topic, fp.partition) for fp in req.partitions)
                    todo.update(session.retry)
            out, size, error = self._fetch_once(req, [held[tp] for tp in todo if tp in held], session)
            if started > session.last_fetch_ms:
                session.last_fetch_ms = started
            for r in out:
                answered[(r.topic, r.partition)] = r
            total += size
            any_error = any_error or error
            return total, any_error     # the answers of all passes go out together
        self._long_poll(req, now, context_active, read_pass)
        with self._sessions_lock:
            session.journal_position = position
            session.retry = {tp for tp, r in answered.items() if r.error is not None}
            sessions = self.fetch_sessions.sessions
            journal.trim(min((s.journal_position for s in sessions.values()), default=position))
        return list(answered.values())

    @staticmethod
    def _in_session(moved: set, held: dict) -> set:
        if len(moved) <= len(held):
            return {tp for tp in moved if tp in held}
        return {tp for tp in held if tp in moved}

    def _fetch_once(self, req: M.FetchRequest, parts=None, session=None
                    ) -> tuple[list[M.FetchPartitionResult], int, bool]:
        """One read of ``parts`` (default: the request's partitions), as ``fetch`` answers them."""
        out: list[M.FetchPartitionResult] = []
        total = 0
        any_error = False
        hw_moved = False
        budget = req.max_bytes if req.max_bytes > 0 else 64 << 20
        columns = list(req.columns) if req.columns else None
        follower_error = self._follower_fetch_error(req) if req.replica_id >= 0 else None
        rejoining: list[Partition] = []
        for fp in (req.partitions if parts is None else parts):
            r = M.FetchPartitionResult(fp.topic, fp.partition)
            out.append(r)
            size = 0
            part = None
            try:
                part = self._partition_or_error(fp.topic, fp.partition)
                max_bytes = min(fp.partition_max_bytes or budget, max(budget - total, 1))
                if req.replica_id >= 0 or req.replica_id == DEBUGGING_REPLICA_ID:
                    if req.replica_id >= 0:
                        self._check_follower_of(part, req.replica_id, follower_error)
                        if session is not None and part.on_news is not self._journal_append:
                            # (a partition put in the map by hand): moves from now on are journalled
                            part.on_news = self._journal_append
                        hw_before = part.hw
                        read = part.read_for_follower(req.replica_id, fp.fetch_offset, max_bytes,
                                                      fp.current_leader_epoch, session)
                        hw_moved = hw_moved or read.high_watermark > hw_before
                        if req.replica_id not in part.isr:   # it may be back: the next ISR pass looks
                            rejoining.append(part)
                    else:  # any replica answers, from its own log, and nothing is recorded
                        read = part.read_for_debugging(fp.fetch_offset, max_bytes, fp.current_leader_epoch)
                    raw = read.data
                    if raw is not None and raw.record_count:
                        r.records, size = raw.stored, raw.stored.size   # zero-copy pieces, joined once on the wire
                        r.records_base_offset, r.record_count = raw.first_offset, raw.record_count
                    elif fp.follower_high_watermark == read.high_watermark and \
                            fp.fetch_offset == read.log_end_offset and req.replica_id >= 0:
                        # Nothing the follower does not know: left out of the answer. A
                        # follower of 25,000 partitions decoded and applied each of them
                        # every round while only the ones written to had news.
                        out.pop()
                        continue
                else:
                    if columns is not None:
                        part.log.check_columns(columns)
                    read = part.read_committed(fp.fetch_offset, max_bytes, fp.current_leader_epoch)
                    if read.data is not None and read.data.batches:
                        r.records, r.records_base_offset, r.record_count = self._consumer_records(
                            part, read.data, fp.fetch_offset, columns)
                        size = len(r.records)
                r.high_watermark, r.log_end_offset, r.log_start_offset = \
                    read.high_watermark, read.log_end_offset, read.log_start_offset
                total += size
                if size:
                    self.stats.fetched(fp.topic, size, r.record_count, req.replica_id >= 0)
            except E.OffsetOutOfRangeError as exc:
                r.error, any_error = exc, True
                if req.replica_id >= 0 and part is not None:
                    # A follower behind our log start (retention) starts over there: it
                    # needs to know where that is (Kafka's follower asks ListOffsets).
                    r.log_start_offset, r.log_end_offset = part.log.log_start_offset, part.log.log_end_offset
            except E.ReplikafkaError as exc:
                r.error = exc
                any_error = True
            except Exception as exc:  # one partition's fault (its disk, a rotten batch) fails only that partition
                r.error = partition_read_error(fp.topic, fp.partition, exc)
                any_error = True
        if rejoining:
            with self.lock:
                self._isr_candidates.update(rejoining)
        if hw_moved:  # a follower's fetch committed data: wake the consumers' long polls now
            self.notify_data()
        return out, total, any_error

    @staticmethod
    def _consumer_records(part: Partition, stored, fetch_offset: int, columns) -> tuple[bytes, int, int]:
        """A consumer's Fetch records: (IPC stream, its first offset, record count). The
        stored batches go as stored (one copy, into the response) unless the range
        starts or ends inside one or a projection applies: then only those are re-framed."""
        clipped = clip_stored(stored.batches, fetch_offset, stored.end_offset, columns)
        count = sum(c.batch.num_rows for c in clipped)
        if all(c.verbatim is not None for c in clipped):
            return b"".join([part.log.schema_message, *(c.verbatim.message for c in clipped)]), \
                clipped[0].first_offset, count
        data = R.encode_stream(clipped[0].batch.schema, [c.batch for c in clipped])
        return data.to_pybytes(), clipped[0].first_offset, count

    def flight_partition(self, topic: str, partition: int) -> Partition:
        """The partition a Flight read names, or the error Fetch would give."""
        return self._partition_or_error(topic, partition)

    def _follower_fetch_error(self, req: M.FetchRequest) -> E.ReplikafkaError | None:
        """KIP-380: a follower fetch must come from a live broker in its current epoch
        (as the controller's metadata says); None if it does."""
        known = self.metadata.broker_epoch(req.replica_id)
        if known is None:
            return E.NotLeaderOrFollowerError(f"fetch from replica {req.replica_id}: not a live broker in broker "
                                              f"{self.broker_id}'s metadata")
        if req.replica_epoch != known:
            return E.StaleBrokerEpochError(f"fetch from replica {req.replica_id} with broker epoch "
                                           f"{req.replica_epoch}; its current epoch is {known}")
        return None

    @staticmethod
    def _check_follower_of(part: Partition, replica_id: int, follower_error: E.ReplikafkaError | None) -> None:
        """Refuse (changing nothing: no follower state, HW or ISR effect) a follower fetch from
        a broker not in its current epoch or not assigned to this partition."""
        if follower_error is not None:
            raise follower_error
        if replica_id not in part.replicas or replica_id == part.broker_id:
            raise E.NotLeaderOrFollowerError(f"{part.topic}-{part.partition}: broker {replica_id} is not a follower "
                                             f"of it (replicas {list(part.replicas)})")

    # ------------------------------------------------------------ log dir failure (KIP-112)
    def handle_storage_failure(self, tp: TP, exc: BaseException) -> None:
        """An I/O error on ``tp``'s log: its log dir goes offline with every partition in it
        (they stop serving and fetching), the controller is told through
        ``/log_dir_event_notification`` and moves their leadership to other in-sync replicas.
        With no log dir left the broker shuts down."""
        path = self.logs.manager.dir_of(*tp)
        if path is not None:   # else already offline (or deleted)
            self._fail_dir(path, exc)

    def handle_io_error(self, exc: BaseException) -> bool:
        """An I/O error from background work (checkpoints, flushes, rolls, file creation on
        a dir turned read-only): the log dir holding the file it names goes offline. False
        if it names no file in an online log dir."""
        err = exc if isinstance(exc, OSError) else exc.__cause__
        name = getattr(err, "filename", None) if isinstance(err, OSError) else None
        if not name:
            return False
        name = os.path.abspath(name)
        for path in self.logs.manager.online_dirs():
            if name == path or name.startswith(path + os.sep):
                self._fail_dir(path, exc)
                return True
        return False

    def _out_of_resources(self, exc: BaseException) -> None:
        log.error("broker %d: out of open files or memory maps (%s): not a disk failure, every log dir stays "
                  "online; %d partitions hold files now (log.open.max.partitions=%d): raise the process's "
                  "open-file limit (ulimit -n) or vm.max_map_count, or lower log.open.max.partitions",
                  self.broker_id, exc, len(self.logs.manager.open_logs), self.logs.manager.open_logs.max_logs)

    def _fail_dir(self, path: str, exc: BaseException) -> None:
        if is_resource_exhaustion(exc):
            # EMFILE / ENFILE / ENOMEM: this process's limits, not the disk: taking the dir
            # offline would stop every partition in it for what the next release frees.
            self._out_of_resources(exc)
            return
        manager = self.logs.manager
        gone = manager.fail_dir(path, f"{type(exc).__name__}: {exc}")
        if not gone:
            return
        self.fetchers.remove_partitions(gone)
        with self.lock:
            parts = [self.partitions.pop(t, None) for t in gone]
            self.offline.update(gone)
        for part in parts:
            if part is not None:
                part.stop()
        self.notify_data()
        state_log.error("broker %d: log dir %s failed: %d partitions offline here", self.broker_id, path, len(gone))
        try:
            self.store.notify_log_dir_failure(self.broker_id, gone)
        except Exception:  # ZooKeeper away: a restart re-registers and the controller re-elects then
            log.exception("could not notify the controller of the failure of log dir %s", path)
        if not manager.online_dirs():
            log.error("broker %d: every log dir is offline; shutting down", self.broker_id)
            self.on_all_dirs_offline()

    # ------------------------------------------------------------ offsets
    def list_offsets(self, queries) -> list[M.ListOffsetsResult]:
        """ListOffsets for ``queries`` (:class:`ListOffsetsQuery`), one result each, in order."""
        out = []
        for q in queries:
            r = M.ListOffsetsResult(q.topic, q.partition)
            out.append(r)
            try:
                part = self._partition_or_error(q.topic, q.partition)
                o = part.leader_offsets(q.current_leader_epoch)
                hw, r.leader_epoch = o.high_watermark, o.leader_epoch
                r.high_watermark = hw if o.hw_known else -1
                r.log_end_offset, r.log_start_offset = o.log_end_offset, o.log_start_offset
                # KIP-207: while a new leader's HW is not known yet, "latest" and a time not
                # found below the HW are OFFSET_NOT_AVAILABLE (retriable), as in Kafka.
                not_yet = E.OffsetNotAvailableError(
                    f"{q.topic}-{q.partition}: the new leader's high watermark has not reached the start of "
                    f"its epoch {r.leader_epoch} yet")
                if q.timestamp_ms == -2:
                    r.offset = o.log_start_offset
                elif q.timestamp_ms == -1:
                    if not o.hw_known:
                        raise not_yet
                    r.offset = hw
                elif q.timestamp_ms < 0:
                    raise E.InvalidRequestError(f"timestamp {q.timestamp_ms} is not -2, -1 or a time in ms")
                else:
                    found = part.log.offset_for_timestamp(q.timestamp_ms)
                    if found is not None and found[0] < hw:
                        r.offset, r.timestamp_ms = found
                    elif not o.hw_known:
                        raise not_yet
            except E.ReplikafkaError as exc:
                r.error = exc
        return out

    def offsets_for_leader_epoch(self, queries) -> list[M.EpochEndOffset]:
        """OffsetsForLeaderEpoch for ``queries`` (:class:`EpochQuery`), one answer each, in order."""
        out = []
        for q in queries:
            r = M.EpochEndOffset(q.topic, q.partition)
            out.append(r)
            try:
                part = self._partition_or_error(q.topic, q.partition)
                r.leader_epoch, r.end_offset = part.end_offset_for_epoch(q.leader_epoch, q.current_leader_epoch)
            except E.ReplikafkaError as exc:
                r.error = exc
        return out

    # ------------------------------------------------------------ background work
    def do_isr_work(self) -> int:
        """One pass of ISR maintenance: over every partition this broker leads when a
        whole pass is due (the first call, then every half replica.lag.time.max.ms),
        else over those marked since the last pass (``_isr_candidates``). Each change is
        a conditional write on the state znode; a version mismatch means someone else
        wrote: re-read, and if our epoch is gone, stop acting as leader (seed 000 §3).
        Returns how many ISRs changed."""
        lag = self.config.get("replica.lag.time.max.ms")
        now = self.clock.time_ms()
        with self.lock:
            if now >= self._isr_pass_due_ms:
                self._isr_pass_due_ms = now + lag // 2
                parts = [p for p in self.partitions.values() if p.role == LEADER]
            else:
                parts = [p for p in self._isr_candidates if p.role == LEADER]
            self._isr_candidates.clear()
        changed = []
        todo = []
        for part in parts:
            wanted = part.isr_change_wanted(lag)
            if wanted is not None:
                new_isr, decided_in, leader_epoch, zk_version, controller_epoch = wanted
                todo.append((part, new_isr, decided_in, zk_version,
                             LeaderAndIsr(self.broker_id, leader_epoch, tuple(new_isr), controller_epoch)))
        # All of this pass's writes at once (pipelined), each still conditional on its version.
        versions = self.store.update_partition_states(
            [(part.topic, part.partition, state, zk_version) for part, _n, _d, zk_version, state in todo])
        failure = next((v for v in versions if isinstance(v, Exception)), None)
        retry: list[Partition] = []
        for (part, new_isr, decided_in, _zk_version, _state), version in zip(todo, versions):
            if isinstance(version, Exception):
                part.isr_change_done(new_isr, None, decided_in)   # not written: decided again next pass
                retry.append(part)
                continue
            if version is None:
                current = self.store.get_partition_state(part.topic, part.partition)
                part.isr_change_done(new_isr, None, decided_in)
                retry.append(part)
                if current is not None and current[0].leader == self.broker_id and \
                        current[0].leader_epoch > part.leader_epoch:
                    # The controller bumped our epoch (a reassignment): its LeaderAndIsr is on the way.
                    continue
                if current is None or current[0].leader != self.broker_id or \
                        current[0].leader_epoch != part.leader_epoch:
                    log.warning("%s-%d: state znode moved on (now %s); this broker stops leading it",
                                part.topic, part.partition, current and current[0])
                    self._demote_zombie(part, current)
                else:  # same epoch, stale version: learn it and retry next pass
                    part.isr_change_done(current[0].isr, current[1])
                continue
            self.stats.isr_changed(len(part.isr), len(new_isr))
            part.isr_change_done(new_isr, version, decided_in)
            state_log.info("broker %d: %s-%d ISR -> %s (zk version %d)", self.broker_id, part.topic,
                           part.partition, list(new_isr), version)
            changed.append(part.tp)
        with self.lock:
            self._isr_candidates.update(retry)
            self._isr_changes_unannounced.update(changed)
            unannounced = list(self._isr_changes_unannounced)
        if changed:
            self.notify_data()
        if unannounced:
            self.store.notify_isr_change(unannounced)   # if it raises, they are sent with the next pass's
            with self.lock:
                self._isr_changes_unannounced.difference_update(unannounced)
        if failure is not None:
            raise failure
        return len(changed)

    def _demote_zombie(self, part: Partition, current) -> None:
        """A leader whose state znode names another leader (or none) follows what the
        znode says, fetcher included: the controller's LeaderAndIsr for that same leader
        and epoch is then a repeat that changes nothing, so this is the only chance to
        start fetching (a follower without a fetcher never rejoins the ISR)."""
        follow: dict[TP, tuple[int, int]] = {}
        unfollow: list[TP] = []
        with self.role_change_lock:
            if current is None:
                self._become_follower(part, -1, part.leader_epoch + 1, (), part.replicas, -1, -1, follow, unfollow)
            else:
                state, version = current
                self._become_follower(part, state.leader, state.leader_epoch, state.isr, part.replicas, version,
                                      state.controller_epoch, follow, unfollow)
            self.fetchers.remove_partitions(unfollow)
            self.fetchers.add_partitions(follow)

    def expire_producers(self) -> None:
        """Forget idempotent producers silent for producer.id.expiration.ms (bounds the
        state): a walk of every partition, once per producer.id.expiration.check.interval.ms
        (Kafka's, 10 minutes), whenever the log maintenance calls. Each second, the walk
        took 50,000 partition locks at 50,000 partitions, through a failover too."""
        expiration_ms = self.config.get("producer.id.expiration.ms")
        now = self.clock.time_ms()
        with self.lock:
            if now < self._producer_expiry_due_ms:
                return
            self._producer_expiry_due_ms = now + self.config.get("producer.id.expiration.check.interval.ms")
            parts = list(self.partitions.values())
        for part in parts:
            with part.lock:
                built = part.producers_if_built
                if built is not None:
                    built.expire(now, expiration_ms)

    def high_watermarks(self) -> dict[TP, int]:
        with self.lock:
            return {tp: p.hw for tp, p in self.partitions.items()}

    def shutdown(self) -> None:
        self.fetchers.shutdown()
        with self.lock:
            for p in self.partitions.values():
                p.stop()
