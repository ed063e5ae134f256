"""Wire fuzz against a real 3-broker cluster while an acks=all producer runs.

Every RPC method (the service's, and the follower path /replikafka.ReplicaData/Fetch)
gets random bytes, truncated and bit-flipped valid requests, and valid requests with
hostile values (huge and negative numbers, illegal names, claimed replica ids and
epochs, forged controllers). The bar: no broker dies; every refused request gets a
named error (``CODE: message``, never UNKNOWN_SERVER_ERROR); nothing acknowledged is
lost or changed; replication of the producer's partitions never stalls (their ISR
stays whole and acknowledgements keep coming during the fuzz).

Forged controller requests use controller epochs other than the current one: a
request carrying the real controller's id and current epoch cannot be told from the
controller's own without authentication (issue 11's business). Likewise hostile values
name the throwaway topic "fuzz-c", not the producer's: deleting or reassigning a topic
is an administrator's right on a cluster without ACLs.
"""
from __future__ import annotations

import random
import time

import grpc
import pytest

import replikafka
from cluster_helpers import BackgroundProducer, read_committed, wait_until
from replikafka import records as R
from replikafka.broker import replica_fetch_codec
from replikafka.protocol import replikafka_pb2 as pb

pytestmark = pytest.mark.integration

SERVICE = pb.DESCRIPTOR.services_by_name["Replikafka"]
METHODS = {f"/{SERVICE.full_name}/{m.name}": m.input_type._concrete_class for m in SERVICE.methods}
METHODS[replica_fetch_codec.PATH] = pb.FetchRequest
HOSTILE_INTS = [-1, -2, 0, 1, 2, 3, 99, 2**31 - 1, -2**31, 65536, 1 << 20]
# "fuzz-c" exists: hostile values reach real entities through it. The producer's topics are left out:
# deleting, shrinking or reassigning them is an administrator's right on a cluster without ACLs, not a
# malformed request (the ACL tests of issue 11 refuse those).
# The producer's topics have names of another length than "fuzz-c": a flipped bit once turned a
# DeleteTopic("fuzz-c") into a valid DeleteTopic("fuzz-a") (c = 0x63, a = 0x61) and deleted the
# producer's topic (10,000-request run, seed 1010, request 9816): an administrator's right here.
ACKED_TOPIC, OTHER_TOPIC = "acked-a", "acked-b"
HOSTILE_NAMES = ["", ".", "..", "../../../../tmp/rk-escape", "a" * 300, "sp ace", "fuzz-c", "\x00", "é"]


def _hostile_value(field, rng: random.Random, depth: int, stale_epochs: list[int]):
    t = field.type
    if field.name == "controller_epoch":
        return rng.choice(stale_epochs)
    if t in (field.TYPE_INT32, field.TYPE_SINT32, field.TYPE_SFIXED32):
        return rng.choice(HOSTILE_INTS + [rng.randint(-2**31, 2**31 - 1)])
    if t in (field.TYPE_INT64, field.TYPE_SINT64, field.TYPE_SFIXED64):
        return rng.choice(HOSTILE_INTS + [2**63 - 1, -2**63, rng.randint(-2**63, 2**63 - 1)])
    if t in (field.TYPE_UINT32, field.TYPE_FIXED32):
        return rng.choice([0, 1, 2**32 - 1, rng.randint(0, 2**32 - 1)])
    if t == field.TYPE_BOOL:
        return rng.random() < 0.5
    if t == field.TYPE_STRING:
        return rng.choice(HOSTILE_NAMES)
    if t == field.TYPE_BYTES:
        return rng.choice([b"", rng.randbytes(rng.randint(1, 300)), b"\xff\xff\xff\xff" + rng.randbytes(40)])
    if t == field.TYPE_MESSAGE and depth > 0:
        return _hostile_message(field.message_type._concrete_class, rng, depth - 1, stale_epochs)
    return None


