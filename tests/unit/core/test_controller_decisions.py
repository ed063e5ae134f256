"""The controller's pure decisions, driven directly."""
from collections import Counter

import pytest

from replikafka.broker.controller import controller_decisions as D
from replikafka.broker.zk_store import LeaderAndIsr
from replikafka.errors import InvalidPartitionsError, InvalidReplicationFactorError


def test_assignment_spreads_leaders_and_replicas_evenly():
    a = D.assign_replicas(6, 3, [1, 2, 3], start_index=0, replica_shift=0)
    assert sorted(a) == list(range(6))
    assert all(len(set(r)) == 3 for r in a.values())
    leaders = Counter(r[0] for r in a.values())
    assert leaders == {1: 2, 2: 2, 3: 2}
    replicas = Counter(b for r in a.values() for b in r)
    assert replicas == {1: 6, 2: 6, 3: 6}


def test_assignment_is_kafkas_round_robin():
    assert D.assign_replicas(4, 2, [1, 2, 3, 4], start_index=0, replica_shift=0) == {
        0: [1, 2], 1: [2, 3], 2: [3, 4], 3: [4, 1]}
    # After every len(brokers) partitions the follower shift moves on.
    a = D.assign_replicas(8, 2, [1, 2, 3, 4], start_index=0, replica_shift=0)
    assert a[4] == [1, 3]


def test_assignment_refuses_bad_counts_with_clear_errors():
    with pytest.raises(InvalidReplicationFactorError, match="larger than the 2 live broker"):
        D.assign_replicas(1, 3, [1, 2], start_index=0, replica_shift=0)
    with pytest.raises(InvalidPartitionsError, match="at least 1"):
        D.assign_replicas(0, 1, [1, 2], start_index=0, replica_shift=0)
    with pytest.raises(InvalidReplicationFactorError):
        D.assign_replicas(1, 0, [1, 2], start_index=0, replica_shift=0)


def test_initial_leader_is_first_live_replica():
    assert D.initial_leader_and_isr([2, 3, 1], {1, 3}, 7) == LeaderAndIsr(3, 0, (3, 1), 7)
    assert D.initial_leader_and_isr([2], set(), 7).leader == D.NO_LEADER


def test_election_picks_first_live_isr_member_in_assignment_order():
    cur = LeaderAndIsr(1, 4, (1, 3, 2), 1)
    e = D.elect_leader([1, 2, 3], cur, {2, 3}, 2, unclean_allowed=False)
    assert e == D.Election(LeaderAndIsr(2, 5, (3, 2), 2))


def test_no_live_isr_member_goes_offline_keeping_the_isr_unless_unclean():
    cur = LeaderAndIsr(1, 4, (1,), 1)
    assert D.elect_leader([1, 2, 3], cur, {2, 3}, 2, unclean_allowed=False) == \
        D.Election(LeaderAndIsr(-1, 5, (1,), 2))
    e = D.elect_leader([1, 2, 3], cur, {2, 3}, 2, unclean_allowed=True)
    assert e.unclean and e.state == LeaderAndIsr(2, 5, (2,), 2)
    # The leader and a follower died together: only the leader stays in the ISR (the
    # follower may have crashed and lost what it had fetched; the leader holds all of it).
    assert D.elect_leader([1, 2, 3], LeaderAndIsr(2, 4, (2, 1), 1), {3}, 2, unclean_allowed=False) == \
        D.Election(LeaderAndIsr(-1, 5, (2,), 2))
    # Already offline and still nobody eligible: nothing to write.
    assert D.elect_leader([1, 2, 3], LeaderAndIsr(-1, 5, (1,), 2), {2, 3}, 2, False) is None
    # The ISR member returns: it leads again.
    assert D.elect_leader([1, 2, 3], LeaderAndIsr(-1, 5, (1,), 2), {1, 2}, 3, False) == \
        D.Election(LeaderAndIsr(1, 6, (1,), 3))


def test_broker_change_elects_for_led_partitions_and_shrinks_isrs_of_the_rest():
    assignments = {"t": {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}}
    states = {("t", 0): LeaderAndIsr(1, 0, (1, 2, 3), 1),
              ("t", 1): LeaderAndIsr(2, 0, (2, 3, 1), 1),
              ("t", 2): LeaderAndIsr(3, 0, (3, 1, 2), 1)}
    out = D.on_brokers_changed(assignments, states, {2, 3}, 2, lambda t: False)
    assert out == {
        ("t", 0): D.Election(LeaderAndIsr(2, 1, (2, 3), 2)),
        ("t", 1): D.Election(LeaderAndIsr(2, 0, (2, 3), 2)),
        ("t", 2): D.Election(LeaderAndIsr(3, 0, (3, 2), 2)),
    }


