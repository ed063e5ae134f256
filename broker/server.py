"""One broker process: logs, replica manager, controller candidate, gRPC server.

Start-up order (seed 003, "broker startup"): connect to ZooKeeper, load and
recover the logs, delete partitions no longer assigned here, serve gRPC, then
register ``/brokers/ids/[id]`` (so nobody is told about us before we answer),
then compete for the controller. Shutdown reverses it and leaves the
clean-shutdown marker so the next start skips recovery.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
import threading
import time
from concurrent import futures

import grpc
from kazoo.client import KazooClient, KazooState

from replikafka import errors as E
from replikafka import records as R
from replikafka.errors import StorageError, UnknownTopicOrPartitionError
from replikafka.client.connection import open_channel, target_of
from replikafka.broker.admin_manager import AdminManager
from replikafka.broker.config import BrokerConfig, Endpoint, log_config_for_topic
from replikafka.broker.controller.controller import Controller
from replikafka.broker.http_server import start_http
from replikafka.broker.malloc_tuning import keep_freed_memory
from replikafka.broker.flight_security import flight_server_options
from replikafka.broker.flight_server import BrokerFlightServer
from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.metrics import BrokerMetrics, flight_middleware_factory
from replikafka.broker.replica.replica_fetcher import ReplicaFetcherManager
from replikafka.broker.replica_rpc import FlightLeaderEndpoint, GrpcLeaderEndpoint, list_offsets
from replikafka.broker.replica.replica_manager import ReplicaManager
from replikafka.broker.rpc_server import BrokerServicer, OpenGate, RpcPipeline
from replikafka.broker.state_change_log import LOGGER_NAME as STATE_CHANGE_LOGGER, StateChangeFormatter
from replikafka.broker.controller.controller_events import SessionReestablished, TopicConfigChange
from replikafka.broker.storage.clock import SYSTEM_CLOCK
from replikafka.broker.storage.fileio import set_gil_kept_file_calls, set_kept_write_max_bytes
from replikafka.broker.startup_failure import check_port_free, startup_failure_line
from replikafka.broker.control_plane_guard import ControlPlaneGuard, ZkClusterTruth
from replikafka.broker.storage.log_manager import LogManager
from replikafka.broker.security import BrokerSecurity
from replikafka.broker.wire_limits import WireLimits
from replikafka.broker.zk_store import PERSISTENT_PATHS, ZkStore
from replikafka.protocol import replikafka_pb2 as pb
from replikafka.protocol import replikafka_pb2_grpc as pbg
from replikafka.protocol.rpc_errors import from_pb, from_rpc_error

log = logging.getLogger("replikafka.broker")
TOPIC_ID_KEY = "topic.id"
GRPC_MESSAGE_BYTES_MAX = 256 << 20
#: The longest a stopping broker waits for its open Arrow Flight calls to end (s): a
#: producer keeps a DoPut open between sends (and any client may hold one open), and
#: pyarrow's shutdown waits for every call; past this the stop goes on without them.
FLIGHT_SHUTDOWN_WAIT_S = 2.0
# A config change notification older than this (ms) has been applied by every live
# broker (they apply within a watch round trip) and is deleted: Kafka's 15 minutes.
CONFIG_CHANGE_EXPIRY_MS = 15 * 60 * 1000
#: The longest (s) the housekeeping that scans every partition (ISR checks, log maintenance,
#: HW checkpoints) holds off for controller events in this process: a failover's few
#: seconds pass first; neither an event stuck longer nor a stream of events holds it longer.
HOUSEKEEPING_DEFER_MAX_S = 10.0
#: Log maintenance and HW checkpoints also hold off while this broker takes up new roles
#: (a LeaderAndIsr) and for this long (s) after: a failover's new leaders take their first
#: writes and its followers truncate and fetch then, and at 50,000 partitions those two
#: scans held 19% and 24% of the two survivors' py-spy --gil samples in that window
#: (bounded as above).
ROLE_CHANGE_SETTLE_S = 5.0


class PartitionLogs:
    """The replica manager's view of the log manager: logs by (topic, partition),
    created with the topic's schema and config and tagged with the topic id
    (``partition.metadata``, as Kafka's KIP-516) so a re-created topic never
    adopts an old directory."""

    def __init__(self, broker_config: BrokerConfig, log_manager: LogManager):
        self.broker_config = broker_config
        self.manager = log_manager
        self.hw_checkpoint = log_manager.read_high_watermarks()
        self._configs: dict[tuple, object] = {}   # topic overrides -> LogConfig (one per topic, not per partition)

    def get_or_create(self, topic: str, partition: int, schema, topic_config: dict, topic_id: str):
        key = tuple(sorted(topic_config.items()))
        cfg = self._configs.get(key)
        if cfg is None:
            if len(self._configs) > 10_000:     # bounded: topics' override sets, rarely this many
                self._configs.clear()
            overrides = {k: v for k, v in topic_config.items() if k != TOPIC_ID_KEY}
            cfg = self._configs[key] = log_config_for_topic(self.broker_config, overrides)
        existing = self.manager.get_log(topic, partition)
        if existing is not None and (existing.topic_id not in ("", topic_id) or not existing.schema.equals(schema)):
            log.warning("%s-%d: local log belongs to an older topic of that name; deleting it", topic, partition)
            self.delete(topic, partition)
            existing = None
        log_ = existing or self.manager.get_or_create_log(topic, partition, schema, cfg)
        if topic_id:
            log_.set_topic_id(topic_id)
        return log_

    def checkpointed_hw(self, tp) -> int:
        return self.hw_checkpoint.get(tp, 0)

    def delete(self, topic: str, partition: int) -> None:
        self.hw_checkpoint.pop((topic, partition), None)
        try:
            self.manager.delete_log(topic, partition)
        except UnknownTopicOrPartitionError:
            pass


class BrokerServer:
    def __init__(self, config: BrokerConfig, clock=None):
        self.config = config
        self.clock = clock or SYSTEM_CLOCK
        self.broker_id = config.get("broker.id")
        self.endpoint = config.advertised_endpoint()
        self.bound: dict[str, Endpoint] = {}   # protocol -> listener with its real port
        self.stopped = threading.Event()
        self.threads: list[threading.Thread] = []
        self.zk: KazooClient | None = None
        self.grpc_servers: list[grpc.Server] = []
        self.flight_server = None
        # More Arrow Flight middleware (e.g. metrics), set before start(); security's
        # comes from broker/flight_security.py.
        self.flight_middleware: dict = {}
        self._offset_channels: dict[int, grpc.Channel] = {}
        # The RPC pipeline's hooks (broker/rpc_server.py): who may call what, and
        # what each call cost. Security and metrics replace them before start().
        self.request_gate = OpenGate()
        self.metrics = BrokerMetrics(self.broker_id, config.get("metrics.recording.enable"))
        self.request_observer = self.metrics.requests
        if self.metrics.recording:
            self.flight_middleware["metrics"] = flight_middleware_factory(self.metrics.requests)
        # How this broker reaches other brokers (security.inter.broker.protocol): None = plaintext.
        self.channel_credentials = None
        self.session_lost = threading.Event()
        self.session_back = threading.Event()
        self.http = None   # the metrics.listener HTTP server (broker/http_server.py)
        self.broker_epoch = -1     # czxid of our registration, once registered (KIP-380)
        self.flight_calls_left = False   # set by stop(): Flight calls outlived FLIGHT_SHUTDOWN_WAIT_S

    # ------------------------------------------------------------ start
    def start(self) -> None:
        cfg = self.config
        self._open_state_change_log()
        self.security = BrokerSecurity(cfg)
        self.zk = KazooClient(hosts=cfg.get("zookeeper.connect"),
                              timeout=cfg.get("zookeeper.session.timeout.ms") / 1000.0, **self.security.zk_kwargs)
        self.zk.start(timeout=cfg.get("zookeeper.connection.timeout.ms") / 1000.0)
        self.zk.add_listener(self._on_zk_state)
        self.store = ZkStore(self.zk)
        self.store.ensure_paths()
        self.security.start(self.zk, PERSISTENT_PATHS)
        self.request_gate = self.security
        self.channel_credentials = self.security.channel_credentials()
        self.log_manager = LogManager(list(cfg.get("log.dirs")), log_config_for_topic(cfg, {}),
                                      topic_config=self._topic_log_config, topic_schema=self._topic_schema,
                                      clock=self.clock, idle_release_ms=cfg.get("log.idle.release.ms"),
                                      load_threads=cfg.get("num.recovery.threads.per.data.dir"),
                                      open_logs_max=cfg.get("log.open.max.partitions"))
        self._delete_unassigned()
        self.logs = PartitionLogs(cfg, self.log_manager)
        self.metadata = MetadataCache()
        fetch_opts = dict(max_wait_ms=cfg.get("replica.fetch.wait.max.ms"),
                          min_bytes=cfg.get("replica.fetch.min.bytes"),
                          max_bytes=cfg.get("replica.fetch.max.bytes"),
                          response_max_bytes=cfg.get("replica.fetch.response.max.bytes"),
                          backoff_ms=cfg.get("replica.fetch.backoff.ms"),
                          request_timeout_s=cfg.get("request.timeout.ms") / 1000.0,
                          broker_epoch=lambda: self.broker_epoch,
                          on_storage_error=lambda tp, exc: self.replica_manager.handle_storage_failure(tp, exc))
        self.fetchers = ReplicaFetcherManager(self.broker_id, cfg.get("num.replica.fetchers"),
                                              lambda tp: self.replica_manager.get(tp), self._leader_endpoint,
                                              **fetch_opts)
        self.replica_manager = ReplicaManager(self.broker_id, cfg, self.logs, self.store, self.metadata,
                                              self.fetchers, self.clock, stats=self.metrics.replica_stats)
        # KIP-112: with every log dir offline, a clean shutdown (the SIGTERM path: controlled shutdown first).
        self.replica_manager.on_all_dirs_offline = lambda: os.kill(os.getpid(), signal.SIGTERM)
        self.admin_manager = AdminManager(cfg, self.store, self.metadata)
        self.control_guard = ControlPlaneGuard(ZkClusterTruth(self.store), WireLimits.from_config(cfg))
        self._serve_grpc()
        self.http = start_http(self)
        if self.http is not None:
            self.store.registration_extra["metrics_url"] = self.http.url
        self._serve_flight()
        self.controller = Controller(self.broker_id, self.store,
                                     unclean_default=cfg.get("unclean.leader.election.enable"),
                                     request_timeout_s=cfg.get("controller.socket.timeout.ms") / 1000.0,
                                     auto_rebalance_enable=cfg.get("auto.leader.rebalance.enable"),
                                     imbalance_percentage=cfg.get("leader.imbalance.per.broker.percentage"),
                                     imbalance_check_interval_s=cfg.get("leader.imbalance.check.interval.seconds"),
                                     channel_credentials=self.channel_credentials)
        # Every metric is served before the registration makes the broker visible
        # (a scrape of a registered broker never misses a family).
        self.metrics.bind(self)
        # A previous incarnation's ephemeral node lives until its session times out.
        self.broker_epoch = self.store.register_broker(
            self.broker_id, self.endpoint.host, self.endpoint.port,
            wait_s=2 * cfg.get("zookeeper.session.timeout.ms") / 1000.0 + 5,
            endpoints=tuple(str(e) for e in self.advertised_endpoints()))
        self.replica_manager.registered_epoch = self.broker_epoch
        self.controller.start()
        # These three scan every partition on each turn: they skip turns while this broker's
        # controller handles an event (Controller.busy), and the last two while it takes up
        # roles (ReplicaManager.role_changes_recent), bounded by HOUSEKEEPING_DEFER_MAX_S. The
        # ISR checks do not wait for role changes: a follower that stopped fetching leaves
        # the ISR within replica.lag.time.max.ms of the leader's clock, whatever else comes.
        self._loop("isr-maintenance", self.replica_manager.do_isr_work,
                   min(cfg.get("replica.lag.time.max.ms") / 4, 500), yields_to_controller=True)
        self._loop("hw-checkpoint", self._checkpoint_hw, cfg.get("replica.high.watermark.checkpoint.interval.ms"),
                   yields_to_controller=True, yields_to_role_changes=True)
        self._loop("log-maintenance", self._maintain_logs,
                   min(cfg.get("log.retention.check.interval.ms"), cfg.get("log.flush.scheduler.interval.ms"), 1000),
                   yields_to_controller=True, yields_to_role_changes=True)
        self._loop("zk-session", self._session_work, 100)
        self._watch_config_changes()
        log.info("broker %d serving on %s:%d", self.broker_id, self.endpoint.host, self.endpoint.port)

    def _open_state_change_log(self) -> None:
        """Every LeaderAndIsr / StopReplica / state transition this broker receives or
        makes goes to ``<first log dir>/state-change.log`` (``state-change-log-merger`` reads them)."""
        d = list(self.config.get("log.dirs"))[0]
        os.makedirs(d, exist_ok=True)
        handler = logging.FileHandler(os.path.join(d, "state-change.log"))
        handler.setFormatter(StateChangeFormatter())   # a batch of transitions is one record, a line each
        logger = logging.getLogger(STATE_CHANGE_LOGGER)
        logger.addHandler(handler)
        logger.propagate = False   # as Kafka's state.change.logger: not repeated in the broker log
        logger.setLevel(logging.INFO)
        self.state_change_handler = handler

    def _topic_schema(self, topic: str):
        """A topic's stored schema while loading its logs (None if it was deleted:
        the log's own segments say it then)."""
        found = self.store.get_topic_config(topic)
        return R.schema_from_bytes(found[1]) if found and found[1] else None

    def _topic_log_config(self, topic: str):
        """A topic's LogConfig while loading its logs (broker defaults if it was deleted)."""
        found = self.store.get_topic_config(topic)
        overrides = {k: v for k, v in (found[0] if found else {}).items() if k != TOPIC_ID_KEY}
        return log_config_for_topic(self.config, overrides)

    def _delete_unassigned(self) -> None:
        """Seed 000 Q5: partitions on disk that are no longer assigned to us go."""
        topics: dict[str, tuple] = {}  # one read per topic, not per partition (10k partitions: 10k big reads)
        deleted: list[str] = []
        for (topic, partition), log_ in self.log_manager.logs().items():
            if topic not in topics:
                topics[topic] = (self.store.get_assignment(topic), self.store.get_topic_config(topic))
            assignment, cfg = topics[topic]
            topic_id = cfg[0].get(TOPIC_ID_KEY, "") if cfg else ""
            if assignment is None or self.broker_id not in assignment.get(partition, []) \
                    or log_.topic_id not in ("", topic_id):
                deleted.append(f"{topic}-{partition}")
                self.log_manager.delete_log(topic, partition)
        if deleted:   # one line, not one per partition
            log.info("deleted %d partitions no longer assigned to broker %d: %s%s", len(deleted), self.broker_id,
                     ", ".join(deleted[:20]), " ..." if len(deleted) > 20 else "")

    def _leader_endpoint(self, leader_id: int):
        host, port = self.metadata.brokers.get(leader_id) or self.store.live_brokers().get(leader_id, ("", 0))
        grpc_endpoint = GrpcLeaderEndpoint(host, port, self.channel_credentials)
        if self.config.get("replica.fetch.transport") == "flight" and not self.security.enabled:
            location = self._flight_location(leader_id)
            if location is not None:
                return FlightLeaderEndpoint(location, grpc_endpoint)
        return grpc_endpoint

    def _serve_grpc(self) -> None:
        """One gRPC server per gRPC listener, all through the same pipeline (so a
        call knows which listener, and so which security protocol, it came in on).
        Ports bound as 0 are replaced by the real ones in ``self.bound``."""
        servicer = BrokerServicer(self)
        workers = max(8, self.config.get("num.io.threads"))
        for listener in self.config.grpc_listeners():
            server = grpc.server(
                futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"rpc-{listener.protocol}"),
                maximum_concurrent_rpcs=self.config.get("queued.max.requests"),
                options=[("grpc.max_send_message_length", GRPC_MESSAGE_BYTES_MAX),
                         ("grpc.max_receive_message_length", self.config.get("socket.request.max.bytes")),
                         ("grpc.so_reuseport", 0)])
            pipeline = RpcPipeline(servicer, listener.protocol, self.request_gate, self.request_observer)
            server.add_generic_rpc_handlers((pipeline.handler(),))
            address = f"{listener.host}:{listener.port}"
            check_port_free(listener.host, listener.port, f"listeners ({listener})")
            if listener.protocol == "PLAINTEXT":
                port = server.add_insecure_port(address)
            else:
                port = server.add_secure_port(address, self.server_credentials(listener))
            if port == 0:
                from replikafka.errors import InvalidConfigError
                raise InvalidConfigError(f"listeners: cannot bind {listener} (port in use?)")
            self.bound[listener.protocol] = Endpoint(listener.protocol, listener.host, port)
            server.start()
            self.grpc_servers.append(server)
        self.endpoint = self._advertised(self.config.advertised_endpoint())

    def _serve_flight(self) -> None:
        """The Arrow Flight listener (``FLIGHT://host:port`` in listeners), if configured."""
        listener = self.config.listener("FLIGHT")
        if listener is None:
            return
        options = flight_server_options(self.security)
        options["middleware"] = {**options.get("middleware", {}), **self.flight_middleware}
        scheme = "grpc+tls" if options.get("tls_certificates") else "grpc"
        try:
            self.flight_server = BrokerFlightServer(
                f"{scheme}://{listener.host or '0.0.0.0'}:{listener.port}", self.replica_manager, self.metadata,
                max_bytes_in_flight=self.config.get("flight.max.bytes.in.flight"),
                wait_timeout_s=self.config.get("request.timeout.ms") / 1000.0,
                flight_location_of=self._flight_location, partition_offsets=self._partition_offsets,
                security=self.security, max_put_bytes=self.config.get("socket.request.max.bytes"),
                wire_limits=WireLimits.from_config(self.config),
                observe_produce=lambda seconds, code: self.request_observer.observe("Produce", seconds, code),
                **options)
        except Exception as exc:    # pyarrow raises a plain OSError/ArrowException for a port in use
            from replikafka.errors import InvalidConfigError
            raise InvalidConfigError(f"listeners: cannot serve Arrow Flight on {listener} ({exc})") from None
        self.bound["FLIGHT"] = Endpoint("FLIGHT", listener.host, self.flight_server.port)
        log.info("broker %d serving Arrow Flight on port %d", self.broker_id, self.flight_server.port)

    def _flight_location(self, broker_id: int) -> str | None:
        """``grpc://host:port`` of a broker's advertised Flight listener (None: it has none)."""
        if broker_id == self.broker_id:
            endpoints = [str(e) for e in self.advertised_endpoints()]
        else:
            endpoints = self.metadata.broker_endpoints.get(broker_id, ())
        for e in endpoints:
            if e.upper().startswith("FLIGHT://"):
                scheme = "grpc+tls" if self.flight_server is not None and self.flight_server.tls else "grpc+tcp"
                return f"{scheme}://{e[len('FLIGHT://'):]}"
        return None

    def _partition_offsets(self, topic: str, partitions: list[tuple[int, int]]) -> dict:
        """partition -> (log start, HW, leader epoch) from each partition's leader (a
        ListOffsets(latest), answered here for our own), or the error it gave."""
        out: dict = {}
        by_leader: dict[int, list[int]] = {}
        for p, leader in partitions:
            if leader >= 0:
                by_leader.setdefault(leader, []).append(p)
        timeout_s = self.config.get("request.timeout.ms") / 1000.0
        for leader, parts in by_leader.items():
            req = pb.ListOffsetsRequest(partitions=[pb.ListOffsetsPartition(
                topic=topic, partition=p, timestamp_ms=-1, current_leader_epoch=-1) for p in parts])
            try:
                resp = (list_offsets(self.replica_manager, req) if leader == self.broker_id else
                        pbg.ReplikafkaStub(self._offset_channel(leader)).ListOffsets(req, timeout=timeout_s))
            except grpc.RpcError as exc:
                for p in parts:
                    out[p] = from_rpc_error(exc, f"broker {leader}")
                continue
            for r in resp.partitions:
                err = from_pb(r.error)
                out[r.partition] = err if err is not None else (r.log_start_offset, r.high_watermark,
                                                                r.leader_epoch)
        return out

    def _offset_channel(self, broker_id: int) -> grpc.Channel:
        ch = self._offset_channels.get(broker_id)
        if ch is None:
            host, port = self.metadata.brokers.get(broker_id, ("", 0))
            ch = self._offset_channels[broker_id] = open_channel(target_of(host, port), self.channel_credentials)
        return ch

    def server_credentials(self, listener: Endpoint) -> grpc.ServerCredentials:
        """TLS credentials for an SSL / SASL_SSL listener."""
        return self.security.server_credentials(listener)

    def _advertised(self, endpoint: Endpoint) -> Endpoint:
        """An advertised endpoint with a bound port filled in where the listener asked for port 0."""
        if endpoint.port == 0 and endpoint.protocol in self.bound:
            return endpoint._replace(port=self.bound[endpoint.protocol].port)
        return endpoint

    def advertised_endpoints(self) -> list[Endpoint]:
        """Every listener as clients and brokers should reach it (published in ZooKeeper)."""
        return [self._advertised(e) for e in self.config.get("advertised.listeners")]

    def _loop(self, name: str, work, interval_ms: float, yields_to_controller: bool = False,
              yields_to_role_changes: bool = False) -> None:
        def run():
            last_run = time.monotonic()
            while not self.stopped.wait(interval_ms / 1000.0):
                # Skips turns while the controller is busy (or roles are being taken up), but
                # never for longer than the bound in all: a controller handling one event after
                # another would otherwise hold the ISR checks and checkpoints off for as long
                # as the events kept coming.
                if ((yields_to_controller and self.controller.busy(HOUSEKEEPING_DEFER_MAX_S)
                     or yields_to_role_changes and self.replica_manager.role_changes_recent(ROLE_CHANGE_SETTLE_S))
                        and time.monotonic() - last_run < HOUSEKEEPING_DEFER_MAX_S):
                    continue
                last_run = time.monotonic()
                try:
                    work()
                except Exception:
                    if not self.stopped.is_set():
                        log.exception("%s failed", name)
        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self.threads.append(t)

    def _maintain_logs(self) -> None:
        try:
            self.log_manager.do_work(self.clock.time_ms())
        except (OSError, StorageError) as exc:   # a failed disk: its log dir goes offline (KIP-112)
            if not self.replica_manager.handle_io_error(exc):
                raise
        self.replica_manager.expire_producers()

    def _checkpoint_hw(self) -> None:
        try:
            self.log_manager.checkpoint_high_watermarks(self.replica_manager.high_watermarks())
        except (OSError, StorageError) as exc:   # e.g. EROFS creating the checkpoint file: that dir goes offline
            if not self.replica_manager.handle_io_error(exc):
                raise

    # ------------------------------------------------------------ dynamic topic config
    def _watch_config_changes(self) -> None:
        """Follow ``/config/changes`` (written by AlterConfigs): the logs were opened
        with the config current now, so only later notifications are applied."""
        self.config_changed = threading.Event()
        changes = self.store.config_changes(watch=lambda _event: self.config_changed.set())
        self.config_change_seen = max((seq for seq, _ in changes), default=-1)
        self._loop("config-changes", self.config_change_work, 100)

    def config_change_work(self) -> None:
        """Apply the topic configs named by notifications not seen yet (one pass)."""
        if not self.config_changed.is_set():
            return
        self.config_changed.clear()
        for seq, entity in self.store.config_changes(watch=lambda _event: self.config_changed.set()):
            if seq <= self.config_change_seen:
                continue
            self.config_change_seen = seq
            kind, _, name = entity.partition("/")
            if kind == "topics":
                self.apply_topic_config(name)
        # bounded: notifications every broker has had time to apply go (as Kafka's changeExpirationMs)
        self.store.purge_config_changes(CONFIG_CHANGE_EXPIRY_MS, self.clock.time_ms())

    def apply_topic_config(self, topic: str) -> None:
        """The topic's current overrides, live: its local logs (retention, segment
        size, flush, min.insync.replicas, ...) and the metadata clients see."""
        found = self.store.get_topic_config(topic)
        if found is None:
            return  # deleted meanwhile
        overrides = {k: v for k, v in found[0].items() if k != TOPIC_ID_KEY}
        log_config = log_config_for_topic(self.config, overrides)
        for (t, _p), log_ in self.log_manager.logs().items():
            if t == topic:
                log_.update_config(log_config)
        self.metadata.set_topic_config(topic, found[0])
        self.controller.enqueue(TopicConfigChange(topic))  # a no-op unless this broker is the controller
        log.info("topic %s: config overrides %s applied", topic, overrides)

    # ------------------------------------------------------------ ZooKeeper session
    def _on_zk_state(self, state) -> None:
        # Listeners must not block: only flag; _session_work does the work.
        self.metrics.zk_stats.state_changed(str(state))
        if state == KazooState.LOST:
            self.session_lost.set()
            if getattr(self, "controller", None) is not None:
                self.controller.on_session_lost()   # stops acting now; only flags and empties its queue
        elif state == KazooState.CONNECTED and self.session_lost.is_set():
            self.session_back.set()

    def _session_work(self) -> None:
        if not self.session_back.is_set():
            return
        self.session_back.clear()
        self.session_lost.clear()
        log.warning("broker %d: ZooKeeper session expired; re-registering", self.broker_id)
        self.broker_epoch = self.store.register_broker(
            self.broker_id, self.endpoint.host, self.endpoint.port,
            endpoints=tuple(str(e) for e in self.advertised_endpoints()))
        self.replica_manager.registered_epoch = self.broker_epoch
        self.controller.enqueue(SessionReestablished())

    # ------------------------------------------------------------ stop
    def stop(self) -> None:
        if self.stopped.is_set():
            return
        log.info("broker %d shutting down", self.broker_id)
        if self.config.get("controlled.shutdown.enable"):
            self.controlled_shutdown()
        self.replica_manager.shutting_down = True
        self.stopped.set()
        self.controller.stop()
        self.replica_manager.shutdown()
        if self.flight_server is not None:
            self._shutdown_flight()
        for server in self.grpc_servers:
            server.stop(grace=1.0).wait(5)
        if self.http is not None:
            self.http.stop()
        for ch in self._offset_channels.values():
            ch.close()
        for t in self.threads:
            t.join(timeout=5)
        self._checkpoint_hw()
        self.log_manager.close()
        try:
            self.zk.stop()
            self.zk.close()
        except Exception:
            pass

    def _shutdown_flight(self) -> None:
        """Stop the Flight listener, waiting at most FLIGHT_SHUTDOWN_WAIT_S for its open
        calls. A call still open after that stores nothing: every partition was stopped
        (``replica_manager.shutdown``), so an append on it is refused as NOT_LEADER and
        its producer retries at the new leader. ``flight_calls_left`` tells ``run_broker``
        to exit without waiting for them again (pyarrow's shutdown cannot be cut short)."""
        t = threading.Thread(target=self.flight_server.shutdown, name="flight-shutdown", daemon=True)
        t.start()
        t.join(FLIGHT_SHUTDOWN_WAIT_S)
        self.flight_calls_left = t.is_alive()
        if self.flight_calls_left:
            log.info("broker %d: Arrow Flight calls still open after %.1fs (clients keep DoPuts open between "
                     "sends); stopping without them", self.broker_id, FLIGHT_SHUTDOWN_WAIT_S)

    def controlled_shutdown(self) -> bool:
        """Ask the controller to move our leaderships away and take us out of ISRs
        before we go, so no partition goes offline (Kafka's controlled shutdown).
        Retries ``controlled.shutdown.max.retries`` times; then an unclean stop."""
        from replikafka.protocol import replikafka_pb2 as pb
        cfg = self.config
        attempts = cfg.get("controlled.shutdown.max.retries") + 1
        backoff_s = cfg.get("controlled.shutdown.retry.backoff.ms") / 1000.0
        timeout_s = cfg.get("request.timeout.ms") / 1000.0
        remaining: list = []
        for attempt in range(1, attempts + 1):
            try:
                controller = self.store.get_controller_id()
                host, port = self.store.live_brokers().get(controller, (None, None))
                if host is None:
                    raise RuntimeError("no controller is registered")
                with open_channel(target_of(host, port), self.channel_credentials) as ch:
                    resp = pbg.ReplikafkaStub(ch).ControlledShutdown(
                        pb.ControlledShutdownRequest(broker_id=self.broker_id, broker_epoch=self.broker_epoch),
                        timeout=timeout_s)
                if resp.error.code:
                    raise RuntimeError(f"{resp.error.code}: {resp.error.message}")
                remaining = [f"{r.topic}-{r.partition}" for r in resp.remaining]
                if not remaining:
                    log.info("broker %d: controlled shutdown succeeded (attempt %d)", self.broker_id, attempt)
                    return True
                log.warning("broker %d: controlled shutdown attempt %d: still leading %d partitions (%s)",
                            self.broker_id, attempt, len(remaining), ", ".join(remaining[:10]))
            except Exception as exc:
                log.warning("broker %d: controlled shutdown attempt %d failed: %s", self.broker_id, attempt, exc)
            if attempt < attempts:
                time.sleep(backoff_s)
        log.warning("broker %d: controlled shutdown did not complete after %d attempts; shutting down anyway",
                    self.broker_id, attempts)
        return False

    def wait(self) -> None:
        self.stopped.wait()


