"""A new client whose first bootstrap address never answers (a SIGSTOPped broker,
a socket that accepts connections but never speaks) moves on to the next
address within its deadline, as Kafka's clients do, against real brokers."""
from __future__ import annotations

import socket
import time

import pytest

from replikafka import Admin
from replikafka import errors as E
from replikafka.client.metadata import BOOTSTRAP_UNREACHABLE_S, METADATA_ATTEMPT_S

pytestmark = pytest.mark.integration


def _silent_socket() -> tuple[socket.socket, str]:
    """A listening socket nobody accepts from: the kernel completes the TCP handshake
    (as for a stopped process) and then nothing is ever said."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def silent_address():
    s, address = _silent_socket()
    yield address
    s.close()


def _list_topics(bootstrap: str, timeout_ms: int) -> tuple[list[str], float]:
    t0 = time.monotonic()
    with Admin({"bootstrap.servers": bootstrap, "request.timeout.ms": timeout_ms}) as admin:
        topics = admin.list_topics()
    return topics, time.monotonic() - t0


def test_a_hung_first_bootstrap_address_is_passed_over_within_the_deadline(cluster_factory, silent_address):
    cluster = cluster_factory(2)
    with Admin({"bootstrap.servers": cluster.bootstrap_servers}) as admin:
        admin.create_topic("boot", partitions=1, replication_factor=2)
    first, second = cluster.ids
    # Two sockets that never answer, then a live broker: it is reached after two bounded attempts.
    other, other_address = _silent_socket()
    try:
        topics, took = _list_topics(f"{silent_address},{other_address},{cluster.address(second)}", 20_000)
    finally:
        other.close()
    assert topics == ["boot"]
    assert took < 2 * METADATA_ATTEMPT_S + 3, f"took {took:.1f} s"
    # A SIGSTOPped broker first: the same, also when the whole timeout is shorter than one
    # attempt's bound (the time is shared among the untried addresses).
    cluster.pause(first)
    try:
        for timeout_ms in (20_000, 4_000):
            topics, took = _list_topics(f"{cluster.address(first)},{cluster.address(second)}", timeout_ms)
            assert topics == ["boot"], timeout_ms
            assert took < timeout_ms / 1000 + 1, f"timeout {timeout_ms} ms: took {took:.1f} s"
    finally:
        cluster.resume(first)


def test_only_hung_addresses_fail_after_each_was_tried_naming_them(silent_address):
    other = socket.socket()
    other.bind(("127.0.0.1", 0))
    other.listen(16)
    second = f"127.0.0.1:{other.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        with pytest.raises(E.BrokerNotAvailableError) as err:
            _list_topics(f"{silent_address},{second}", 30_000)
        took = time.monotonic() - t0
    finally:
        other.close()
    text = str(err.value)
    assert "could not reach any bootstrap server" in text
    assert f"{silent_address}:" in text and f"{second}:" in text, text   # each address's failure named
    assert BOOTSTRAP_UNREACHABLE_S - 0.5 <= took < 2 * METADATA_ATTEMPT_S + 3, f"took {took:.1f} s"
