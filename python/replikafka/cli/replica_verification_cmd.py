"""`replikafka replica-verification`: check that the replicas of partitions hold the
same batches (as Kafka's kafka-replica-verification.sh / ReplicaVerificationTool).

    replikafka replica-verification --bootstrap-server H:P [--topic-white-list REGEX]
                                    [--report-interval-ms N] [--max-wait-ms N] [--fetch-size BYTES]

For every partition of the topics whose whole name matches the regex (default
``.*``), each replica is read with a *debugging* fetch (replica id -2, Kafka's
DEBUGGING_CONSUMER): any replica, leader or follower, answers with its own
stored batches verbatim, its own high watermark and LEO, and the fetch counts
for nothing (no ISR or HW effect). The batches are compared one by one from the
largest log start offset of the replicas up to their smallest high watermark
(above it replicas may legitimately differ): base offset, record count, leader
epoch, the CRC-32C stored in the batch header and the CRC-32C of the body bytes
as received, so a replica whose bytes changed on disk differs even though its
header does not. A replica that refuses the read because its own stored batch
fails its CRC (CORRUPT_MESSAGE: brokers never serve a damaged batch, not even to
this tool) differs at the offset it was asked for, as holding a corrupt batch
there. Each difference names the topic, partition, offset and which
replicas differ from which; after one where the batches no longer line up (a
different base offset or count), that partition is not compared further.

Without ``--report-interval-ms``: one pass, then ``max lag is ...`` (the largest
leader LEO minus replica LEO) and a summary. Exit status 0 when every replica
agrees, 1 when a difference was found, 3 when none was found but some replica
could not be read. With ``--report-interval-ms N`` it keeps verifying newly
committed data and prints the max lag every N ms, as Kafka's tool does, until
interrupted (Ctrl-C or SIGTERM); the exit status then says whether a difference
was seen. ``--max-wait-ms`` is how long a fetch may wait for data a replica does
not have yet (default 0 for one pass, 1000 when continuous).
"""
from __future__ import annotations

import re
import signal
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from datetime import datetime

from replikafka import errors as E
from replikafka.cli import command_config
from replikafka.cluster_admin import stored_batches

#: Kafka's DEBUGGING_CONSUMER replica id (see broker/replica/replica_manager.py).
DEBUGGING_REPLICA_ID = -2
DEFAULT_FETCH_SIZE = 1 << 20
REQUEST_MAX_BYTES = 32 << 20
REQUEST_TIMEOUT_S = 15.0
#: A replica that keeps answering with a retriable error (not yet hosting the
#: partition, broker restarting) is retried this often, then reported unreadable.
RETRIES = 10
RETRY_BACKOFF_S = 0.2
#: Differences printed per partition and pass (all are counted).
MAX_REPORTED_PER_PARTITION = 10

EXIT_OK, EXIT_DIFFERENCE, EXIT_USAGE, EXIT_INCOMPLETE = 0, 1, 2, 3


class UsageError(Exception):
    """A bad argument (exit 2)."""


def now_text() -> str:
    """Kafka's log time format, ``yyyy-MM-dd HH:mm:ss,SSS``."""
    t = datetime.now()
    return t.strftime("%Y-%m-%d %H:%M:%S,") + f"{t.microsecond // 1000:03d}"


# ---------------------------------------------------------------- batches
@dataclass(frozen=True, slots=True)
class BatchInfo:
    """What is compared of one stored batch, as one replica returned it."""
    base_offset: int
    record_count: int             # -1: unreadable
    leader_epoch: int = -1
    stored_crc: int = 0           # CRC-32C in the batch header
    body_crc: int = 0             # CRC-32C of the body bytes received
    problem: str | None = None    # why the batch is unreadable or inconsistent in itself

    @property
    def next_offset(self) -> int:
        return self.base_offset + max(self.record_count, 1)

    @property
    def signature(self) -> tuple:
        return (self.base_offset, self.record_count, self.leader_epoch, self.stored_crc, self.body_crc,
                self.problem is None)

    def describe(self) -> str:
        if self.record_count < 0:
            return f"an unreadable batch ({self.problem})"
        text = (f"{self.record_count} records from offset {self.base_offset}, leader epoch {self.leader_epoch}, "
                f"body CRC-32C {self.body_crc:08x}")
        if self.problem:
            text += f" ({self.problem})"
        return text


