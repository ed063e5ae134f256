"""replica-verification's comparison of replicas, on real stored-batch bytes
(the answers of debugging fetches are built with the storage engine's encoder)."""
from __future__ import annotations

import pyarrow as pa
import pytest

from replikafka.broker.storage import batch_format as bf
from replikafka.cli import replica_verification_cmd as V
from replikafka.cli.main import main

TS = pa.timestamp("ms", tz="UTC")
SCHEMA = pa.schema([("value", pa.binary()), ("timestamp", TS)])


def message(base: int, n: int, epoch: int = 0, salt: str = "") -> bytes:
    batch = pa.record_batch([pa.array([f"v{salt}{base + i}".encode() for i in range(n)], pa.binary()),
                             pa.array([1_700_000_000_000 + base + i for i in range(n)], pa.int64()).view(TS)],
                            schema=SCHEMA)
    return bf.encode_batch(batch, bf.BatchHeader(base, n, epoch, bf.max_timestamp_ms(batch))).to_bytes()


def stream(*messages: bytes) -> bytes:
    return bf.schema_message(SCHEMA) + b"".join(messages)


def flip_body_byte(msg: bytes) -> bytes:
    """The same message with one byte of its body changed (the header, CRC included, kept)."""
    meta_len = int.from_bytes(msg[4:8], "little")
    at = bf.PREFIX_SIZE + meta_len + 2
    return msg[:at] + bytes([msg[at] ^ 0x20]) + msg[at + 1:]


LOG = [message(0, 5), message(5, 3), message(8, 4, epoch=1)]      # offsets 0..11


def test_parse_batches_reads_headers_and_checks_each_body():
    got, problem = V.parse_batches(stream(*LOG))
    assert problem is None
    assert [(b.base_offset, b.record_count, b.leader_epoch) for b in got] == [(0, 5, 0), (5, 3, 0), (8, 4, 1)]
    assert all(b.problem is None and b.body_crc == b.stored_crc for b in got)

    got, problem = V.parse_batches(stream(LOG[0], flip_body_byte(LOG[1])))
    assert problem is None
    assert got[1].body_crc != got[1].stored_crc and "corrupt" in got[1].problem

    torn = stream(LOG[0], LOG[1][:-7])
    got, problem = V.parse_batches(torn)
    assert len(got) == 1 and "torn" in problem
    assert V.parse_batches(b"") == ([], None)


def check_of(answers: dict[int, tuple[int, int, int, bytes]], leader: int = 1) -> V.PartitionCheck:
    """A check whose replicas answered once each with (hw, leo, lso, records) and
    have nothing more to give."""
    c = V.PartitionCheck("orders.eu-1", 0, sorted(answers), leader)
    for r, (hw, leo, lso, records) in answers.items():
        c.on_answer(c.cursors[r], 0, hw, leo, lso, records)
    c.advance()
    return c


def test_identical_replicas_agree_up_to_the_smallest_hw():
    # replica 3 lags (HW 8, a batch short); only [0, 8) is compared.
    c = check_of({1: (12, 12, 0, stream(*LOG)), 2: (12, 12, 0, stream(*LOG)), 3: (8, 8, 0, stream(*LOG[:2]))})
    assert c.done and not c.difference_count and c.batches_compared == 2 and c.end == 8
    assert c.lag() == (4, 3, 8)


def test_replicas_may_differ_above_the_smallest_hw():
    c = check_of({1: (8, 12, 0, stream(*LOG)), 2: (8, 12, 0, stream(LOG[0], LOG[1], message(8, 4, 2, "x")))})
    assert c.done and not c.difference_count


def test_a_corrupt_body_is_a_difference_naming_the_replica_and_offset():
    bad = stream(LOG[0], flip_body_byte(LOG[1]), LOG[2])
    c = check_of({1: (12, 12, 0, stream(*LOG)), 2: (12, 12, 0, stream(*LOG)), 3: (12, 12, 0, bad)})
    assert c.difference_count == 1 and not c.diverged and c.batches_compared == 2
    line = c.differences[0]
    assert "topic orders.eu-1 partition 0 at offset 5: replica 3 differs from replicas 1,2" in line
    assert "corrupt" in line


