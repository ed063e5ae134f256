"""The RPC layer's decoding of a Produce (``replica_rpc.produce_request``): each
partition entry checked and decoded, all entries validated together, a refusal
kept to its own entry."""
from __future__ import annotations

import pyarrow as pa

from replikafka import records as R
from replikafka.broker import replica_rpc
from replikafka.errors import CorruptRecordError
from replikafka.protocol import replikafka_pb2 as pb


def _entry(topic: str, partition: int, payload: bytes, crc: int | None = None) -> pb.PartitionProduceData:
    d = pb.PartitionProduceData(topic=topic, partition=partition, records=payload)
    d.records_crc32c = R.records_crc32c(payload) if crc is None else crc
    return d


def test_a_bad_entry_is_refused_alone_and_the_others_keep_their_batches_and_order():
    kafka = R.to_record_batch([{"value": b"v%d" % i} for i in range(3)], R.KAFKA_SCHEMA, timestamp_ms=5)
    typed_schema = R.parse_schema("id BIGINT, name STRING")
    typed = R.to_record_batch([{"id": 1, "name": "a"}], typed_schema, timestamp_ms=5)
    good = R.encode_stream(kafka.schema, [kafka, kafka]).to_pybytes()
    other_schema = R.encode_stream(typed.schema, [typed]).to_pybytes()
    not_utf8 = bytearray(other_schema)
    not_utf8[not_utf8.rfind(b"a")] = 0xff
    req = pb.ProduceRequest(acks=-1, timeout_ms=1000, partitions=[
        _entry("k", 0, good), _entry("t", 0, bytes(not_utf8)), _entry("k", 1, good),
        _entry("k", 2, good, crc=1), _entry("t", 1, other_schema), _entry("k", 3, b"garbage!")])
    got = replica_rpc.produce_request(req)
    assert (got.acks, got.timeout_ms) == (-1, 1000)
    assert [(p.topic, p.partition) for p in got.partitions] == [("k", 0), ("t", 0), ("k", 1), ("k", 2), ("t", 1),
                                                                ("k", 3)]
    errors = {(p.topic, p.partition): p.decode_error for p in got.partitions if p.decode_error is not None}
    assert sorted(errors) == [("k", 2), ("k", 3), ("t", 0)]
    assert all(isinstance(e, CorruptRecordError) for e in errors.values())
    assert "t-0: record batch 0 is not valid Arrow" in str(errors[("t", 0)])
    assert "k-2: CRC-32C mismatch" in str(errors[("k", 2)])
    assert "k-3: records are not an Arrow IPC stream" in str(errors[("k", 3)])
    fine = {(p.topic, p.partition): p for p in got.partitions if p.decode_error is None}
    assert [b.equals(kafka) for b in fine[("k", 0)].batches] == [True, True]
    assert fine[("t", 1)].batches[0].equals(typed) and fine[("k", 1)].size_bytes == len(good)
    assert all(p.batches == () for p in got.partitions if p.decode_error is not None)