def parse_batches(data: bytes, where: str = "fetch") -> tuple[list[BatchInfo], str | None]:
    """The stored batches of a debugging-fetch answer (an Arrow IPC stream: schema
    message, then stored batch messages). Returns the batches and, when the bytes
    stop making sense part-way, why (the batches before that point are kept)."""
    out: list[BatchInfo] = []
    try:
        for b in stored_batches(data, where):
            problems = []
            if b.body_crc != b.stored_crc:
                problems.append(f"the body does not match the CRC-32C {b.stored_crc:08x} stored with it: corrupt")
            if b.record_count != b.arrow_record_count:
                problems.append(f"the header says {b.record_count} records, the Arrow batch {b.arrow_record_count}")
            out.append(BatchInfo(b.base_offset, b.record_count, b.leader_epoch, b.stored_crc, b.body_crc,
                                 "; ".join(problems) or None))
    except E.CorruptRecordError as exc:
        return out, exc.message
    return out, None


# ---------------------------------------------------------------- comparing
class Cursor:
    """One replica of a partition being read."""

    def __init__(self, replica: int):
        self.replica = replica
        self.pending: deque[BatchInfo] = deque()
        self.hw = self.leo = self.lso = -1
        self.probed = False        # answered at least once
        self.exhausted = False     # the last answer held no batch
        self.error: str | None = None
        self.tries = 0


