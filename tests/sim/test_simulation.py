"""The deterministic simulation (``sim_cluster.py``): 200 seeds by default, 10,000
with ``--long``, one seed with ``--seed N`` (what a failure prints)."""
from __future__ import annotations

import logging
import os
import tempfile
import warnings

import pytest

from sim_cluster import Simulation

DEFAULT_SEEDS = 200
LONG_SEEDS = 10_000


class DocumentedLoss(UserWarning):
    """A seed hit the loss README's guarantees leave out (a crashed last leader came
    back without records it had not flushed): accepted, but reported in the summary."""


class FailOnErrorLog(logging.Handler):
    """An ERROR from the brokers' code (a controller event that failed, a fetcher
    round that blew up) is a failure of the run, not noise."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def run_seed(seed: int, **kw):
    """Run one seed; returns its model (what clients were told, the documented losses)."""
    # A memory file system when there is one: the real storage engine, without disk latency.
    root = tempfile.mkdtemp(prefix=f"sim-{seed}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    handler = FailOnErrorLog()
    logger = logging.getLogger("replikafka")
    logger.addHandler(handler)
    sim = None
    try:
        sim = Simulation(seed, root, **kw)
        sim.run()
        unexpected = [r for r in handler.records if "UNCLEAN" not in r.getMessage()]
        assert not unexpected, (f"ERROR logged: {unexpected[0].getMessage()}\n{unexpected[0].exc_text or ''}\n"
                                f"reproduce with --seed {seed}")
        return sim.model
    finally:
        logger.removeHandler(handler)
        if sim is not None:
            sim.close()


def seeds(config) -> list[int]:
    one = config.getoption("--seed")
    if one is not None:
        return [one]
    return list(range(LONG_SEEDS if config.getoption("--long") else DEFAULT_SEEDS))


def pytest_generate_tests(metafunc):
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", seeds(metafunc.config))


def test_simulation(seed):
    for step, tp, leader, start, hw_seen, acked in run_seed(seed).documented_losses:
        warnings.warn(DocumentedLoss(f"seed {seed}, step {step}: {tp} lost its records from offset {start} (HW seen "
                                     f"{hw_seen}, {acked} acknowledged) when its last leader {leader} came back "
                                     f"from a crash"))


def test_the_simulation_acknowledges_and_crashes(tmp_path):
    """Guard against a simulation that passes because nothing happens (a produce path
    that refuses every request, faults that never fire)."""
    acks = crashes = 0
    sessions = {}
    for seed in range(10):
        root = tempfile.mkdtemp(prefix=f"sim-{seed}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        sim = Simulation(seed, root)
        try:
            sim.run()
            acks += sim.model.acks
            crashes += sum(b.restarts for b in sim.brokers.values())
            for k, v in sim.session_faults.items():
                sessions[k] = sessions.get(k, 0) + v
        finally:
            sim.close()
    assert acks > 50 and crashes > 0
    # Fetch sessions: incremental fetches, sessions forgotten, fetches delivered twice, refusals.
    assert sessions["incremental"] > 100 and sessions["forgotten"] > 0 and sessions["twice"] > 0 \
        and sessions["refused"] > 0, sessions


def test_a_crashed_last_leader_loses_what_it_had_not_flushed_and_nothing_else():
    """Seed 1372 (seed 3720 of the 10,000 showed this first, before the controller's
    leaders-first ordering moved that run elsewhere): nothing was flushed; ('sim', 0)'s
    last leader, broker 1, crashed while its session lingered, the partition went
    offline keeping 1 alone in its ISR, and 1 restarted without the records readers
    had seen committed (22 of them acknowledged) and led again. That is the loss
    README's guarantees leave out (acks=all is not fsynced; as in ZooKeeper-mode Kafka,
    which KRaft's KIP-966 closes with unclean-shutdown tracking): the simulation records
    it as exactly that and takes back only what the leader lost.
    test_simulation_breaks.py shows the run fails without the model, and that the model
    forgives nothing when an offline partition keeps more than its last leader."""
    model = run_seed(1372, session_faults=False)   # its run as found, before fetch-session faults
    assert [(tp, leader, start, hw_seen, acked) for _step, tp, leader, start, hw_seen, acked
            in model.documented_losses] == [(("sim", 0), 1, 0, 24, 22)]


def test_a_crashed_last_leader_elected_and_made_offline_within_one_controller_event():
    """Seed 2269 of the 10,000 (I1 failed: acknowledged records not on the leader): the
    same loss, with four acknowledged records, and the offline state overwritten by the
    election within the one controller step that saw brokers 1 and 3 die and 3 return;
    the model learns the offline ISR from every state write, not from what a step leaves."""
    model = run_seed(2269, session_faults=False)
    assert [(tp, leader, start, hw_seen, acked) for _step, tp, leader, start, hw_seen, acked
            in model.documented_losses] == [(("sim", 1), 3, 0, 13, 4)]
