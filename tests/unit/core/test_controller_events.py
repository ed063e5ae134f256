"""The controller's event plumbing, driven with no threads: typed events through a
dispatch table, watch events that coalesce instead of being dropped, a session LOST
that stops the controller at once, and a resignation that empties the queue quietly.
The real Controller and ZkStore over the simulation's in-memory ZooKeeper."""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import logging
import os
import queue
import sys
import threading
import time

import pytest
from kazoo.protocol.states import KazooState

from replikafka import errors as E
from replikafka.broker import zk_store as Z
from replikafka.broker.controller import controller as C
from replikafka.broker.controller import controller_events as V

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "sim"))
from sim_zookeeper import SimKazooClient, SimZooKeeper  # noqa: E402


class NoChannels:
    def __init__(self):
        self.sent = []

    def set_brokers(self, live):
        pass

    def send(self, broker_id, request, on_response=None):
        self.sent.append((broker_id, type(request).__name__.removesuffix("Request")))

    def held(self):
        return contextlib.nullcontext([])

    def drain(self, timeout_s):
        return True

    def close(self):
        pass


def controller(server: SimZooKeeper, broker_id: int) -> C.Controller:
    zk = SimKazooClient(server)
    store = Z.ZkStore(zk)
    store.ensure_paths()
    store.register_broker(broker_id, "h", broker_id)
    c = C.Controller(broker_id, store, clock=lambda: 0.0)
    c.channels = NoChannels()
    zk.add_listener(lambda state: state == KazooState.LOST and c.on_session_lost())
    return c


def drain(c: C.Controller) -> int:
    n = 0
    while c.do_work():
        n += 1
    return n


def queued(c: C.Controller) -> list:
    return [event for event, _queued_at in c.events.queue]


def test_every_event_type_has_a_handler_in_the_table():
    types = {cls for cls in vars(V).values()
             if isinstance(cls, type) and issubclass(cls, V.ControllerEvent) and cls is not V.ControllerEvent}
    assert set(C.HANDLERS) == types
    assert all(dataclasses.is_dataclass(t) for t in types)


def test_watch_events_coalesce_instead_of_being_dropped():
    c = controller(SimZooKeeper(), 1)
    for _ in range(1000):
        c.enqueue(V.BrokerChange())
        c.enqueue(V.PartitionChange("a"))
    c.enqueue(V.PartitionChange("b"))
    assert queued(c) == [V.BrokerChange(), V.PartitionChange("a"), V.PartitionChange("b")]
    # Once taken off the queue, the next firing queues a fresh copy (the watch is re-set by then).
    c.do_work()
    c.enqueue(V.BrokerChange())
    assert queued(c) == [V.PartitionChange("a"), V.PartitionChange("b"), V.BrokerChange()]


def test_busy_while_an_event_is_handled_and_the_broker_housekeeping_waits_for_it(monkeypatch):
    """Controller.busy says an event is being handled (bounded by the age asked for); the
    broker's loops that scan every partition skip their turns meanwhile (they share the
    GIL with the event thread), the others do not, and none waits for an event past the bound."""
    from replikafka.broker.server import BrokerServer

    c = controller(SimZooKeeper(), 1)
    seen = []
    monkeypatch.setitem(C.HANDLERS, V.Elect, lambda self, _e: seen.append((self.busy(10.0), self.busy(0.0))))
    assert not c.busy(10.0)
    c.enqueue(V.Elect())
    c.do_work()
    assert seen == [(True, False)] and not c.busy(10.0)

    server = object.__new__(BrokerServer)       # only what _loop uses: stop flag, threads, controller
    server.stopped, server.threads, server.controller = threading.Event(), [], c
    turns = {"scan": 0, "other": 0}
    c.event_started = time.monotonic()           # an event being handled, as do_work marks it
    server._loop("scan", lambda: turns.__setitem__("scan", turns["scan"] + 1), 5, yields_to_controller=True)
    server._loop("other", lambda: turns.__setitem__("other", turns["other"] + 1), 5)
    time.sleep(0.3)
    assert turns["scan"] == 0 and turns["other"] > 0
    c.event_started = time.monotonic() - 11.0    # stuck past HOUSEKEEPING_DEFER_MAX_S: no longer waited for
    time.sleep(0.3)
    assert turns["scan"] > 0
    server.stopped.set()
    for t in server.threads:
        t.join(5)