class PartitionCheck:
    """Compares the replicas of one partition from ``start`` up to their smallest HW."""

    def __init__(self, topic: str, partition: int, replicas, leader: int, start: int = 0):
        self.topic, self.partition = topic, partition
        self.replicas = tuple(replicas)
        self.leader = leader
        self.offset = start                        # next offset to compare
        self.end: int | None = None                # the smallest HW, once every replica answered
        self.cursors = {r: Cursor(r) for r in self.replicas}
        self.differences: list[str] = []           # reported lines (at most MAX_REPORTED_PER_PARTITION)
        self.difference_count = 0
        self.diverged = False                      # batches no longer line up: stop comparing
        self.done = False
        self.batches_compared = 0

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    def readable(self) -> list[Cursor]:
        return [c for c in self.cursors.values() if c.error is None]

    def unreadable(self) -> dict[int, str]:
        return {c.replica: c.error for c in self.cursors.values() if c.error is not None}

    def wants_data(self, cursor: Cursor) -> bool:
        if self.done or cursor.error is not None:
            return False
        if not cursor.probed:
            return True
        return self.end is not None and self.offset < self.end and not cursor.pending and not cursor.exhausted

    def on_answer(self, cursor: Cursor, fetch_offset: int, hw: int, leo: int, lso: int, records: bytes) -> None:
        cursor.hw, cursor.leo, cursor.lso = hw, leo, lso
        cursor.probed, cursor.tries = True, 0
        batches, problem = parse_batches(records, f"replica {cursor.replica} of {self.name}")
        batches = [b for b in batches if b.next_offset > fetch_offset]
        cursor.pending.extend(batches)
        if problem is not None:
            at = batches[-1].next_offset if batches else max(fetch_offset, lso)
            cursor.pending.append(BatchInfo(at, -1, problem=problem))
        cursor.exhausted = not batches and problem is None

    def on_corrupt(self, cursor: Cursor, fetch_offset: int, error: E.ReplikafkaError) -> None:
        """The replica refused the read from ``fetch_offset``: its stored batch there fails
        its CRC. A difference at that offset (its HW, LEO and log start stay unknown,
        unless an earlier answer gave them)."""
        cursor.probed, cursor.tries = True, 0
        cursor.exhausted = False
        cursor.pending.append(BatchInfo(fetch_offset, -1, problem=f"the stored batch is corrupt: {error.code}: "
                                                                  f"{error.message}"))

    def lag(self) -> tuple[int, int, int] | None:
        """(lag, replica, replica LEO) of the most lagging replica: leader LEO minus
        its LEO (the largest LEO when the leader could not be read)."""
        answered = [c for c in self.readable() if c.probed and c.leo >= 0]
        if not answered:
            return None
        leader = self.cursors.get(self.leader)
        top = leader.leo if leader is not None and leader.error is None and leader.probed \
            else max(c.leo for c in answered)
        worst = max(answered, key=lambda c: (top - c.leo, -c.replica))
        return top - worst.leo, worst.replica, worst.leo

    def advance(self) -> None:
        """Compare whatever every readable replica has; sets ``done`` when finished."""
        if self.done:
            return
        readable = self.readable()
        if any(not c.probed for c in readable):
            return
        if self.end is None:
            if not readable:
                self.done = True
                return
            # A replica that refused its first read (a corrupt batch) gave no HW or log start.
            self.end = min([c.hw for c in readable if c.hw >= 0], default=self.offset + 1)
            self.offset = max([self.offset] + [c.lso for c in readable])
        if len(readable) < 2:
            self.done = True         # nothing to compare against
            return
        while self.offset < self.end:
            heads: dict[int, BatchInfo] = {}
            for c in readable:
                while c.pending and c.pending[0].next_offset <= self.offset:
                    c.pending.popleft()
                if not c.pending:
                    if not c.exhausted:
                        return       # needs a fetch
                    heads[c.replica] = BatchInfo(self.offset, -1, problem=(
                        f"no batch at offset {self.offset}: its log now ends at {c.leo}"))
                else:
                    heads[c.replica] = c.pending[0]
            if len({h.signature for h in heads.values()}) == 1:
                self.batches_compared += 1
                head = next(iter(heads.values()))
                if head.problem:     # the same, but broken everywhere
                    self._report_everywhere(head)
                self._pop(readable, heads)
                continue
            self._report(heads)
            if len({(h.base_offset, h.record_count) for h in heads.values()}) != 1 \
                    or any(h.record_count < 0 for h in heads.values()):
                self.diverged = True
                break
            self._pop(readable, heads)
        self.done = True

    def _pop(self, readable: list[Cursor], heads: dict[int, BatchInfo]) -> None:
        for c in readable:
            if c.pending:
                c.pending.popleft()
        self.offset = min(h.next_offset for h in heads.values())

    def _report_everywhere(self, head: BatchInfo) -> None:
        self.difference_count += 1
        if len(self.differences) < MAX_REPORTED_PER_PARTITION:
            self.differences.append(
                f"{now_text()}: bad batch in topic {self.topic} partition {self.partition} at offset "
                f"{head.base_offset} on every replica read: {head.describe()}")

    def _report(self, heads: dict[int, BatchInfo]) -> None:
        self.difference_count += 1
        if len(self.differences) >= MAX_REPORTED_PER_PARTITION:
            return
        groups: dict[tuple, list[int]] = defaultdict(list)
        for r in self.replicas:
            if r in heads:
                groups[heads[r].signature].append(r)
        # The copy most replicas hold (the leader's on a tie) is the reference.
        ordered = sorted(groups.values(), key=lambda rs: (-len(rs), self.leader not in rs, rs))
        reference = ordered[0]
        offset = min(h.base_offset for h in heads.values())

        def who(rs):
            return ("replica " if len(rs) == 1 else "replicas ") + ",".join(map(str, sorted(rs)))

        details = "; ".join(f"{who(rs)} {'has' if len(rs) == 1 else 'have'} {heads[rs[0]].describe()}"
                            for rs in ordered[1:])
        differ = sorted(r for rs in ordered[1:] for r in rs)
        self.differences.append(
            f"{now_text()}: difference in topic {self.topic} partition {self.partition} at offset {offset}: "
            f"{who(differ)} {'differs' if len(differ) == 1 else 'differ'} from {who(reference)} "
            f"({details}; {who(reference)} {'has' if len(reference) == 1 else 'have'} "
            f"{heads[reference[0]].describe()})")


