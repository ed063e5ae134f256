"""Pure decision of where a new follower truncates its log (KIP-101, KIP-279).

The follower asks the leader ``OffsetsForLeaderEpoch(e)`` for its own latest
epoch ``e``. The leader answers the largest epoch ``e' <= e`` it has and where
that epoch ends on the leader. If ``e' < e`` the follower may have epochs the
leader never had: it looks up its own largest epoch ``<= e'`` and, if that is a
different epoch, asks again about it (the walk-back of KIP-279). Otherwise it
truncates to the smaller of the two end offsets. Not using the HW here is what
keeps committed data (KIP-101).
"""
from __future__ import annotations

from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True)
class Truncate:
    offset: int


@dataclass(frozen=True)
class AskAgain:
    epoch: int


def truncation_decision(leader_epoch: int, leader_end_offset: int,
                        follower_end_offset_for, follower_leo: int, follower_hw: int):
    """``follower_end_offset_for(epoch) -> (largest own epoch <= epoch, its end offset)``
    (``(-1, -1)`` when none). Returns :class:`Truncate` or :class:`AskAgain`."""
    if leader_end_offset == UNDEFINED_OFFSET:
        # The leader knows nothing about our epochs (an old log): fall back to the HW.
        return Truncate(min(follower_hw, follower_leo))
    if leader_epoch == UNDEFINED_EPOCH:
        return Truncate(min(leader_end_offset, follower_leo))
    own_epoch, own_end = follower_end_offset_for(leader_epoch)
    if own_epoch == UNDEFINED_EPOCH:
        # None of our epochs is <= the leader's: keep at most what the leader has.
        return Truncate(min(leader_end_offset, follower_leo))
    if own_epoch != leader_epoch:
        return AskAgain(own_epoch)
    return Truncate(min(leader_end_offset, own_end, follower_leo))
