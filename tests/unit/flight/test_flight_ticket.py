"""The Flight ticket codec: round trips and strict, named refusals."""
from __future__ import annotations

import json

import pytest

from replikafka.errors import InvalidRequestError
from replikafka.protocol.flight_ticket import INT32_MAX, PartitionTicket, decode


def test_round_trip_all_fields():
    t = PartitionTicket("events", 3, 10, 20, 4096, 7, ("value", "timestamp"))
    assert decode(t.encode()) == t
    assert json.loads(t.encode()) == {"v": 1, "topic": "events", "partition": 3, "start_offset": 10,
                                      "end_offset": 20, "max_bytes": 4096, "current_leader_epoch": 7,
                                      "columns": ["value", "timestamp"]}


def test_round_trip_defaults_and_pyarrow_ticket():
    import pyarrow.flight as fl
    t = PartitionTicket("t", 0, 0, end_offset=5)
    assert decode(fl.Ticket(t.encode())) == t
    assert (t.max_bytes, t.current_leader_epoch, t.columns) == (0, -1, None)
    assert decode(PartitionTicket("t", 0, 5, max_bytes=1).encode()).end_offset == -1


def test_max_wait_ms_round_trip_and_bound():
    from replikafka.protocol.flight_ticket import MAX_WAIT_MS
    t = PartitionTicket("t", 0, 4, max_bytes=10, max_wait_ms=250)
    assert decode(t.encode()) == t and json.loads(t.encode())["max_wait_ms"] == 250
    with pytest.raises(InvalidRequestError, match="'max_wait_ms' must be an integer in \\[0, 30000\\]"):
        decode(_raw(max_wait_ms=MAX_WAIT_MS + 1))


def _raw(**over):
    d = {"v": 1, "topic": "t", "partition": 0, "start_offset": 0, "end_offset": 10}
    d.update(over)
    return json.dumps({k: v for k, v in d.items() if v is not ...}).encode()


@pytest.mark.parametrize("data, named", [
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"{not json", "not UTF-8 JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (_raw(topic=...), "missing field(s) ['topic']"),
    (_raw(extra=1), "unknown field(s) ['extra']"),
    (_raw(v=2), "'v' must be 1"),
    (_raw(topic=5), "'topic' must be a string"),
    (_raw(topic="bad/name"), "'topic'"),
    (_raw(partition=-1), "'partition' must be an integer in [0, 2147483647]"),
    (_raw(partition=True), "'partition' must be an integer"),
    (_raw(partition="0"), "'partition' must be an integer"),
    (_raw(start_offset=-5), "'start_offset' must be an integer in [0, 9223372036854775807]"),
    (_raw(start_offset=2**63), "'start_offset'"),
    (_raw(start_offset=20, end_offset=10), "'end_offset' must be an integer in [20, "),
    (_raw(end_offset=-2), "'end_offset'"),
    (_raw(max_bytes=-1), "'max_bytes' must be an integer in [0, 2147483647]"),
    (_raw(max_bytes=INT32_MAX + 1), "'max_bytes' must be an integer in [0, 2147483647]"),
    (_raw(end_offset=...), "needs an 'end_offset' or a 'max_bytes'"),
    (_raw(current_leader_epoch=-2), "'current_leader_epoch'"),
    (_raw(columns="value"), "'columns' must be a list of column names"),
    (_raw(columns=[]), "'columns' must be a non-empty list"),
    (_raw(columns=["value", ""]), "'columns' must be a list of non-empty strings"),
    (_raw(columns=["value", 3]), "'columns' must be a list of non-empty strings"),
    (_raw(columns=["value", "value"]), "without repeated names"),
    (b"x" * ((1 << 20) + 1), "more than 1048576"),
])
def test_bad_tickets_are_refused_naming_the_field(data, named):
    with pytest.raises(InvalidRequestError) as e:
        decode(data)
    assert named in str(e.value)
    assert e.value.code == "INVALID_REQUEST" and not e.value.retriable


def test_constructor_checks_like_decode():
    with pytest.raises(InvalidRequestError, match="'partition'"):
        PartitionTicket("t", -1, 0, 5)
    with pytest.raises(InvalidRequestError, match="needs an 'end_offset' or a 'max_bytes'"):
        PartitionTicket("t", 0, 0)
