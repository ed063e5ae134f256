"""The leader's pure HW/ISR state machine."""
from replikafka.broker.replica.partition_state import LeaderState


def leader(isr=(1, 2, 3), hw=0, leo_start=0, now=1000):
    return LeaderState(broker_id=1, leader_epoch=3, replicas=(1, 2, 3), isr=isr, zk_version=0, hw=hw,
                       epoch_start_offset=leo_start, now_ms=now)


def test_hw_is_min_leo_over_isr_and_never_moves_back():
    s = leader()
    assert not s.on_follower_fetch(2, 10, leader_leo=20, now_ms=1001)
    assert s.on_follower_fetch(3, 15, leader_leo=20, now_ms=1002)
    assert s.hw == 10
    assert s.on_follower_fetch(2, 20, leader_leo=20, now_ms=1003)
    assert s.hw == 15
    assert not s.on_follower_fetch(2, 12, leader_leo=20, now_ms=1004)  # a follower that truncated
    assert s.hw == 15


def test_only_the_leader_in_isr_commits_at_its_leo():
    s = leader(isr=(1,))
    assert s.maybe_advance_hw(42)
    assert s.hw == 42


def test_lagging_follower_is_shrunk_after_lag_time_and_caught_up_one_is_not():
    s = leader(now=0)
    s.on_follower_fetch(2, 100, leader_leo=100, now_ms=5_000)   # caught up
    s.on_follower_fetch(3, 50, leader_leo=100, now_ms=5_000)    # behind since t=0
    assert s.isr_to_shrink(now_ms=9_000, leader_leo=100, lag_time_ms_max=10_000) is None
    assert s.isr_to_shrink(now_ms=10_001, leader_leo=100, lag_time_ms_max=10_000) == (1, 2)


def test_shrink_can_advance_hw_and_follower_reenters_once_at_hw():
    s = leader(now=0)
    s.on_follower_fetch(2, 100, leader_leo=100, now_ms=1)
    s.on_follower_fetch(3, 10, leader_leo=100, now_ms=1)
    assert s.hw == 10
    new = s.isr_to_shrink(now_ms=20_000, leader_leo=100, lag_time_ms_max=10_000)
    s.pending_isr = new
    assert s.isr_to_shrink(now_ms=20_000, leader_leo=100, lag_time_ms_max=10_000) is None  # one write at a time
    assert s.on_isr_committed(new, 1, leader_leo=100)
    assert s.hw == 100
    assert s.isr_to_expand() is None
    s.on_follower_fetch(3, 99, leader_leo=120, now_ms=20_001)
    assert s.isr_to_expand() is None
    s.on_follower_fetch(3, 100, leader_leo=120, now_ms=20_002)
    assert s.isr_to_expand() == (1, 2, 3)


def test_a_follower_that_keeps_up_with_a_moving_leo_stays_in_sync():
    s = leader(now=0)
    t, leo = 0, 0
    for _ in range(100):
        t += 500
        s.on_follower_fetch(2, leo, leader_leo=leo + 10, now_ms=t)  # always one fetch behind
        s.on_follower_fetch(3, leo + 10, leader_leo=leo + 10, now_ms=t)
        leo += 10
    assert s.isr_to_shrink(now_ms=t, leader_leo=leo, lag_time_ms_max=10_000) is None


def test_a_removed_follower_needs_a_fresh_fetch_before_it_can_rejoin():
    s = leader(now=0)
    s.on_follower_fetch(2, 10, leader_leo=10, now_ms=1)
    s.on_follower_fetch(3, 10, leader_leo=10, now_ms=1)
    # The controller takes the (dead) follower 3 out; its old LEO must not bring it back.
    s.on_isr_committed((1, 2), 5, leader_leo=10)
    assert s.isr_to_expand() is None
    s.on_follower_fetch(3, 10, leader_leo=10, now_ms=2)
    assert s.isr_to_expand() == (1, 2, 3)
