"""A deterministic simulation of a replikafka cluster running the real code.

Modelled on Kafka's ``RaftEventSimulationTest`` and TigerBeetle's VOPR: one seed
drives every choice; N real brokers (real :class:`ReplicaManager`, real
:class:`ReplicaFetcher` rounds through ``do_work()``, real ISR maintenance through
``do_isr_work()``, a real :class:`Controller` per broker, the real storage engine
on a temp dir) run in one thread against

* :class:`SimZooKeeper` (sessions, ephemerals, watches, conditional writes, expiry);
* an in-memory network (:class:`SimNetwork`): links cut by partitions, requests
  and responses dropped, controller requests delayed in their per-broker queue,
  and a follower's fetch held in flight while other steps run (reordering it
  against LeaderAndIsr, ISR writes and other fetches);
* a manual clock that only the simulation moves;
* a disk that loses what was not flushed when a broker crashes (the real log is cut
  back to its recovery point and its active segment gets a torn tail; the restart
  recovers it with the real recovery code).

Invariants (ARCHITECTURE.md I1-I8) are checked after every step by
:class:`InvariantChecker`. A run is a safety phase with faults, then a liveness
phase: faults healed, every partition must reach a full ISR and equal logs within
a bounded number of steps.
"""
from __future__ import annotations

import logging
import os
import random
import shutil
import struct
from dataclasses import dataclass, field
from types import SimpleNamespace

import grpc
import pyarrow as pa
from kazoo.exceptions import KazooException

from replikafka import errors as E
from replikafka import records as R
from replikafka.broker import controller_rpc, replica_fetch_codec, replica_rpc, zk_store as Z
from replikafka.broker.config import BrokerConfig, log_config_for_topic
from replikafka.broker.controller import controller_events as V
from replikafka.broker.controller.broker_channels import HeldSends
from replikafka.broker.controller.controller import Controller
from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.metrics import BrokerMetrics
from replikafka.broker.replica import messages as M
from replikafka.broker.replica.partition import LEADER
from replikafka.broker.replica.replica_fetcher import ReplicaFetcherManager
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.server import BrokerServer, PartitionLogs
from replikafka.broker.storage import LogManager, ManualClock
from replikafka.protocol import replikafka_pb2 as pb
from sim_zookeeper import SimKazooClient, SimZooKeeper

TOPIC = "sim"
TP = tuple[str, int]
STEP_MS_MAX = 200
TRACE_KEPT = int(os.environ.get("SIM_TRACE_KEPT", "60"))   # trace lines a failure keeps (more to debug one)


class SimRpcError(grpc.RpcError):
    """A request or its response lost on the simulated network."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what

    def code(self):
        return grpc.StatusCode.UNAVAILABLE


class InvariantViolation(AssertionError):
    pass


# ---------------------------------------------------------------- network
@dataclass
class SimNetwork:
    """Which links work, and how often requests and responses are lost (TigerBeetle's
    PacketSimulator options, reduced to what a request/response protocol needs)."""
    rng: random.Random
    drop_rate: float = 0.0          # a request, or its response, is lost
    hold_rate: float = 0.0          # a fetch stays in flight while other steps run
    cut: set = field(default_factory=set)   # frozenset({a, b}) pairs that cannot talk

    def reachable(self, a: int, b: int) -> bool:
        return a == b or frozenset((a, b)) not in self.cut

    def lose(self) -> bool:
        return self.rng.random() < self.drop_rate

    def heal(self) -> None:
        self.cut.clear()
        self.drop_rate = self.hold_rate = 0.0


class SimLeaderEndpoint:
    """A follower's :class:`LeaderEndpoint` over the simulated network: the real
    leader's ReplicaManager answers in the real follower wire format."""

    def __init__(self, sim: "Simulation", follower: int, leader: int):
        self.sim, self.follower, self.leader = sim, follower, leader

    def _call(self, handle):
        sim = self.sim
        if not sim.network.reachable(self.follower, self.leader) or sim.network.lose():
            raise SimRpcError(f"request {self.follower}->{self.leader} lost")
        sim.run_nested(exclude_broker=self.follower)        # the request in flight
        target = sim.brokers[self.leader]
        if not target.up or not sim.network.reachable(self.follower, self.leader):
            raise SimRpcError(f"broker {self.leader} unreachable")
        response = handle(target)
        sim.run_nested(exclude_broker=self.follower)        # the response in flight
        if sim.network.lose() or not sim.brokers[self.follower].up:
            raise SimRpcError(f"response {self.leader}->{self.follower} lost")
        return response

    def _call_leader(self, handle):
        """As GrpcLeaderEndpoint: a lost request or answer is the error tree's, for the fetcher."""
        try:
            return self._call(handle)
        except SimRpcError as exc:
            raise E.BrokerNotAvailableError(str(exc)) from None

    def fetch(self, request, timeout_s):
        sim = self.sim

        def handle(target):   # through the RPC layer and the follower wire codec, as over gRPC
            if request.session_epoch and sim.session_rng.random() < 0.02 * sim.session_fault_rate:
                sim.session_faults["twice"] += 1      # delivered twice, the first answer lost
                replica_rpc.follower_fetch(target.rm, replica_rpc.fetch_request_pb(request))
            answer = replica_rpc.follower_fetch(target.rm, replica_rpc.fetch_request_pb(request))
            sim.session_faults["incremental"] += bool(request.session_epoch and request.session_epoch > 0)
            sim.session_faults["refused"] += answer[0].HasField("error")
            return replica_rpc.follower_fetch_results(replica_fetch_codec.decode(replica_fetch_codec.encode(answer)))
        return self._call_leader(handle)

    def offsets_for_leader_epoch(self, replica_id, queries, timeout_s):
        return self._call_leader(lambda target: replica_rpc.epoch_end_offsets(replica_rpc.offsets_for_leader_epoch(
            target.rm, replica_rpc.epoch_queries_pb(replica_id, queries))))

    def close(self):
        pass