# ---------------------------------------------------------------- fetching
class Verifier:
    """Runs PartitionChecks against the cluster, one Fetch per broker per round."""

    def __init__(self, bootstrap: str, fetch_size: int, max_wait_ms: int, security=None):
        from replikafka.client.connection import ConnectionPool, parse_bootstrap
        from replikafka.client.metadata import ClusterMetadata

        self.pool = ConnectionPool(security=security)
        self.metadata = ClusterMetadata(self.pool, parse_bootstrap(bootstrap))
        self.fetch_size = fetch_size
        self.max_wait_ms = max_wait_ms

    def close(self) -> None:
        self.pool.close()

    def partitions(self, pattern: re.Pattern) -> list[tuple[str, int, tuple[int, ...], int]]:
        """(topic, partition, replicas, leader) of every partition of the matching topics."""
        self.metadata.refresh(all_topics=True)
        out = []
        for name, info in sorted(self.metadata.topics().items()):
            if pattern.fullmatch(name):
                for p in sorted(info.partitions.values(), key=lambda p: p.partition):
                    out.append((name, p.partition, p.replicas, p.leader))
        return out

    def run(self, checks: list[PartitionCheck], stop: threading.Event | None = None) -> None:
        """Until every check is done (or ``stop`` is set)."""
        while True:
            for c in checks:
                c.advance()
            wanted: dict[int, list[tuple[PartitionCheck, Cursor]]] = defaultdict(list)
            for c in checks:
                for cursor in c.cursors.values():
                    if c.wants_data(cursor):
                        wanted[cursor.replica].append((c, cursor))
            if not wanted or (stop is not None and stop.is_set()):
                return
            if self._fetch(wanted):
                time.sleep(RETRY_BACKOFF_S)
                try:             # a broker just back may be missing from the cache of the one asked
                    self.metadata.refresh(timeout_ms=int(REQUEST_TIMEOUT_S * 1000))
                except E.ReplikafkaError:
                    pass

    def _fetch(self, wanted: dict[int, list[tuple[PartitionCheck, Cursor]]]) -> bool:
        """One round of debugging fetches; returns whether something is to be retried."""
        from replikafka.client.connection import result_of
        from replikafka.protocol import replikafka_pb2 as pb
        from replikafka.protocol.rpc_errors import from_pb

        retry = False
        calls = []
        for broker_id, items in wanted.items():
            broker = self.metadata.broker(broker_id)
            if broker is None:
                for c, cursor in items:
                    retry |= self._failed(cursor, E.BrokerNotAvailableError(f"broker {broker_id} is not live"))
                continue
            request = pb.FetchRequest(
                replica_id=DEBUGGING_REPLICA_ID, max_wait_ms=self.max_wait_ms, min_bytes=1,
                max_bytes=REQUEST_MAX_BYTES,
                partitions=[pb.FetchPartition(topic=c.topic, partition=c.partition, fetch_offset=c.offset,
                                              current_leader_epoch=-1, partition_max_bytes=self.fetch_size,
                                              last_fetched_epoch=-1) for c, _ in items])
            timeout = self.max_wait_ms / 1000 + REQUEST_TIMEOUT_S
            try:
                future = self.pool.call_async(broker.target, "Fetch", request, timeout)
            except E.ReplikafkaError as exc:
                future = exc
            calls.append((broker, items, future))
        for broker, items, future in calls:
            try:
                if isinstance(future, E.ReplikafkaError):
                    raise future
                response = result_of(future, broker.target)
            except E.ReplikafkaError as exc:
                for c, cursor in items:
                    retry |= self._failed(cursor, exc)
                continue
            answers = {(r.topic, r.partition): r for r in response.partitions}
            for c, cursor in items:
                r = answers.get((c.topic, c.partition))
                if r is None:
                    retry |= self._failed(cursor, E.InvalidRequestError(
                        f"broker {broker.id} did not answer for {c.name}"))
                    continue
                err = from_pb(r.error)
                if isinstance(err, E.CorruptRecordError):
                    c.on_corrupt(cursor, c.offset, err)
                    continue
                if err is not None:
                    retry |= self._failed(cursor, err)
                    continue
                c.on_answer(cursor, c.offset, r.high_watermark, r.log_end_offset, r.log_start_offset, r.records)
        return retry

    @staticmethod
    def _failed(cursor: Cursor, exc: E.ReplikafkaError) -> bool:
        """Note a failed read; True when it will be retried."""
        if exc.retriable and cursor.tries < RETRIES:
            cursor.tries += 1
            return True
        cursor.error = f"{exc.code}: {exc.message}" if exc.code else str(exc)
        return False


