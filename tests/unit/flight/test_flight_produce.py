"""The Flight append (DoPut) command and answer codec: round trips and strict, named refusals."""
from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from replikafka import errors as E
from replikafka.errors import CorruptRecordError, InvalidRequestError
from replikafka.protocol.flight_produce import (Append, ProduceCommand, decode, decode_next_appends, decode_results,
                                                encode_next_appends, encode_results)


def test_round_trip_idempotent_and_plain():
    c = ProduceCommand("events", 2, -1, 30_000, (Append(120, (1, 0xFFFFFFFF)), Append(20120, (7,))), 7, 0)
    assert decode(c.encode()) == c and c.batch_count == 3
    assert decode(fl.FlightDescriptor.for_command(c.encode())) == c
    plain = ProduceCommand("t", 0, 1, 0, (Append(-1, (5,)),))
    assert decode(plain.encode()) == plain
    assert json.loads(plain.encode()) == {"v": 1, "topic": "t", "partition": 0, "acks": 1, "timeout_ms": 0,
                                          "appends": [{"base_sequence": -1, "batch_crc32c": [5]}]}


def test_a_further_group_keeps_the_calls_header_and_is_checked_as_strictly():
    c = ProduceCommand("events", 2, -1, 30_000, (Append(120, (1,)),), 7, 0)
    nxt = decode_next_appends(c, pa.py_buffer(encode_next_appends((Append(121, (2, 3)), Append(123, (4,))))))
    assert nxt == ProduceCommand("events", 2, -1, 30_000, (Append(121, (2, 3)), Append(123, (4,))), 7, 0)
    assert nxt.batch_count == 3
    for meta, named in [(b'{"v":1}', "missing field(s) ['appends']"),
                        (b'{"v":1,"appends":[],"topic":"x"}', "unknown field(s) ['topic']"),
                        (b'{"v":1,"appends":[]}', "'appends'"),
                        (b'{"v":1,"appends":[{"base_sequence":1,"batch_crc32c":[-1]}]}', "'batch_crc32c'"),
                        (b"\x00", "not UTF-8 JSON")]:
        with pytest.raises(InvalidRequestError, match="a further append's metadata|'appends'|'batch_crc32c'") as info:
            decode_next_appends(c, meta)
        assert named in str(info.value), (meta, info.value)


def _raw(**over):
    d = {"v": 1, "topic": "t", "partition": 0, "acks": -1, "timeout_ms": 100,
         "appends": [{"base_sequence": 0, "batch_crc32c": [1]}]}
    d.update(over)
    return json.dumps({k: v for k, v in d.items() if v is not ...}).encode()


@pytest.mark.parametrize("data, named", [
    (b"", "must be a command"),
    (b"\xff\xfe", "not UTF-8 JSON"),
    (b"[1]", "expected a JSON object"),
    (_raw(topic=...), "missing field(s) ['topic']"),
    (_raw(appends=...), "missing field(s) ['appends']"),
    (_raw(extra=1), "unknown field(s) ['extra']"),
    (_raw(v=2), "'v' must be 1"),
    (_raw(topic="bad topic"), "'topic'"),
    (_raw(partition=-1), "'partition' must be an integer"),
    (_raw(acks=2), "'acks' must be -1 (all), 0 or 1"),
    (_raw(acks=True), "'acks' must be"),
    (_raw(timeout_ms="5"), "'timeout_ms' must be an integer"),
    (_raw(appends=[]), "'appends' must be a non-empty list"),
    (_raw(appends=5), "'appends' must be a list"),
    (_raw(appends=[{"batch_crc32c": [1]}]), "'appends' must be a list of objects with exactly"),
    (_raw(appends=[{"base_sequence": 0, "batch_crc32c": []}]), "'batch_crc32c' must be a non-empty list"),
    (_raw(appends=[{"base_sequence": 0, "batch_crc32c": [2**32]}]),
     "'batch_crc32c' must be an integer in [0, 4294967295]"),
    (_raw(appends=[{"base_sequence": -2, "batch_crc32c": [1]}]), "'base_sequence' must be an integer"),
    (_raw(producer_epoch=40000), "'producer_epoch' must be an integer"),
])
def test_bad_commands_are_refused_naming_the_field(data, named):
    with pytest.raises(InvalidRequestError) as e:
        decode(data)
    assert named in str(e.value) and "flight produce" in str(e.value)


def test_results_round_trip_and_garbage():
    ok = dict(base_offset=10, record_count=3, log_append_time_ms=-1, log_start_offset=0)
    got = decode_results(pa.py_buffer(encode_results([ok, E.NotEnoughReplicasError("isr [1]")])), 2)
    assert got[0] == ok
    assert isinstance(got[1], E.NotEnoughReplicasError) and got[1].retriable and "isr [1]" in got[1].message
    with pytest.raises(CorruptRecordError, match="1 results for 2 appends"):
        decode_results(encode_results([ok]), 2)
    with pytest.raises(CorruptRecordError, match="unreadable answer"):
        decode_results(b'{"results": [{"base_offset": 1}]}', 1)