class SimChannels:
    """The controller's channels to brokers: one FIFO per broker, delivered by the
    simulation (delayed as long as the link is cut or the broker is down)."""

    def __init__(self, sim: "Simulation", controller_id: int):
        self.sim, self.controller_id = sim, controller_id
        self.queues: dict[int, list] = {}
        # inside held(): (broker, request, on_response), queued as the channel manager does
        self.holds = HeldSends(self._queue)

    def set_brokers(self, live) -> None:
        for b in list(self.queues):
            if b not in live:
                del self.queues[b]
        for b in live:
            self.queues.setdefault(b, [])

    def send(self, broker_id, request, on_response=None) -> None:
        if not self.holds.add(broker_id, request, on_response):
            self._queue(broker_id, request, on_response)

    def _queue(self, broker_id, request, on_response) -> None:
        if broker_id in self.queues:
            self.queues[broker_id].append((request, on_response))

    def held(self):
        return self.holds.block()

    def drain(self, timeout_s: float) -> bool:
        return True

    def close(self) -> None:
        self.queues.clear()


# ---------------------------------------------------------------- broker
class SimBroker:
    """One broker wired as ``BrokerServer.start`` wires it, without gRPC or threads."""

    def __init__(self, sim: "Simulation", broker_id: int, config: BrokerConfig):
        self.sim, self.broker_id, self.config = sim, broker_id, config
        self.dir = os.path.join(sim.root, f"broker-{broker_id}")
        self.endpoint = SimpleNamespace(host="sim", port=broker_id)
        self.up = False
        self.session_lost = _Flag()
        self.session_back = _Flag()
        self.zk = None
        self.broker_epoch = -1
        self.restarts = 0
        self.metrics = BrokerMetrics(broker_id, recording=False)

    # the parts of BrokerServer reused as they are
    _topic_schema = BrokerServer._topic_schema
    _topic_log_config = BrokerServer._topic_log_config
    _delete_unassigned = BrokerServer._delete_unassigned
    _on_zk_state = BrokerServer._on_zk_state
    _session_work = BrokerServer._session_work

    def advertised_endpoints(self) -> list:
        return []

    @property
    def replica_manager(self) -> ReplicaManager:   # BrokerServer's name for it
        return self.rm

    def start(self) -> None:
        cfg, sim = self.config, self.sim
        self.zk = SimKazooClient(sim.zookeeper)
        self.zk.add_listener(self._on_zk_state)
        self.store = Z.ZkStore(self.zk)
        self.store.ensure_paths()
        self.log_manager = LogManager([self.dir], log_config_for_topic(cfg, {}), topic_config=self._topic_log_config,
                                      topic_schema=self._topic_schema, clock=sim.clock)
        self._delete_unassigned()
        self.logs = PartitionLogs(cfg, self.log_manager)
        self.metadata = MetadataCache()
        self.fetchers = ReplicaFetcherManager(
            self.broker_id, 1, lambda tp: self.rm.get(tp), lambda leader: SimLeaderEndpoint(sim, self.broker_id, leader),
            start_threads=False, max_wait_ms=0, min_bytes=1, max_bytes=cfg.get("replica.fetch.max.bytes"),
            response_max_bytes=cfg.get("replica.fetch.response.max.bytes"), backoff_ms=0,
            request_timeout_s=1.0, broker_epoch=lambda: self.broker_epoch)
        self.rm = ReplicaManager(self.broker_id, cfg, self.logs, self.store, self.metadata, self.fetchers, sim.clock)
        self.rm.fetch_sessions.rng = random.Random(sim.session_rng.random())   # session ids: seeded too
        self.rm.fetch_sessions.max_slots = sim.session_slots
        self.broker_epoch = self.store.register_broker(self.broker_id, "sim", self.broker_id)
        self.rm.registered_epoch = self.broker_epoch
        self.controller = Controller(self.broker_id, self.store, clock=lambda: sim.clock.time_ms() / 1000.0,
                                     request_timeout_s=1.0)
        self.controller.channels = SimChannels(sim, self.broker_id)
        self.controller.enqueue(V.Elect())
        self.up = True

    def crash(self) -> None:
        """The process dies: memory is gone, unflushed bytes are lost, the ZooKeeper
        session lingers until it expires."""
        self.up = False
        for _tp, log_ in sorted(self.log_manager.logs().items()):   # not directory order: seeded runs repeat
            lost_from = log_.recovery_point
            if lost_from < log_.log_end_offset:
                log_.truncate_to(lost_from)
            active = log_.segments()[-1]
            log_.close()
            path = active.path
            if path and os.path.exists(path) and self.sim.rng.random() < 0.5:
                with open(path, "ab") as f:          # a torn write at the tail
                    f.write(struct.pack("<I", 0xFFFFFFFF) + self.sim.rng.randbytes(self.sim.rng.randrange(1, 64)))
        for d in self.log_manager._dirs:
            d.release()
        self.controller.channels.close()
        self.controller = None
        self.fetchers = None

    # controller requests (the controller's plain data, as the wire would bring it),
    # as BrokerServicer handles them
    def deliver(self, request) -> M.ControllerRequestResult:
        rm = self.rm
        try:
            if isinstance(request, M.LeaderAndIsrRequest):
                return replica_rpc.handle_leader_and_isr(rm, self.metadata, request)
            if isinstance(request, M.StopReplicaRequest):
                return rm.stop_replica(request)
            if isinstance(request, M.UpdateMetadataRequest):
                rm.check_controller_epoch(request.controller_epoch)
                replica_rpc.handle_update_metadata(rm, self.metadata, request)
                return M.ControllerRequestResult()
        except E.StaleControllerEpochError as exc:
            return M.ControllerRequestResult(error=exc)
        raise AssertionError(f"unexpected controller request {request!r}")