def max_lag_line(checks: list[PartitionCheck]) -> str:
    """Kafka's line: the largest leader LEO minus replica LEO over the checks."""
    worst = None
    for c in checks:
        found = c.lag()
        if found is not None and (worst is None or found[0] > worst[0]):
            worst = (found[0], c, found[1], found[2])
    n = len(checks)
    if worst is None:
        return f"{now_text()}: max lag is unknown (no replica answered) among {n} partitions"
    lag, c, replica, leo = worst
    return (f"{now_text()}: max lag is {lag} for partition {c.name} at offset {leo} (replica {replica}) "
            f"among {n} partitions")


# ---------------------------------------------------------------- command
def add_parser(sub, name):
    p = sub.add_parser(name, help="check that the replicas of partitions hold the same data")
    p.add_argument("--bootstrap-server", metavar="H:P", help="brokers to connect to (comma-separated)")
    command_config.add_argument(p)
    p.add_argument("--topic-white-list", metavar="REGEX", default=".*",
                   help="verify the topics whose whole name matches this regex (default .*)")
    p.add_argument("--report-interval-ms", type=int, metavar="N",
                   help="keep verifying new data and print the max lag every N ms, until interrupted")
    p.add_argument("--max-wait-ms", type=int, metavar="N",
                   help="how long a fetch may wait for data (default 0; 1000 with --report-interval-ms)")
    p.add_argument("--fetch-size", type=int, metavar="BYTES", default=DEFAULT_FETCH_SIZE,
                   help=f"bytes fetched per partition and request (default {DEFAULT_FETCH_SIZE})")
    p.set_defaults(func=run)


def _check(args) -> re.Pattern:
    if not args.bootstrap_server:
        raise UsageError("--bootstrap-server is required")
    try:
        from replikafka.client.connection import parse_bootstrap
        parse_bootstrap(args.bootstrap_server)
    except E.InvalidConfigError as exc:
        raise UsageError(f"--bootstrap-server: {exc.message}") from None
    try:
        pattern = re.compile(args.topic_white_list)
    except re.error as exc:
        raise UsageError(f"--topic-white-list {args.topic_white_list!r} is not a regular expression ({exc})") \
            from None
    if args.report_interval_ms is not None and args.report_interval_ms < 1:
        raise UsageError(f"--report-interval-ms must be at least 1, got {args.report_interval_ms}")
    if args.max_wait_ms is not None and not 0 <= args.max_wait_ms <= 30_000:
        raise UsageError(f"--max-wait-ms must be between 0 and 30000, got {args.max_wait_ms}")
    if args.fetch_size < 1:
        raise UsageError(f"--fetch-size must be at least 1, got {args.fetch_size}")
    return pattern


