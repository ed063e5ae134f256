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


def _message_spans(payload: bytes) -> list[tuple[int, int]]:
    """(start, end) of each record-batch message of a one-schema stream, framed by
    Arrow's own message reader (the test's reference, not the code's framing)."""
    reader = pa.BufferReader(payload)
    pa.ipc.read_message(reader)                       # the schema message
    spans = []
    while True:
        start = reader.tell()
        try:
            msg = pa.ipc.read_message(reader)
        except (OSError, EOFError):
            break
        if msg is None or msg.type != "record batch":
            break
        spans.append((start, reader.tell()))
    return spans


def test_small_entries_of_one_schema_are_read_by_arrow_once_and_keep_the_producers_messages(monkeypatch):
    """A Produce naming many partitions of one topic: one Arrow read (and validation)
    for all their small entries, not one per entry (each Arrow call gives the GIL
    up); every batch equals what was sent and carries the producer's message, byte
    for byte, for the log to store verbatim; a batch of no rows is dropped."""
    import pyarrow.ipc
    reads = []
    real_open = pyarrow.ipc.open_stream
    monkeypatch.setattr(pyarrow.ipc, "open_stream", lambda src: reads.append(1) or real_open(src))
    kafka = R.to_record_batch([{"value": b"v%d" % i} for i in range(3)], R.KAFKA_SCHEMA, timestamp_ms=5)
    typed = R.to_record_batch([{"id": 7, "name": "é"}], R.parse_schema("id BIGINT, name STRING"), timestamp_ms=6)
    payloads = [R.encode_stream(kafka.schema, [kafka.slice(i % 3), kafka.slice(0, 0), kafka]).to_pybytes()
                for i in range(40)]
    typed_payload = R.encode_stream(typed.schema, [typed]).to_pybytes()
    req = pb.ProduceRequest(acks=1, timeout_ms=1000, partitions=[
        *(_entry("k", i, p) for i, p in enumerate(payloads)), _entry("t", 0, typed_payload)])
    got = replica_rpc.produce_request(req)
    assert len(reads) == 2                                # one per schema, not one per entry
    assert all(p.decode_error is None for p in got.partitions)
    for i, p in enumerate(got.partitions[:-1]):
        assert [b.equals(e) for b, e in zip(p.batches, [kafka.slice(i % 3), kafka])] == [True, True]
        spans = _message_spans(payloads[i])
        assert len(spans) == 3
        assert [m.message.to_pybytes() for m in p.sent_messages] == [payloads[i][s:e]
                                                                     for s, e in (spans[0], spans[2])]
    [typed_got] = got.partitions[-1].batches
    assert typed_got.equals(typed)
    typed_message = typed_payload[slice(*_message_spans(typed_payload)[0])]
    assert got.partitions[-1].sent_messages[0].message.to_pybytes() == typed_message


def test_a_large_entry_and_a_stream_arrow_must_frame_are_decoded_alone(monkeypatch):
    """An entry over GROUPED_ENTRY_MAX_BYTES is read alone, zero-copy, and keeps its
    messages; a stream with a dictionary (not the plain framing) is read by Arrow's
    stream reader and has no message to store (the log serialises its batches)."""
    from replikafka.broker import produce_decoding
    monkeypatch.setattr(produce_decoding, "GROUPED_ENTRY_MAX_BYTES", 100)
    kafka = R.to_record_batch([{"value": b"v" * 200}], R.KAFKA_SCHEMA, timestamp_ms=5)
    big = R.encode_stream(kafka.schema, [kafka]).to_pybytes()
    dict_schema = pa.schema([("c", pa.dictionary(pa.int8(), pa.string()))])
    dict_batch = pa.record_batch([pa.array(["a", "b", "a"]).dictionary_encode()], schema=dict_schema)
    dict_stream = R.encode_stream(dict_schema, [dict_batch]).to_pybytes()
    [a, b] = produce_decoding.decode_produce_entries([(big, R.records_crc32c(big), "k-0"),
                                                      (dict_stream, R.records_crc32c(dict_stream), "d-0")])
    assert a.batches[0].equals(kafka)
    assert a.sent_messages[0].message.to_pybytes() == big[slice(*_message_spans(big)[0])]
    assert b.batches[0].equals(dict_batch) and b.sent_messages == (None,)


def test_a_compressed_message_is_not_stored_verbatim_but_decoded_and_stored_plain():
    """A producer's compressed batch is decoded as before; its message is not handed
    to the log (a stored body is what readers map, uncompressed)."""
    from replikafka.broker import produce_decoding
    from replikafka.broker.storage import batch_format as bf
    kafka = R.to_record_batch([{"value": b"v%d" % i} for i in range(50)], R.KAFKA_SCHEMA, timestamp_ms=5)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, kafka.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_batch(kafka)
    data = sink.getvalue().to_pybytes()
    start, end = _message_spans(data)[0]
    assert bf.plain_message(pa.py_buffer(data[start:end])) is None
    uncompressed = R.encode_stream(kafka.schema, [kafka]).to_pybytes()
    assert bf.plain_message(pa.py_buffer(uncompressed[slice(*_message_spans(uncompressed)[0])])) is not None
    [got] = produce_decoding.decode_produce_entries([(data, R.records_crc32c(data), "k-0")])
    assert got.batches[0].equals(kafka) and got.sent_messages == (None,)
