"""The broker's side of the scale bench's failover rows, in one process, no cluster.

One survivor (broker 1 of brokers 1-3, RF=3) with N partitions on a temp dir: a
real LogManager, ReplicaManager and metadata cache, driven as its RPC shell
(``broker/replica_rpc.py``) drives them, from protobuf wire bytes. The fetcher
manager only records what it is asked (no fetches run), ZooKeeper is not used.
Each round, in a fresh child process:

* take-up: one LeaderAndIsr of all N partitions, leaders 1, 2, 3 in turn (epoch 0);
  take-up-again: the same request again, as a controller resends one it timed out on;
  then every log's files and mappings are released as idle (the broker does so after
  ``log.idle.release.ms``, 60 s, long before a failover at this size);
* failover: broker 3 died: one LeaderAndIsr of its N/3 partitions, half led by
  broker 1 now (epoch 1), half by broker 2 (broker 1 follows); failover-um: the
  UpdateMetadata of those new leaders; isr-lai and isr-um: the controller's second
  round, broker 3 taken out of the ISRs of the 2N/3 partitions whose leader lives
  (the same leader epoch), a LeaderAndIsr and an UpdateMetadata. These four are
  handled by the RPC layer's own methods (``rpc_server.BrokerServicer``: the
  control-plane guard, ZooKeeper's answers scripted, with the collector paused);
* first write: one acks=1 Produce of one record to each partition broker 1 now
  leads (what the bench's ``_write_all`` sends), wire bytes in, wire bytes out;
* second write: the same again (a later write to a leader); with ``--gil-load K``,
  K threads run pure Python through both writes, as a loaded survivor's fetchers
  and RPC threads do: a write that gives the GIL up and takes it back often waits
  for the others' switch interval each time;
* the background passes a broker runs every 0.5 s and 1 s (ISR maintenance, log
  maintenance), twice each, with nothing for them to change;
* a replication round with nothing new, the two sides of what runs back to back
  while the writes go on: fetch-serve, broker 2's follower fetch of every partition
  broker 1 leads (wire bytes in, the follower codec's bytes out, no wait); and
  fetch-follow, one round of broker 1's fetcher of the partitions it follows from
  broker 2 (its request's wire bytes made, a recorded answer of that leader decoded
  and applied); in an incremental fetch session (KIP-227) once the code has them,
  the round after the full fetch that opened it;
* follow-write: the follower's side of the writes: one answer naming every partition
  broker 1 follows from broker 2, each with the two batches the writes made, applied
  by broker 1's fetcher (beside the same ``--gil-load``).

``--root DIR`` loads the package from another worktree (DIR/python/replikafka,
DIR/broker) to compare an older commit with this one, rounds interleaved::

    python bench/failover_inproc.py --partitions 20000 --rounds 3 [--root /work/wt-old ...]

Prints per round and code version each phase's wall and CPU seconds (this process)
and the 1-minute load.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from controller_inproc import _load_from  # noqa: E402

TOPIC = "scale"


class _NoWrites:
    """The ZooKeeper store's ISR writes, for a pass that has none to make."""

    def update_partition_states(self, updates):
        assert not updates, updates[:3]
        return []

    def notify_isr_change(self, changed):
        pass


class _RecordingFetchers:
    def __init__(self):
        self.following: dict = {}

    def add_partitions(self, partitions):
        self.following.update(partitions)

    def remove_partitions(self, tps):
        for tp in tps:
            self.following.pop(tp, None)

    def remove_partition(self, tp):
        self.remove_partitions([tp])

    def shutdown(self):
        pass


