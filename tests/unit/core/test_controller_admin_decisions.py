"""Pure decisions behind the admin operations: reassignment steps, preferred
election, the auto-rebalance check and controlled shutdown."""
from replikafka.broker.controller import controller_decisions as D
from replikafka.broker.zk_store import LeaderAndIsr as L


# ---------------------------------------------------------------- reassignment (seed 003's table)
def test_reassignment_walks_the_seed_table():
    live = {1, 2, 3, 4, 5, 6}
    s0 = L(1, 5, (1, 2, 3), 7)
    step = D.reassignment_step([1, 2, 3], [4, 5, 6], s0, live, 8)
    # step 2: AR = OAR + RAR, same leader and ISR, epoch + 1
    assert step == D.ReassignmentStep(assignment=(1, 2, 3, 4, 5, 6), state=L(1, 6, (1, 2, 3), 8))
    # step 4: new replicas not in sync yet: wait
    assert D.reassignment_step([1, 2, 3, 4, 5, 6], [4, 5, 6], L(1, 6, (1, 2, 3, 4), 8), live, 8) \
        == D.ReassignmentStep()
    # steps 5-10: leader 4, ISR {4,5,6}, stop 1,2,3, AR = RAR
    step = D.reassignment_step([1, 2, 3, 4, 5, 6], [4, 5, 6], L(1, 6, (1, 2, 3, 4, 5, 6), 8), live, 8)
    assert step == D.ReassignmentStep(assignment=(4, 5, 6), state=L(4, 7, (4, 5, 6), 8), stop=(1, 2, 3), done=True)
    # step 11: already there
    assert D.reassignment_step([4, 5, 6], [4, 5, 6], L(4, 7, (4, 5, 6), 8), live, 8) == D.ReassignmentStep(done=True)


def test_reassignment_keeps_a_leader_that_stays_and_resumes_from_zookeeper_state():
    live = {1, 2, 3, 4}
    # leader 2 is in RAR: it keeps leading; only 1 leaves
    step = D.reassignment_step([1, 2, 3, 4], [2, 3, 4], L(2, 3, (2, 1, 3, 4), 1), live, 2)
    assert step.state == L(2, 4, (2, 3, 4), 2) and step.stop == (1,) and step.done
    # a new controller after the ISR was already shrunk (step 8 done, step 10 not): finishes again
    step = D.reassignment_step([1, 2, 3, 4], [2, 3, 4], L(2, 4, (2, 3, 4), 2), live, 3)
    assert step.assignment == (2, 3, 4) and step.stop == (1,) and step.done


def test_reassignment_shrink_and_reorder_skip_the_catch_up():
    live = {1, 2, 3}
    step = D.reassignment_step([1, 2, 3], [1, 2], L(1, 0, (1, 2, 3), 1), live, 1)
    assert step == D.ReassignmentStep(assignment=(1, 2), state=L(1, 1, (1, 2), 1), stop=(3,), done=True)
    step = D.reassignment_step([1, 2, 3], [3, 2, 1], L(1, 0, (1, 2, 3), 1), live, 1)
    assert step.assignment == (3, 2, 1) and step.stop == () and step.state.leader == 1


def test_reassignment_moves_leadership_only_to_a_live_in_sync_target():
    # leader 1 leaves; RAR = [4, 5]; 4 is dead -> 5 leads
    step = D.reassignment_step([1, 4, 5], [4, 5], L(1, 2, (1, 4, 5), 1), {1, 5}, 1)
    assert step.state == L(5, 3, (4, 5), 1)
    # no RAR member alive and in sync: wait
    assert D.reassignment_step([1, 4, 5], [4, 5], L(1, 2, (1, 4, 5), 1), {1}, 1) == D.ReassignmentStep()


# ---------------------------------------------------------------- preferred election / rebalance
def test_preferred_elections_only_where_the_preferred_replica_is_alive_and_in_sync():
    assignments = {"t": {0: [1, 2], 1: [2, 1], 2: [3, 1], 3: [1, 3]}}
    states = {("t", 0): L(2, 4, (1, 2), 1),   # preferred 1 in ISR: moves
              ("t", 1): L(2, 1, (2, 1), 1),   # already preferred
              ("t", 2): L(1, 1, (1,), 1),     # preferred 3 not in ISR
              ("t", 3): L(3, 1, (1, 3), 1)}   # preferred 1 in ISR: moves while 1 is alive
    out = D.preferred_elections(assignments, states, list(states), {1, 2, 3}, 5)
    assert out == {("t", 0): L(1, 5, (1, 2), 5), ("t", 3): L(1, 2, (1, 3), 5)}
    assert D.preferred_elections(assignments, states, [("t", 3)], {2, 3}, 5) == {}   # 1 is down