class _Flag:
    """threading.Event's interface, for BrokerServer's session code, without threads."""

    def __init__(self):
        self.value = False

    def set(self):
        self.value = True

    def clear(self):
        self.value = False

    def is_set(self):
        return self.value


# ---------------------------------------------------------------- clients' view
@dataclass
class Pending:
    """An acks=all produce appended by a leader and waiting for its HW (Kafka's DelayedProduce)."""
    broker: int
    tp: TP
    part: object
    first: int
    end: int
    min_isr: int
    values: list
    deadline_ms: int


@dataclass
class Model:
    """What clients were told: acknowledged records, values read, HWs seen."""
    acked: dict = field(default_factory=dict)         # tp -> {offset: value}
    read: dict = field(default_factory=dict)          # tp -> {offset: value}
    hw_seen: dict = field(default_factory=dict)       # tp -> highest HW a reader was shown
    epoch_known: dict = field(default_factory=dict)   # tp -> the readers' newest leader epoch
    next_value: int = 0
    acks: int = 0
    # The one loss the guarantees leave out (README, "What it guarantees"): acks=all is
    # not fsynced, so when every in-sync replica crashed losing unflushed records, the
    # last leader comes back without them. broker, tp -> end offset its log had when it
    # crashed while in the ISR and losing records; dropped once it leaves the ISR.
    crashed_in_isr: dict = field(default_factory=dict)
    offline_isr: dict = field(default_factory=dict)   # tp -> its ISR when it last went offline, until a leader acts
    #                                                   (both kept from every state write: Simulation.state_written)
    documented_losses: list = field(default_factory=list)   # (step, tp, leader, from offset, HW seen, acked lost)


def values_of(log_, start: int, end: int) -> list[bytes]:
    out: list[bytes] = []
    offset = start
    while offset < end:
        r = log_.read(offset, 1 << 20, end)
        for b in r.batches:
            out.extend(b.column("value").to_pylist())
        offset += r.record_count
    return out