def tune_process(config: BrokerConfig) -> None:
    """Process-wide settings, once at start-up: glibc's (broker/malloc_tuning.py), the
    cyclic garbage collector's youngest-generation threshold, Python's switch interval
    and the size of the segment writes that keep the GIL (broker/storage/fileio.py).

    The collector: a request naming thousands of partitions holds more objects than
    Python's default threshold (700) while it runs, so each young collection during it
    promoted them; once enough had been promoted a full collection walked every object
    the broker holds (1.0-1.2 s at 50,000 partitions, every 10-15 s in the scale bench).

    The switch interval: a thread that gives the GIL up for I/O or C code and takes
    it back waits, each time, until the thread running Python reaches its switch
    interval: a Produce naming thousands of partitions does so a few times a partition,
    and beside a survivor's busy fetchers and RPC threads (a failover) its writes took
    1.7 ms a partition against 0.25 alone. With 1 ms instead of Python's 5 such a write
    waits a fifth as long each time (bench/failover_inproc.py --gil-load)."""
    keep_freed_memory(config.get("malloc.trim.threshold.bytes"))
    switch_us = config.get("python.switch.interval.us")
    if switch_us > 0:
        sys.setswitchinterval(switch_us / 1e6)
    set_kept_write_max_bytes(config.get("python.gil.kept.write.max.bytes"))
    set_gil_kept_file_calls(config.get("python.gil.kept.file.calls.enable"))
    young_objects = config.get("python.gc.generation0.threshold.objects")
    if young_objects > 0:
        _, older1, older2 = gc.get_threshold()
        gc.set_threshold(young_objects, older1, older2)


