"""The controller: one event thread, fed by a bounded queue.

Every broker runs one of these; the one that wins the ephemeral ``/controller``
znode is active. ZooKeeper watches and session listeners only enqueue events;
``do_work()`` takes one event and handles it completely (read ZooKeeper, call
the pure decisions in ``controller_decisions.py``, write the results with
guarded ``multi``s, send LeaderAndIsr / UpdateMetadata / StopReplica).
"""
from __future__ import annotations

import logging
import queue
import random
import threading
import time
from dataclasses import dataclass, field

from replikafka.broker import zk_store as Z
from replikafka.broker.controller import controller_decisions as D
from replikafka.broker.controller.broker_channels import ControllerChannelManager
from replikafka.broker.zk_store import LeaderAndIsr, ZkStore
from replikafka.protocol import replikafka_pb2 as pb

log = logging.getLogger("replikafka.controller")
state_log = logging.getLogger("replikafka.state.change")
EVENT_QUEUE_MAX = 100_000
TP = tuple[str, int]


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
    topics: dict[str, TopicMeta] = field(default_factory=dict)
    states: dict[TP, tuple[LeaderAndIsr, int]] = field(default_factory=dict)
    deleting: set[str] = field(default_factory=set)


class Controller:
    def __init__(self, broker_id: int, store: ZkStore, *, unclean_default: bool = False,
                 request_timeout_s: float = 30.0, on_became_controller=None):
        self.broker_id = broker_id
        self.store = store
        self.zk = store.zk
        self.unclean_default = unclean_default
        self.events: queue.Queue = queue.Queue(maxsize=EVENT_QUEUE_MAX)
        self.channels = ControllerChannelManager(request_timeout_s)
        self.ctx = ControllerContext()
        self.active = False
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.on_became_controller = on_became_controller

    # ------------------------------------------------------------ plumbing
    def enqueue(self, name: str, *args) -> None:
        try:
            self.events.put_nowait((name, args))
        except queue.Full:  # bounded: a flood of watches collapses into a full reload
            log.error("controller event queue full; dropping %s", name)

    def _watch(self, name: str):
        return lambda _event: self.enqueue(name)

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="controller-event-thread", daemon=True)
        self.thread.start()
        self.enqueue("elect")

    def stop(self) -> None:
        self.stopped.set()
        self.enqueue("shutdown")
        if self.thread is not None:
            self.thread.join(timeout=10)
        self._resign(delete_znode=True)
        self.channels.close()

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.do_work(timeout_s=0.5)

    def do_work(self, timeout_s: float = 0.0) -> bool:
        """Handle one event. Returns False when the queue was empty."""
        try:
            name, args = self.events.get(timeout=timeout_s) if timeout_s else self.events.get_nowait()
        except queue.Empty:
            return False
        try:
            getattr(self, f"_on_{name}")(*args)
        except Z.ControllerMovedError:
            log.warning("broker %d: lost the controller role during %s", self.broker_id, name)
            self._resign(delete_znode=False)
        except Exception:
            if not self.stopped.is_set():
                log.exception("controller event %s failed", name)
        return True

    # ------------------------------------------------------------ election (seed 002)
    def _on_elect(self) -> None:
        current = self.store.get_controller_id(watch=self._watch("elect"))
        if current == self.broker_id and self.active:
            return
        if current != -1:
            if self.active:
                self._resign(delete_znode=False)
            return
        if not self.store.try_elect_controller(self.broker_id):
            self.store.get_controller_id(watch=self._watch("elect"))
            return
        self.store.get_controller_id(watch=self._watch("elect"))
        epoch, version = self.store.increment_controller_epoch()
        self.ctx = ControllerContext(epoch=epoch, epoch_zk_version=version)
        self.active = True
        log.info("broker %d is the controller, epoch %d", self.broker_id, epoch)
        self._failover()
        if self.on_became_controller:
            self.on_became_controller(epoch)

    def _on_session_reestablished(self) -> None:
        self._resign(delete_znode=False)
        self._on_elect()

    def _on_shutdown(self) -> None:
        self.stopped.set()

    def _resign(self, delete_znode: bool) -> None:
        was = self.active
        self.active = False
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
        self.store.ensure_paths()
        ctx.live = self.store.live_brokers(watch=self._watch("broker_change"), epochs=ctx.broker_epochs)
        self.channels.set_brokers(ctx.live)
        for t in self.store.list_topics(watch=self._watch("topic_change")):
            self._load_topic(t)
        tps = [(t, p) for t, m in ctx.topics.items() for p in m.assignment]
        ctx.states = self.store.get_partition_states(tps)
        missing = [tp for tp in tps if tp not in ctx.states]
        if missing:
            self._create_states(missing)
        ctx.deleting = set(self.store.topics_pending_deletion(watch=self._watch("delete_topics")))
        self.store.take_isr_change_notifications(watch=self._watch("isr_change"))
        self._elect_offline()
        # Full state to every live broker: metadata first, then roles.
        for bid in ctx.live:
            self._send_update_metadata([bid], list(ctx.states), full=True)
        self._send_leader_and_isr(list(ctx.states))
        log.info("controller failover: loaded %d topics, %d partitions and sent the full state to %d brokers "
                 "in %.3fs", len(ctx.topics), len(ctx.states), len(ctx.live), time.monotonic() - started)
        self._try_delete_topics()

    def _load_topic(self, topic: str) -> TopicMeta | None:
        assignment = self.store.get_assignment(topic, watch=self._watch_partitions(topic))
        cfg = self.store.get_topic_config(topic)
        if assignment is None or cfg is None:
            return None
        meta = TopicMeta(assignment, cfg[1], cfg[0])
        self.ctx.topics[topic] = meta
        return meta

    def _watch_partitions(self, topic: str):
        return lambda _event: self.enqueue("partition_change", topic)

    # ------------------------------------------------------------ events
    def _on_broker_change(self) -> None:
        if not self.active:
            return
        ctx = self.ctx
        epochs: dict[int, int] = {}
        live = self.store.live_brokers(watch=self._watch("broker_change"), epochs=epochs)
        old = set(ctx.live)
        # Restarted between two looks (its old session expired and it re-registered):
        # it lost its in-memory state, so it is new to us.
        bounced = {b for b in set(live) & old if epochs.get(b) != ctx.broker_epochs.get(b)}
        ctx.live, ctx.broker_epochs = live, epochs
        self.channels.set_brokers(live)
        new, dead = (set(live) - old) | bounced, old - set(live)
        started = time.monotonic()
        if dead:
            log.info("controller: brokers %s failed", sorted(dead))
        if new:
            log.info("controller: brokers %s started", sorted(new))
        # A bounced broker lost its in-memory state (its HW, its role): like Kafka
        # with broker epochs, it is handled as failed and then as started, so the
        # partitions it led get a new leader and epoch rather than a leader that
        # forgot its HW.
        changed = self._elect_offline(exclude=bounced) if bounced else []
        changed += [tp for tp in self._elect_offline() if tp not in changed]
        # New brokers learn everything; everyone learns the changed partitions.
        for bid in new:
            self._send_update_metadata([bid], list(ctx.states), full=True)
        if changed:
            self._send_update_metadata([b for b in live if b not in new], changed)
        self._send_leader_and_isr(changed, extra_brokers=new)
        if changed:
            log.info("controller: %d partition states written and sent in %.3fs", len(changed),
                     time.monotonic() - started)
        if new and ctx.deleting:
            self._try_delete_topics()

    def _elect_offline(self, exclude=frozenset()) -> list[TP]:
        """Elect leaders for partitions without a live leader, take dead followers out of ISRs.
        Brokers in ``exclude`` count as dead for this pass."""
        ctx = self.ctx
        current = {tp: s for tp, (s, _v) in ctx.states.items() if tp[0] not in ctx.deleting}
        assignments = {t: m.assignment for t, m in ctx.topics.items() if t not in ctx.deleting}
        decisions = D.on_brokers_changed(assignments, current, set(ctx.live) - set(exclude), ctx.epoch,
                                         self._unclean_for)
        for tp, e in decisions.items():
            if e.unclean:
                log.error("UNCLEAN leader election for %s-%d: broker %d was not in the ISR %s; "
                          "records acknowledged but not on it are LOST",
                          tp[0], tp[1], e.state.leader, list(current[tp].isr))
        return self._write_states({tp: e.state for tp, e in decisions.items()})

    def _unclean_for(self, topic: str) -> bool:
        v = self.ctx.topics[topic].config.get("unclean.leader.election.enable")
        return self.unclean_default if v is None else v.lower() == "true"

    def _write_states(self, new: dict[TP, LeaderAndIsr], rounds: int = 5) -> list[TP]:
        """Guarded, batched writes; re-read and re-decide partitions whose znode moved."""
        ctx = self.ctx
        done: list[TP] = []
        for _ in range(rounds):
            if not new:
                break
            updates = {tp: (s, ctx.states[tp][1]) for tp, s in new.items()}
            ok, failed = Z.guarded_state_writes(self.zk, ctx.epoch_zk_version, updates)
            for tp, version in ok.items():
                ctx.states[tp] = (new[tp], version)
                state_log.info("controller %d epoch %d: %s-%d -> %s", self.broker_id, ctx.epoch, tp[0], tp[1], new[tp])
                done.append(tp)
            if not failed:
                break
            # A leader changed its ISR meanwhile: re-read and decide again.
            fresh = self.store.get_partition_states(failed)
            ctx.states.update(fresh)
            cur = {tp: fresh[tp][0] for tp in failed if tp in fresh}
            decisions = D.on_brokers_changed({t: {p: ctx.topics[t].assignment[p] for (tt, p) in cur if tt == t}
                                              for t in {tp[0] for tp in cur}},
                                             cur, set(ctx.live), ctx.epoch, self._unclean_for)
            new = {tp: e.state for tp, e in decisions.items()}
        return done

    def _on_topic_change(self) -> None:
        if not self.active:
            return
        ctx = self.ctx
        topics = set(self.store.list_topics(watch=self._watch("topic_change")))
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
            self._send_update_metadata(list(ctx.live), new_tps)
            self._send_leader_and_isr(new_tps)

    def _on_partition_change(self, topic: str) -> None:
        if not self.active or topic not in self.ctx.topics:
            return
        meta = self.ctx.topics[topic]
        assignment = self.store.get_assignment(topic, watch=self._watch_partitions(topic))
        if assignment is None:
            return
        new_tps = [(topic, p) for p in assignment if p not in meta.assignment]
        meta.assignment = assignment
        if new_tps:
            self._create_states(new_tps)
            self._send_update_metadata(list(self.ctx.live), new_tps)
            self._send_leader_and_isr(new_tps)

    def _create_states(self, tps: list[TP]) -> None:
        ctx = self.ctx
        live = set(ctx.live)
        new = {tp: D.initial_leader_and_isr(ctx.topics[tp[0]].assignment[tp[1]], live, ctx.epoch) for tp in tps}
        self.store.create_partition_states(new)
        # Re-read: a partition created by an earlier controller keeps its state.
        ctx.states.update(self.store.get_partition_states(tps))
        for tp in tps:
            state_log.info("controller %d epoch %d: %s-%d NewPartition -> %s", self.broker_id, ctx.epoch,
                           tp[0], tp[1], ctx.states.get(tp, (None,))[0])

    def _on_isr_change(self) -> None:
        if not self.active:
            return
        tps = self.store.take_isr_change_notifications(watch=self._watch("isr_change"))
        tps = [tp for tp in tps if tp[0] in self.ctx.topics]
        if not tps:
            return
        self.ctx.states.update(self.store.get_partition_states(tps))
        self._send_update_metadata(list(self.ctx.live), tps)

    # ------------------------------------------------------------ topic deletion
    def _on_delete_topics(self) -> None:
        if not self.active:
            return
        pending = set(self.store.topics_pending_deletion(watch=self._watch("delete_topics")))
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
                log.info("deletion of %s waits for brokers %s", topic, sorted(replicas - set(ctx.live)))
                continue
            acks: dict[int, bool] = {}
            done = threading.Event()
            lock = threading.Lock()

            def on_response(bid, resp, _acks=acks, _done=done, _n=len(replicas)):
                with lock:
                    _acks[bid] = not resp.error.code
                    if len(_acks) == _n:
                        _done.set()

            for b in replicas:
                parts = [pb.TopicPartitionRef(topic=topic, partition=p) for p, r in meta.assignment.items() if b in r]
                self.channels.send(b, "StopReplica", pb.StopReplicaRequest(
                    controller_id=self.broker_id, controller_epoch=ctx.epoch, delete_partitions=True,
                    partitions=parts), on_response)
            # Waiting here is bounded and keeps deletion ordered before any re-creation.
            if not done.wait(timeout=30) or not all(acks.values()):
                log.warning("deletion of %s: not every replica confirmed yet; will retry", topic)
                continue
            self.store.remove_topic(topic)
            self._forget_topic(topic)
            ctx.deleting.discard(topic)
            state_log.info("controller %d epoch %d: topic %s deleted", self.broker_id, ctx.epoch, topic)
            for b in ctx.live:
                self.channels.send(b, "UpdateMetadata", pb.UpdateMetadataRequest(
                    controller_id=self.broker_id, controller_epoch=ctx.epoch, deleted_topics=[topic],
                    live_brokers=self._endpoints()))

    def _forget_topic(self, topic: str) -> None:
        meta = self.ctx.topics.pop(topic, None)
        if meta:
            for p in meta.assignment:
                self.ctx.states.pop((topic, p), None)

    # ------------------------------------------------------------ requests to brokers
    def _endpoints(self) -> list[pb.BrokerEndpoint]:
        return [pb.BrokerEndpoint(id=b, host=h, port=p) for b, (h, p) in sorted(self.ctx.live.items())]

    def _partition_state_pb(self, tp: TP) -> pb.PartitionState | None:
        entry = self.ctx.states.get(tp)
        meta = self.ctx.topics.get(tp[0])
        if entry is None or meta is None:
            return None
        s, version = entry
        return pb.PartitionState(topic=tp[0], partition=tp[1], controller_epoch=s.controller_epoch,
                                 leader=s.leader, leader_epoch=s.leader_epoch, isr=list(s.isr),
                                 zk_version=version, replicas=meta.assignment.get(tp[1], []))

    def _topic_infos(self, topics) -> list[pb.TopicInfo]:
        out = []
        for t in sorted(topics):
            m = self.ctx.topics.get(t)
            if m is not None:
                out.append(pb.TopicInfo(name=t, schema=m.schema, config=m.config,
                                        partition_count=len(m.assignment), topic_id=m.topic_id))
        return out

    def _send_update_metadata(self, brokers, tps: list[TP], full: bool = False) -> None:
        states = [s for s in (self._partition_state_pb(tp) for tp in tps) if s is not None]
        topics = self.ctx.topics.keys() if full else {tp[0] for tp in tps}
        req = pb.UpdateMetadataRequest(controller_id=self.broker_id, controller_epoch=self.ctx.epoch,
                                       partitions=states, live_brokers=self._endpoints(),
                                       topics=self._topic_infos(topics), full=full)
        for b in brokers:
            self.channels.send(b, "UpdateMetadata", req)

    def _send_leader_and_isr(self, tps: list[TP], extra_brokers=()) -> None:
        """One LeaderAndIsr per affected live broker, carrying all its partitions.
        ``extra_brokers`` (new brokers) get every partition they host."""
        ctx = self.ctx
        per_broker: dict[int, list[pb.PartitionState]] = {}
        wanted = set(tps)
        for b in extra_brokers:
            wanted |= {(t, p) for t, m in ctx.topics.items() for p, r in m.assignment.items() if b in r}
        for tp in wanted:
            if tp[0] in ctx.deleting:
                continue
            s = self._partition_state_pb(tp)
            if s is None:
                continue
            for b in s.replicas:
                if b in ctx.live:
                    per_broker.setdefault(b, []).append(s)
        for b, states in per_broker.items():
            req = pb.LeaderAndIsrRequest(controller_id=self.broker_id, controller_epoch=ctx.epoch,
                                         partitions=states, live_leaders=self._endpoints(),
                                         topics=self._topic_infos({s.topic for s in states}))
            self.channels.send(b, "LeaderAndIsr", req)


def random_assignment(n_partitions: int, rf: int, brokers: list[int], first_partition: int = 0,
                      rng: random.Random | None = None) -> dict[int, list[int]]:
    rng = rng or random.Random()
    n = max(len(brokers), 1)
    return D.assign_replicas(n_partitions, rf, brokers, start_index=rng.randrange(n),
                             replica_shift=rng.randrange(n), first_partition=first_partition)