def test_a_new_controller_loads_with_the_short_gil_switch_interval_and_gives_the_old_one_back(monkeypatch):
    """While a new controller reads its context the GIL changes hands every
    LOAD_SWITCH_INTERVAL_S (the event thread and kazoo's wait less for the broker's threads
    at each of a hundred hand-overs); what it does after, and the process after it, even
    after a load that failed, have the interval that was."""
    server = SimZooKeeper()
    c = controller(server, 1)
    Z.ZkStore(c.zk).create_topic("t", {0: [1]}, b"", {"topic.id": "x"})
    seen, failing = [], []
    read_states = c.store.get_partition_states

    def recording(*args, **kw):
        seen.append(("load", sys.getswitchinterval()))
        if failing:
            raise RuntimeError("a load that fails half way")
        return read_states(*args, **kw)
    monkeypatch.setattr(c.store, "get_partition_states", recording)
    write = C.Controller._write_states
    monkeypatch.setattr(C.Controller, "_write_states",
                        lambda self, *a, **kw: seen.append(("write", sys.getswitchinterval())) or write(self, *a, **kw))
    before = sys.getswitchinterval()
    assert before != C.LOAD_SWITCH_INTERVAL_S
    c.enqueue(V.Elect())
    drain(c)
    assert c.active and sys.getswitchinterval() == before
    assert {v for what, v in seen if what == "load"} == {C.LOAD_SWITCH_INTERVAL_S}
    assert {v for what, v in seen if what == "write"} == {before}
    c._resign(delete_znode=True)
    seen.clear()
    failing.append(True)
    c.enqueue(V.Elect())
    drain(c)
    assert seen == [("load", C.LOAD_SWITCH_INTERVAL_S)] and sys.getswitchinterval() == before


def test_a_stream_of_controller_events_holds_the_housekeeping_off_no_longer_than_the_bound(monkeypatch):
    """One event after another, each fresh (busy every time a loop looks): a scanning loop
    still runs once it has not run for HOUSEKEEPING_DEFER_MAX_S."""
    from replikafka.broker import server as server_module
    from replikafka.broker.server import BrokerServer
    monkeypatch.setattr(server_module, "HOUSEKEEPING_DEFER_MAX_S", 0.3)

    class AlwaysBusy:
        def busy(self, longest_s):
            return True

    server = object.__new__(BrokerServer)
    server.stopped, server.threads, server.controller = threading.Event(), [], AlwaysBusy()
    turns = []
    server._loop("scan", lambda: turns.append(time.monotonic()), 5, yields_to_controller=True)
    time.sleep(1.2)
    server.stopped.set()
    for t in server.threads:
        t.join(5)
    assert 2 <= len(turns) <= 5, turns


def test_log_maintenance_and_checkpoints_wait_for_role_changes_within_the_bound(monkeypatch):
    """A loop that yields to role changes skips its turns while the replica manager says
    roles are being taken up (the ISR checks do not ask), and still runs once it has not
    run for HOUSEKEEPING_DEFER_MAX_S."""
    from replikafka.broker import server as server_module
    from replikafka.broker.server import BrokerServer
    monkeypatch.setattr(server_module, "HOUSEKEEPING_DEFER_MAX_S", 0.5)

    class Idle:
        def busy(self, longest_s):
            return False

    class Roles:
        recent = True
        asked = []

        def role_changes_recent(self, within_s):
            self.asked.append(within_s)
            return self.recent

    server = object.__new__(BrokerServer)
    server.stopped, server.threads, server.controller = threading.Event(), [], Idle()
    server.replica_manager = roles = Roles()
    turns = {"scan": [], "isr": []}
    server._loop("scan", lambda: turns["scan"].append(time.monotonic()), 5, yields_to_controller=True,
                 yields_to_role_changes=True)
    server._loop("isr", lambda: turns["isr"].append(time.monotonic()), 5, yields_to_controller=True)
    time.sleep(0.3)
    assert turns["scan"] == [] and turns["isr"]
    assert set(roles.asked) == {server_module.ROLE_CHANGE_SETTLE_S}
    time.sleep(0.5)                 # past the bound: one turn, then it waits again
    assert 1 <= len(turns["scan"]) <= 2
    roles.recent = False
    time.sleep(0.2)
    assert len(turns["scan"]) > 5
    server.stopped.set()
    for t in server.threads:
        t.join(5)


