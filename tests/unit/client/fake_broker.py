"""An in-process fake of the broker's client-facing RPCs, for unit tests of the
client's own logic (routing, batching, retries, sequence numbers, assembling
fetched rows). It is not a broker: one process plays every broker id, logs are
Python lists, HW = LEO. Tests inject failures through ``FakeCluster.faults``.
Real-broker behaviour is covered by tests/integration.
"""
from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
import pyarrow as pa

from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pb_grpc
from replikafka.records import (KAFKA_SCHEMA, decode_stream, encode_stream, schema_from_bytes, schema_to_bytes,
                                stored_schema)


@dataclass
class FakePartition:
    batches: list = field(default_factory=list)  # (base_offset, RecordBatch)
    leo: int = 0
    leader: int = 1
    epoch: int = 0
    seqs: dict = field(default_factory=dict)      # producer_id -> (last base_sequence, base_offset, count)
    hw_unknown: int = 0   # the next Fetch answers report no HW (-1, a new leader: KIP-207)


@dataclass
class FakeTopic:
    schema: pa.Schema                              # stored schema
    config: dict
    partitions: list


class FakeCluster(pb_grpc.ReplikafkaServicer):
    """Serves every broker id from one gRPC server on 127.0.0.1."""

    def __init__(self, broker_ids=(1,)):
        self.lock = threading.Lock()
        self.topics: dict[str, FakeTopic] = {}
        self.broker_ids = list(broker_ids)
        self.faults: list = []          # (method, topic, partition, code) consumed in order
        self.produce_requests: list = []
        self.fetch_requests: list = []
        self.next_pid = 1000
        self.produce_gate = threading.Event()  # Produce waits until it is set
        self.produce_gate.set()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
        pb_grpc.add_ReplikafkaServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self):
        self.server.stop(0)

    def add_topic(self, name, partitions=1, topic_schema=KAFKA_SCHEMA, config=None):
        with self.lock:
            self.topics[name] = FakeTopic(stored_schema(topic_schema), dict(config or {}),
                                          [FakePartition(leader=self.broker_ids[i % len(self.broker_ids)])
                                           for i in range(partitions)])

    def rows(self, topic, partition) -> pa.Table:
        p = self.topics[topic].partitions[partition]
        return pa.Table.from_batches([b for _, b in p.batches], self.topics[topic].schema)

    def _fault(self, method, topic, partition):
        for i, f in enumerate(self.faults):
            if f[0] == method and f[1] in (topic, None) and f[2] in (partition, None):
                del self.faults[i]
                return f[3]
        return None

    # ------------------------------------------------------------ RPCs
    def Metadata(self, request, context):
        with self.lock:
            names = list(self.topics) if request.all_topics else list(request.topics)
            out = pb.MetadataResponse(controller_id=self.broker_ids[0], brokers=[
                pb.BrokerEndpoint(id=i, host="127.0.0.1", port=self.port) for i in self.broker_ids])
            for n in names:
                t = self.topics.get(n)
                if t is None:
                    out.topics.append(pb.TopicMetadata(name=n, error=pb.Error(code="UNKNOWN_TOPIC_OR_PARTITION")))
                    continue
                out.topics.append(pb.TopicMetadata(
                    name=n, schema=schema_to_bytes(t.schema), config=t.config,
                    partitions=[pb.PartitionMetadata(partition=i, leader=p.leader, leader_epoch=p.epoch,
                                                     replicas=self.broker_ids, isr=self.broker_ids)
                                for i, p in enumerate(t.partitions)]))
            return out

    def InitProducerId(self, request, context):
        with self.lock:
            self.next_pid += 1
            return pb.InitProducerIdResponse(producer_id=self.next_pid, producer_epoch=0)

    def Produce(self, request, context):
        self.produce_gate.wait(30)
        with self.lock:
            self.produce_requests.append(request)
            out = pb.ProduceResponse()
            for d in request.partitions:
                r = out.partitions.add(topic=d.topic, partition=d.partition)
                t = self.topics.get(d.topic)
                if t is None or d.partition >= len(t.partitions):
                    r.error.code = "UNKNOWN_TOPIC_OR_PARTITION"
                    continue
                code = self._fault("Produce", d.topic, d.partition)
                p = t.partitions[d.partition]
                schema, batches = decode_stream(d.records)
                count = sum(b.num_rows for b in batches)
                if code and code.startswith("APPENDED_THEN_"):
                    # append, then answer with an error (a lost acknowledgement)
                    self._append(p, d, batches, count)
                    r.error.code = code[len("APPENDED_THEN_"):]
                    continue
                if code:
                    r.error.code = code
                    continue
                if d.producer_id >= 0:
                    last = p.seqs.get(d.producer_id)
                    if last and last[0] == d.base_sequence:
                        r.base_offset, r.record_count = last[1], last[2]
                        continue
                    expected = last[0] + last[2] if last else 0
                    if d.base_sequence != expected:
                        r.error.code = "OUT_OF_ORDER_SEQUENCE_NUMBER"
                        continue
                r.base_offset = self._append(p, d, batches, count)
                r.record_count = count
                if request.acks == 0:
                    r.base_offset = -1
            return out

    def _append(self, p, d, batches, count):
        base = p.leo
        for b in batches:
            p.batches.append((p.leo, b))
            p.leo += b.num_rows
        if d.producer_id >= 0:
            p.seqs[d.producer_id] = (d.base_sequence, base, count)
        return base

    def Fetch(self, request, context):
        with self.lock:
            self.fetch_requests.append(request)
            out = pb.FetchResponse()
            for f in request.partitions:
                r = out.partitions.add(topic=f.topic, partition=f.partition)
                t = self.topics.get(f.topic)
                if t is None:
                    r.error.code = "UNKNOWN_TOPIC_OR_PARTITION"
                    continue
                code = self._fault("Fetch", f.topic, f.partition)
                p = t.partitions[f.partition]
                r.high_watermark = r.log_end_offset = p.leo
                if code:
                    r.error.code = code
                    continue
                if p.hw_unknown:
                    p.hw_unknown -= 1
                    r.high_watermark = -1
                    continue
                if f.fetch_offset > p.leo:
                    r.error.code = "OFFSET_OUT_OF_RANGE"
                    continue
                rows, size = [], 0
                for base, b in p.batches:
                    if base + b.num_rows > f.fetch_offset and (not rows or size < f.partition_max_bytes):
                        rows.append(b.slice(max(f.fetch_offset - base, 0)))
                        size += rows[-1].nbytes
                if rows:
                    schema = t.schema
                    if request.columns:
                        keep = [c for c in request.columns if c in schema.names]
                        rows = [b.select(keep) for b in rows]
                        schema = pa.schema([schema.field(c) for c in keep])
                    r.records = encode_stream(schema, rows).to_pybytes()
                    r.records_base_offset = f.fetch_offset
                    r.record_count = sum(b.num_rows for b in rows)
            return out

    def ListOffsets(self, request, context):
        with self.lock:
            out = pb.ListOffsetsResponse()
            for q in request.partitions:
                p = self.topics[q.topic].partitions[q.partition]
                r = out.partitions.add(topic=q.topic, partition=q.partition, high_watermark=p.leo,
                                       log_end_offset=p.leo, log_start_offset=0, leader_epoch=p.epoch)
                code = self._fault("ListOffsets", q.topic, q.partition)
                if code:
                    r.error.code = code
                    continue
                if q.timestamp_ms == -2:
                    r.offset = 0
                elif q.timestamp_ms == -1:
                    r.offset = p.leo
                else:
                    r.offset = -1
                    for base, b in p.batches:
                        ts = b.column("timestamp").cast(pa.int64()).to_pylist()
                        hit = next((i for i, v in enumerate(ts) if v >= q.timestamp_ms), None)
                        if hit is not None:
                            r.offset, r.timestamp_ms = base + hit, ts[hit]
                            break
            return out

    def CreateTopic(self, request, context):
        if request.name in self.topics:
            return pb.CreateTopicResponse(error=pb.Error(code="TOPIC_ALREADY_EXISTS", message=request.name))
        schema = schema_from_bytes(request.schema) if request.schema else KAFKA_SCHEMA
        self.add_topic(request.name, request.partitions, schema, dict(request.config))
        return pb.CreateTopicResponse()

    def DeleteTopic(self, request, context):
        with self.lock:
            if self.topics.pop(request.name, None) is None:
                return pb.DeleteTopicResponse(error=pb.Error(code="UNKNOWN_TOPIC_OR_PARTITION"))
        return pb.DeleteTopicResponse()

    def CreatePartitions(self, request, context):
        with self.lock:
            t = self.topics[request.name]
            while len(t.partitions) < request.total_count:
                t.partitions.append(FakePartition(leader=self.broker_ids[len(t.partitions) % len(self.broker_ids)]))
        return pb.CreatePartitionsResponse()
