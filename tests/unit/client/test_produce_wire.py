"""ProduceRequest bytes assembled around the payloads parse as protobuf's own."""
import pyarrow as pa

from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol.produce_wire import encode_produce_request


def test_hand_built_request_equals_protobufs_for_small_and_large_payloads():
    entries = [(pb.PartitionProduceData(topic="t", partition=1, producer_id=9, producer_epoch=2, base_sequence=7),
                pa.py_buffer(b"x" * 300_000)),                   # a length needing a 3-byte varint
               (pb.PartitionProduceData(topic="u", partition=0, producer_id=-1), b"ab"),
               (pb.PartitionProduceData(topic="v", partition=3), b"")]
    wire = encode_produce_request(-1, 5000, entries)
    expected = pb.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[
        pb.PartitionProduceData(topic="t", partition=1, producer_id=9, producer_epoch=2, base_sequence=7,
                                records=b"x" * 300_000),
        pb.PartitionProduceData(topic="u", partition=0, producer_id=-1, records=b"ab"),
        pb.PartitionProduceData(topic="v", partition=3)])
    assert pb.ProduceRequest.FromString(wire) == expected