def test_a_full_queue_blocks_a_watch_event_until_there_is_room():
    c = controller(SimZooKeeper(), 1)
    c.events = queue.Queue(maxsize=2)
    c.enqueue(V.BrokerChange())
    c.enqueue(V.TopicChange())
    t = threading.Thread(target=c.enqueue, args=(V.IsrChange(),))
    t.start()
    t.join(0.2)
    assert t.is_alive()             # waiting for room, not dropped
    c.do_work()
    t.join(5)
    assert not t.is_alive() and queued(c) == [V.TopicChange(), V.IsrChange()]


def test_session_lost_stops_the_controller_at_once_and_quietly(caplog):
    server = SimZooKeeper()
    c1, c2 = controller(server, 1), controller(server, 2)
    c1.enqueue(V.Elect())
    c2.enqueue(V.Elect())
    drain(c1), drain(c2)
    assert (c1.active, c2.active) == (True, False)
    for t in range(50):
        c1.enqueue(V.PartitionChange(f"t{t}"))
    reply = concurrent.futures.Future()
    c1.enqueue(V.ControlledShutdown(broker_id=2, broker_epoch=-1, reply=reply))
    caplog.set_level(logging.INFO, logger="replikafka.controller")
    server.expire(c1.store.zk.session_id)
    assert not c1.active and queued(c1) == []
    with pytest.raises(E.NotControllerError):
        reply.result(0)
    # Events that arrive while the session is lost are dropped, not handled: no ZooKeeper call fails.
    c1.enqueue(V.BrokerChange())
    c1.enqueue(V.Elect())
    assert drain(c1) == 2 and not c1.active
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    # The other broker's watch on /controller fired: it takes over.
    drain(c2)
    assert c2.active and c2.ctx.epoch == 2
    # A new session: the old controller runs for election again and loses to broker 2.
    c1.store.zk.reconnect()
    c1.enqueue(V.SessionReestablished())
    drain(c1)
    assert not c1.active and not c1.session_lost


def test_a_lost_connection_mid_event_takes_the_role_back_once_connected(caplog):
    """A 10,000-request wire fuzz once starved a controller's ZooKeeper heartbeats: an
    event failed with ConnectionLoss and the controller stopped acting, yet its session,
    and so its /controller znode, lived on. No broker could be elected and the cluster
    had no controller for minutes. Once connected it must take the role back."""
    server = SimZooKeeper()
    c1, c2 = controller(server, 1), controller(server, 2)
    c1.enqueue(V.Elect())
    drain(c1)
    c2.enqueue(V.Elect())
    drain(c2)
    assert (c1.active, c2.active, c1.ctx.epoch) == (True, False, 1)
    caplog.set_level(logging.INFO, logger="replikafka.controller")
    c1.store.zk.disconnect()
    c1.enqueue(V.BrokerChange())
    drain(c1)
    assert not c1.active
    c1.schedule_timed_events()                  # still disconnected: no election yet
    assert queued(c1) == []
    c1.store.zk.reconnect_same_session()
    c1.schedule_timed_events()
    assert queued(c1) == [V.Elect()]
    drain(c1)
    assert c1.active and c1.ctx.epoch == 2 and c1.store.get_controller_id() == 1
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    c1.schedule_timed_events()
    assert queued(c1) == []                     # once only
    drain(c2)
    assert not c2.active


