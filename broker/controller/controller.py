"""The controller: one event thread, fed by a bounded queue.

Every broker runs one of these; the one that wins the ephemeral ``/controller``
znode is active. ZooKeeper watches and session listeners only enqueue typed
events (``controller_events.py``); ``do_work()`` takes one event and handles it
completely through the handler its type maps to in ``HANDLERS`` (read ZooKeeper,
call the pure decisions in ``controller_decisions.py``, write the results with
guarded ``multi``s, send LeaderAndIsr / UpdateMetadata / StopReplica). Those
requests are the plain dataclasses of ``broker/replica/messages.py``, the ones
the brokers' replica managers take; the channel manager encodes them for the
wire (``broker/controller_rpc.py``) and answers with plain results.

The queue never drops a watch's event: those coalesce (one queued copy each).
Events only the active controller handles are dropped quietly when it is not,
and removed from the queue when it resigns. When the ZooKeeper session is LOST
the controller stops acting at once (kazoo's recipes do the same): it is no
longer active, its queue is emptied, and it handles nothing but a new election
until the session is re-established.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import queue
import random
import sys
import threading
import time
from dataclasses import dataclass, field

from kazoo.exceptions import ConnectionLoss, SessionExpiredError

from replikafka.broker import state_change_log
from replikafka.broker.bulk_work import paused_gc
from replikafka.broker import zk_store as Z
from replikafka.broker.controller import controller_decisions as D
from replikafka.broker.controller import controller_events as V
from replikafka.broker.controller.controller_states import (PARTITION_TRANSITIONS, REPLICA_TRANSITIONS,
                                                            PartitionState as PS, ReplicaState as RS, StateMachine)
from replikafka.broker.controller.broker_channels import ControllerChannelManager
from replikafka.broker.metrics import ControllerStats
from replikafka.broker.replica import messages as M
from replikafka.broker.zk_store import LeaderAndIsr, ZkStore
from replikafka import errors as E

log = logging.getLogger("replikafka.controller")
state_log = logging.getLogger("replikafka.state.change")
EVENT_QUEUE_MAX = 100_000      # events; watch events coalesce, so only RPC-born events can fill it
EVENT_PUT_TIMEOUT_S = 30.0     # an RPC-born event waits this long for room, then its caller gets an error
RECENT_EVENTS_MAX = 20         # events remembered for error reports (illegal state transitions)
REASSIGNMENT_NUDGE_S = 2.0
#: The process's GIL switch interval while a new controller loads its context (Python's
#: default is 5 ms). The event thread and kazoo's connection thread hand the GIL to each
#: other at every ZooKeeper request and answer (50,000 partitions: 50 multiReads and their
#: answers); each time the one woken waits until a thread running Python code is told to
#: drop it, a switch interval, and a broker's fetchers and RPC handlers run such code.
#: Not for the whole event: while it computes, more hand-overs cost it more than it gains.
LOAD_SWITCH_INTERVAL_S = 0.0005
TP = tuple[str, int]


@contextlib.contextmanager
def _switch_interval(seconds: float):
    """sys.setswitchinterval(``seconds``) for the block, then back as it was (only the
    event thread sets it)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@dataclass
class TopicMeta:
    assignment: dict[int, list[int]]
    schema: bytes
    config: dict[str, str]

    @property
    def topic_id(self) -> str:
        return self.config.get("topic.id", "")


@dataclass
class ControllerContext:
    epoch: int = 0
    epoch_zk_version: int = -1
    live: dict[int, tuple[str, int]] = field(default_factory=dict)
    broker_epochs: dict[int, int] = field(default_factory=dict)
    endpoints: dict[int, tuple[str, ...]] = field(default_factory=dict)  # every advertised listener
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    states: dict[TP, tuple[LeaderAndIsr, int]] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)
    reassigning: dict[TP, list[int]] = field(default_factory=dict)   # partition -> target replicas (RAR)
    shutting_down: set[int] = field(default_factory=set)             # brokers in controlled shutdown
    # Kafka's partition and replica state machines (controller_states.py): per partition,
    # and per (partition, broker) replica.
    partition_states: StateMachine = field(
        default_factory=lambda: StateMachine("partition", PARTITION_TRANSITIONS, PS.NON_EXISTENT))
    replica_states: StateMachine = field(
        default_factory=lambda: StateMachine("replica", REPLICA_TRANSITIONS, RS.NON_EXISTENT))