def test_a_replica_refusing_its_corrupt_batch_is_a_difference_at_that_offset():
    """Brokers verify stored CRCs on read: a replica whose batch at 5 rotted answers the
    sound batches before it, then CORRUPT_MESSAGE for a fetch at 5. That is a difference
    naming it and offset 5, not an unreadable replica."""
    from replikafka import errors as E

    c = V.PartitionCheck("orders.eu-1", 0, [1, 2, 3], 1)
    for r in (1, 2):
        c.on_answer(c.cursors[r], 0, 12, 12, 0, stream(*LOG))
    c.on_answer(c.cursors[3], 0, 12, 12, 0, stream(LOG[0]))
    c.advance()
    assert not c.done and c.wants_data(c.cursors[3]) and c.offset == 5
    c.on_corrupt(c.cursors[3], c.offset, E.CorruptRecordError("t-0.arrows position 900 (batch at offset 5): "
                                                              "CRC-32C mismatch on read"))
    c.advance()
    assert c.done and c.difference_count == 1 and c.batches_compared == 1 and not c.unreadable()
    line = c.differences[0]
    assert "topic orders.eu-1 partition 0 at offset 5: replica 3 differs from replicas 1,2" in line
    assert "the stored batch is corrupt: CORRUPT_MESSAGE" in line

    # refused on its very first read: no HW or LEO from it; the others' bound the comparison
    c = V.PartitionCheck("t", 0, [1, 2], 1)
    c.on_answer(c.cursors[1], 0, 12, 12, 0, stream(*LOG))
    c.on_corrupt(c.cursors[2], 0, E.CorruptRecordError("CRC-32C mismatch on read"))
    c.advance()
    assert c.done and c.end == 12 and c.difference_count == 1
    assert "at offset 0: replica 2 differs from replica 1" in c.differences[0]
    assert c.lag() == (0, 1, 12)


def test_the_same_corrupt_batch_on_every_replica_is_reported_too():
    bad = stream(LOG[0], flip_body_byte(LOG[1]), LOG[2])
    c = check_of({1: (12, 12, 0, bad), 2: (12, 12, 0, bad)})
    assert c.done and c.difference_count == 1 and not c.diverged and c.batches_compared == 3
    assert "partition 0 at offset 5 on every replica read" in c.differences[0]


def test_different_batches_stop_the_comparison_of_that_partition():
    other = stream(LOG[0], message(5, 2), message(7, 5))
    c = check_of({1: (12, 12, 0, stream(*LOG)), 2: (12, 12, 0, other)})
    assert c.difference_count == 1 and c.diverged
    assert "at offset 5: replica 2 differs from replica 1" in c.differences[0]
    assert "2 records from offset 5" in c.differences[0]


def test_unreadable_bytes_and_missing_data_are_differences():
    c = check_of({1: (12, 12, 0, stream(*LOG)), 2: (12, 12, 0, stream(LOG[0], b"\xff\xff\xff\xff\x03\x00"))})
    assert c.diverged and "replica 2 differs" in c.differences[0] and "unreadable" in c.differences[0]

    c = V.PartitionCheck("t", 0, [1, 2], 1)
    c.on_answer(c.cursors[1], 0, 12, 12, 0, stream(*LOG))
    c.on_answer(c.cursors[2], 0, 12, 12, 0, stream(LOG[0]))
    c.advance()
    assert not c.done and c.wants_data(c.cursors[2]) and not c.wants_data(c.cursors[1])
    c.on_answer(c.cursors[2], c.offset, 12, 5, 0, b"")      # truncated meanwhile: nothing at 5
    c.advance()
    assert c.done and c.diverged and "no batch at offset 5" in c.differences[0]


def test_comparison_starts_at_the_largest_log_start():
    c = check_of({1: (12, 12, 0, stream(*LOG)), 2: (12, 12, 5, stream(*LOG[1:]))})
    assert c.done and not c.difference_count and c.batches_compared == 2


def test_a_single_readable_replica_is_not_compared():
    c = V.PartitionCheck("t", 0, [1, 2], 1)
    c.on_answer(c.cursors[1], 0, 12, 12, 0, stream(*LOG))
    c.cursors[2].error = "BROKER_NOT_AVAILABLE: broker 2 is not live"
    c.advance()
    assert c.done and c.batches_compared == 0 and c.unreadable() == {2: c.cursors[2].error}


@pytest.mark.parametrize("argv, message", [
    ([], "--bootstrap-server is required"),
    (["--bootstrap-server", "nohost"], "--bootstrap-server: bootstrap server 'nohost' is not 'host:port'"),
    (["--bootstrap-server", "127.0.0.1:9", "--topic-white-list", "(x"], "--topic-white-list '(x' is not a regular"),
    (["--bootstrap-server", "127.0.0.1:9", "--report-interval-ms", "0"], "--report-interval-ms must be at least 1"),
    (["--bootstrap-server", "127.0.0.1:9", "--max-wait-ms", "-1"], "--max-wait-ms must be between 0 and 30000"),
    (["--bootstrap-server", "127.0.0.1:9", "--fetch-size", "0"], "--fetch-size must be at least 1"),
])
def test_bad_arguments_give_one_line_and_exit_2(capsys, argv, message):
    code = main(["replica-verification", *argv])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err