def test_a_node_left_by_an_earlier_session_is_not_taken_over():
    server = SimZooKeeper()
    old = controller(server, 1)
    old.enqueue(V.Elect())
    drain(old)
    assert old.active
    new = C.Controller(1, Z.ZkStore(SimKazooClient(server)), clock=lambda: 0.0)   # restarted: a new session
    new.channels = NoChannels()
    new.enqueue(V.Elect())
    drain(new)
    assert not new.active                       # waits for the old session's node to go
    server.expire(old.store.zk.session_id)
    drain(new)                                  # the watch on /controller fired
    assert new.active and new.ctx.epoch == 2


def test_resignation_drops_the_queued_work_quietly(caplog):
    server = SimZooKeeper()
    c1, c2 = controller(server, 1), controller(server, 2)
    c1.enqueue(V.Elect())
    drain(c1)
    assert c1.active
    caplog.set_level(logging.INFO, logger="replikafka.controller")
    # Another controller took over behind its back (its znode and epoch moved): the
    # watch's Elect is queued ahead of 51 events of the active controller's work.
    c1.store.zk.delete(Z.CONTROLLER)
    c2.store.try_elect_controller(2)
    c2.store.increment_controller_epoch()
    for t in range(50):
        c1.enqueue(V.PartitionChange(f"t{t}"))
    c1.enqueue(V.BrokerChange())
    assert queued(c1)[0] == V.Elect()
    drain(c1)
    assert not c1.active and queued(c1) == []
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert any("dropped 51 queued controller events" in r.getMessage() for r in caplog.records)


def test_failover_and_a_broker_failure_move_the_state_machines():
    from replikafka import records as R
    from replikafka.broker.controller.controller_states import PartitionState as PS, ReplicaState as RS

    server = SimZooKeeper()
    c1 = controller(server, 1)
    others = {b: SimKazooClient(server) for b in (2, 3)}
    for b, zk in others.items():
        Z.ZkStore(zk).register_broker(b, "h", b)
    c1.store.create_topic("t", {0: [3, 1, 2], 1: [1, 2, 3]}, R.schema_to_bytes(R.stored_schema(R.KAFKA_SCHEMA)),
                          {"topic.id": "x"})
    c1.enqueue(V.Elect())
    drain(c1)
    ctx = c1.ctx
    assert ctx.partition_states.states == {("t", 0): PS.ONLINE, ("t", 1): PS.ONLINE}
    assert set(ctx.replica_states.states.values()) == {RS.ONLINE} and len(ctx.replica_states.states) == 6
    assert {tp: s.leader for tp, (s, _v) in ctx.states.items()} == {("t", 0): 3, ("t", 1): 1}
    c1.channels.sent.clear()
    server.expire(others[3].session_id)          # broker 3 dies
    drain(c1)
    assert ctx.replica_states.states == {(("t", 0), 3): RS.OFFLINE, (("t", 1), 3): RS.OFFLINE,
                                         (("t", 0), 1): RS.ONLINE, (("t", 1), 1): RS.ONLINE,
                                         (("t", 0), 2): RS.ONLINE, (("t", 1), 2): RS.ONLINE}
    assert ctx.partition_states.states == {("t", 0): PS.ONLINE, ("t", 1): PS.ONLINE}
    assert {tp: (s.leader, s.leader_epoch, s.isr) for tp, (s, _v) in ctx.states.items()} == {
        ("t", 0): (1, 1, (1, 2)), ("t", 1): (1, 0, (1, 2))}
    # the new leader of t-0 first, then t-1's smaller ISR: two of each to each survivor
    assert sorted(c1.channels.sent) == [(b, kind) for b in (1, 2) for kind in ("LeaderAndIsr", "UpdateMetadata")
                                        for _ in range(2)]
    assert [type(e).__name__ for e in c1.recent][-1] == "BrokerChange"
