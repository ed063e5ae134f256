"""The simulation's invariants can fail: with the code broken on purpose, known seeds
fail (found by running the default seeds against each break; see the commit that
added this file). If a change to the simulation moves these seeds, run the default
seeds against the break again and put failing ones here."""
from __future__ import annotations

import pytest

from replikafka.broker.replica import replica_manager
from sim_cluster import InvariantViolation
from test_simulation import run_seed

NO_FETCHER_DEMOTION_SEEDS = (4, 22, 39)


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
            run_seed(seed)
