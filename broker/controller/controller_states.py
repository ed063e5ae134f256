"""The controller's partition and replica state machines, as data (Kafka 2.8's
``PartitionStateMachine`` / ``ReplicaStateMachine``, their ``validPreviousStates``).

A table maps each target state to the states it may be entered from; a
:class:`StateMachine` holds the current state of each key (a partition, or a
(partition, broker) replica) and moves keys only along the table. An illegal move
raises :class:`replikafka.errors.IllegalStateTransitionError` naming the key, both
states and the controller's recent events: a bug in the controller's bookkeeping
shows up where it happens, not as a wrong election later.

No I/O, no threads (the controller's event thread owns its machines).
"""
from __future__ import annotations

from enum import Enum
from typing import Hashable, Iterable

from replikafka import errors as E


class PartitionState(Enum):
    NON_EXISTENT = "NonExistentPartition"
    NEW = "NewPartition"
    ONLINE = "OnlinePartition"
    OFFLINE = "OfflinePartition"


class ReplicaState(Enum):
    NON_EXISTENT = "NonExistentReplica"
    NEW = "NewReplica"
    ONLINE = "OnlineReplica"
    OFFLINE = "OfflineReplica"
    DELETION_STARTED = "ReplicaDeletionStarted"
    DELETION_SUCCESSFUL = "ReplicaDeletionSuccessful"
    DELETION_INELIGIBLE = "ReplicaDeletionIneligible"


P, R = PartitionState, ReplicaState

#: target state -> the states it may be entered from (Kafka 2.8 PartitionState.validPreviousStates)
PARTITION_TRANSITIONS: dict[PartitionState, frozenset] = {
    P.NEW: frozenset({P.NON_EXISTENT}),
    P.ONLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.OFFLINE: frozenset({P.NEW, P.ONLINE, P.OFFLINE}),
    P.NON_EXISTENT: frozenset({P.OFFLINE}),
}

#: target state -> the states it may be entered from (Kafka 2.8 ReplicaState.validPreviousStates)
REPLICA_TRANSITIONS: dict[ReplicaState, frozenset] = {
    R.NEW: frozenset({R.NON_EXISTENT}),
    R.ONLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.OFFLINE: frozenset({R.NEW, R.ONLINE, R.OFFLINE, R.DELETION_INELIGIBLE}),
    R.DELETION_STARTED: frozenset({R.OFFLINE}),
    R.DELETION_SUCCESSFUL: frozenset({R.DELETION_STARTED}),
    R.DELETION_INELIGIBLE: frozenset({R.OFFLINE, R.DELETION_STARTED}),
    R.NON_EXISTENT: frozenset({R.DELETION_SUCCESSFUL}),
}


class StateMachine:
    """Current state per key, moved only along ``transitions``; absent keys are in
    ``initial`` (NonExistent)."""

    def __init__(self, name: str, transitions: dict, initial):
        self.name = name
        self.transitions = transitions
        self.initial = initial
        self.states: dict[Hashable, Enum] = {}

    def state(self, key) -> Enum:
        return self.states.get(key, self.initial)

    def initialize(self, key, state) -> None:
        """Set a key's state as loaded (a new controller's failover), without a transition."""
        self.initialize_many(((key, state),))

    def initialize_many(self, keys_states: Iterable) -> None:
        """``initialize`` each (key, state): a failover loads 50,000 partitions' states
        and 150,000 replicas'."""
        initial, states = self.initial, self.states
        for key, state in keys_states:
            if state is initial:
                states.pop(key, None)
            else:
                states[key] = state

    def transition(self, keys: Iterable, to, recent_events=()) -> None:
        """Move every key to ``to``; the first illegal move raises (and moves nothing).
        The checks compare members by identity (a tuple, not the frozenset: hashing an
        Enum member is a Python call, and a failover moves 50,000 keys at once)."""
        keys = list(keys)
        allowed = tuple(self.transitions[to])
        get, initial = self.states.get, self.initial
        for key in keys:
            now = get(key, initial)
            if now not in allowed:
                raise E.IllegalStateTransitionError(
                    f"{self.name} {key}: illegal transition {now.value} -> {to.value} (allowed from "
                    f"{sorted(s.value for s in allowed)}); recent controller events: "
                    f"{[type(e).__name__ if not hasattr(e, '__dataclass_fields__') else repr(e) for e in recent_events]}",
                    key=key, from_state=now, to_state=to, recent_events=tuple(recent_events))
        if to is initial:
            for key in keys:
                self.states.pop(key, None)
        else:
            self.states.update(dict.fromkeys(keys, to))

    def forget(self, keys: Iterable) -> None:
        for key in keys:
            self.states.pop(key, None)
