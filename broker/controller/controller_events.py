"""The controller's events, as typed values (Kafka's ``ControllerEvent``s).

ZooKeeper watches, the session listener, timers and RPC threads only build one of
these and enqueue it; the controller's one event thread handles them in order,
each through the handler its type maps to (a table, not a name looked up).

Two properties of an event type decide how the queue treats it:

* ``coalesce``: a watch fires once and its event only says "go and look": two
  queued copies of one such event do the same work as one. The queue keeps at
  most one queued copy of each (per topic for :class:`PartitionChange`), so it
  never drops a watch's event however many fire, and stays bounded.
* ``only_active``: work only the active controller does. A controller that is
  not (or no longer) active drops these quietly; on resignation they are
  removed from the queue on purpose.

No I/O, no threads: plain frozen dataclasses.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ControllerEvent:
    coalesce = True
    only_active = True


@dataclass(frozen=True)
class Elect(ControllerEvent):
    """``/controller`` changed (or this broker starts): try to become the controller."""
    only_active = False


@dataclass(frozen=True)
class SessionReestablished(ControllerEvent):
    """A new ZooKeeper session after an expiry: resign, then run for election again."""
    only_active = False


@dataclass(frozen=True)
class Shutdown(ControllerEvent):
    only_active = False


@dataclass(frozen=True)
class BrokerChange(ControllerEvent):
    """``/brokers/ids`` children changed."""


@dataclass(frozen=True)
class TopicChange(ControllerEvent):
    """``/brokers/topics`` children changed."""


@dataclass(frozen=True)
class PartitionChange(ControllerEvent):
    """A topic's assignment znode changed (partitions added)."""
    topic: str


@dataclass(frozen=True)
class TopicConfigChange(ControllerEvent):
    """A topic's dynamic config changed (AlterConfigs, told by the broker that wrote it)."""
    topic: str


@dataclass(frozen=True)
class IsrChange(ControllerEvent):
    """A leader wrote an ISR change notification."""


@dataclass(frozen=True)
class LogDirFailure(ControllerEvent):
    """A broker wrote a ``/log_dir_event_notification`` (KIP-112): some of its replicas are offline."""


@dataclass(frozen=True)
class DeleteTopics(ControllerEvent):
    """``/admin/delete_topics`` children changed."""


@dataclass(frozen=True)
class Reassign(ControllerEvent):
    """``/admin/reassign_partitions`` was created or changed."""


@dataclass(frozen=True)
class PartitionsRemove(ControllerEvent):
    """``/admin/partitions_remove`` (or one topic's requests under it) changed."""


@dataclass(frozen=True)
class ReassignmentNudge(ControllerEvent):
    """Timer: advance reassignments whose last write lost a race."""


@dataclass(frozen=True)
class PreferredElection(ControllerEvent):
    """``/admin/preferred_replica_election`` was created."""


@dataclass(frozen=True)
class AutoRebalance(ControllerEvent):
    """Timer: the periodic leader-imbalance check."""


@dataclass(frozen=True, eq=False)
class ControlledShutdown(ControllerEvent):
    """A broker asks to hand its leaderships away before it stops (an RPC thread waits
    on ``reply``). Never coalesced: each request has its own reply."""
    coalesce = False
    broker_id: int = -1
    broker_epoch: int = -1
    reply: Any = field(default=None, compare=False)
