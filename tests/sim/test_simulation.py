"""The deterministic simulation (``sim_cluster.py``): 200 seeds by default, 10,000
with ``--long``, one seed with ``--seed N`` (what a failure prints)."""
from __future__ import annotations

import logging
import os
import tempfile

import pytest

from sim_cluster import Simulation

DEFAULT_SEEDS = 200
LONG_SEEDS = 10_000


class FailOnErrorLog(logging.Handler):
    """An ERROR from the brokers' code (a controller event that failed, a fetcher
    round that blew up) is a failure of the run, not noise."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


def run_seed(seed: int, **kw) -> None:
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
    run_seed(seed)


def test_the_simulation_acknowledges_and_crashes(tmp_path):
    """Guard against a simulation that passes because nothing happens (a produce path
    that refuses every request, faults that never fire)."""
    acks = crashes = 0
    for seed in range(10):
        root = tempfile.mkdtemp(prefix=f"sim-{seed}-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        sim = Simulation(seed, root)
        try:
            sim.run()
            acks += sim.model.acks
            crashes += sum(b.restarts for b in sim.brokers.values())
        finally:
            sim.close()
    assert acks > 50 and crashes > 0
