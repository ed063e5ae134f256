"""The simulation's invariants can fail: with the code broken on purpose, known seeds
fail (found by running the default seeds against each break; see the commit that
added this file). If a change to the simulation moves these seeds, run the default
seeds against the break again and put failing ones here."""
from __future__ import annotations

import dataclasses

import pytest

from replikafka.broker.controller import controller_decisions
from replikafka.broker.replica import partition, replica_fetcher, replica_manager
from replikafka.broker.replica.leader_epoch_truncation import Truncate
from sim_cluster import InvariantChecker, InvariantViolation
from test_simulation import run_seed

NO_FETCHER_DEMOTION_SEEDS = (22, 31, 40)
HW_TRUNCATION_SEEDS = (52, 194)


def test_a_demotion_without_a_fetcher_never_converges(monkeypatch):
    """The zombie-leader path of issue 14: a demoted leader that starts no fetcher never
    catches up or rejoins the ISR; the liveness phase finds it."""
    def demote_without_fetcher(self, part, current):
        state = current[0] if current else None
        part.make_follower(state.leader if state else -1, state.leader_epoch if state else part.leader_epoch + 1,
                           state.isr if state else (), part.replicas, -1, -1)
    monkeypatch.setattr(replica_manager.ReplicaManager, "_demote_zombie", demote_without_fetcher)
    for seed in NO_FETCHER_DEMOTION_SEEDS:
        with pytest.raises(InvariantViolation, match="liveness"):
            run_seed(seed, session_faults=False)


def test_truncation_to_the_high_watermark_loses_acknowledged_records(monkeypatch):
    """Kafka before KIP-101: a replica becoming a follower truncates its log to its HW
    at once, and its fetcher by HW too, instead of by leader epoch. A follower's HW lags
    the leader's; when the new leader loses its session too before the truncated
    follower fetched again (the simulation's cascade fault), that follower leads
    without records acknowledged before it: I1 fails."""
    def by_hw(leader_epoch, leader_end_offset, follower_end_offset_for, follower_leo, follower_hw):
        return Truncate(min(follower_hw, follower_leo))
    make_follower = partition.Partition.make_follower

    def make_follower_truncating_to_hw(self, *args):
        changed = make_follower(self, *args)
        if changed:
            self.truncate_to(self.hw)
        return changed
    monkeypatch.setattr(replica_fetcher, "truncation_decision", by_hw)
    monkeypatch.setattr(partition.Partition, "make_follower", make_follower_truncating_to_hw)
    for seed in HW_TRUNCATION_SEEDS:
        with pytest.raises(InvariantViolation, match="I1: acknowledged"):
            run_seed(seed, session_faults=False)


def test_without_the_documented_loss_model_the_crashed_last_leader_fails_i1(monkeypatch):
    """Seed 1372 passes only because the simulation models README's one uncovered loss
    (test_simulation.py); without the model the records the crashed last leader lost
    are acknowledged records missing from the leader."""
    monkeypatch.setattr(InvariantChecker, "documented_loss", lambda self, tp, state, part: None)
    with pytest.raises(InvariantViolation, match=r"I1: acknowledged \('sim', 0\) offset \d+ .* is not on the leader 1"):
        run_seed(1372, session_faults=False)


def test_the_documented_loss_model_does_not_excuse_an_offline_isr_that_keeps_every_member(monkeypatch):
    """Before the last-leader rule, an offline partition kept its whole ISR, and a
    follower that crashed losing acknowledged records came back empty and led while
    the zombie leader still held them (seed 9976). Only the last leader's own crash is
    the documented loss: with the rule undone, seed 9976 still fails I1."""
    elect_leader = controller_decisions.elect_leader

    def offline_keeps_the_whole_isr(replicas, current, live, controller_epoch, unclean_allowed, avoid=frozenset()):
        election = elect_leader(replicas, current, live, controller_epoch, unclean_allowed, avoid)
        if election is not None and election.state.leader == controller_decisions.NO_LEADER:
            return dataclasses.replace(election, state=dataclasses.replace(election.state, isr=current.isr))
        return election
    monkeypatch.setattr(controller_decisions, "elect_leader", offline_keeps_the_whole_isr)
    with pytest.raises(InvariantViolation, match="I1: acknowledged"):
        run_seed(9976, session_faults=False)
