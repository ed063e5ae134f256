"""A broker's Prometheus metrics, named after Kafka's JMX beans as the Prometheus
JMX exporter renders them for Kafka (its ``kafka-2_0_0.yml`` rules, lower-cased):

* a gauge ``kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions``
  becomes ``kafka_server_replicamanager_underreplicatedpartitions``;
* a meter ``...,name=IsrShrinksPerSec`` becomes the counter
  ``kafka_server_replicamanager_isrshrinks_total`` (``PerSec`` dropped);
* bean keys such as ``topic=``, ``request=``, ``error=`` become labels;
* Kafka's timers and histograms (``TotalTimeMs``, ``EventQueueTimeMs``) are
  Prometheus histograms here (``_bucket``/``_sum``/``_count``) instead of the
  exporter's pre-computed percentiles, so they aggregate across brokers.

The README's "Monitoring" section has the full table.

Two kinds of metrics, so nothing is counted per record and nothing is computed
on a hot path that a scrape can compute:

* **state gauges** (partition counts, lag, log sizes, controller state) are read
  from the broker's objects when Prometheus scrapes, by the collectors below;
* **event counters** (bytes in/out per topic, ISR changes, elections, per-RPC
  requests, errors and latency) are plain integers bumped once per request,
  per partition of a request or per batch (:class:`ReplicaStats`,
  :class:`ControllerStats`, :class:`RequestMetrics`), rendered at scrape time.

Every broker has its own :class:`prometheus_client.CollectorRegistry` (never
the process-wide default), so several brokers in one test process each export
their own numbers.

Thread-safety: the stats objects take a lock per update (a few hundred
nanoseconds); collectors read the broker's state without holding its locks for
long (snapshots of the partition map, one partition lock at a time).
"""
from __future__ import annotations

import gc
import threading
import time
from typing import Iterable

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

#: Request latency buckets, in ms (Kafka's RequestMetrics times are in ms).
LATENCY_BUCKETS_MS = (0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000)
#: gRPC method -> Kafka's ``request=`` name (its RequestMetrics split Fetch into consumer and follower).
KAFKA_REQUEST_NAMES = {
    "Fetch": "FetchConsumer",
    "ReplicaFetch": "FetchFollower",
    "CreateTopic": "CreateTopics",
    "DeleteTopic": "DeleteTopics",
}
ZK_SESSION_STATES = ("CONNECTED", "SUSPENDED", "LOST")
#: BrokerTopicMetrics counters: (name, index in a ReplicaStats row, help).
TOPIC_COUNTERS = (("bytesin", 0, "Bytes produced to the topic"),
                  ("messagesin", 1, "Records produced to the topic"),
                  ("bytesout", 2, "Bytes fetched from the topic by consumers"),
                  ("messagesout", 3, "Records fetched from the topic by consumers (no Kafka counterpart)"),
                  ("replicationbytesout", 4, "Bytes fetched from the topic by followers"))


