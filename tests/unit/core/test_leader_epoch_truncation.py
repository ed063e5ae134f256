"""Where a follower truncates: KIP-101's two scenarios and KIP-279's walk-back."""
from replikafka.broker.replica.leader_epoch_truncation import AskAgain, Truncate, truncation_decision


def cache(entries, leo):
    """entries: [(epoch, start_offset)] -> lookup(epoch) -> (largest epoch <= e, its end offset)."""
    def lookup(e):
        cands = [(ep, so) for ep, so in entries if ep <= e]
        if not cands:
            return (-1, -1)
        ep = max(cands)[0]
        later = [so for ep2, so in entries if ep2 > ep]
        return (ep, min(later) if later else leo)
    return lookup


def test_kip101_scenario1_follower_keeps_committed_data_it_has_not_seen_the_hw_of():
    # Follower B has offsets 0,1 (epoch 0) but its HW is still 1 when it restarts.
    # The leader A (epoch 0 ends at 2 there) must not make B drop offset 1.
    d = truncation_decision(0, 2, cache([(0, 0)], leo=2), follower_leo=2, follower_hw=1)
    assert d == Truncate(2)


def test_kip101_scenario2_divergent_logs_truncate_to_where_epochs_agree():
    # B wrote offset 1 in epoch 1 that the new leader (epoch 2, which began at 1) never had.
    d = truncation_decision(1, 1, cache([(0, 0), (1, 1)], leo=2), follower_leo=2, follower_hw=1)
    assert d == Truncate(1)


def test_kip279_leader_answers_an_earlier_epoch_and_follower_walks_back():
    # Follower has epochs 0,2,4; the leader never had 4 and answers epoch 3 ending at 30.
    lookup = cache([(0, 0), (2, 10), (4, 25)], leo=40)
    d = truncation_decision(3, 30, lookup, follower_leo=40, follower_hw=5)
    assert d == AskAgain(2)
    # Asked about epoch 2, the leader says epoch 2 ends at 20 on it: truncate to 20.
    assert truncation_decision(2, 20, lookup, follower_leo=40, follower_hw=5) == Truncate(20)


def test_unknown_answers_fall_back_safely():
    lookup = cache([(5, 0)], leo=10)
    assert truncation_decision(-1, -1, lookup, follower_leo=10, follower_hw=4) == Truncate(4)
    assert truncation_decision(3, 7, lookup, follower_leo=10, follower_hw=4) == Truncate(7)
