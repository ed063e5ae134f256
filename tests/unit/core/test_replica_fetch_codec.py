"""The follower fetch wire format: protobuf header, then each partition's batches."""
import pytest

from replikafka.broker import replica_fetch_codec as C
from replikafka.protocol import replikafka_pb2 as pb


def response(*sizes):
    r = pb.FetchResponse()
    for i, n in enumerate(sizes):
        p = r.partitions.add(topic="t", partition=i, high_watermark=10 + i, log_end_offset=20, record_count=n and 1)
        p.records_size = n
    return r


def test_round_trip_slices_each_partitions_batches_without_copying():
    wire = C.encode((response(3, 0, 5), [b"abc", b"defgh"]))
    got = C.decode(wire)
    assert [(p.partition, p.high_watermark, p.records and p.records.to_pybytes()) for p in got.partitions] == \
        [(0, 10, b"abc"), (1, 11, None), (2, 12, b"defgh")]
    assert got.partitions[0].error.code == ""
    assert got.partitions[2].records.address - got.partitions[0].records.address == 3   # one buffer


@pytest.mark.parametrize("wire, named", [
    (b"\x01", "no header length"),
    (b"\xff\x00\x00\x00", "overruns"),
    (C.encode((response(3), [b"ab"])), "overrun the response"),
    (C.encode((response(1), [b"ab"])), "after its last partition"),
])
def test_a_malformed_response_is_refused_naming_the_fault(wire, named):
    with pytest.raises(ValueError, match=named):
        C.decode(wire)