def child(args) -> None:
    if args.root:
        _load_from(args.root[0])
    from replikafka import records as R
    from replikafka.broker import replica_fetch_codec, replica_rpc
    from replikafka.broker.replica import messages as M
    from replikafka.broker.replica.replica_fetcher import ReplicaFetcher
    from replikafka.broker.config import BrokerConfig, log_config_for_topic
    from replikafka.broker.metadata_cache import MetadataCache
    from replikafka.broker.replica.replica_manager import ReplicaManager
    from replikafka.broker.server import PartitionLogs
    from replikafka.broker.storage import LogManager
    from replikafka.broker.storage.clock import SYSTEM_CLOCK
    from replikafka.protocol import replikafka_pb2 as pb

    n = args.partitions
    tmp = tempfile.mkdtemp(prefix="fo-inproc-", dir=args.dir)
    # The followers here never fetch: a lag time longer than any round keeps the ISR passes
    # what they measure, a scan with nothing to change (a slow round under --gil-load
    # outlasted the default 30 s and the passes found every follower behind).
    cfg = BrokerConfig.from_dict({"broker.id": 1, "zookeeper.connect": "unused:1", "log.dirs": tmp,
                                  "replica.lag.time.max.ms": 3_600_000})
    # The process settings a broker starts with (the collector's threshold above all: with
    # Python's default, young collections inside each big request promote its objects and
    # full ones walk every object held); code from before tune_process had none.
    from replikafka.broker import server as broker_server
    if hasattr(broker_server, "tune_process"):
        broker_server.tune_process(cfg)
    logs = LogManager([tmp], log_config_for_topic(cfg, {}), clock=SYSTEM_CLOCK)
    metadata = MetadataCache()
    metadata.broker_epochs = {1: 10, 2: 20, 3: 30}
    rm = ReplicaManager(1, cfg, PartitionLogs(cfg, logs), None, metadata, _RecordingFetchers(), SYSTEM_CLOCK)
    rm.registered_epoch = 10
    topic_schema = R.parse_schema("value BINARY")
    schema = R.schema_to_bytes(R.stored_schema(topic_schema))

    def add_states(req, states, epoch):
        """(partition, leader, leader epoch, ISR[, znode version: the epoch if not given])."""
        for p, leader, leader_epoch, isr, *version in states:
            req.partitions.add(topic=TOPIC, partition=p, leader=leader, leader_epoch=leader_epoch, isr=isr,
                               replicas=[1, 2, 3], zk_version=version[0] if version else leader_epoch,
                               controller_epoch=epoch)
        return req.SerializeToString()

    def lai(states, epoch) -> bytes:
        req = pb.LeaderAndIsrRequest(controller_id=2, controller_epoch=epoch, broker_epoch=10)
        t = req.topics.add()
        t.name, t.schema, t.topic_id = TOPIC, schema, "tid"
        return add_states(req, states, epoch)

    def um(states, epoch) -> bytes:
        req = pb.UpdateMetadataRequest(controller_id=2, controller_epoch=epoch)
        for b in (1, 2):
            req.live_brokers.add(id=b, host="127.0.0.1", port=9000 + b, broker_epoch=10 * b)
        return add_states(req, states, epoch)

    class Truth:
        """What ZooKeeper says after broker 3 died (the guard's ClusterTruth)."""
        def controller_epoch(self): return (1, 0)
        def get_controller_id(self): return 2
        def get_assignment(self, topic): return {p: [1, 2, 3] for p in range(n)}
        def assignment_version(self, topic): return 7
        def live_brokers(self, epochs=None):
            if epochs is not None:
                epochs.update({1: 10, 2: 20})
            return {1: ("127.0.0.1", 9001), 2: ("127.0.0.1", 9002)}

    from types import SimpleNamespace
    from replikafka.broker.control_plane_guard import ControlPlaneGuard
    from replikafka.broker.rpc_server import BrokerServicer
    from replikafka.broker.wire_limits import WireLimits
    # The RPC layer's own handlers of controller requests (the guard, the paused
    # collector, the replica manager and metadata cache), over this process's parts.
    servicer = BrokerServicer(SimpleNamespace(replica_manager=rm, admin_manager=None, config=cfg, metadata=metadata,
                                              control_guard=ControlPlaneGuard(Truth(), WireLimits())))

    def controller_request(kind: str, wire: bytes):
        """A controller's request, parsed and handled by ``rpc_server.BrokerServicer``."""
        if kind == "LeaderAndIsr":
            out = servicer.LeaderAndIsr(pb.LeaderAndIsrRequest.FromString(wire), None)
            refused = [r for r in out.partitions if r.error.code]
            assert not out.error.code and not refused, (out.error, refused[:3])
        else:
            out = servicer.UpdateMetadata(pb.UpdateMetadataRequest.FromString(wire), None)
            assert not out.error.code, out.error

    b = R.to_record_batch([{"value": b"x"}], topic_schema, timestamp_ms=0)
    payload = R.encode_stream(b.schema, [b]).to_pybytes()
    crc = R.records_crc32c(payload)
    out = {}
    # Full (generation 2) garbage collections: which phase holds them moves with any
    # change in what the process allocates, and one takes ~0.6 s at 50,000 partitions.
    import gc
    full_gc = [0.0, 0.0]     # (pause seconds so far, start of the one running)

    def on_gc(phase, info):
        if info["generation"] == 2:
            if phase == "start":
                full_gc[1] = time.perf_counter()
            else:
                full_gc[0] += time.perf_counter() - full_gc[1]
    gc.callbacks.append(on_gc)

    def timed(name, fn):
        w, c, g = time.perf_counter(), time.process_time(), full_gc[0]
        r = fn()
        out[name] = (time.perf_counter() - w, time.process_time() - c, full_gc[0] - g)
        return r

    take_up = lai([(p, 1 + p % 3, 0, [1, 2, 3]) for p in range(n)], 1)
    timed("take-up", lambda: replica_rpc.leader_and_isr(rm, metadata, pb.LeaderAndIsrRequest.FromString(take_up)))
    # The same request again, as a controller resends one it timed out waiting for.
    timed("take-up-again", lambda: replica_rpc.leader_and_isr(rm, metadata,
                                                              pb.LeaderAndIsrRequest.FromString(take_up)))
    now = SYSTEM_CLOCK.time_ms()
    for p in range(n):
        logs.get_log(TOPIC, p).release_if_idle(now + 1, 0)
    victims = [p for p in range(n) if p % 3 == 2]
    mine = victims[0::2]
    failover = lai([(p, 1 if i % 2 == 0 else 2, 1, [1, 2]) for i, p in enumerate(victims)], 1)
    produce = pb.ProduceRequest(acks=1, timeout_ms=30000, partitions=[
        pb.PartitionProduceData(topic=TOPIC, partition=p, records=payload, records_crc32c=crc)
        for p in mine]).SerializeToString()
    timed("failover-lai", lambda: controller_request("LeaderAndIsr", failover))
    # The metadata of those new leaders, as every broker is sent it.
    moved_um = um([(p, 1 if i % 2 == 0 else 2, 1, [1, 2], 1) for i, p in enumerate(victims)], 1)
    timed("failover-um", lambda: controller_request("UpdateMetadata", moved_um))
    # Then the controller takes the dead broker out of the ISRs of the partitions whose
    # leader lives (the same leader epoch, the state's next ZooKeeper version): a
    # LeaderAndIsr and an UpdateMetadata of 2N/3 partitions, while the writes go on.
    shrunk = [(p, 1 + p % 3, 0, [1 + p % 3, 2 - p % 3], 1) for p in range(n) if p % 3 != 2]
    timed("isr-lai", lambda: controller_request("LeaderAndIsr", lai(shrunk, 1)))
    timed("isr-um", lambda: controller_request("UpdateMetadata", um(shrunk, 1)))

    def write():
        resp = replica_rpc.produce_response(rm.produce(replica_rpc.produce_request(
            pb.ProduceRequest.FromString(produce))))
        errors = [r for r in resp.partitions if r.error.code]
        assert not errors, errors[:3]
        return resp.SerializeToString()

    stop_load = threading.Event()

    def spin():   # another thread's pure-Python work, as a broker's fetchers and RPCs are
        while not stop_load.is_set():
            sum(range(2000))

    if args.switch_interval_ms:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    for _ in range(args.gil_load):
        threading.Thread(target=spin, daemon=True).start()
    if args.profile_pause:
        print("PID", os.getpid(), flush=True)
        time.sleep(args.profile_pause)
    timed("first-write", write)
    timed("second-write", write)
    stop_load.set()
    # Steady-state background passes (server.py runs them every 0.5 s and 1 s): the
    # first ISR pass and log pass after the writes, then a later one of each.
    rm.store = _NoWrites()
    clock_ms = SYSTEM_CLOCK.time_ms
    timed("isr-pass-1", rm.do_isr_work)
    timed("isr-pass-2", rm.do_isr_work)
    timed("log-pass-1", lambda: logs.do_work(clock_ms()))
    timed("log-pass-2", lambda: logs.do_work(clock_ms()))
    led = [p for p in range(n) if rm.get((TOPIC, p)).role == "leader"]
    # A follower that names the HW it holds hears only of partitions with news (since
    # this field came in); before, every partition it named was in each answer.
    hw_known = "follower_high_watermark" in pb.FetchPartition.DESCRIPTOR.fields_by_name
    # Followers in incremental fetch sessions (since they came in): the measured round is
    # a session's fetch with nothing new; before, a fetch naming every partition.
    sessions = "session_epoch" in pb.FetchRequest.DESCRIPTOR.fields_by_name

    def follower_request(**session) -> bytes:
        return pb.FetchRequest(replica_id=2, replica_epoch=20, max_wait_ms=0, min_bytes=1, max_bytes=10 << 20,
                               partitions=[pb.FetchPartition(
                                   topic=TOPIC, partition=p, fetch_offset=rm.get((TOPIC, p)).log.log_end_offset,
                                   current_leader_epoch=rm.get((TOPIC, p)).leader_epoch, partition_max_bytes=1 << 20,
                                   **({"follower_high_watermark": rm.get((TOPIC, p)).hw} if hw_known else {}))
                                   for p in led], **session).SerializeToString()

    def fetch_serve(serve: bytes):
        answer = replica_fetch_codec.encode(replica_rpc.follower_fetch(rm, pb.FetchRequest.FromString(serve)))
        return replica_fetch_codec.decode(answer)

    if sessions:
        # The full fetch opening the session (the HWs move), the follower naming the HWs
        # it learnt; then a fetch of that session with nothing new.
        sid = fetch_serve(follower_request(session_epoch=0)).session_id
        assert sid
        fetch_serve(follower_request(session_id=sid, session_epoch=1))
        serve = pb.FetchRequest(replica_id=2, replica_epoch=20, max_wait_ms=0, min_bytes=1, max_bytes=10 << 20,
                                session_id=sid, session_epoch=2).SerializeToString()
    else:
        fetch_serve(follower_request())   # the follower caught up with the writes (the HWs move)
        serve = follower_request()
    answered = timed("fetch-serve", lambda: len(fetch_serve(serve).partitions))
    assert answered == (0 if hw_known else len(led)), answered
    followed = {tp: epoch for tp, (leader, epoch) in rm.fetchers.following.items() if leader == 2}
    answer = replica_fetch_codec.encode(replica_rpc.follower_fetch_response(
        M.FetchResponse([], session_id=7) if sessions else [] if hw_known else [
            M.FetchPartitionResult(tp[0], tp[1], None, 0, 0, 0) for tp in followed]))

    class RecordedLeader:
        def fetch(self, request, timeout_s):
            replica_rpc.fetch_request_pb(request).SerializeToString()
            return replica_rpc.follower_fetch_results(replica_fetch_codec.decode(answer))

    fetcher = ReplicaFetcher(1, 2, RecordedLeader(), rm.get, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20,
                             backoff_ms=1000, request_timeout_s=30)
    fetcher.add_many(followed)
    for st in fetcher.states.values():
        st.truncating = False
    if sessions:
        fetcher.do_work()                 # the full fetch opening the session
    timed("fetch-follow", fetcher.do_work)
    # The follower's side of the writes: one answer naming every partition broker 1
    # follows from broker 2, each with the two batches the writes left (the stored
    # bytes of a partition broker 1 leads: the same messages broker 2 would send),
    # applied as the fetcher applies any answer, beside the same --gil-load.
    wrote = rm.get((TOPIC, mine[0])).log.read_raw(0, 1 << 20)
    answer = replica_fetch_codec.encode(replica_rpc.follower_fetch_response(M.FetchResponse([
        M.FetchPartitionResult(tp[0], tp[1], None, wrote.record_count, wrote.record_count, 0, wrote.data, 0,
                               wrote.record_count) for tp in followed], session_id=7)))
    stop_load.clear()
    for _ in range(args.gil_load):
        threading.Thread(target=spin, daemon=True).start()
    timed("follow-write", fetcher.do_work)
    stop_load.set()
    behind = [tp for tp in followed if rm.get(tp).log.log_end_offset != wrote.record_count]
    assert not behind, f"{len(behind)} followers did not append the writes, e.g. {behind[:3]}"
    out["mine"] = len(mine)
    out["fetch"] = (len(led), len(followed))
    print("RESULT " + json.dumps(out), flush=True)
    logs.close()
    # Each round made N log dirs and left them: a few dozen rounds had filled /tmp with 29 GB.
    shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", action="append", default=[], help="another worktree to compare (repeatable)")
    ap.add_argument("--child", action="store_true")
    ap.add_argument("--dir", default=None, help="where the temp log dirs go")
    ap.add_argument("--profile-pause", type=float, default=0, help="child: print its pid and sleep first")
    ap.add_argument("--switch-interval-ms", type=float, default=0, help="child: sys.setswitchinterval (0: as is)")
    ap.add_argument("--gil-load", type=int, default=0,
                    help="threads running pure Python beside the writes (a loaded broker's fetchers and RPCs)")
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    roots = [""] + args.root
    for r in range(args.rounds):
        for root in roots:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", "--partitions", str(args.partitions),
                   "--gil-load", str(args.gil_load), "--switch-interval-ms", str(args.switch_interval_ms),
                   "--profile-pause", str(args.profile_pause)] \
                + (["--root", root] if root else []) + (["--dir", args.dir] if args.dir else [])
            load = os.getloadavg()[0]
            res = subprocess.run(cmd, capture_output=True, text=True)
            line = next((l for l in res.stdout.splitlines() if l.startswith("RESULT ")), None)
            if line is None:
                print(res.stdout[-2000:], res.stderr[-4000:])
                raise SystemExit(f"round {r} {root or 'this'} failed")
            got = json.loads(line[7:])
            phases = "  ".join(f"{k} {v[0]:7.3f}s (cpu {v[1]:6.3f}" + (f", full gc {v[2]:.3f}" if v[2] else "")
                               + ")" for k, v in got.items() if k not in ("mine", "fetch"))
            print(f"round {r} {root or 'this':16s} load {load:5.2f}/{os.getloadavg()[0]:5.2f}  "
                  f"leads {got['mine']} (fetches serve/follow {got.get('fetch')})  {phases}", flush=True)


if __name__ == "__main__":
    main()