# ---------------------------------------------------------------- event counters
class ReplicaStats(Collector):
    """Counters of the replica manager's hot paths: per topic bytes and messages
    in (produce) and out (consumer fetch, follower fetch), ISR shrinks and expands.
    Called once per partition of a request, never per record. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        # topic -> [bytes in, messages in, bytes out, messages out, replication bytes out]
        self._topics: dict[str, list[int]] = {}
        self.isr_shrinks = 0
        self.isr_expands = 0

    def _row(self, topic: str) -> list[int]:
        row = self._topics.get(topic)
        if row is None:
            row = self._topics.setdefault(topic, [0, 0, 0, 0, 0])
        return row

    def produced(self, topic: str, size_bytes: int, records: int) -> None:
        with self._lock:
            row = self._row(topic)
            row[0] += size_bytes
            row[1] += records

    def fetched(self, topic: str, size_bytes: int, records: int, follower: bool) -> None:
        with self._lock:
            row = self._row(topic)
            if follower:
                row[4] += size_bytes
            else:
                row[2] += size_bytes
                row[3] += records

    def isr_changed(self, old_size: int, new_size: int) -> None:
        with self._lock:
            if new_size < old_size:
                self.isr_shrinks += 1
            elif new_size > old_size:
                self.isr_expands += 1

    def snapshot(self) -> tuple[dict[str, tuple[int, ...]], int, int]:
        with self._lock:
            return {t: tuple(r) for t, r in self._topics.items()}, self.isr_shrinks, self.isr_expands

    def collect(self):
        topics, shrinks, expands = self.snapshot()
        yield CounterMetricFamily("kafka_server_replicamanager_isrshrinks", "ISR shrinks by leaders here",
                                  value=shrinks)
        yield CounterMetricFamily("kafka_server_replicamanager_isrexpands", "ISR expansions by leaders here",
                                  value=expands)
        for name, i, doc in TOPIC_COUNTERS:
            c = CounterMetricFamily(f"kafka_server_brokertopicmetrics_{name}", doc, labels=["topic"])
            for topic, row in sorted(topics.items()):
                c.add_metric([topic], row[i])
            yield c


class NoReplicaStats(ReplicaStats):
    """``metrics.recording.enable=false``: the hot paths count nothing."""

    def produced(self, topic, size_bytes, records):
        return None

    def fetched(self, topic, size_bytes, records, follower):
        return None

    def isr_changed(self, old_size, new_size):
        return None


class ControllerStats:
    """The controller's counters and event timings (Kafka's ControllerStats and
    ControllerEventManager). Updated by the controller's event thread only;
    read by scrapes (ints and prometheus histograms are safe to read)."""

    def __init__(self):
        self.leader_elections = 0
        self.unclean_leader_elections = 0
        self.event_queue_time = Histogram(
            "kafka_controller_controllereventmanager_eventqueuetimems",
            "Time an event waited in the controller's queue (ms)", buckets=LATENCY_BUCKETS_MS, registry=None)
        self.event_processing_time = Histogram(
            "kafka_controller_controllereventmanager_eventqueueprocessingtimems",
            "Time the controller took to handle an event (ms)", buckets=LATENCY_BUCKETS_MS, registry=None)

    def elections(self, leaders_before: Iterable[int], leaders_after: Iterable[int]) -> None:
        """States written: each partition whose leader changed is one leader election."""
        self.leader_elections += sum(1 for a, b in zip(leaders_before, leaders_after) if a != b and b >= 0)

    def unclean_election(self) -> None:
        self.unclean_leader_elections += 1

    def event_done(self, queued_s: float, processing_s: float) -> None:
        self.event_queue_time.observe(queued_s * 1000.0)
        self.event_processing_time.observe(processing_s * 1000.0)


class RequestMetrics:
    """The RPC pipeline's observer (``broker/rpc_server.py`` calls :meth:`observe`
    once per finished call): Kafka's RequestMetrics ``RequestsPerSec``,
    ``ErrorsPerSec`` (by error code) and ``TotalTimeMs``. Other request paths
    (Arrow Flight reads) call :meth:`observe` with their own method name."""

    def __init__(self):
        self._lock = threading.Lock()
        self._requests: dict[str, int] = {}
        self._errors: dict[tuple[str, str], int] = {}
        self.total_time = Histogram("kafka_network_requestmetrics_totaltimems",
                                    "Time from request received to response sent (ms)", ["request"],
                                    buckets=LATENCY_BUCKETS_MS, registry=None)
        self._timers: dict[str, object] = {}

    def observe(self, method: str, seconds: float, error_code: str) -> None:
        request = KAFKA_REQUEST_NAMES.get(method, method)
        timer = self._timers.get(request)
        if timer is None:
            timer = self._timers.setdefault(request, self.total_time.labels(request))
        with self._lock:
            self._requests[request] = self._requests.get(request, 0) + 1
            if error_code:
                key = (request, error_code)
                self._errors[key] = self._errors.get(key, 0) + 1
        timer.observe(seconds * 1000.0)

    def collect(self):
        with self._lock:
            requests, errors = dict(self._requests), dict(self._errors)
        c = CounterMetricFamily("kafka_network_requestmetrics_requests", "Requests handled", labels=["request"])
        for request, n in sorted(requests.items()):
            c.add_metric([request], n)
        yield c
        e = CounterMetricFamily("kafka_network_requestmetrics_errors", "Requests that failed, by error code",
                                labels=["request", "error"])
        for (request, code), n in sorted(errors.items()):
            e.add_metric([request, code], n)
        yield e
        yield from self.total_time.collect()


#: Flight method -> the ``request=`` label of its RequestMetrics (Kafka has no Flight; our names).
# A DoPut is a producer's open append stream (counted when it ends); each group of
# appends it carries is Kafka's Produce request, counted by the Flight server itself
# (BrokerFlightServer.observe_produce): operators watch one Produce family.
FLIGHT_REQUEST_NAMES = {"DO_GET": "FlightDoGet", "GET_FLIGHT_INFO": "FlightGetFlightInfo",
                        "GET_SCHEMA": "FlightGetSchema", "LIST_FLIGHTS": "FlightListFlights",
                        "DO_PUT": "FlightDoPut"}


def flight_middleware_factory(requests: "RequestMetrics"):
    """Arrow Flight server middleware reporting each call to ``requests`` once, when
    it completes (for DoGet: when the last batch was sent), with the error code a
    failed call carried (``to_flight_error`` puts it in the error's extra info)."""
    import pyarrow.flight as fl

    class _Call(fl.ServerMiddleware):
        def __init__(self, method: str):
            self.method = method
            self.started = time.perf_counter()

        def call_completed(self, exception):
            code = ""
            if exception is not None:
                extra = getattr(exception, "extra_info", None) or b""
                code = extra.decode("ascii", "replace") if isinstance(extra, bytes) and extra.isupper() \
                    else type(exception).__name__
            requests.observe(self.method, time.perf_counter() - self.started, code)

    class _Factory(fl.ServerMiddlewareFactory):
        def start_call(self, info, headers):
            name = info.method.name
            return _Call(FLIGHT_REQUEST_NAMES.get(name, f"Flight{name.title().replace('_', '')}"))

    return _Factory()


class NoRequestMetrics(RequestMetrics):
    def observe(self, method, seconds, error_code):
        return None


class ZkSessionStats:
    """ZooKeeper session transitions seen by the broker's kazoo listener."""

    def __init__(self):
        self.expirations = 0
        self.disconnects = 0

    def state_changed(self, state: str) -> None:
        if state == "LOST":
            self.expirations += 1
        elif state == "SUSPENDED":
            self.disconnects += 1


# ---------------------------------------------------------------- scrape-time collectors
def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


class ReplicaManagerCollector(Collector):
    """ReplicaManager, BrokerTopicMetrics, ReplicaFetcherManager and per-partition
    Log gauges, from the replica manager's partitions at scrape time."""

    def __init__(self, replica_manager, fetchers):
        self.rm = replica_manager
        self.fetchers = fetchers

    def collect(self):
        from replikafka.broker.replica.partition import LEADER
        with self.rm.lock:
            parts = list(self.rm.partitions.values())
        leaders = under_replicated = under_min_isr = at_min_isr = producer_ids = 0
        max_follower_lag = 0
        size = GaugeMetricFamily("kafka_log_log_size", "Bytes of the partition's log on this broker",
                                 labels=["topic", "partition"])
        segments = GaugeMetricFamily("kafka_log_log_numlogsegments", "Segments of the partition's log",
                                     labels=["topic", "partition"])
        start = GaugeMetricFamily("kafka_log_log_logstartoffset", "First offset of the partition's log",
                                  labels=["topic", "partition"])
        end = GaugeMetricFamily("kafka_log_log_logendoffset", "Offset after the last record of the log",
                                labels=["topic", "partition"])
        for part in parts:
            labels = [part.topic, str(part.partition)]
            log_ = part.log
            with part.lock:
                role, isr, replicas, st = part.role, part.isr, part.replicas, part.leader_state
                built = part.producers_if_built    # counting must not build every partition's state
                producer_ids += len(built.producers) if built is not None else 0
                leo = log_.log_end_offset
                if role == LEADER and st is not None:
                    leaders += 1
                    min_isr = log_.config.min_insync_replicas
                    under_replicated += len(isr) < len(replicas)
                    under_min_isr += len(isr) < min_isr
                    at_min_isr += len(isr) == min_isr
                    for p in st.progress.values():
                        if p.leo >= 0:
                            max_follower_lag = max(max_follower_lag, leo - p.leo)
            segs = log_.segments()
            size.add_metric(labels, sum(s.size for s in segs))
            segments.add_metric(labels, len(segs))
            start.add_metric(labels, log_.log_start_offset)
            end.add_metric(labels, leo)
        yield _gauge("kafka_server_replicamanager_partitioncount", "Partitions on this broker", len(parts))
        yield _gauge("kafka_server_replicamanager_leadercount", "Partitions this broker leads", leaders)
        yield _gauge("kafka_server_replicamanager_underreplicatedpartitions",
                     "Partitions led here whose ISR is smaller than their replica set", under_replicated)
        yield _gauge("kafka_server_replicamanager_underminisrpartitioncount",
                     "Partitions led here whose ISR is smaller than min.insync.replicas", under_min_isr)
        yield _gauge("kafka_server_replicamanager_atminisrpartitioncount",
                     "Partitions led here whose ISR is exactly min.insync.replicas", at_min_isr)
        yield _gauge("kafka_server_replicamanager_produceridcount",
                     "Idempotent producer ids held in the partitions' producer state", producer_ids)
        yield _gauge("kafka_server_replicamanager_replicamaxlag",
                     "Largest (leader LEO - follower fetch offset) over the partitions led here (records)",
                     max_follower_lag)
        yield _gauge("kafka_server_replicafetchermanager_maxlag",
                     "Largest (leader LEO - own LEO) over the partitions this broker follows (records)",
                     self._fetcher_max_lag())
        yield from self._fetch_sessions()
        yield size
        yield segments
        yield start
        yield end

    def _fetch_sessions(self):
        """The followers' incremental fetch sessions this broker keeps as a leader (KIP-227)."""
        with self.rm._sessions_lock:
            cache = self.rm.fetch_sessions
            count, evictions = len(cache), cache.evictions
            cached = sum(len(s.partitions) for s in cache.sessions.values())
        yield _gauge("kafka_server_fetchsessioncache_numincrementalfetchsessions",
                     "Followers' incremental fetch sessions held here", count)
        yield _gauge("kafka_server_fetchsessioncache_numincrementalfetchpartitionscached",
                     "Partitions held in those sessions", cached)
        yield CounterMetricFamily("kafka_server_fetchsessioncache_incrementalfetchsessionevictions",
                                  "Fetch sessions evicted to make room for new ones", value=evictions)

    def _fetcher_max_lag(self) -> int:
        with self.fetchers.lock:
            fetchers = list(self.fetchers.fetchers.values())
        lag = 0
        for f in fetchers:
            with f.lock:
                states = list(f.states.items())
            for tp, s in states:
                part = self.rm.get(tp)
                if part is not None and s.leader_log_end >= 0:
                    lag = max(lag, s.leader_log_end - part.log.log_end_offset)
        return lag


class ControllerCollector(Collector):
    """KafkaController gauges (only the active controller reports the cluster-wide
    ones, as in Kafka), ControllerStats counters, the event queue."""

    def __init__(self, controller):
        self.controller = controller

    def collect(self):
        c = self.controller
        active = c.active
        ctx = c.ctx
        states = list(ctx.states.values()) if active else []
        live = set(ctx.live) if active else set()
        offline = sum(1 for s, _v in states if s.leader < 0 or s.leader not in live)
        yield _gauge("kafka_controller_kafkacontroller_activecontrollercount",
                     "1 on the active controller, 0 elsewhere", 1 if active else 0)
        yield _gauge("kafka_controller_kafkacontroller_offlinepartitionscount",
                     "Partitions without a live leader (active controller only)", offline)
        yield _gauge("kafka_controller_kafkacontroller_globalpartitioncount",
                     "Partitions in the cluster (active controller only)", len(states))
        yield _gauge("kafka_controller_kafkacontroller_globaltopiccount",
                     "Topics in the cluster (active controller only)", len(ctx.topics) if active else 0)
        yield _gauge("kafka_controller_kafkacontroller_activebrokercount",
                     "Live brokers (active controller only)", len(live))
        yield _gauge("kafka_controller_kafkacontroller_reassigningpartitions",
                     "Partitions being reassigned (active controller only)", len(ctx.reassigning) if active else 0)
        yield _gauge("kafka_controller_controllereventmanager_eventqueuesize",
                     "Events waiting in the controller's queue", c.events.qsize())
        stats = c.stats
        yield CounterMetricFamily("kafka_controller_controllerstats_leaderelections",
                                  "Leader elections decided by this broker as controller",
                                  value=stats.leader_elections)
        yield CounterMetricFamily("kafka_controller_controllerstats_uncleanleaderelections",
                                  "Unclean leader elections decided by this broker as controller",
                                  value=stats.unclean_leader_elections)
        yield from stats.event_queue_time.collect()
        yield from stats.event_processing_time.collect()


class ZooKeeperCollector(Collector):
    """SessionExpireListener: the session state and its expirations and disconnects."""

    def __init__(self, zk_state, stats: ZkSessionStats):
        self.zk_state = zk_state        # () -> "CONNECTED" | "SUSPENDED" | "LOST"
        self.stats = stats

    def collect(self):
        state = self.zk_state()
        g = GaugeMetricFamily("kafka_server_sessionexpirelistener_sessionstate",
                              "1 for the ZooKeeper session's current state", labels=["state"])
        for s in ZK_SESSION_STATES:
            g.add_metric([s], 1 if s == state else 0)
        yield g
        yield CounterMetricFamily("kafka_server_sessionexpirelistener_zookeeperexpires",
                                  "ZooKeeper session expirations", value=self.stats.expirations)
        yield CounterMetricFamily("kafka_server_sessionexpirelistener_zookeeperdisconnects",
                                  "ZooKeeper disconnections", value=self.stats.disconnects)


class BrokerInfoCollector(Collector):
    def __init__(self, broker_id: int, started_s: float):
        self.broker_id = broker_id
        self.started_s = started_s

    def collect(self):
        g = GaugeMetricFamily("kafka_server_kafkaserver_brokerstate",
                              "3 = running (Kafka's BrokerState.RUNNING)", labels=["broker_id"])
        g.add_metric([str(self.broker_id)], 3)
        yield g
        yield _gauge("replikafka_broker_uptime_seconds", "Seconds since this broker started",
                     time.monotonic() - self.started_s)


class OpenLogsCollector(Collector):
    """The broker's cap on partitions holding open files and maps (`OpenLogs`)."""

    def __init__(self, open_logs):
        self.open_logs = open_logs

    def collect(self):
        yield _gauge("replikafka_log_openpartitions",
                     "Partitions that may hold open files and memory maps now", len(self.open_logs))
        yield _gauge("replikafka_log_openpartitionsmax",
                     "At most this many partitions hold open files and maps (log.open.max.partitions)",
                     self.open_logs.max_logs)
        yield CounterMetricFamily("replikafka_log_openpartitionsreleased",
                                  "Partitions made to close their files and maps by log.open.max.partitions "
                                  "(reopened on their next use)", value=self.open_logs.released)


class GcPauses(Collector):
    """Python's cyclic collections in this process (``gc.callbacks``): per generation,
    how many ran and the seconds they held the GIL, the counterpart of the JVM
    exporter's ``jvm_gc_collection_seconds``, and the longest one. Process-wide:
    :func:`gc_pauses` installs one. Not locked: Python runs no collection while a
    collection's callbacks run, so two updates never interleave."""

    def __init__(self):
        self.counts = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest_s = 0.0
        self._started = 0.0

    def on_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        g = info["generation"]
        self.counts[g] += 1
        self.seconds[g] += took
        if took > self.longest_s:
            self.longest_s = took

    def collect(self):
        s = SummaryMetricFamily("python_gc_pause_seconds",
                                "Python cyclic garbage collections and the seconds they held the GIL",
                                labels=["generation"])
        for g in range(3):
            s.add_metric([str(g)], self.counts[g], self.seconds[g])
        yield s
        yield _gauge("python_gc_pause_seconds_max", "The longest cyclic garbage collection so far, in seconds",
                     self.longest_s)


_gc_pauses: GcPauses | None = None
_gc_pauses_lock = threading.Lock()


def gc_pauses() -> GcPauses:
    """This process's :class:`GcPauses`, installed in ``gc.callbacks`` on first use."""
    global _gc_pauses
    with _gc_pauses_lock:
        if _gc_pauses is None:
            _gc_pauses = GcPauses()
            gc.callbacks.append(_gc_pauses.on_gc)
        return _gc_pauses


# ---------------------------------------------------------------- wiring
class BrokerMetrics:
    """One broker's registry and the stats objects its hot paths update.

    ``recording=False`` (``metrics.recording.enable=false``) makes the hot-path
    stats no-ops; scrape-time gauges still work (they cost nothing unscraped).
    """

    def __init__(self, broker_id: int, recording: bool = True):
        self.broker_id = broker_id
        self.recording = recording
        self.registry = CollectorRegistry(auto_describe=False)
        self.replica_stats: ReplicaStats = ReplicaStats() if recording else NoReplicaStats()
        self.requests: RequestMetrics = RequestMetrics() if recording else NoRequestMetrics()
        self.zk_stats = ZkSessionStats()
        self.registry.register(self.requests)
        self.registry.register(self.replica_stats)
        self.registry.register(BrokerInfoCollector(broker_id, time.monotonic()))
        self.registry.register(gc_pauses())

    def bind(self, broker) -> None:
        """Register the scrape-time collectors over a started broker's objects."""
        self.registry.register(ReplicaManagerCollector(broker.replica_manager, broker.fetchers))
        self.registry.register(ControllerCollector(broker.controller))
        self.registry.register(ZooKeeperCollector(lambda: str(broker.zk.state), self.zk_stats))
        self.registry.register(OpenLogsCollector(broker.log_manager.open_logs))

    def observe_request(self, method: str, seconds: float, error_code: str = "") -> None:
        """For request paths outside the gRPC pipeline (Arrow Flight reads): one call per request."""
        self.requests.observe(method, seconds, error_code)