def test_imbalance_check_uses_the_per_broker_percentage():
    assignments = {"t": {p: [1 + p % 2, 2 - p % 2] for p in range(10)}}   # broker 1 prefers 0,2,4,6,8
    states = {("t", p): L(2, 1, (1, 2), 1) for p in range(10)}           # broker 2 leads everything
    assert D.imbalanced_partitions(assignments, states, {1, 2}, 10) == [("t", p) for p in range(0, 10, 2)]
    # one of five not led = 20%: above 10, not above 25
    states = {("t", p): L(1 + p % 2, 1, (1, 2), 1) for p in range(10)}
    states[("t", 0)] = L(2, 2, (1, 2), 1)
    assert D.imbalanced_partitions(assignments, states, {1, 2}, 10) == [("t", 0)]
    assert D.imbalanced_partitions(assignments, states, {1, 2}, 25) == []
    # a dead preferred broker is not rebalanced to
    assert D.imbalanced_partitions(assignments, states, {2}, 10) == []


# ---------------------------------------------------------------- controlled shutdown
def test_controlled_shutdown_moves_leaders_and_leaves_isrs():
    assignments = {"t": {0: [1, 2, 3], 1: [2, 1, 3], 2: [1, 2], 3: [1]}, "u": {0: [1, 3]}}
    states = {("t", 0): L(1, 3, (1, 2, 3), 1),
              ("t", 1): L(2, 3, (2, 1, 3), 1),
              ("t", 2): L(1, 3, (1,), 1),           # 2 not in sync: must wait
              ("t", 3): L(1, 0, (1,), 1),           # RF 1: cannot move, not reported
              ("u", 0): L(1, 0, (1,), 1)}           # 3 is down: cannot move, not reported
    new, remaining = D.controlled_shutdown_moves(assignments, states, {1, 2}, {1}, 9)
    assert new == {("t", 0): L(2, 4, (2, 3), 9), ("t", 1): L(2, 4, (2, 3), 9)}
    assert remaining == [("t", 2)]


def test_controlled_shutdown_never_moves_to_another_shutting_broker():
    assignments = {"t": {0: [1, 2, 3]}}
    states = {("t", 0): L(1, 0, (1, 2, 3), 1)}
    new, remaining = D.controlled_shutdown_moves(assignments, states, {1, 2, 3}, {1, 2}, 2)
    assert new == {("t", 0): L(3, 1, (3,), 2)} and remaining == []


def test_a_broker_in_controlled_shutdown_is_alive_for_offline_elections():
    assignments = {"t": {0: [1, 2], 1: [3, 1, 2], 2: [3, 1]}}
    states = {("t", 0): L(1, 1, (1,), 1),        # led by the shutting broker 1 (nothing else in sync)
              ("t", 1): L(3, 1, (3, 1, 2), 1),   # leader 3 died: 2 is preferred over shutting 1
              ("t", 2): L(3, 1, (3, 1), 1)}      # leader 3 died, only 1 in sync: 1 leads, not unclean
    out = D.on_brokers_changed(assignments, states, {1, 2}, 2, lambda t: True, avoid={1})
    assert ("t", 0) not in out
    assert out[("t", 1)] == D.Election(L(2, 2, (1, 2), 2))
    assert out[("t", 2)] == D.Election(L(1, 2, (1,), 2))


def test_controlled_shutdown_leaves_offline_and_dead_led_partitions_alone():
    assignments = {"t": {0: [1, 2], 1: [3, 1, 2]}}
    states = {("t", 0): L(-1, 4, (1, 2), 1), ("t", 1): L(3, 1, (3, 1, 2), 1)}   # 3 just died
    assert D.controlled_shutdown_moves(assignments, states, {1, 2}, {1}, 2) == ({}, [])


# ---- partition removal (seed 000 H) ---------------------------------------------------------
def test_removal_takes_the_highest_numbered_partitions():
    assert D.partitions_to_remove(range(5), {3, 4}) == ([3, 4], None)


def test_removal_must_leave_ids_dense():
    doomed, problem = D.partitions_to_remove(range(5), {2, 4})
    assert doomed == [] and "[3] removed too" in problem


def test_removal_keeps_partition_zero():
    doomed, problem = D.partitions_to_remove(range(3), {0, 1, 2})
    assert doomed == [] and "at least partition 0" in problem


def test_a_half_finished_removal_is_repeated():
    # A failed controller already took 4 out of the assignment; its successor removes 3 and 4 again.
    assert D.partitions_to_remove(range(4), {3, 4}) == ([3, 4], None)
    assert D.partitions_to_remove(range(3), {3, 4}) == ([3, 4], None)