# ---------------------------------------------------------------- the simulation
class Simulation:
    def __init__(self, seed: int, root: str, *, brokers: int = 3, partitions: int = 2, rf: int = 3,
                 break_with=None, session_faults: bool = True):
        self.seed = seed
        self.rng = random.Random(seed)
        self.root = root
        self.clock = ManualClock(1_700_000_000_000)
        self.zookeeper = SimZooKeeper()
        self.network = SimNetwork(self.rng)
        self.model = Model()
        self.pending: list[Pending] = []
        self.trace: list[str] = []
        self.step_no = 0
        self.nesting = 0
        self.busy: set[int] = set()
        self.expiries: dict[int, int] = {}          # broker -> step its dead session expires
        # Cascades (a partition's next leader losing its session too, soon after the
        # first) draw from their own generator: the main one, and so every run
        # without a cascade, is as before.
        self.cascade_rng = random.Random(seed * 1_000_003 + 1)
        # Fetch sessions (KIP-227) draw from theirs too: how many a leader keeps, when it
        # forgets them all (as a restart or evictions would), when a fetch arrives twice
        # (the first answer lost on the way: the second finds the session's epoch moved on).
        # ``session_faults`` False: none of these (the seeds some tests replay were found
        # before them, and these faults change their runs).
        self.session_rng = random.Random(seed * 1_000_003 + 2)
        self.session_fault_rate = 1.0 if session_faults else 0.0
        self.session_slots = self.session_rng.choice([1, 2, 1000]) if session_faults else 1000
        self.session_faults = {"forgotten": 0, "twice": 0, "incremental": 0, "refused": 0}
        self.cascade: tuple[tuple[str, int], int, int, int] | None = None   # (partition, first zombie, new
        #                                                                     leader or -1, step it fires or gives up)
        self.partitions = partitions
        self.rf = rf
        self.healed = False
        self._states: dict = {}
        rng = self.rng
        flush_messages = rng.choice([1, 3, 1 << 40])
        self.min_isr = rng.choice([1, 2]) if rf >= 2 else 1
        config = BrokerConfig.from_dict({
            "broker.id": 0, "zookeeper.connect": "sim:2181", "log.dirs": root,
            "replica.lag.time.max.ms": rng.choice([1000, 3000]),
            "log.flush.interval.messages": flush_messages,
            "min.insync.replicas": self.min_isr,
        })
        self.state_paths = {Z.state_path(TOPIC, p): (TOPIC, p) for p in range(partitions)}
        self.zookeeper.write_observers.append(self.state_written)
        self.brokers = {b: SimBroker(self, b, config.with_overrides({"broker.id": b})) for b in range(1, brokers + 1)}
        for b in self.brokers.values():
            b.start()
        self.run_controllers()
        self._create_topic()

    # ------------------------------------------------------------ helpers
    def note(self, what: str) -> None:
        self.trace.append(f"[{self.step_no}] {what}")
        del self.trace[:-TRACE_KEPT]

    def up(self) -> list[SimBroker]:
        return [b for b in self.brokers.values() if b.up]

    def zk_state(self, tp: TP):
        """The partition's state as ZooKeeper has it now (parsed once per write)."""
        node = self.zookeeper.nodes.get(Z.state_path(*tp))
        if node is None:
            return None
        cached = self._states.get(tp)
        if cached is None or cached[0] != node.mzxid:
            cached = self._states[tp] = (node.mzxid, Z.LeaderAndIsr.from_json(node.data))
        return cached[1]

    def state_written(self, path: str, data: bytes) -> None:
        """Every partition state write, including those a controller overwrites within
        one step (an offline state, then its election): what the documented-loss model
        needs to know (InvariantChecker.documented_loss)."""
        tp = self.state_paths.get(path)
        if tp is None:
            return
        state = Z.LeaderAndIsr.from_json(data)
        model = self.model
        for key in [k for k in model.crashed_in_isr if k[1] == tp and k[0] not in state.isr]:
            del model.crashed_in_isr[key]   # out of the ISR: it returns only by catching up
        if state.leader < 0:
            model.offline_isr[tp] = state.isr

    def assignment(self) -> dict[int, list[int]]:
        import json
        node = self.zookeeper.nodes.get(Z.topic_path(TOPIC))
        return {int(p): r for p, r in json.loads(node.data)["partitions"].items()} if node else {}

    def _create_topic(self) -> None:
        ids = sorted(self.brokers)
        assignment = {p: [ids[(p + i) % len(ids)] for i in range(self.rf)] for p in range(self.partitions)}
        schema = R.stored_schema(R.KAFKA_SCHEMA)
        self.brokers[ids[0]].store.create_topic(TOPIC, assignment, R.schema_to_bytes(schema),
                                                {"topic.id": f"id-{self.seed}"})
        self.schema = schema
        for _ in range(50):
            self.run_controllers()
            self.deliver_all()
            if all((s := self.zk_state((TOPIC, p))) is not None and s.leader > 0 for p in range(self.partitions)):
                return
        raise AssertionError("the topic never got leaders")

    # ------------------------------------------------------------ actions
    def run_controllers(self) -> None:
        for b in self.up():
            b.controller.schedule_timed_events()
            while b.controller.do_work():
                pass

    def deliver_all(self) -> None:
        for _ in range(100):
            if not self.deliver_one(everything=True):
                return

    def deliver_one(self, everything=False) -> bool:
        choices = [(b, dst) for b in self.up() for dst, q in sorted(b.controller.channels.queues.items())
                   if q and self.brokers[dst].up and self.network.reachable(b.broker_id, dst)]
        if not choices:
            return False
        src, dst = choices[0] if everything else self.rng.choice(choices)
        request, on_response = src.controller.channels.queues[dst].pop(0)
        self.note(f"deliver {controller_rpc.CALLS[type(request)][0]} {src.broker_id}->{dst}")
        resp = self.brokers[dst].deliver(request)
        if on_response is not None:
            on_response(dst, resp)
        return True

    def fetch_round(self, broker: SimBroker) -> None:
        fetchers = [f for _key, f in sorted(broker.fetchers.fetchers.items())]
        if not fetchers:
            return
        f = self.rng.choice(fetchers)
        self.note(f"fetch round {broker.broker_id}<-{f.leader_id}")
        self.busy.add(broker.broker_id)
        try:
            f.do_work()
        except (E.BrokerNotAvailableError, KazooException):
            pass
        finally:
            self.busy.discard(broker.broker_id)

    def run_nested(self, exclude_broker: int) -> None:
        """While a fetch is in flight, other things happen (bounded nesting)."""
        if self.nesting or self.rng.random() >= self.network.hold_rate:
            return
        self.nesting += 1
        try:
            for _ in range(self.rng.randrange(1, 4)):
                self.random_action(nested=True)
        finally:
            self.nesting -= 1

    def isr_work(self, broker: SimBroker) -> None:
        self.note(f"isr work {broker.broker_id}")
        try:
            broker.rm.do_isr_work()
        except KazooException:
            pass

    def produce(self) -> None:
        tp = (TOPIC, self.rng.randrange(self.partitions))
        state = self.zk_state(tp)
        target = self.brokers.get(state.leader) if state and self.rng.random() < 0.9 else None
        target = target or self.rng.choice(list(self.brokers.values()))
        if not target.up:
            return
        n = self.rng.randrange(1, 4)
        values = [f"{tp[1]}:{self.model.next_value + i}".encode() for i in range(n)]
        self.model.next_value += n
        batch = pa.record_batch([pa.nulls(n, pa.binary()), pa.array(values, pa.binary()),
                                 pa.nulls(n, R.HEADER_TYPE), R.constant_timestamps(self.clock.time_ms(), n)],
                                schema=self.schema)
        records = R.encode_stream(self.schema, [batch]).to_pybytes()
        req = pb.ProduceRequest(acks=-1, timeout_ms=5000, partitions=[pb.PartitionProduceData(
            topic=tp[0], partition=tp[1], records=records, records_crc32c=R.records_crc32c(records))])
        results, waits = target.rm.append_records(replica_rpc.produce_request(req))
        r = results[0]
        self.note(f"produce {n} to {target.broker_id} {tp}: {r.error.code if r.error else r.base_offset}")
        for w in waits:
            self.pending.append(Pending(target.broker_id, tp, w.partition, w.end_offset - n, w.end_offset,
                                        w.min_insync, values, self.clock.time_ms() + 5000))

    def complete_produces(self) -> None:
        """Answer the acks=all produces whose HW arrived (or that failed)."""
        still = []
        for p in self.pending:
            broker = self.brokers[p.broker]
            if not broker.up or broker.rm.get(p.tp) is not p.part:
                continue
            try:
                done = p.part.committed(p.end, p.min_isr)
            except E.ReplikafkaError:
                continue
            if done:
                acked = self.model.acked.setdefault(p.tp, {})
                for i, v in enumerate(p.values):
                    off = p.first + i
                    if acked.get(off, v) != v:
                        self.fail(f"I3: offset {off} of {p.tp} acknowledged twice, for {acked[off]!r} and {v!r}")
                    acked[off] = v
                self.model.acks += 1
                self.note(f"acked {p.tp} [{p.first}, {p.end})")
            elif self.clock.time_ms() < p.deadline_ms:
                still.append(p)
        self.pending = still

    def consume(self) -> None:
        """A reader: ListOffsets latest and a Fetch from what it believes is the leader,
        carrying the newest leader epoch it has learnt (KIP-320)."""
        tp = (TOPIC, self.rng.randrange(self.partitions))
        target = self.rng.choice(self.up()) if self.up() else None
        if target is None:
            return
        known = self.model.epoch_known.get(tp, -1)
        entry = target.metadata.topics.get(TOPIC)
        if entry is not None and tp[1] in entry.partitions:
            known = max(known, entry.partitions[tp[1]].leader_epoch)
        self.model.epoch_known[tp] = known
        lo = replica_rpc.list_offsets(target.rm, pb.ListOffsetsRequest(partitions=[pb.ListOffsetsPartition(
            topic=tp[0], partition=tp[1], timestamp_ms=-1, current_leader_epoch=known)])).partitions[0]
        if not lo.error.code:
            self.saw_hw(tp, lo.offset, f"ListOffsets latest from {target.broker_id}")
            known = self.model.epoch_known[tp] = max(known, lo.leader_epoch)
        start = self.rng.randrange(0, max(self.model.hw_seen.get(tp, 0), 0) + 1)
        resp = replica_rpc.fetch(target.rm, pb.FetchRequest(replica_id=-1, max_wait_ms=0, max_bytes=1 << 20, partitions=[
            pb.FetchPartition(topic=tp[0], partition=tp[1], fetch_offset=start, current_leader_epoch=known)]))
        r = resp.partitions[0]
        if r.error.code:
            return
        if r.high_watermark >= 0:
            self.saw_hw(tp, r.high_watermark, f"Fetch from {target.broker_id}")
        if r.record_count:
            _schema, batches = R.decode_stream(r.records)
            vals = [v for b in batches for v in b.column("value").to_pylist()]
            base = r.records_base_offset
            if base + len(vals) > r.high_watermark:
                self.fail(f"I6: {tp} read offsets up to {base + len(vals)} from broker {target.broker_id} "
                          f"beyond its HW {r.high_watermark}")
            for i, v in enumerate(vals):
                self.check_value(tp, base + i, v, f"read from broker {target.broker_id}")
                self.model.read.setdefault(tp, {})[base + i] = v

    def saw_hw(self, tp: TP, hw: int, where: str) -> None:
        before = self.model.hw_seen.get(tp, -1)
        if hw < before:
            self.fail(f"I7: the HW of {tp} a reader saw went back from {before} to {hw} ({where})")
        self.model.hw_seen[tp] = hw

    def check_value(self, tp: TP, offset: int, value: bytes, where: str) -> None:
        for name, seen in (("acknowledged", self.model.acked), ("read before", self.model.read)):
            want = seen.get(tp, {}).get(offset)
            if want is not None and want != value:
                self.fail(f"I2: {tp} offset {offset} holds {value!r} ({where}) but {want!r} was {name}")

    # ------------------------------------------------------------ faults
    def crash(self, broker: SimBroker) -> None:
        self.note(f"crash broker {broker.broker_id}")
        for p in range(self.partitions):
            tp, state = (TOPIC, p), self.zk_state((TOPIC, p))
            part = broker.rm.get(tp)
            if part is not None and state is not None and broker.broker_id in state.isr \
                    and part.log.recovery_point < part.log.log_end_offset:
                key = (broker.broker_id, tp)
                self.model.crashed_in_isr[key] = max(self.model.crashed_in_isr.get(key, 0), part.log.log_end_offset)
        broker.crash()
        self.expiries[broker.broker_id] = self.step_no + self.rng.randrange(1, 15)

    def restart(self, broker: SimBroker) -> None:
        self.note(f"restart broker {broker.broker_id}")
        broker.restarts += 1
        broker.start()

    def expire_session(self, broker: SimBroker) -> None:
        self.note(f"expire the session of broker {broker.broker_id}")
        self.zookeeper.expire(broker.zk.session_id)

    def reconnect(self, broker: SimBroker) -> None:
        self.note(f"broker {broker.broker_id} reconnects to ZooKeeper")
        broker.zk.reconnect()
        broker._session_work()

    def partition_network(self) -> None:
        a, b = self.rng.sample(sorted(self.brokers), 2)
        self.network.cut.add(frozenset((a, b)))
        self.note(f"cut the link {a}-{b}")

    def all_isrs_full(self) -> bool:
        assignment = self.assignment()
        return all((s := self.zk_state((TOPIC, p))) is not None and set(s.isr) == set(r)
                   for p, r in assignment.items())

    # ------------------------------------------------------------ one step
    def random_action(self, nested=False) -> None:
        """One thing happens. In the liveness phase producers are quiet (the logs must
        become equal), readers keep reading."""
        rng = self.rng
        up = [b for b in self.up() if b.broker_id not in self.busy]
        # A controller with events to handle acts soon (it reacts in milliseconds, a
        # fetch round takes a long poll): quick successive leader changes happen.
        waiting = [b for b in self.up() if not b.controller.events.empty()]
        if waiting and rng.random() < 0.3:
            b = rng.choice(waiting)
            self.note(f"controller {b.broker_id} works")
            b.controller.do_work()
            return
        roll = rng.random()
        if roll < 0.30 and up:
            b = rng.choice(up)
            if not nested:
                self.fetch_round(b)
        elif roll < 0.45:
            self.deliver_one()
        elif roll < 0.60 and up:
            self.isr_work(rng.choice(up))
        elif roll < 0.72 and up:
            b = rng.choice(up)
            self.note(f"controller {b.broker_id} works")
            b.controller.schedule_timed_events()
            b.controller.do_work()
        elif roll < 0.84 and not nested:
            if not self.healed:
                self.produce()
        elif roll < 0.92 and not nested:
            self.consume()
        elif up and not nested:
            b = rng.choice(up)
            self.note(f"checkpoint and flush on {b.broker_id}")
            b.log_manager.checkpoint_high_watermarks(b.rm.high_watermarks())
            b.log_manager.do_work(self.clock.time_ms())

    def fault(self) -> None:
        """A crash loses the unflushed tail, so at most one broker is crashed at a time
        and a new crash comes only once every ISR is full again: f = 1 of RF = 3, as
        Kafka's guarantee assumes. A session expiry loses nothing (the broker lives on
        as a zombie until it reconnects), so it may hit any broker at any time, one
        zombie at a time; leaderships then move quickly, which is what KIP-101/279
        truncation must survive."""
        rng = self.rng
        crashed = [b for b in self.brokers.values() if not b.up]
        zombies = [b for b in self.brokers.values() if b.up and b.zk.expired]
        roll = rng.random()
        if roll < 0.25:
            if len(self.network.cut) < 2:
                self.partition_network()
        elif roll < 0.45:
            if self.network.cut:
                pair = rng.choice(sorted(self.network.cut, key=sorted))
                self.network.cut.discard(pair)
                self.note(f"heal the link {sorted(pair)}")
        elif roll < 0.65:
            if not crashed and not zombies and self.all_isrs_full():
                self.crash(rng.choice(self.up()))
        elif not zombies and self.up():
            # Mostly a partition's leader: quick leader changes are what KIP-101/279 are about.
            tp = (TOPIC, rng.randrange(self.partitions))
            state = self.zk_state(tp)
            leader = self.brokers.get(state.leader) if state is not None else None
            victim = leader if leader is not None and leader.up and rng.random() < 0.7 else rng.choice(self.up())
            self.expire_session(victim)
            if victim is leader and self.cascade is None and len(state.isr) > 2 and self.cascade_rng.random() < 0.5:
                self.cascade = (tp, victim.broker_id, -1, self.step_no + 40)

    def cascade_fault(self) -> None:
        """The partition's next leader loses its session too, a few steps after the first
        one did (two zombies at once: a session expiry loses nothing, so every record
        acknowledged is still on the last in-sync replica, which must then lead with it).
        This is where a follower that truncated to its HW on the first change, and has
        not fetched again, would lead without records acknowledged before it (KIP-101)."""
        tp, first, new_leader, due = self.cascade
        state = self.zk_state(tp)
        if new_leader < 0:
            if state is not None and state.leader not in (first, -1):   # the controller moved it: soon, the next
                self.cascade = (tp, first, state.leader, self.step_no + self.cascade_rng.randrange(0, 3))
            elif self.step_no >= due:
                self.cascade = None
            return
        if self.step_no < due:
            return
        self.cascade = None
        leader = self.brokers.get(new_leader)
        if state is not None and state.leader == new_leader and len(state.isr) > 1 and leader.up \
                and not leader.zk.expired:
            self.note(f"cascade on {tp}:")
            self.expire_session(leader)

    def recover(self) -> None:
        """Sessions of crashed brokers expire on time; the dead come back later."""
        for b in self.brokers.values():
            if not b.up and b.zk is not None and not b.zk.expired and self.expiries.get(b.broker_id, 0) <= self.step_no:
                self.expire_session(b)
            elif not b.up and b.zk.expired and self.rng.random() < 0.1:
                self.restart(b)
            elif b.up and b.zk.expired and self.rng.random() < 0.2:
                self.reconnect(b)

    def step(self, faults: bool) -> None:
        self.step_no += 1
        self.clock.advance(self.rng.randrange(0, STEP_MS_MAX))
        if faults and self.rng.random() < 0.08:
            self.fault()
        if faults and self.cascade is not None:
            self.cascade_fault()
        self.recover()
        if self.session_rng.random() < 0.01 * self.session_fault_rate:
            b = self.session_rng.choice(sorted(self.brokers))
            if self.brokers[b].up:
                self.note(f"broker {b} forgets its fetch sessions")
                self.session_faults["forgotten"] += 1
                cache = self.brokers[b].rm.fetch_sessions
                for sid in list(cache.sessions):
                    cache.remove(sid)
        self.random_action()
        self.complete_produces()
        self.checker.check()

    def fail(self, message: str) -> None:
        raise InvariantViolation(f"{message}\nreproduce with --seed {self.seed}\nlast steps:\n  "
                                 + "\n  ".join(self.trace[-25:]))

    # ------------------------------------------------------------ runs
    def run(self, safety_steps: int = 300, liveness_steps: int = 1500) -> None:
        self.checker = InvariantChecker(self)
        self.network.drop_rate = self.rng.choice([0.0, 0.05, 0.2])
        self.network.hold_rate = self.rng.choice([0.0, 0.2, 0.5])
        for _ in range(safety_steps):
            self.step(faults=True)
        # Liveness: heal everything, bring everyone back; then no faults.
        self.network.heal()
        self.healed = True
        self.note("heal")
        for b in self.brokers.values():
            if not b.up:
                if not b.zk.expired:
                    self.expire_session(b)
                self.restart(b)
            elif b.zk.expired:
                self.reconnect(b)
        for i in range(liveness_steps):
            self.step(faults=False)
            if i % 20 == 0 and self.converged():
                self.checker.check_final()
                return
        self.fail(f"liveness: not converged {liveness_steps} steps after healing: "
                  f"{self.convergence_problem()}")

    def close(self) -> None:
        for b in self.brokers.values():
            if b.up:
                b.up = False
                for log_ in b.log_manager.logs().values():
                    log_.close()
                for d in b.log_manager._dirs:
                    d.release()
        shutil.rmtree(self.root, ignore_errors=True)

    def converged(self) -> bool:
        return self.convergence_problem() is None

    def convergence_problem(self) -> str | None:
        assignment = self.assignment()
        for p, replicas in assignment.items():
            tp = (TOPIC, p)
            s = self.zk_state(tp)
            if s is None or s.leader < 0 or set(s.isr) != set(replicas):
                return f"{tp}: state {s} (replicas {replicas})"
            leos = {}
            for b in replicas:
                part = self.brokers[b].rm.get(tp)
                if part is None:
                    return f"{tp}: broker {b} has no replica"
                leos[b] = (part.log.log_end_offset, part.hw)
            if len(set(leos.values())) != 1:
                return f"{tp}: replicas differ in (LEO, HW): {leos}"
            leader = self.brokers[s.leader].rm.get(tp)
            if leader.role != LEADER or leader.leader_epoch != s.leader_epoch:
                return f"{tp}: broker {s.leader} is not leading epoch {s.leader_epoch}"
        return None


