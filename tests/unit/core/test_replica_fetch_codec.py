"""The follower fetch wire format: protobuf header, then each partition's batches."""
import pytest

import pyarrow as pa

from replikafka.broker import replica_fetch_codec as C
from replikafka.broker.storage.log import StoredBytes
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


def test_stored_pieces_are_sent_in_order_as_one_partitions_batches():
    """A leader's read hands over its pieces (schema message, then stored messages as
    slices of the segment mapping) unjoined: the answer joins them once, in order."""
    mapped = pa.py_buffer(b"..SCHEMA|batch1|batch2..")
    stored = StoredBytes([mapped.slice(2, 7), mapped.slice(9, 7), mapped.slice(16, 6)])
    assert len(stored) == 20 and bytes(stored) == b"SCHEMA|batch1|batch2"
    got = C.decode(C.encode((response(20, 3), [stored, b"xyz"])))
    assert [p.records.to_pybytes() for p in got.partitions] == [b"SCHEMA|batch1|batch2", b"xyz"]


@pytest.mark.parametrize("wire, named", [
    (b"\x01", "no header length"),
    (b"\xff\x00\x00\x00", "overruns"),
    (C.encode((response(3), [b"ab"])), "overrun the response"),
    (C.encode((response(1), [b"ab"])), "after its last partition"),
])
def test_a_malformed_response_is_refused_naming_the_fault(wire, named):
    with pytest.raises(ValueError, match=named):
        C.decode(wire)


def test_a_followers_high_watermark_crosses_the_wire_and_its_absence_too():
    """``follower_high_watermark`` is optional on the wire: 0 is a high watermark, not
    "unknown" (a leader would leave out partitions of a follower that never said)."""
    from replikafka.broker import replica_rpc
    from replikafka.broker.replica import messages as M
    req = M.FetchRequest(2, (M.FetchPartition("t", 0, 7, 3, 100, 2, 0), M.FetchPartition("t", 1, 7, 3, 100, 2, 5),
                             M.FetchPartition("t", 2, 7, 3, 100, 2)), replica_epoch=9)
    wire = replica_rpc.fetch_request_pb(req).SerializeToString()
    got = replica_rpc.fetch_request(pb.FetchRequest.FromString(wire))
    assert [p.follower_high_watermark for p in got.partitions] == [0, 5, None]
    assert got == req