def run(args) -> int:
    try:
        pattern = _check(args)
    except UsageError as exc:
        sys.stderr.write(f"replikafka replica-verification: error: {exc}\n")
        return EXIT_USAGE
    continuous = args.report_interval_ms is not None
    max_wait = args.max_wait_ms if args.max_wait_ms is not None else (1000 if continuous else 0)
    verifier = Verifier(args.bootstrap_server, args.fetch_size, max_wait, command_config.security_of(args))
    try:
        found = verifier.partitions(pattern)
        if not found:
            raise E.UnknownTopicOrPartitionError(f"no topic matches --topic-white-list {args.topic_white_list!r}")
        topics = sorted({t for t, *_ in found})
        print(f"Verifying {len(found)} partitions of {len(topics)} "
              f"topic{'s' if len(topics) != 1 else ''} ({', '.join(topics)})", flush=True)
        if continuous:
            return _run_continuously(verifier, pattern, args.report_interval_ms)
        return _run_once(verifier, found)
    finally:
        verifier.close()


def _run_once(verifier: Verifier, found) -> int:
    checks = [PartitionCheck(t, p, replicas, leader) for t, p, replicas, leader in found]
    verifier.run(checks)
    unreadable = 0
    for c in checks:
        for line in c.differences:
            print(line)
        if c.difference_count > len(c.differences):
            print(f"{now_text()}: ... and {c.difference_count - len(c.differences)} more differences in "
                  f"topic {c.topic} partition {c.partition}")
        for replica, error in sorted(c.unreadable().items()):
            unreadable += 1
            print(f"{now_text()}: cannot read topic {c.topic} partition {c.partition} on replica {replica}: {error}")
    print(max_lag_line(checks))
    differences = sum(c.difference_count for c in checks)
    compared = sum(c.batches_compared for c in checks)
    print(f"Compared {compared} batches of {len(checks)} partitions up to the smallest high watermark of their "
          f"replicas: {differences} difference{'s' if differences != 1 else ''}"
          + (f", {unreadable} replica{'s' if unreadable != 1 else ''} not read" if unreadable else ""),
          flush=True)
    if differences:
        return EXIT_DIFFERENCE
    return EXIT_INCOMPLETE if unreadable else EXIT_OK


def _run_continuously(verifier: Verifier, pattern: re.Pattern, interval_ms: int) -> int:
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    verified: dict[tuple[str, int], int] = {}
    diverged: set[tuple[str, int]] = set()
    shown_errors: dict[tuple[str, int, int], str] = {}
    differences = 0
    next_report = time.monotonic() + interval_ms / 1000
    try:
        while not stop.is_set():
            try:
                found = verifier.partitions(pattern)
            except E.ReplikafkaError as exc:
                print(f"{now_text()}: cannot read the cluster's metadata: {exc}", flush=True)
                stop.wait(1.0)
                continue
            checks = [PartitionCheck(t, p, replicas, leader, verified.get((t, p), 0))
                      for t, p, replicas, leader in found if (t, p) not in diverged]
            verifier.run(checks, stop)
            for c in checks:
                tp = (c.topic, c.partition)
                if not c.done:
                    continue
                for line in c.differences:
                    print(line, flush=True)
                differences += c.difference_count
                verified[tp] = max(verified.get(tp, 0), c.offset)
                if c.diverged:
                    diverged.add(tp)
                for replica in c.replicas:
                    error = c.cursors[replica].error
                    key = (c.topic, c.partition, replica)
                    if error is not None and shown_errors.get(key) != error:
                        print(f"{now_text()}: cannot read topic {c.topic} partition {c.partition} on replica "
                              f"{replica}: {error}", flush=True)
                    if error is None:
                        shown_errors.pop(key, None)
                    else:
                        shown_errors[key] = error
            if time.monotonic() >= next_report:
                print(max_lag_line(checks), flush=True)
                next_report = time.monotonic() + interval_ms / 1000
            if not checks:
                stop.wait(min(interval_ms / 1000, 1.0))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(f"Stopped: {differences} difference{'s' if differences != 1 else ''} found", flush=True)
    return EXIT_DIFFERENCE if differences else EXIT_OK