def run_broker(config: BrokerConfig) -> int:
    tune_process(config)
    server = BrokerServer(config)
    done = threading.Event()

    def on_signal(signum, _frame):
        done.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        server.start()
    except Exception as exc:
        _exit_after_failed_start(server, exc)
    print(f"replikafka broker {server.broker_id} started on {server.endpoint.host}:{server.endpoint.port} "
          f"(pid {os.getpid()})" + (f"; metrics at {server.http.url}/metrics, status page at {server.http.url}/"
                                    if server.http else ""), flush=True)
    while not done.wait(1.0):
        pass
    server.stop()
    if server.flight_calls_left:
        # The logs are closed and the clean-shutdown marker written; only the open
        # Flight calls' threads remain, and an interpreter exit would wait on them.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


def _exit_after_failed_start(server: BrokerServer, exc: BaseException) -> None:
    """One line naming the cause, then exit at once: threads a half-done start
    left running (gRPC, kazoo) must not keep the process alive."""
    line = startup_failure_line(exc, server.config)
    log.debug("start-up failed", exc_info=exc)
    sys.stderr.write(f"replikafka broker {server.broker_id}: could not start: {line}\n")
    sys.stderr.flush()
    for grpc_server in server.grpc_servers:
        grpc_server.stop(grace=0)
    if server.zk is not None:
        try:  # our registration (if made) goes now, not at session expiry
            server.zk.stop()
            server.zk.close()
        except Exception:
            pass
    os._exit(1)