class Controller:
    def __init__(self, broker_id: int, store: ZkStore, *, unclean_default: bool = False,
                 request_timeout_s: float = 30.0, on_became_controller=None,
                 auto_rebalance_enable: bool = False, imbalance_percentage: int = 10,
                 imbalance_check_interval_s: float = 300.0, clock=time.monotonic,
                 channel_credentials=None):
        self.broker_id = broker_id
        self.auto_rebalance_enable = auto_rebalance_enable
        self.imbalance_percentage = imbalance_percentage
        self.imbalance_check_interval_s = imbalance_check_interval_s
        self.clock = clock
        self.next_rebalance_check = clock() + imbalance_check_interval_s
        self.next_reassignment_nudge = clock()
        self.store = store
        self.zk = store.zk
        self.unclean_default = unclean_default
        self.events: queue.Queue = queue.Queue(maxsize=EVENT_QUEUE_MAX)
        self.channels = ControllerChannelManager(request_timeout_s, channel_credentials)
        self.ctx = ControllerContext()
        self.active = False
        self.session_lost = False        # set by the session listener; cleared by SessionReestablished
        # An event stopped by a lost connection (the session lives on): run for election again
        # once connected, to take the role back while this session still holds /controller.
        self.reelect_when_connected = False
        self.queued: set[V.ControllerEvent] = set()   # coalescing events now in the queue
        self.queued_lock = threading.Lock()
        self.recent: collections.deque = collections.deque(maxlen=RECENT_EVENTS_MAX)
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.on_became_controller = on_became_controller
        self.stats = ControllerStats()   # elections, event queue timings (broker/metrics.py)
        # When the event now being handled started (time.monotonic()), None between events:
        # the broker's housekeeping waits for it (``busy``).
        self.event_started: float | None = None

    # ------------------------------------------------------------ plumbing
    def enqueue(self, event: V.ControllerEvent) -> None:
        """Queue ``event``. A coalescing event already queued is not queued twice (the
        queued copy does the same work), so watch events are never dropped and the
        queue holds at most one of each; any other event waits for room, bounded."""
        if event.coalesce:
            with self.queued_lock:
                if event in self.queued:
                    return
                self.queued.add(event)
            self.events.put((event, time.monotonic()))
            return
        try:
            self.events.put((event, time.monotonic()), timeout=EVENT_PUT_TIMEOUT_S)
        except queue.Full:
            raise E.RequestTimedOutError(f"the controller's event queue stayed full for {EVENT_PUT_TIMEOUT_S:.0f}s "
                                         f"({type(event).__name__} not queued)") from None

    def _watch(self, event: V.ControllerEvent):
        return lambda _zk_event: self.enqueue(event)

    def on_session_lost(self) -> None:
        """The ZooKeeper session expired (called from the session listener): stop acting
        now. Its ephemerals and watches are gone; a new session brings SessionReestablished."""
        self.session_lost = True
        if self.active:
            log.warning("broker %d: ZooKeeper session lost; no longer acting as the controller", self.broker_id)
        self.active = False
        self._drop_queued(lambda event: not isinstance(event, V.SessionReestablished))

    def _drop_queued(self, which) -> int:
        """Remove the queued events ``which(event)`` selects, on purpose and quietly (one
        line for the lot). A waiting ControlledShutdown caller is told to ask the new controller."""
        kept, dropped = [], 0
        while True:
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                break
            event = item[0]
            if which(event):
                dropped += 1
                self._forget_queued(event)
                if isinstance(event, V.ControlledShutdown) and event.reply is not None:
                    event.reply.set_exception(E.NotControllerError(
                        f"broker {self.broker_id} stopped being the controller"))
            else:
                kept.append(item)
        for item in kept:
            self.events.put_nowait(item)
        if dropped:
            log.info("broker %d: dropped %d queued controller events (not the controller any more)",
                     self.broker_id, dropped)
        return dropped

    def _forget_queued(self, event: V.ControllerEvent) -> None:
        if event.coalesce:
            with self.queued_lock:
                self.queued.discard(event)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="controller-event-thread", daemon=True)
        self.thread.start()
        self.enqueue(V.Elect())

    def stop(self) -> None:
        self.stopped.set()
        self.enqueue(V.Shutdown())
        if self.thread is not None:
            self.thread.join(timeout=10)
        self._resign(delete_znode=True)
        # What this controller decided last (a controlled shutdown's new leaders) must
        # still reach the brokers: deliver what is queued, within a bound.
        self.channels.drain(timeout_s=5.0)
        self.channels.close()

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.schedule_timed_events()
            self.do_work(timeout_s=0.5)

    def schedule_timed_events(self) -> None:
        """The periodic auto leader rebalance check becomes an event like any other; so
        does the election after a lost connection, once the connection is back."""
        if self.reelect_when_connected and self.zk.connected and not self.session_lost:
            self.reelect_when_connected = False
            self.enqueue(V.Elect())
        now = self.clock()
        if self.active and self.auto_rebalance_enable and now >= self.next_rebalance_check:
            self.next_rebalance_check = now + self.imbalance_check_interval_s
            self.enqueue(V.AutoRebalance())
        # Reassignments advance on ISR changes; this nudge covers a write that lost a race.
        if self.active and self.ctx.reassigning and now >= self.next_reassignment_nudge:
            self.next_reassignment_nudge = now + REASSIGNMENT_NUDGE_S
            self.enqueue(V.ReassignmentNudge())

    def do_work(self, timeout_s: float = 0.0) -> bool:
        """Handle one event. Returns False when the queue was empty."""
        try:
            event, queued_at = self.events.get(timeout=timeout_s) if timeout_s else self.events.get_nowait()
        except queue.Empty:
            return False
        started = time.monotonic()
        self._forget_queued(event)   # from now on a new watch firing queues a fresh copy
        name = type(event).__name__
        if (event.only_active and not self.active) or (self.session_lost and not isinstance(
                event, (V.SessionReestablished, V.Shutdown))):
            log.debug("broker %d: controller event %s dropped (not the active controller)", self.broker_id, name)
            if isinstance(event, V.ControlledShutdown) and event.reply is not None:
                event.reply.set_exception(E.NotControllerError(f"broker {self.broker_id} is not the controller"))
            return True
        self.recent.append(event)
        self.event_started = started
        try:
            with paused_gc():    # a failover or broker change builds a state per partition
                HANDLERS[type(event)](self, event)
        except Z.ControllerMovedError:
            log.warning("broker %d: lost the controller role during %s", self.broker_id, name)
            self._resign(delete_znode=False)
        except (SessionExpiredError, ConnectionLoss) as exc:
            # This event's work stopped half way: stop acting on what it left. An expired
            # session also stops the controller through the session listener, and a new one
            # brings SessionReestablished. A lost connection keeps the session, and with it
            # this broker's /controller: nobody else can be elected, so this controller runs
            # for election again once connected and takes the role back with a new epoch
            # (a full failover redoes what the event left undone).
            log.warning("broker %d: controller event %s stopped by ZooKeeper: %r", self.broker_id, name, exc)
            if self.active and isinstance(exc, ConnectionLoss):
                self.reelect_when_connected = True
            self._resign(delete_znode=False)
        except Exception:
            if not self.stopped.is_set():
                log.exception("controller event %s failed", name)
        finally:
            self.event_started = None
        self.stats.event_done(started - queued_at, time.monotonic() - started)
        return True

    def busy(self, longest_s: float) -> bool:
        """Whether an event is being handled and started less than ``longest_s`` ago (any
        thread may ask). The broker's periodic scans of every partition wait meanwhile:
        they share this process's GIL with the event thread, and at 50,000 partitions they
        held it for most of a controller failover."""
        started = self.event_started
        return started is not None and time.monotonic() - started < longest_s

    # ------------------------------------------------------------ election (seed 002)
    def _on_elect(self, _event=None) -> None:
        current = self.store.get_controller_id(watch=self._watch(V.Elect()))
        if current == self.broker_id and self.active:
            return
        if current == self.broker_id and self.store.controller_is_ours():
            log.warning("broker %d: taking the controller role back (this session still holds /controller)",
                        self.broker_id)
        elif current != -1:
            if self.active:
                self._resign(delete_znode=False)
            return
        elif not self.store.try_elect_controller(self.broker_id):
            self.store.get_controller_id(watch=self._watch(V.Elect()))
            return
        else:
            self.store.get_controller_id(watch=self._watch(V.Elect()))
        epoch, version = self.store.increment_controller_epoch()
        self.ctx = ControllerContext(epoch=epoch, epoch_zk_version=version)
        self.active = True
        log.info("broker %d is the controller, epoch %d", self.broker_id, epoch)
        self._failover()
        if self.on_became_controller:
            self.on_became_controller(epoch)

    def _on_session_reestablished(self, _event=None) -> None:
        self.session_lost = False
        self._resign(delete_znode=False)
        self._on_elect()

    def _on_shutdown(self, _event=None) -> None:
        self.stopped.set()

    def _resign(self, delete_znode: bool) -> None:
        was = self.active
        self.active = False
        if was:
            self._drop_queued(lambda event: event.only_active)
        if was and delete_znode:
            try:
                if self.store.get_controller_id() == self.broker_id:
                    self.zk.delete(Z.CONTROLLER)
            except Exception:
                pass
        self.ctx = ControllerContext()

    # ------------------------------------------------------------ failover: load everything
    def _failover(self) -> None:
        ctx = self.ctx
        started = time.monotonic()
        # Loading is a hundred ZooKeeper requests and answers, each handed between this
        # thread and kazoo's: with the broker's threads running Python code, each hand-over
        # waited a switch interval (LOAD_SWITCH_INTERVAL_S).
        with _switch_interval(LOAD_SWITCH_INTERVAL_S):
            written_at = self._load_everything()
        loaded = time.monotonic()
        # Every state a failed broker or a restarted ISR member must change is written
        # before the full state goes out, ISRs included: the old controller's broker, dead
        # with it, is in a replica set of most partitions, so at scale this writes most
        # states. Sending the full state first and the ISR departures after (as Kafka's
        # onControllerFailover orders them) got the full state out no sooner in the scale
        # bench (2.8 s vs 2.4 s at 20,000 partitions) and took 2 s more in all: the
        # departures then need requests of their own.
        # Full state to every live broker: metadata first, then roles (one request built for
        # all), both encoded before either is queued (ControllerChannelManager.held), and
        # queued only once every state write returned: a leader goes out only after its
        # state is written under this controller's epoch (a write that finds the epoch
        # moved raises, and the block queues nothing). The full state is encoded while
        # ZooKeeper writes the offline pass (most states: the old controller's broker is
        # in most ISRs), from the states as those writes make them; if any went otherwise
        # (a version had moved) or a later pass wrote more, it is encoded again.
        with self.channels.held() as held:
            ahead: dict[str, object] = {}

            def encode_ahead(expected: dict[TP, tuple[LeaderAndIsr, int]]) -> None:
                saved = {tp: ctx.states[tp] for tp in expected}
                ctx.states.update(expected)
                try:
                    ahead["mark"] = len(held)
                    self._send_full_state()
                    ahead["states"] = dict(ctx.states)
                finally:
                    ctx.states.update(saved)

            restarted = self._elect_restarted_since_written(written_at)
            changed = (restarted + self._elect_offline(while_in_flight=encode_ahead)
                       + self._elect_for_offline_replicas())
            self._sync_partition_states(changed)
            decided = time.monotonic()
            if ahead.get("states") != ctx.states:
                del held[ahead.get("mark", len(held)):]
                self._send_full_state()
        # The phases, so a slow failover says where its time went (ZooKeeper reads,
        # re-decided states, building and queueing the requests).
        log.info("controller failover: loaded %d topics, %d partitions and sent the full state to %d brokers "
                 "in %.3fs (read %.3fs, decided and wrote %d states (%d with restarted ISR members) in %.3fs, "
                 "sent %.3fs)", len(ctx.topics), len(ctx.states), len(ctx.live), time.monotonic() - started,
                 loaded - started, len(set(changed)), len(restarted), decided - loaded, time.monotonic() - decided)
        self._try_delete_topics()
        # Admin work an earlier controller left unfinished resumes here (seed 003);
        # a failure there must not stop the controller from serving.
        for resume in (self._on_reassign, self._on_preferred_election, self._on_partitions_remove):
            try:
                resume()
            except Z.ControllerMovedError:
                raise
            except Exception:
                log.exception("controller failover: resuming %s failed; retried on its next event", resume.__name__)
        self.next_rebalance_check = self.clock() + self.imbalance_check_interval_s

    def _load_everything(self) -> dict[TP, int]:
        """A new controller's context from ZooKeeper: live brokers, topics, every partition
        state (returns when each was last written: its mzxid), the state machines as loaded."""
        ctx = self.ctx
        self.store.ensure_paths()
        ctx.live = self.store.live_brokers(watch=self._watch(V.BrokerChange()), epochs=ctx.broker_epochs,
                                           endpoints=ctx.endpoints)
        self.channels.set_brokers(ctx.live)
        for t in self.store.list_topics(watch=self._watch(V.TopicChange())):
            self._load_topic(t)
        tps = [(t, p) for t, m in ctx.topics.items() for p in m.assignment]
        written_at: dict[TP, int] = {}
        ctx.states = self.store.get_partition_states(tps, mzxids=written_at)
        live = ctx.live                          # as loaded, like Kafka's initializePartitionState
        ctx.partition_states.initialize_many((tp, PS.ONLINE if s.leader in live else PS.OFFLINE)
                                             for tp, (s, _v) in ctx.states.items())
        ctx.replica_states.initialize_many(((tp, b), RS.ONLINE if b in live else RS.OFFLINE)
                                           for tp in ctx.states for b in ctx.topics[tp[0]].assignment[tp[1]])
        missing = [tp for tp in tps if tp not in ctx.states]
        if missing:
            self._create_states(missing)
        ctx.deleting = set(self.store.topics_pending_deletion(watch=self._watch(V.DeleteTopics())))
        self.store.take_isr_change_notifications(watch=self._watch(V.IsrChange()))
        return written_at

    def _send_full_state(self) -> None:
        """Every partition's state to every live broker: the full UpdateMetadata, then each
        broker's LeaderAndIsr of every partition it hosts (the states built once for both)."""
        built = self._send_update_metadata(list(self.ctx.live), list(self.ctx.states), full=True)
        self._send_leader_and_isr(list(self.ctx.states), prebuilt=built)

    def _load_topic(self, topic: str) -> TopicMeta | None:
        assignment = self.store.get_assignment(topic, watch=self._watch_partitions(topic))
        cfg = self.store.get_topic_config(topic)
        if assignment is None or cfg is None:
            return None
        meta = TopicMeta(assignment, cfg[1], cfg[0])
        self.ctx.topics[topic] = meta
        return meta

    def _watch_partitions(self, topic: str):
        return self._watch(V.PartitionChange(topic))

    # ------------------------------------------------------------ events
    def _on_broker_change(self, _event=None) -> None:
        ctx = self.ctx
        epochs: dict[int, int] = {}
        endpoints: dict[int, tuple[str, ...]] = {}
        live = self.store.live_brokers(watch=self._watch(V.BrokerChange()), epochs=epochs, endpoints=endpoints)
        ctx.endpoints = endpoints
        change = D.broker_set_change(ctx.live, ctx.broker_epochs, live, epochs)
        new, dead, bounced = set(change.started), set(change.dead), set(change.bounced)
        ctx.live, ctx.broker_epochs = live, epochs
        ctx.shutting_down -= bounced | dead
        self.channels.set_brokers(live)
        started = time.monotonic()
        if dead:
            log.info("controller: brokers %s failed", sorted(dead))
        if new:
            log.info("controller: brokers %s started", sorted(new))
        # A bounced broker lost its in-memory state (its HW, its role): like Kafka
        # with broker epochs, it is handled as failed and then as started, so the
        # partitions it led get a new leader and epoch rather than a leader that
        # forgot its HW.
        self._replicas_of_brokers_to(dead | bounced, RS.OFFLINE)
        passes = [bounced, frozenset()] if bounced else [frozenset()]
        # Leaders first, as Kafka's onBrokerFailure: the partitions that lost their leader
        # get new ones, written and sent to their replicas (LeaderAndIsr, then metadata)
        # before the dead brokers leave the ISRs of partitions whose leader lives. A dead
        # broker is in most ISRs: those writes and roles no longer delay the new leaders.
        moved = self._elect_offline_passes(passes, leaders_only=True)
        self._sync_partition_states(moved + [tp for tp, (s, _v) in ctx.states.items()
                                             if s.leader in dead or s.leader in bounced])
        if moved:
            built = self._send_leader_and_isr(moved, skip=new)
            self._send_update_metadata(change.changes_to(live), moved, prebuilt=built)
        leaders_s = time.monotonic() - started
        led = set(moved)
        shrunk = [tp for tp in self._elect_offline_passes(passes) if tp not in led]
        self._replicas_of_brokers_to(new, RS.ONLINE)
        self._sync_partition_states(shrunk)
        # New brokers learn everything; everyone else learns the changed partitions
        # and the new set of live brokers (as Kafka's onBrokerStartup/onBrokerFailure:
        # a broker that leads nothing is still a broker clients must be told of).
        built: dict[TP, M.PartitionRole | None] = {}
        if new:
            built = self._send_update_metadata(change.full_metadata_to(), list(ctx.states), full=True)
        if shrunk or (change.moved and not moved):  # the others learn the new brokers (and epochs, KIP-380)
            built = {**built, **self._send_update_metadata(change.changes_to(live), shrunk)}
        self._send_leader_and_isr(shrunk, extra_brokers=new, prebuilt=built)
        if moved or shrunk:
            log.info("controller: %d partition states written and sent in %.3fs (%d new leaders in %.3fs, "
                     "then %d ISRs without the failed brokers)", len(moved) + len(shrunk),
                     time.monotonic() - started, len(moved), leaders_s, len(shrunk))
        if new and ctx.deleting:
            self._try_delete_topics()
        if ctx.reassigning:
            self._advance_reassignments(list(ctx.reassigning))

    def _elect_offline_passes(self, passes, leaders_only: bool = False) -> list[TP]:
        """``_elect_offline`` once per set of brokers to exclude, in order; each partition once."""
        done: dict[TP, None] = {}
        for exclude in passes:
            done.update(dict.fromkeys(self._elect_offline(exclude, leaders_only)))
        return list(done)

    def _elect_offline(self, exclude=frozenset(), leaders_only: bool = False, while_in_flight=None) -> list[TP]:
        """Elect leaders for partitions without a live leader, take dead followers out of ISRs
        (``leaders_only``: not yet). Brokers in ``exclude`` count as dead for this pass.
        ``while_in_flight``: as ``_write_states``'s."""
        ctx = self.ctx
        current = {tp: s for tp, (s, _v) in ctx.states.items() if tp[0] not in ctx.deleting}
        assignments = {t: m.assignment for t, m in ctx.topics.items() if t not in ctx.deleting}
        decisions = D.on_brokers_changed(assignments, current, set(ctx.live) - set(exclude), ctx.epoch,
                                         self._unclean_for, avoid=ctx.shutting_down)
        if leaders_only:
            decisions = {tp: e for tp, e in decisions.items() if D.moves_leadership(current[tp], e.state)}
        for tp, e in decisions.items():
            if e.unclean:
                self.stats.unclean_election()
                log.error("UNCLEAN leader election for %s-%d: broker %d was not in the ISR %s; "
                          "records acknowledged but not on it are LOST",
                          tp[0], tp[1], e.state.leader, list(current[tp].isr))
        return self._write_states({tp: e.state for tp, e in decisions.items()}, set(ctx.live) - set(exclude),
                                  while_in_flight=while_in_flight)

    def _elect_restarted_since_written(self, written_at: dict[TP, int]) -> list[TP]:
        """Failover's view of bounced brokers: an ISR member registered (czxid) after its
        partition's state was last written restarted since it was put there, so it may
        have lost what it held (an unflushed tail) and the HW with it. As the running
        controller does for a broker it saw bounce, such a partition is decided as if
        those brokers were dead: a new leader from the rest of the ISR, the restarted
        ones out of it (they catch up and rejoin). Without this a leader restarted
        while the controller moved was reinstated in the same epoch with a shorter log,
        and its followers truncated acknowledged records to match it."""
        ctx = self.ctx
        by_restarted = D.restarted_isr_members({tp: s for tp, (s, _v) in ctx.states.items()}, ctx.live,
                                               ctx.broker_epochs, written_at, ctx.deleting)
        changed: list[TP] = []
        for restarted, current in by_restarted.items():
            log.info("controller failover: brokers %s registered after %d partition states were written: "
                     "deciding those partitions without them", sorted(restarted), len(current))
            assignments = D.assignments_of({t: m.assignment for t, m in ctx.topics.items()}, current)
            decisions = D.on_brokers_changed(assignments, current, set(ctx.live) - restarted, ctx.epoch,
                                             self._unclean_for, avoid=ctx.shutting_down)
            changed += self._write_states({tp: e.state for tp, e in decisions.items()}, set(ctx.live) - restarted)
        return changed

    def _eligible(self) -> set[int]:
        """Brokers that may lead and stay in ISRs: live and not shutting down."""
        return set(self.ctx.live) - self.ctx.shutting_down

    def _unclean_for(self, topic: str) -> bool:
        v = self.ctx.topics[topic].config.get("unclean.leader.election.enable")
        return self.unclean_default if v is None else v.lower() == "true"

    def _write_states(self, new: dict[TP, LeaderAndIsr], live: set[int], rounds: int = 5,
                      while_in_flight=None) -> list[TP]:
        """Guarded, batched writes; re-read and re-decide partitions whose znode moved,
        with the same ``live`` brokers the first decision had (a bounced broker stays
        excluded: a leader's concurrent ISR write must not undo its demotion).
        ``while_in_flight(expected)``: called once while the first round's writes are in
        flight, with {tp: (state, version)} as they will be if every one succeeds."""
        ctx = self.ctx
        done: list[TP] = []
        for _ in range(rounds):
            if not new:
                break
            ok, fresh = self._guarded_round(new, "", while_in_flight)
            while_in_flight = None
            done += ok
            if not fresh:
                break
            # A leader changed its ISR meanwhile: decide again on what it wrote.
            cur = {tp: s for tp, (s, _v) in fresh.items()}
            decisions = D.on_brokers_changed(D.assignments_of({t: m.assignment for t, m in ctx.topics.items()}, cur),
                                             cur, live, ctx.epoch, self._unclean_for, avoid=ctx.shutting_down)
            new = {tp: e.state for tp, e in decisions.items()}
        return done

    def _on_topic_change(self, _event=None) -> None:
        ctx = self.ctx
        topics = set(self.store.list_topics(watch=self._watch(V.TopicChange())))
        added = [t for t in topics if t not in ctx.topics]
        for t in set(ctx.topics) - topics:  # removed behind our back
            self._forget_topic(t)
        new_tps = []
        for t in added:
            meta = self._load_topic(t)
            if meta is not None:
                new_tps += [(t, p) for p in meta.assignment]
        if new_tps:
            self._create_states(new_tps)
            built = self._send_update_metadata(list(ctx.live), new_tps)
            self._send_leader_and_isr(new_tps, prebuilt=built)

    def _on_topic_config_change(self, event: V.TopicConfigChange) -> None:
        """A dynamic config change (AlterConfigs): the controller's copy, which its
        UpdateMetadata and unclean-election decisions use, follows ZooKeeper."""
        topic = event.topic
        if topic not in self.ctx.topics:
            return
        found = self.store.get_topic_config(topic)
        if found is not None:
            self.ctx.topics[topic].config = found[0]
            self._send_update_metadata(list(self.ctx.live), [(topic, p) for p in self.ctx.topics[topic].assignment])

    def _on_partition_change(self, event: V.PartitionChange) -> None:
        topic = event.topic
        if topic not in self.ctx.topics:
            return
        meta = self.ctx.topics[topic]
        assignment = self.store.get_assignment(topic, watch=self._watch_partitions(topic))
        if assignment is None:
            return
        new_tps = [(topic, p) for p in assignment if p not in meta.assignment]
        meta.assignment = assignment
        if new_tps:
            self._create_states(new_tps)
            built = self._send_update_metadata(list(self.ctx.live), new_tps)
            self._send_leader_and_isr(new_tps, prebuilt=built)

    def _create_states(self, tps: list[TP]) -> None:
        ctx = self.ctx
        live = set(ctx.live)
        new = {tp: D.initial_leader_and_isr(ctx.topics[tp[0]].assignment[tp[1]], live, ctx.epoch) for tp in tps}
        ctx.partition_states.transition(tps, PS.NEW, self.recent)
        self._replicas_appear([(tp, b) for tp in tps for b in ctx.topics[tp[0]].assignment[tp[1]]])
        created = self.store.create_partition_states(new)
        ctx.states.update((tp, (new[tp], version)) for tp, version in created.items())
        # Re-read the others: a partition created by an earlier controller keeps its
        # state (the ones created here are as written: 50,000 reads less for a big topic).
        ctx.states.update(self.store.get_partition_states([tp for tp in tps if tp not in created]))
        self._sync_partition_states(tps)
        if state_change_log.enabled():  # one record for the batch (a line per partition)
            state_change_log.log_lines([f"controller {self.broker_id} epoch {ctx.epoch}: {tp[0]}-{tp[1]} "
                                        f"NewPartition -> {ctx.states.get(tp, (None,))[0]}" for tp in tps])

    def _on_log_dir_failure(self, _event=None) -> None:
        """KIP-112: a broker's log dir failed; its replicas there are offline. They leave
        the ISRs and the partitions they led get new leaders from the other in-sync replicas."""
        changed = self._elect_for_offline_replicas()
        if changed:
            self._sync_partition_states(changed)
            self._announce(changed)

    def _elect_for_offline_replicas(self) -> list[TP]:
        ctx = self.ctx
        changed: list[TP] = []
        for b, tps in self.store.take_log_dir_events(watch=self._watch(V.LogDirFailure())).items():
            current = {tp: ctx.states[tp][0] for tp in tps if tp in ctx.states and tp[0] not in ctx.deleting}
            log.info("controller: broker %d reports %d replicas offline (log dir failure)", b, len(current))
            assignments = D.assignments_of({t: m.assignment for t, m in ctx.topics.items()}, current)
            decisions = D.on_brokers_changed(assignments, current, set(ctx.live) - {b}, ctx.epoch,
                                             self._unclean_for, avoid=ctx.shutting_down)
            changed += self._write_states({tp: e.state for tp, e in decisions.items()}, set(ctx.live) - {b})
        return changed

    def _on_isr_change(self, _event=None) -> None:
        tps = self.store.take_isr_change_notifications(watch=self._watch(V.IsrChange()))
        tps = [tp for tp in tps if tp[0] in self.ctx.topics]
        if not tps:
            return
        self.ctx.states.update(self.store.get_partition_states(tps))
        self._send_update_metadata(list(self.ctx.live), tps)
        waiting = [tp for tp in tps if tp in self.ctx.reassigning]
        if waiting:
            self._advance_reassignments(waiting)

    # ------------------------------------------------------------ admin operations: shared plumbing
    def _guarded_round(self, new: dict[TP, LeaderAndIsr], why: str, while_in_flight=None
                       ) -> tuple[list[TP], dict[TP, tuple[LeaderAndIsr, int]]]:
        """One round of guarded, batched state writes: the written partitions, and the
        fresh states of those whose znode had moved (re-read into the context).
        ``while_in_flight``: as ``_write_states``'s."""
        if not new:
            return [], {}
        ctx = self.ctx
        updates = {tp: (s, ctx.states[tp][1]) for tp, s in new.items()}
        # a set's new version is the one it expected plus one
        ahead = None if while_in_flight is None else (
            lambda: while_in_flight({tp: (s, v + 1) for tp, (s, v) in updates.items()}))
        ok, failed = Z.guarded_state_writes(self.zk, ctx.epoch_zk_version, updates, ahead)
        self.stats.elections((ctx.states[tp][0].leader for tp in ok), (new[tp].leader for tp in ok))
        for tp, version in ok.items():
            ctx.states[tp] = (new[tp], version)
        if state_change_log.enabled():  # one record for the batch (a line per partition)
            suffix = f" ({why})" if why else ""
            state_change_log.log_lines([f"controller {self.broker_id} epoch {ctx.epoch}: {tp[0]}-{tp[1]} -> "
                                        f"{new[tp]}{suffix}" for tp in ok])
        fresh = self.store.get_partition_states(failed) if failed else {}
        ctx.states.update(fresh)
        return list(ok), fresh

    def _write_decided(self, new: dict[TP, LeaderAndIsr], why: str) -> list[TP]:
        """Guarded writes of states decided for an admin operation. A partition whose
        znode moved meanwhile (its leader changed the ISR) is re-read and left for the
        operation's next event rather than re-decided here."""
        return self._guarded_round(new, why)[0]

    def _announce(self, tps: list[TP], skip=()) -> None:
        """New states to everyone: metadata to every live broker, roles to the replicas."""
        if tps:
            built = self._send_update_metadata(list(self.ctx.live), tps)
            self._send_leader_and_isr(tps, skip=skip, prebuilt=built)

    def _write_assignments(self, changes: dict[TP, tuple[int, ...]]) -> None:
        by_topic: dict[str, dict[int, list[int]]] = {}
        for (t, p), replicas in changes.items():
            by_topic.setdefault(t, {})[p] = list(replicas)
        for t, parts in by_topic.items():
            # Only these partitions: others added meanwhile are the partition_change event's news.
            if self.store.update_assignment(t, parts) is not None and t in self.ctx.topics:
                self.ctx.topics[t].assignment.update(parts)

    def _stop_replica(self, broker: int, tps: list[TP], delete: bool) -> M.StopReplicaRequest:
        return M.StopReplicaRequest(self.broker_id, self.ctx.epoch, self.ctx.broker_epochs.get(broker, 0), delete,
                                    tuple(tps))

    def _send_stop_replica(self, broker: int, tps: list[TP], delete: bool) -> None:
        if tps and broker in self.ctx.live:
            self.channels.send(broker, self._stop_replica(broker, tps, delete))

    # ------------------------------------------------------------ partition removal (seed 000 H)
    def _on_partitions_remove(self, _event=None) -> None:
        """``/admin/partitions_remove/[topic]/[partition]``: the replicas stop and delete
        their logs (StopReplica delete), then the assignment loses the partitions and
        their state znodes go, then every broker's metadata, then the request. Each
        step is idempotent: a new controller resumes an unfinished removal from the
        start (brokers that were down delete the logs at start-up, as unassigned)."""
        ctx = self.ctx
        for topic, requested in self.store.partition_removals(watch=self._watch(V.PartitionsRemove())).items():
            meta = ctx.topics.get(topic)
            if meta is None or topic in ctx.deleting:
                self.store.finish_partition_removal(topic)   # the topic went: so did its partitions
                continue
            doomed, problem = D.partitions_to_remove(meta.assignment, requested)
            if problem:
                log.warning("removal of %s partitions %s refused: %s", topic, sorted(requested), problem)
                self.store.finish_partition_removal(topic)
                continue
            tps = [(topic, p) for p in doomed]
            for b in ctx.live:
                self._send_stop_replica(b, tps, delete=True)
            self.store.remove_partitions(topic, doomed)
            for p in doomed:
                meta.assignment.pop(p, None)
                ctx.states.pop((topic, p), None)
                ctx.reassigning.pop((topic, p), None)
            # The topic's partition count tells every broker which partitions are gone.
            self._send_update_metadata(list(ctx.live), [(topic, p) for p in meta.assignment])
            self.store.finish_partition_removal(topic)
            if state_change_log.enabled():
                state_change_log.log_lines([f"controller {self.broker_id} epoch {ctx.epoch}: {t}-{p} removed"
                                            for t, p in tps])
            log.info("removed partitions %s of %s; it now has %d", doomed, topic, len(meta.assignment))

    # ------------------------------------------------------------ partition reassignment (seed 003)
    def _on_reassign(self, _event=None) -> None:
        ctx = self.ctx
        try:
            pending = self.store.get_reassignment(watch=self._watch(V.Reassign()))
        except E.InvalidRequestError as exc:  # written by hand, not by the tool
            log.error("%s is not a valid reassignment, removing it: %s", Z.REASSIGN_PARTITIONS, exc)
            self.store.set_reassignment({})
            return
        valid = {}
        for tp, rar in pending.items():
            problem = self._reassignment_problem(tp, rar)
            if problem:
                log.error("reassignment of %s-%d to %s refused: %s", tp[0], tp[1], rar, problem)
            else:
                valid[tp] = rar
        for tp in set(valid) - set(ctx.reassigning):
            state_log.info("controller %d epoch %d: %s-%d reassignment %s -> %s started", self.broker_id,
                           ctx.epoch, tp[0], tp[1], ctx.topics[tp[0]].assignment[tp[1]], valid[tp])
        ctx.reassigning = valid
        if len(valid) != len(pending):
            self.store.set_reassignment(valid)
        if valid:
            self._advance_reassignments(list(valid))

    def _on_reassignment_nudge(self, _event=None) -> None:
        if self.ctx.reassigning:
            self._advance_reassignments(list(self.ctx.reassigning))

    def _reassignment_problem(self, tp: TP, rar: list[int]) -> str | None:
        ctx = self.ctx
        meta = ctx.topics.get(tp[0])
        if meta is None or tp[0] in ctx.deleting:
            return f"topic {tp[0]!r} does not exist"
        if tp[1] not in meta.assignment:
            return f"partition {tp[1]} does not exist (topic {tp[0]!r} has {len(meta.assignment)})"
        if not rar:
            return "the replica list is empty"
        if len(set(rar)) != len(rar):
            return f"the replica list {rar} repeats a broker"
        dead = [b for b in rar if b not in ctx.live]
        if dead and not set(rar) <= set(meta.assignment[tp[1]]):
            return f"brokers {dead} are not alive"
        return None

    def _advance_reassignments(self, tps: list[TP]) -> None:
        """Take each partition as far through the 11 steps as its state allows now."""
        ctx = self.ctx
        gone = [tp for tp in tps if tp in ctx.reassigning and (tp[0] not in ctx.topics or tp[0] in ctx.deleting)]
        if gone:  # the topic was deleted meanwhile: nothing left to move
            for tp in gone:
                ctx.reassigning.pop(tp)
            self.store.set_reassignment(ctx.reassigning)
        steps: dict[TP, D.ReassignmentStep] = {}
        for tp in tps:
            rar, meta, entry = ctx.reassigning.get(tp), ctx.topics.get(tp[0]), ctx.states.get(tp)
            if rar is not None and meta is not None and entry is not None and tp[1] in meta.assignment:
                steps[tp] = D.reassignment_step(meta.assignment[tp[1]], rar, entry[0], self._eligible(), ctx.epoch)
        # Steps 1-3: AR = OAR + RAR in ZooKeeper first (a new controller finds the new
        # replicas there), then the epoch bump, then LeaderAndIsr to every replica of AR.
        starting = [tp for tp, st in steps.items() if not st.done and st.assignment is not None]
        self._write_assignments({tp: steps[tp].assignment for tp in starting})
        self._replicas_appear([(tp, b) for tp in starting for b in steps[tp].assignment])
        self._write_decided({tp: steps[tp].state for tp in starting}, "reassignment: new replicas")
        self._announce(starting)
        # Steps 5-10: leader into RAR and ISR = RAR (one guarded write), AR = RAR in the
        # cache, LeaderAndIsr to RAR, stop and delete OAR - RAR, AR = RAR in ZooKeeper last.
        moving = {tp: st.state for tp, st in steps.items() if st.done and st.state is not None}
        written = set(self._write_decided(moving, "reassignment: leader and ISR into the new replicas"))
        finishing = [tp for tp, st in steps.items() if st.done and (st.state is None or tp in written)]
        old_ar = {tp: ctx.topics[tp[0]].assignment[tp[1]] for tp in finishing}
        try:
            for tp in finishing:
                if steps[tp].assignment is not None:
                    ctx.topics[tp[0]].assignment[tp[1]] = list(steps[tp].assignment)
            self._announce([tp for tp in finishing if tp in written])
            stops: dict[int, list[TP]] = {}
            for tp in finishing:
                for b in steps[tp].stop:
                    stops.setdefault(b, []).append(tp)
            for b, parts in stops.items():
                self._send_stop_replica(b, parts, delete=True)
                self._replicas_deleted([(tp, b) for tp in parts])
            self._write_assignments({tp: steps[tp].assignment for tp in finishing
                                     if steps[tp].assignment is not None})
        except BaseException:
            # ZooKeeper still says AR = OAR + RAR: so must the cache, or the step is never redone.
            for tp, ar in old_ar.items():
                if tp[0] in ctx.topics:
                    ctx.topics[tp[0]].assignment[tp[1]] = ar
            raise
        if finishing:
            for tp in finishing:
                ctx.reassigning.pop(tp, None)
                state_log.info("controller %d epoch %d: %s-%d reassignment to %s completed", self.broker_id,
                               ctx.epoch, tp[0], tp[1], ctx.topics[tp[0]].assignment[tp[1]])
            self.store.set_reassignment(ctx.reassigning)  # step 11: the znode goes with the last partition

    # ------------------------------------------------------------ preferred replica election
    def _on_preferred_election(self, _event=None) -> None:
        try:
            tps = self.store.get_preferred_election(watch=self._watch(V.PreferredElection()))
        except (ValueError, KeyError, TypeError) as exc:  # written by hand, not by the tool
            log.error("%s is not a valid election request, removing it: %r", Z.PREFERRED_REPLICA_ELECTION, exc)
            self.store.delete_preferred_election()
            return
        if tps is None:
            return
        moved = self._elect_preferred(tps)
        log.info("preferred replica election for %d partitions: %d moved back to their preferred replica",
                 len(tps), len(moved))
        self.store.delete_preferred_election()

    def _on_auto_rebalance(self, _event=None) -> None:
        ctx = self.ctx
        assignments = {t: m.assignment for t, m in ctx.topics.items() if t not in ctx.deleting}
        states = {tp: s for tp, (s, _v) in ctx.states.items() if tp not in ctx.reassigning}
        tps = D.imbalanced_partitions(assignments, states, self._eligible(), self.imbalance_percentage)
        if tps:
            moved = self._elect_preferred(tps)
            log.info("auto leader rebalance: %d partitions moved back to their preferred replica", len(moved))

    def _elect_preferred(self, tps) -> list[TP]:
        ctx = self.ctx
        tps = [tp for tp in tps if tp[0] not in ctx.deleting and tp not in ctx.reassigning]
        new = D.preferred_elections({t: m.assignment for t, m in ctx.topics.items()},
                                    {tp: s for tp, (s, _v) in ctx.states.items()}, tps, self._eligible(), ctx.epoch)
        done = self._write_decided(new, "preferred replica election")
        self._announce(done)
        return done

    # ------------------------------------------------------------ controlled shutdown
    def controlled_shutdown(self, broker_id: int, broker_epoch: int, timeout_s: float) -> list[TP]:
        """Called on an RPC thread; the work is an event like any other. Returns the
        partitions the broker still leads (the caller retries until there are none)."""
        if not self.active:
            raise E.NotControllerError(f"broker {self.broker_id} is not the controller")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self.enqueue(V.ControlledShutdown(broker_id=broker_id, broker_epoch=broker_epoch, reply=fut))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                return fut.result(timeout=0.2)
            except concurrent.futures.TimeoutError:
                if self.stopped.is_set() or not self.active:  # this controller is going away
                    raise E.NotControllerError(f"broker {self.broker_id} stopped being the controller") from None
        raise E.RequestTimedOutError(f"controlled shutdown of broker {broker_id}: the controller did not "
                                     f"finish in {timeout_s:.0f}s")

    def _on_controlled_shutdown(self, event: V.ControlledShutdown) -> None:
        fut = event.reply
        try:
            fut.set_result(self._controlled_shutdown(event.broker_id, event.broker_epoch))
        except BaseException as exc:
            fut.set_exception(exc)
            if isinstance(exc, Z.ControllerMovedError):
                raise

    def _controlled_shutdown(self, b: int, broker_epoch: int) -> list[TP]:
        ctx = self.ctx
        if not self.active:
            raise E.NotControllerError(f"broker {self.broker_id} is not the controller any more")
        if b not in ctx.live:
            raise E.BrokerNotAvailableError(f"broker {b} is not registered")
        if ctx.broker_epochs.get(b) != broker_epoch:  # always: -1 or any made-up epoch is refused
            raise E.StaleBrokerEpochError(f"broker {b}: epoch {broker_epoch} is not the registered "
                                          f"{ctx.broker_epochs.get(b)} (an older incarnation?)")
        if b not in ctx.shutting_down:
            log.info("controller: controlled shutdown of broker %d", b)
        ctx.shutting_down.add(b)
        assignments = {t: m.assignment for t, m in ctx.topics.items() if t not in ctx.deleting}
        states = {tp: s for tp, (s, _v) in ctx.states.items() if tp[0] in assignments}
        new, remaining = D.controlled_shutdown_moves(assignments, states, set(ctx.live), ctx.shutting_down,
                                                     ctx.epoch)
        done = self._write_decided(new, f"controlled shutdown of broker {b}")
        # The others learn their roles; the shutting broker is told to stop (not delete)
        # every replica it no longer leads, so it neither serves nor fetches them.
        self._announce(done, skip=ctx.shutting_down)
        stop = [(t, p) for t, parts in assignments.items() for p, r in parts.items()
                if b in r and len(r) > 1 and (t, p) in ctx.states and ctx.states[(t, p)][0].leader != b]
        self._send_stop_replica(b, stop, delete=False)
        # A write that lost a race with a leader's own ISR write is retried by the broker.
        return sorted(set(remaining) | (set(new) - set(done)))

    # ------------------------------------------------------------ topic deletion
    def _on_delete_topics(self, _event=None) -> None:
        pending = set(self.store.topics_pending_deletion(watch=self._watch(V.DeleteTopics())))
        for t in pending - set(self.ctx.topics):
            self.store.remove_topic(t)  # nothing to delete
        self.ctx.deleting |= pending & set(self.ctx.topics)
        self._try_delete_topics()

    def _try_delete_topics(self) -> None:
        ctx = self.ctx
        for topic in sorted(ctx.deleting):
            meta = ctx.topics.get(topic)
            if meta is None:
                ctx.deleting.discard(topic)
                self.store.remove_topic(topic)
                continue
            replicas = {b for r in meta.assignment.values() for b in r}
            if not replicas <= set(ctx.live):
                # Live replicas go now; the topic stays marked until the others return.
                log.info("deletion of %s waits for brokers %s", topic, sorted(replicas - set(ctx.live)))
                for b in replicas & set(ctx.live):
                    self._send_stop_replica(b, [(topic, p) for p, r in meta.assignment.items() if b in r],
                                            delete=True)
                continue
            acks: dict[int, bool] = {}
            done = threading.Event()
            lock = threading.Lock()

            def on_response(bid, result: M.ControllerRequestResult, _acks=acks, _done=done, _n=len(replicas)):
                with lock:
                    _acks[bid] = result.error is None
                    if len(_acks) == _n:
                        _done.set()

            for b in replicas:
                self.channels.send(b, self._stop_replica(b, [(topic, p) for p, r in meta.assignment.items() if b in r],
                                                         delete=True), on_response)
            # Waiting here is bounded and keeps deletion ordered before any re-creation.
            if not done.wait(timeout=30) or not all(acks.values()):
                log.warning("deletion of %s: not every replica confirmed yet; will retry", topic)
                continue
            self.store.remove_topic(topic)
            tps = [(topic, p) for p in meta.assignment]
            self._replicas_deleted([(tp, b) for tp in tps for b in meta.assignment[tp[1]]])
            tps = [tp for tp in tps if ctx.partition_states.state(tp) != PS.NON_EXISTENT]
            ctx.partition_states.transition(tps, PS.OFFLINE, self.recent)
            ctx.partition_states.transition(tps, PS.NON_EXISTENT, self.recent)
            self._forget_topic(topic)
            ctx.deleting.discard(topic)
            state_log.info("controller %d epoch %d: topic %s deleted", self.broker_id, ctx.epoch, topic)
            gone = M.UpdateMetadataRequest(self.broker_id, ctx.epoch, live_brokers=self._endpoints(),
                                           deleted_topics=(topic,))
            for b in ctx.live:
                self.channels.send(b, gone)

    def _forget_topic(self, topic: str) -> None:
        meta = self.ctx.topics.pop(topic, None)
        if meta:
            for p, replicas in meta.assignment.items():
                self.ctx.states.pop((topic, p), None)
                self.ctx.partition_states.forget([(topic, p)])
                self.ctx.replica_states.forget([((topic, p), b) for b in replicas])

    # ------------------------------------------------------------ state machines (bookkeeping)
    def _sync_partition_states(self, tps) -> None:
        """Partitions whose leadership was just decided or loaded: Online with a live
        leader, Offline without one."""
        ctx = self.ctx
        online, offline = [], []
        for tp in dict.fromkeys(tps):
            entry = ctx.states.get(tp)
            if entry is not None:
                (online if entry[0].leader in ctx.live else offline).append(tp)
        ctx.partition_states.transition(online, PS.ONLINE, self.recent)
        ctx.partition_states.transition(offline, PS.OFFLINE, self.recent)

    def _replicas_of_brokers_to(self, brokers, to) -> None:
        if brokers:
            ctx = self.ctx
            ctx.replica_states.transition([((t, p), b) for t, m in ctx.topics.items() for p, r in m.assignment.items()
                                           for b in r if b in brokers], to, self.recent)

    def _replicas_appear(self, replicas) -> None:
        """Replicas newly assigned (a new partition, a reassignment's new replicas): New,
        then Online on a live broker or Offline. Replicas already known keep their state."""
        ctx = self.ctx
        fresh = [r for r in dict.fromkeys(replicas) if ctx.replica_states.state(r) == RS.NON_EXISTENT]
        ctx.replica_states.transition(fresh, RS.NEW, self.recent)
        ctx.replica_states.transition([r for r in fresh if r[1] in ctx.live], RS.ONLINE, self.recent)
        ctx.replica_states.transition([r for r in fresh if r[1] not in ctx.live], RS.OFFLINE, self.recent)

    def _replicas_deleted(self, replicas) -> None:
        """Replicas told to delete themselves: Offline, deletion started and done, gone."""
        ctx = self.ctx
        known = [r for r in dict.fromkeys(replicas) if ctx.replica_states.state(r) != RS.NON_EXISTENT]
        for to in (RS.OFFLINE, RS.DELETION_STARTED, RS.DELETION_SUCCESSFUL, RS.NON_EXISTENT):
            ctx.replica_states.transition(known, to, self.recent)

    # ------------------------------------------------------------ requests to brokers
    def _endpoints(self) -> tuple[M.BrokerEndpoint, ...]:
        return tuple(M.BrokerEndpoint(b, h, p, tuple(self.ctx.endpoints.get(b, ())), self.ctx.broker_epochs.get(b, 0))
                     for b, (h, p) in sorted(self.ctx.live.items()))

    def _partition_role(self, tp: TP) -> M.PartitionRole | None:
        entry = self.ctx.states.get(tp)
        meta = self.ctx.topics.get(tp[0])
        if entry is None or meta is None:
            return None
        s, version = entry
        return M.PartitionRole(tp[0], tp[1], s.leader, s.leader_epoch, tuple(s.isr),
                               tuple(meta.assignment.get(tp[1], ())), version, s.controller_epoch)

    def _topic_infos(self, topics) -> dict[str, M.TopicInfo]:
        out = {}
        for t in sorted(topics):
            m = self.ctx.topics.get(t)
            if m is not None:
                out[t] = M.TopicInfo(m.schema, dict(m.config), m.topic_id, len(m.assignment))
        return out

    def _send_update_metadata(self, brokers, tps: list[TP], full: bool = False,
                              prebuilt: dict[TP, M.PartitionRole | None] | None = None
                              ) -> dict[TP, M.PartitionRole | None]:
        """Returns the partition states it sent, for a LeaderAndIsr that follows
        (``prebuilt``): at 50,000 partitions building them is a good part of a failover.
        ``prebuilt``: the states a LeaderAndIsr just sent (reused, and encoded once)."""
        prebuilt = prebuilt or {}
        built = {tp: prebuilt[tp] if tp in prebuilt else self._partition_role(tp) for tp in tps}
        topics = self.ctx.topics.keys() if full else {tp[0] for tp in tps}
        req = M.UpdateMetadataRequest(self.broker_id, self.ctx.epoch, tuple(s for s in built.values() if s is not None),
                                      self._endpoints(), self._topic_infos(topics), full=full)
        for b in brokers:
            self.channels.send(b, req)
        return built

    def _send_leader_and_isr(self, tps: list[TP], extra_brokers=(), skip=(),
                             prebuilt: dict[TP, M.PartitionRole | None] | None = None
                             ) -> dict[TP, M.PartitionRole | None]:
        """One LeaderAndIsr per affected live broker, carrying all its partitions.
        ``extra_brokers`` (new brokers) get every partition they host; ``skip`` get none.
        ``prebuilt``: partition states just built for the same state (by ``_send_update_metadata``).
        Returns the partition states it built, for an UpdateMetadata that follows."""
        ctx = self.ctx
        per_broker: dict[int, list[M.PartitionRole]] = {}
        built: dict[TP, M.PartitionRole | None] = {}
        wanted = dict.fromkeys(tps)   # in the order given: mostly sorted already, which sorts in one pass
        for b in extra_brokers:
            wanted.update(dict.fromkeys((t, p) for t, m in ctx.topics.items() for p, r in m.assignment.items()
                                        if b in r))
        for tp in sorted(wanted):   # a request lists its partitions in one order, run after run
            if tp[0] in ctx.deleting:
                continue
            s = built[tp] = prebuilt[tp] if prebuilt is not None and tp in prebuilt else self._partition_role(tp)
            if s is None:
                continue
            for b in s.replicas:
                if b in ctx.live and b not in skip:
                    per_broker.setdefault(b, []).append(s)
        live_leaders = self._endpoints() if per_broker else ()
        for b, states in per_broker.items():
            self.channels.send(b, M.LeaderAndIsrRequest(self.broker_id, ctx.epoch, ctx.broker_epochs.get(b, 0),
                                                        tuple(states), self._topic_infos({s.topic for s in states}),
                                                        live_leaders))
        return built