class InvariantChecker:
    """I1-I8 of ARCHITECTURE.md, over the real brokers' state and what clients saw."""

    def __init__(self, sim: Simulation):
        self.sim = sim
        self.cache: dict = {}       # (broker, tp) -> (log identity, LEO, values)
        self.verified: dict = {}    # (broker, tp) -> (log identity, offset checked below)
        self.i1_checked: dict = {}  # (broker, tp) -> (log identity, LEO, acknowledged count)

    def values(self, broker: int, tp: TP, part) -> list[bytes]:
        log_ = part.log
        key = (broker, tp)
        ident = (id(log_), log_._generation, log_.log_start_offset)
        leo = log_.log_end_offset
        cached = self.cache.get(key)
        if cached is not None and cached[0] == ident and cached[1] <= leo:
            vals = cached[2] + values_of(log_, cached[1], leo) if cached[1] < leo else cached[2]
        else:
            vals = values_of(log_, log_.log_start_offset, leo)
        self.cache[key] = (ident, leo, vals)
        return vals

    def check(self) -> None:
        sim = self.sim
        for p in range(sim.partitions):
            tp = (TOPIC, p)
            state = sim.zk_state(tp)
            acked = sim.model.acked.get(tp, {})
            replicas = {}
            for b in sim.up():
                part = b.rm.get(tp)
                if part is None:
                    continue
                vals = self.values(b.broker_id, tp, part)
                hw = part.hw
                if hw > part.log.log_end_offset:
                    sim.fail(f"{tp}: broker {b.broker_id} HW {hw} is beyond its LEO {part.log.log_end_offset}")
                # I2: what a replica holds below its HW is what was acknowledged or read.
                # Records only change by truncation (a new log identity): check each once.
                ident = self.cache[(b.broker_id, tp)][0]
                lso = part.log.log_start_offset
                done = self.verified.get((b.broker_id, tp))
                start = done[1] if done is not None and done[0] == ident else lso
                for off in range(max(start, lso), hw):
                    sim.check_value(tp, off, vals[off - lso], f"below the HW of broker {b.broker_id}")
                self.verified[(b.broker_id, tp)] = (ident, max(start, hw))
                replicas[b.broker_id] = (part, vals)
            if state is not None and state.leader in replicas:
                self.documented_loss(tp, state, replicas[state.leader][0])
            # I1: the current leader holds every acknowledged record.
            if state is not None and state.leader in replicas:
                part, vals = replicas[state.leader]
                mark = (self.cache[(state.leader, tp)][0], part.log.log_end_offset, len(acked))
                if part.role == LEADER and part.leader_epoch == state.leader_epoch \
                        and self.i1_checked.get((state.leader, tp)) != mark:
                    self.i1_checked[(state.leader, tp)] = mark
                    for off, v in acked.items():
                        if off >= part.log.log_end_offset or vals[off - part.log.log_start_offset] != v:
                            sim.fail(f"I1: acknowledged {tp} offset {off} ({v!r}) is not on the leader "
                                     f"{state.leader} (epoch {state.leader_epoch}, LEO {part.log.log_end_offset})")

    def documented_loss(self, tp: TP, state, part) -> None:
        """The loss README's guarantees leave out, and only it: the partition went offline
        with its last leader alone in the ISR (the last-leader rule), that leader had
        crashed while in the ISR losing unflushed records and has not left the ISR
        since, and it now leads again from its shorter log. Records at or beyond its end
        offset are gone: acknowledged ones, values read and the HW readers saw are taken
        back from there, readers move to the new epoch (a reader of a zombie's older
        epoch reads the lost history), and the loss is kept in ``documented_losses`` and
        the trace. Anything else is still a violation: an offline ISR with more members
        (whoever of them leads, the others held the records), an ISR member that never
        crashed, or a record the leader never held (beyond its end offset at the crash)."""
        sim, model = self.sim, self.sim.model
        if part is None or part.role != LEADER or part.leader_epoch != state.leader_epoch:
            return
        offline_isr = model.offline_isr.pop(tp, None)
        if offline_isr != (state.leader,) or not all((b, tp) in model.crashed_in_isr for b in state.isr):
            return
        held_end = model.crashed_in_isr[(state.leader, tp)]
        start = part.log.log_end_offset
        acked = model.acked.get(tp, {})
        hw_seen = model.hw_seen.get(tp, -1)
        if hw_seen > held_end or any(off >= held_end for off in acked):
            return   # committed beyond what the leader ever held: not this case (I1/I7 say so)
        lost = sorted(off for off in acked if off >= start)
        if not lost and hw_seen <= start:
            return
        for off in lost:
            del acked[off]
        for off in [o for o in model.read.get(tp, {}) if o >= start]:
            del model.read[tp][off]
        model.hw_seen[tp] = min(hw_seen, start)
        model.epoch_known[tp] = max(model.epoch_known.get(tp, -1), state.leader_epoch)
        model.documented_losses.append((sim.step_no, tp, state.leader, start, hw_seen, len(lost)))
        sim.note(f"documented loss on {tp}: last leader {state.leader}, alone in the ISR, crashed and leads epoch "
                 f"{state.leader_epoch} without [{start}, {held_end}): HW seen {hw_seen}, {len(lost)} acked lost")

    def check_final(self) -> None:
        """After healing: identical replicas (I5), full ISRs (I8, in convergence), every
        acknowledged record readable by a consumer (I1)."""
        sim = self.sim
        self.check()
        for p, replicas in sim.assignment().items():
            tp = (TOPIC, p)
            logs = {b: self.values(b, tp, sim.brokers[b].rm.get(tp)) for b in replicas}
            first = logs[replicas[0]]
            for b, vals in logs.items():
                if vals != first:
                    sim.fail(f"I5: after healing {tp} replicas {replicas[0]} and {b} differ")
            for off, v in sim.model.acked.get(tp, {}).items():
                if off >= len(first) or first[off] != v:
                    sim.fail(f"I1: acknowledged {tp} offset {off} is gone after healing")
