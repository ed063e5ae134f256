"""The controller's state machines as data: Kafka 2.8's validPreviousStates, and an
illegal move that names the key, both states and the recent events."""
from __future__ import annotations

import pytest

from replikafka import errors as E
from replikafka.broker.controller import controller_events as V
from replikafka.broker.controller.controller_states import (PARTITION_TRANSITIONS, REPLICA_TRANSITIONS,
                                                            PartitionState as P, ReplicaState as R, StateMachine)


def test_the_tables_are_kafkas():
    assert {to: sorted(s.value for s in frm) for to, frm in PARTITION_TRANSITIONS.items()} == {
        P.NEW: ["NonExistentPartition"],
        P.ONLINE: ["NewPartition", "OfflinePartition", "OnlinePartition"],
        P.OFFLINE: ["NewPartition", "OfflinePartition", "OnlinePartition"],
        P.NON_EXISTENT: ["OfflinePartition"],
    }
    assert {to: sorted(s.value for s in frm) for to, frm in REPLICA_TRANSITIONS.items()} == {
        R.NEW: ["NonExistentReplica"],
        R.ONLINE: ["NewReplica", "OfflineReplica", "OnlineReplica", "ReplicaDeletionIneligible"],
        R.OFFLINE: ["NewReplica", "OfflineReplica", "OnlineReplica", "ReplicaDeletionIneligible"],
        R.DELETION_STARTED: ["OfflineReplica"],
        R.DELETION_SUCCESSFUL: ["ReplicaDeletionStarted"],
        R.DELETION_INELIGIBLE: ["OfflineReplica", "ReplicaDeletionStarted"],
        R.NON_EXISTENT: ["ReplicaDeletionSuccessful"],
    }


def test_a_partitions_life():
    sm = StateMachine("partition", PARTITION_TRANSITIONS, P.NON_EXISTENT)
    tp = ("t", 0)
    for to in (P.NEW, P.ONLINE, P.OFFLINE, P.ONLINE, P.ONLINE, P.OFFLINE, P.NON_EXISTENT):
        sm.transition([tp], to)
        assert sm.state(tp) == to
    assert sm.states == {}


def test_an_illegal_move_raises_with_the_key_the_states_and_the_recent_events_and_moves_nothing():
    sm = StateMachine("partition", PARTITION_TRANSITIONS, P.NON_EXISTENT)
    sm.transition([("t", 0), ("t", 1)], P.NEW)
    sm.transition([("t", 0)], P.ONLINE)
    recent = [V.BrokerChange(), V.PartitionChange("t")]
    with pytest.raises(E.IllegalStateTransitionError) as err:
        sm.transition([("t", 1), ("t", 0)], P.NON_EXISTENT, recent)
    e = err.value
    assert (e.key, e.from_state, e.to_state, e.recent_events) == (("t", 1), P.NEW, P.NON_EXISTENT, tuple(recent))
    assert "NewPartition -> NonExistentPartition" in str(e) and "PartitionChange(topic='t')" in str(e)
    assert sm.states == {("t", 0): P.ONLINE, ("t", 1): P.NEW}


def test_a_replica_deleted_and_back():
    sm = StateMachine("replica", REPLICA_TRANSITIONS, R.NON_EXISTENT)
    r = (("t", 0), 3)
    for to in (R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_STARTED, R.DELETION_INELIGIBLE, R.OFFLINE,
               R.DELETION_STARTED, R.DELETION_SUCCESSFUL, R.NON_EXISTENT, R.NEW):
        sm.transition([r], to)
    assert sm.state(r) == R.NEW
    with pytest.raises(E.IllegalStateTransitionError):
        sm.transition([r], R.DELETION_STARTED)


def test_loading_and_moving_many_keys_at_once_is_as_one_at_a_time():
    """initialize_many / transition over many keys (a failover's 50,000 partitions) leave
    the same states as initialize / transition key by key, the initial state included
    (it is not stored)."""
    import random
    rng = random.Random(3)
    for _ in range(20):
        pairs = [(k, rng.choice(list(R))) for k in rng.sample(range(100), 60)]
        bulk = StateMachine("replica", REPLICA_TRANSITIONS, R.NON_EXISTENT)
        one = StateMachine("replica", REPLICA_TRANSITIONS, R.NON_EXISTENT)
        bulk.initialize_many(pairs)
        for k, s in pairs:
            one.initialize(k, s)
        assert bulk.states == one.states and R.NON_EXISTENT not in bulk.states.values()
        to = rng.choice(list(R))
        movable = [k for k, s in pairs if s in REPLICA_TRANSITIONS[to]]
        bulk.transition(movable, to)
        for k in movable:
            one.transition([k], to)
        assert bulk.states == one.states and all(bulk.state(k) is to for k in movable)