def _hostile_message(cls, rng: random.Random, depth: int, stale_epochs: list[int]):
    msg = cls()
    for field in cls.DESCRIPTOR.fields:
        if rng.random() < 0.3:
            continue
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            continue    # maps: left empty (their keys and values are covered by the plain fields)
        if field.is_repeated:
            for _ in range(rng.choice([0, 1, 2, 5, 50])):
                v = _hostile_value(field, rng, depth, stale_epochs)
                if v is None:
                    break
                target = getattr(msg, field.name)
                if field.type == field.TYPE_MESSAGE:
                    target.add().CopyFrom(v)
                else:
                    target.append(v)
        else:
            v = _hostile_value(field, rng, depth, stale_epochs)
            if v is None:
                continue
            if field.type == field.TYPE_MESSAGE:
                getattr(msg, field.name).CopyFrom(v)
            else:
                setattr(msg, field.name, v)
    return msg


def _valid_request(path: str, rng: random.Random) -> bytes:
    """A plausible request of each method, for truncation and bit flips."""
    cls = METHODS[path]
    payload = R.encode_stream(R.stored_schema(R.KAFKA_SCHEMA), [R.to_record_batch(
        [{"key": None, "value": b"fuzz", "headers": None}], R.KAFKA_SCHEMA, timestamp_ms=1)]).to_pybytes()
    if cls is pb.ProduceRequest:
        msg = pb.ProduceRequest(acks=1, timeout_ms=1000, partitions=[pb.PartitionProduceData(
            topic=OTHER_TOPIC, partition=0, records=payload, records_crc32c=R.records_crc32c(payload))])
    elif cls is pb.FetchRequest:
        msg = pb.FetchRequest(replica_id=rng.choice([-1, 1, 2, 3]), max_wait_ms=0, partitions=[
            pb.FetchPartition(topic=ACKED_TOPIC, partition=rng.randint(0, 1), fetch_offset=0, current_leader_epoch=-1,
                              partition_max_bytes=1 << 16)])
    else:
        msg = _hostile_message(cls, rng, 2, [-1])
    return msg.SerializeToString()


def _mutate(path: str, rng: random.Random, stale_epochs: list[int]) -> tuple[str, bytes]:
    kind = rng.choice(["random", "truncated", "flipped", "hostile", "hostile"])
    if kind == "random":
        return kind, rng.randbytes(rng.randint(0, 400))
    if kind == "hostile":
        return kind, _hostile_message(METHODS[path], rng, 2, stale_epochs).SerializeToString()
    data = bytearray(_valid_request(path, rng))
    if kind == "truncated" and data:
        return kind, bytes(data[:rng.randint(0, len(data) - 1)])
    for _ in range(rng.randint(1, 4)):
        if data:
            i = rng.randrange(len(data))
            data[i] ^= 1 << rng.randrange(8)
    return kind, bytes(data)


def _long_poll(path: str, data: bytes) -> bool:
    """A fetch that asked to wait longer than the call's 10 s (the broker holds it up to 30 s)."""
    if METHODS[path] is not pb.FetchRequest:
        return False
    try:
        return pb.FetchRequest.FromString(data).max_wait_ms >= 10_000
    except Exception:
        return False


def _named(details: str) -> bool:
    head, sep, _rest = (details or "").partition(": ")
    return bool(sep) and head.isupper() and head != "UNKNOWN_SERVER_ERROR"


def _response_errors(path: str, raw: bytes) -> list[pb.Error]:
    """The Error fields of a response (top level and per entry)."""
    if path == replica_fetch_codec.PATH:   # a FetchResponse header, then the batches (replica_fetch_codec)
        replica_fetch_codec.decode(raw)
        (n,) = replica_fetch_codec._LEN.unpack_from(raw, 0)
        resp = pb.FetchResponse.FromString(raw[replica_fetch_codec._LEN.size:replica_fetch_codec._LEN.size + n])
    else:
        name = path.rsplit("/", 1)[1]
        resp = SERVICE.methods_by_name[name].output_type._concrete_class.FromString(raw)
    errors = [resp.error] if resp.DESCRIPTOR.fields_by_name.get("error") else []
    for field in resp.DESCRIPTOR.fields:
        if field.is_repeated and field.message_type is not None \
                and "error" in field.message_type.fields_by_name:
            errors += [e.error for e in getattr(resp, field.name)]
    return [e for e in errors if e.code]