def test_preferred_election_only_when_preferred_is_live_and_in_sync():
    cur = LeaderAndIsr(2, 3, (2, 1), 1)
    assert D.preferred_leader_election([1, 2], cur, {1, 2}, 2) == LeaderAndIsr(1, 4, (2, 1), 2)
    assert D.preferred_leader_election([1, 2], LeaderAndIsr(2, 3, (2,), 1), {1, 2}, 2) is None
    assert D.preferred_leader_election([1, 2], cur, {2}, 2) is None


# ---------------------------------------------------------------- the broker-change event's core
def test_broker_set_change_names_started_dead_and_bounced_brokers():
    change = D.broker_set_change([1, 2, 3], {1: 10, 2: 20, 3: 30}, [1, 2, 4], {1: 10, 2: 21, 4: 40})
    assert change == D.BrokerSetChange(started=frozenset({2, 4}), dead=frozenset({3}), bounced=frozenset({2}))
    assert change.moved and change.full_metadata_to() == [2, 4] and change.changes_to([1, 2, 4]) == [1]
    same = D.broker_set_change([1, 2], {1: 10, 2: 20}, [1, 2], {1: 10, 2: 20})
    assert same == D.BrokerSetChange(frozenset(), frozenset(), frozenset()) and not same.moved


def test_restarted_isr_members_groups_partitions_by_who_registered_after_the_write():
    states = {("t", 0): LeaderAndIsr(1, 3, (1, 2, 3), 1), ("t", 1): LeaderAndIsr(2, 3, (2, 3), 1),
              ("gone", 0): LeaderAndIsr(2, 1, (2,), 1), ("t", 2): LeaderAndIsr(1, 1, (1,), 1)}
    written_at = {("t", 0): 100, ("t", 1): 100, ("gone", 0): 100, ("t", 2): 100}
    # Broker 2 re-registered at czxid 150 (after the writes); 3 registered before them; 1 is dead.
    assert D.restarted_isr_members(states, [2, 3], {2: 150, 3: 50}, written_at, deleting={"gone"}) == {
        frozenset({2}): {("t", 0): states[("t", 0)], ("t", 1): states[("t", 1)]}}
    assert D.assignments_of({"t": {0: [1, 2, 3], 1: [2, 3, 1]}}, [("t", 1)]) == {"t": {1: [2, 3, 1]}}


def test_broker_change_decisions_equal_each_partitions_own_and_are_shared_between_equal_inputs():
    """Each partition is decided as elect_leader / remove_from_isr decide it alone (random
    states, replica orders, dead brokers, unclean per topic, brokers to avoid), while equal
    inputs are decided once: at 50,000 partitions they take tens of values."""
    import random
    rng = random.Random(8)
    for _ in range(50):
        brokers = list(range(1, rng.randint(2, 6)))
        live = set(rng.sample(brokers, rng.randint(0, len(brokers))))
        avoid = set(rng.sample(sorted(live), rng.randint(0, len(live)))) if live else set()
        unclean = {t: rng.random() < 0.5 for t in "abc"}
        assignments, states = {}, {}
        for t in "abc":
            assignments[t] = {}
            for p in range(rng.randint(0, 40)):
                replicas = rng.sample(brokers, rng.randint(1, len(brokers)))
                assignments[t][p] = replicas
                if rng.random() < 0.9:
                    isr = tuple(b for b in replicas if rng.random() < 0.7)
                    leader = rng.choice(list(isr) + [D.NO_LEADER]) if isr else D.NO_LEADER
                    states[(t, p)] = LeaderAndIsr(leader, rng.randint(0, 2), isr, 1)
        asked = []
        out = D.on_brokers_changed(assignments, states, live, 5, lambda t: asked.append(t) or unclean[t], avoid)
        want = {}
        for t, parts in assignments.items():
            for p, replicas in parts.items():
                cur = states.get((t, p))
                if cur is None:
                    continue
                if cur.leader == D.NO_LEADER or cur.leader not in live:
                    e = D.elect_leader(replicas, cur, live, 5, unclean[t], avoid)
                else:
                    s = D.remove_from_isr(cur, set(cur.isr) - live, 5)
                    e = None if s is None else D.Election(s)
                if e is not None:
                    want[(t, p)] = e
        assert out == want
        assert len(asked) == len(set(asked))        # each topic's setting asked once at most
        by_input: dict = {}
        for tp, e in out.items():
            key = (states[tp], tuple(assignments[tp[0]][tp[1]]), unclean[tp[0]])
            assert by_input.setdefault(key, e) is e  # equal inputs: one shared decision