#: Each event type's handler: the whole dispatch of the event thread.
HANDLERS = {
    V.Elect: Controller._on_elect,
    V.SessionReestablished: Controller._on_session_reestablished,
    V.Shutdown: Controller._on_shutdown,
    V.BrokerChange: Controller._on_broker_change,
    V.TopicChange: Controller._on_topic_change,
    V.PartitionChange: Controller._on_partition_change,
    V.TopicConfigChange: Controller._on_topic_config_change,
    V.IsrChange: Controller._on_isr_change,
    V.LogDirFailure: Controller._on_log_dir_failure,
    V.DeleteTopics: Controller._on_delete_topics,
    V.Reassign: Controller._on_reassign,
    V.PartitionsRemove: Controller._on_partitions_remove,
    V.ReassignmentNudge: Controller._on_reassignment_nudge,
    V.PreferredElection: Controller._on_preferred_election,
    V.AutoRebalance: Controller._on_auto_rebalance,
    V.ControlledShutdown: Controller._on_controlled_shutdown,
}


def random_assignment(n_partitions: int, rf: int, brokers: list[int], first_partition: int = 0,
                      rng: random.Random | None = None) -> dict[int, list[int]]:
    rng = rng or random.Random()
    n = max(len(brokers), 1)
    return D.assign_replicas(n_partitions, rf, brokers, start_index=rng.randrange(n),
                             replica_shift=rng.randrange(n), first_partition=first_partition)