def run_fuzz(cluster, requests: int, seed: int) -> dict:
    bs = cluster.bootstrap_servers
    admin = replikafka.Admin(bs)
    admin.create_topic(ACKED_TOPIC, partitions=2, replication_factor=3)
    admin.create_topic(OTHER_TOPIC, partitions=1, replication_factor=3)
    admin.create_topic("fuzz-c", partitions=1, replication_factor=1)
    zk = cluster.zk()
    try:
        epoch = int(zk.get("/controller_epoch")[0])
    finally:
        zk.stop()
        zk.close()
    stale_epochs = [-2**31, -1, 0, epoch + 1, epoch + 1000, 2**31 - 1] + ([epoch - 1] if epoch > 1 else [])
    rng = random.Random(seed)
    # A flipped bit can make a valid fetch for megabytes: the broker answers it; this client must be able to read it.
    channels = {b: grpc.insecure_channel(cluster.address(b), options=[("grpc.max_receive_message_length", 256 << 20)])
                for b in cluster.ids}
    calls = {(b, path): ch.unary_unary(path, request_serializer=None, response_deserializer=None)
             for b, ch in channels.items() for path in METHODS}
    producer = BackgroundProducer(bs, ACKED_TOPIC, 2, batch=10).start()
    unnamed: list[str] = []
    stats = {"requests": 0, "refused": 0, "ok": 0, "named_errors": 0}
    started = time.monotonic()
    acked_midway = None
    try:
        for i in range(requests):
            if i == requests // 2:
                acked_midway = len(producer.log.acked)
            path = rng.choice(list(METHODS))
            kind, data = _mutate(path, rng, stale_epochs)
            broker = rng.choice(cluster.ids)
            stats["requests"] += 1
            try:
                raw = calls[(broker, path)](data, timeout=10)
            except grpc.RpcError as exc:
                stats["refused"] += 1
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                    if not _long_poll(path, data):
                        unnamed.append(f"{path} ({kind}) to broker {broker}: no answer in 10 s")
                elif not _named(exc.details()):
                    unnamed.append(f"{path} ({kind}) to broker {broker}: {exc.code()} {exc.details()!r}")
                else:
                    stats["named_errors"] += 1
                continue
            stats["ok"] += 1
            for err in _response_errors(path, raw):
                if err.code == "UNKNOWN_SERVER_ERROR":
                    unnamed.append(f"{path} ({kind}) to broker {broker}: {err.code}: {err.message}")
                else:
                    stats["named_errors"] += 1
        stats["fuzz_seconds"] = round(time.monotonic() - started, 1)
        stats["brokers_dead"] = sum(not cluster.alive(b) for b in cluster.ids)
        assert all(cluster.alive(b) for b in cluster.ids), "a broker died under the fuzz"
    finally:
        log = producer.stop()
        for ch in channels.values():
            ch.close()
    assert not unnamed, f"{len(unnamed)} requests without a named error, e.g. {unnamed[:5]}"
    # Replication never stalled: acknowledgements kept coming after the midpoint, and the ISRs are whole.
    assert acked_midway is not None and len(log.acked) > acked_midway
    wait_until(lambda: all(len(p.isr) == 3 for t in (ACKED_TOPIC, OTHER_TOPIC)
                           for p in admin.describe_topic(t).partitions), what="every ISR whole after the fuzz")
    got = read_committed(bs, ACKED_TOPIC, 2)
    lost = {k: v for k, v in log.acked.items() if got.get(k) != v}
    assert not lost, f"{len(lost)} acknowledged records lost or changed, e.g. {list(lost.items())[:3]}"
    stats["acked"] = len(log.acked)
    stats["acked_lost"] = len(lost)
    # Logs stay useful: malformed requests are rate-limited lines (the RPC seam), never tracebacks.
    for b in cluster.ids:
        text = cluster.tail(b, 100_000)
        assert "Traceback" not in text, f"broker {b} logged a traceback under the fuzz"
        stats[f"malformed_lines_{b}"] = text.count("malformed ")
    return stats


def test_wire_fuzz_bounded(cluster3):
    stats = run_fuzz(cluster3, requests=400, seed=10)
    print("fuzz:", stats)
    assert stats["refused"] > 0 and stats["acked"] > 0


@pytest.mark.long
def test_wire_fuzz_ten_thousand(cluster3):
    stats = run_fuzz(cluster3, requests=10_000, seed=1010)
    print("fuzz:", stats)
