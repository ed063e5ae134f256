"""Fixtures for the client's unit tests: an in-process fake of the broker RPCs
(see fake_broker.py) — for the client's own logic only; real brokers are
exercised by tests/integration."""
from __future__ import annotations

import pytest

from fake_broker import FakeCluster


@pytest.fixture
def fake():
    cluster = FakeCluster(broker_ids=(1, 2))
    yield cluster
    cluster.stop()
