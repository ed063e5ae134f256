"""`replikafka state-change-log-merger`: merge brokers' state-change logs in time order
(as Kafka's kafka.tools.StateChangeLogMerger).

    replikafka state-change-log-merger --logs F1,F2[,...] [--logs-regex REGEX] [--topic T]
                                       [--partitions 0,1] [--start-time T] [--end-time T]

Each broker writes ``state-change.log`` into its first log dir; a line looks like
``[2026-11-21 01:50:48,123] INFO broker 2: t-0 becomes LEADER ...`` or
``[...] INFO controller 1 epoch 3: t-0 -> LeaderAndIsr(...)``. A line that does not
start with such a timestamp (a traceback) continues the entry above it and stays
with it; lines before a file's first entry are dropped.

The files are merged as a k-way merge of sorted streams: each file is read line
by line and nothing is loaded whole. A file may be out of order by a few
milliseconds (two threads logging at once): each is put back in order within a
one-second window first. Each output line starts with the file it came from (the
shortest path suffix that tells the files apart), then ``: ``.

Filters (all optional, combined with AND):
``--topic T``        entries naming a partition of T, as a whole ``T-<digits>`` token
                     (topic names may hold '-' and '.': ``a-1`` is not a partition of
                     ``a`` in ``a-1-0``), or, without ``--partitions``, ``topic T``;
``--partitions 0,1`` entries naming one of these partitions (of T, or of any topic);
``--start-time`` / ``--end-time``  inclusive, as ``yyyy-MM-dd HH:mm:ss,SSS`` (Kafka's
                     format, the log's own) or ISO 8601 (``2026-11-21T01:50:48.123``,
                     ``2026-11-21``); a time with a zone is converted to local time,
                     which is what the logs are written in.
"""
from __future__ import annotations

import heapq
import itertools
import os
import re
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Iterable, Iterator

#: An entry's first line: ``[yyyy-MM-dd HH:mm:ss,SSS] LEVEL message``.
ENTRY_LINE = re.compile(r"^\[(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3})\] (?:[A-Z]+ )?")
#: Characters of a topic name (Kafka's legal set); a token is delimited by anything else.
_TOPIC_CHARS = r"[A-Za-z0-9._-]"
#: Any ``<topic>-<partition>`` token: the topic is everything up to the token's last '-'.
ANY_PARTITION = re.compile(rf"(?<!{_TOPIC_CHARS})({_TOPIC_CHARS}+)-(\d+)(?!{_TOPIC_CHARS})")
#: How far out of order one file may be (see the module docstring).
REORDER_WINDOW = timedelta(seconds=1)


class UsageError(Exception):
    """A bad argument (exit 2)."""


@dataclass(order=True, frozen=True)
class Entry:
    """One log entry: its first line and the lines that continue it (no newlines)."""
    time: datetime
    source: int                     # index of the file it came from
    seq: int                        # position in that file
    lines: tuple[str, ...] = field(compare=False)

    @property
    def message(self) -> str:
        """The first line after ``[time] LEVEL``."""
        first = self.lines[0]
        m = ENTRY_LINE.match(first)
        return first[m.end():] if m else first


# ---------------------------------------------------------------- parsing
def parse_log_time(text: str) -> datetime:
    """The timestamp of a log line (``yyyy-MM-dd HH:mm:ss,SSS``)."""
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f")


def parse_user_time(text: str, flag: str = "time") -> datetime:
    """A time given on the command line: Kafka's ``yyyy-MM-dd HH:mm:ss,SSS`` or ISO 8601.
    Naive result in local time. Raises UsageError naming the flag."""
    raw = text.strip()
    candidate = raw
    # Kafka's and the log's own comma before the milliseconds.
    candidate = re.sub(r"(\d{2}:\d{2}:\d{2}),(\d+)", r"\1.\2", candidate)
    if candidate.endswith("Z"):
        candidate = candidate[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(candidate)
    except ValueError:
        raise UsageError(f"{flag} {text!r} is not a time: use 'yyyy-MM-dd HH:mm:ss,SSS' "
                         f"(e.g. '2026-11-21 01:50:48,123') or ISO 8601") from None
    if value.tzinfo is not None:
        value = value.astimezone().replace(tzinfo=None)
    return value


def parse_partitions(text: str) -> frozenset[int]:
    """``"0,1,2"`` -> {0, 1, 2}; raises UsageError naming a bad item."""
    out = set()
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit():
            raise UsageError(f"--partitions: {item!r} is not a partition number (use e.g. 0,1,2)")
        out.add(int(item))
    if not out:
        raise UsageError(f"--partitions {text!r} names no partition (use e.g. 0,1,2)")
    return frozenset(out)


def read_entries(lines: Iterable[str], source: int = 0) -> Iterator[Entry]:
    """Entries of one file, lazily: a line starting ``[timestamp]`` opens an entry,
    every other line continues the one above (dropped before the first entry)."""
    seq = 0
    time = None
    current: list[str] = []
    for raw in lines:
        line = raw.rstrip("\r\n")
        m = ENTRY_LINE.match(line)
        if m is None:
            if current:
                current.append(line)
            continue
        try:
            t = parse_log_time(m.group(1))
        except ValueError:          # e.g. month 13: not a timestamp, so a continuation
            if current:
                current.append(line)
            continue
        if current:
            yield Entry(time, source, seq, tuple(current))
            seq += 1
        time, current = t, [line]
    if current:
        yield Entry(time, source, seq, tuple(current))


def in_time_order(entries: Iterable[Entry], window: timedelta = REORDER_WINDOW) -> Iterator[Entry]:
    """The entries sorted by time, assuming none is more than ``window`` earlier than
    one before it; holds at most ``window`` worth of entries."""
    held: list[Entry] = []
    for e in entries:
        heapq.heappush(held, e)
        while held[0].time < e.time - window:
            yield heapq.heappop(held)
    while held:
        yield heapq.heappop(held)


class EntryFilter:
    """Topic, partitions and time range; see the module docstring."""

    def __init__(self, topic: str | None = None, partitions: Iterable[int] | None = None,
                 start: datetime | None = None, end: datetime | None = None):
        self.topic = topic
        self.partitions = frozenset(partitions) if partitions else None
        self.start, self.end = start, end
        if topic is not None:
            t = re.escape(topic)
            self._tp = re.compile(rf"(?<!{_TOPIC_CHARS}){t}-(\d+)(?!{_TOPIC_CHARS})")
            self._topic_word = re.compile(rf"(?<!{_TOPIC_CHARS})topic {t}(?!{_TOPIC_CHARS})")
        else:
            self._tp = ANY_PARTITION

    def time_ok(self, t: datetime) -> bool:
        return (self.start is None or t >= self.start) and (self.end is None or t <= self.end)

    def past_end(self, t: datetime) -> bool:
        """Nothing at or after ``t`` + the reorder window can match any more."""
        return self.end is not None and t > self.end + REORDER_WINDOW

    def content_ok(self, message: str) -> bool:
        if self.topic is None and self.partitions is None:
            return True
        for m in self._tp.finditer(message):
            if self.partitions is None or int(m.group(m.lastindex)) in self.partitions:
                return True
        return self.topic is not None and self.partitions is None and bool(self._topic_word.search(message))

    def __call__(self, e: Entry) -> bool:
        return self.time_ok(e.time) and self.content_ok(e.message)


def filtered(entries: Iterable[Entry], flt: EntryFilter) -> Iterator[Entry]:
    """The entries that pass ``flt``; stops reading once a file is past the end time."""
    for e in entries:
        if flt.past_end(e.time):
            return
        if flt(e):
            yield e


def merge(streams: Iterable[Iterable[Entry]]) -> Iterator[Entry]:
    """k-way merge of time-ordered streams; equal times keep file, then line, order."""
    return heapq.merge(*streams)


def source_labels(paths: list[str]) -> list[str]:
    """For each path, its shortest trailing part (whole path components) that no
    other path shares, e.g. ``broker-1-logs/state-change.log``."""
    parts = [os.path.normpath(os.path.abspath(p)).split(os.sep) for p in paths]
    out = []
    for i, mine in enumerate(parts):
        for n in range(1, len(mine) + 1):
            tail = mine[-n:]
            if all(other[-n:] != tail for j, other in enumerate(parts) if j != i):
                break
        out.append("/".join(tail).lstrip("/") or paths[i])
    return out


def _literal_prefix(pattern: str) -> str:
    """The text every match of ``pattern`` starts with (escaped characters included)."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern) and not pattern[i + 1].isalnum():
            out.append(pattern[i + 1])
            i += 2
            continue
        if ch in "^$.|?*+()[]{}\\":
            break
        out.append(ch)
        i += 1
    if i < len(pattern) and pattern[i] in "?*{" and out:
        out.pop()            # a quantifier makes the last character optional
    return "".join(out)


def expand_logs_regex(pattern: str) -> list[str]:
    """Files whose whole path matches ``pattern``, searched under its longest
    leading directory without regex characters (``.`` when there is none)."""
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise UsageError(f"--logs-regex {pattern!r} is not a regular expression ({exc})") from None
    literal = _literal_prefix(pattern)
    root = literal[:literal.rfind("/") + 1] if "/" in literal else ""
    walk_root = root or "."
    found = []
    for d, dirs, files in os.walk(walk_root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(d, name)
            shown = path if root else os.path.relpath(path, ".")
            if rx.fullmatch(shown):
                found.append(shown)
    return found


# ---------------------------------------------------------------- command
def add_parser(sub, name):
    p = sub.add_parser(name, help="merge brokers' state-change logs in time order")
    p.add_argument("--logs", metavar="F1,F2", help="comma-separated state-change.log files to merge")
    p.add_argument("--logs-regex", metavar="REGEX",
                   help="also merge every file whose whole path matches REGEX, "
                        "e.g. '/tmp/rk/broker-.*-logs/state-change\\.log'")
    p.add_argument("--topic", help="only entries about this topic")
    p.add_argument("--partitions", metavar="0,1", help="only entries about these partitions")
    p.add_argument("--start-time", metavar="T",
                   help="only entries at or after T ('yyyy-MM-dd HH:mm:ss,SSS' or ISO 8601, local time)")
    p.add_argument("--end-time", metavar="T", help="only entries at or before T (same formats)")
    p.set_defaults(func=run)


def _check(args) -> tuple[list[str], EntryFilter]:
    paths: list[str] = []
    if args.logs is not None:
        for p in args.logs.split(","):
            if p.strip() and p.strip() not in paths:
                paths.append(p.strip())
        if not paths:
            raise UsageError(f"--logs {args.logs!r} names no file")
    if args.logs_regex is not None:
        matched = expand_logs_regex(args.logs_regex)
        if not matched:
            raise UsageError(f"no file matches --logs-regex {args.logs_regex!r}")
        paths += [p for p in matched if p not in paths]
    if not paths:
        raise UsageError("--logs (or --logs-regex) is required")
    for p in paths:
        if not os.path.isfile(p):
            raise UsageError(f"log file {p!r} does not exist" if not os.path.exists(p)
                             else f"{p!r} is not a file")
        if not os.access(p, os.R_OK):
            raise UsageError(f"log file {p!r} is not readable")
    if args.topic is not None and not re.fullmatch(rf"{_TOPIC_CHARS}+", args.topic):
        raise UsageError(f"--topic {args.topic!r} is not a topic name (letters, digits, '.', '_', '-')")
    partitions = parse_partitions(args.partitions) if args.partitions is not None else None
    start = parse_user_time(args.start_time, "--start-time") if args.start_time is not None else None
    end = parse_user_time(args.end_time, "--end-time") if args.end_time is not None else None
    if start is not None and end is not None and start > end:
        raise UsageError(f"--start-time {args.start_time!r} is after --end-time {args.end_time!r}")
    return paths, EntryFilter(args.topic, partitions, start, end)


def merged_lines(paths: list[str], flt: EntryFilter) -> Iterator[str]:
    """The output lines (without newlines), prefixed with their file's label."""
    labels = source_labels(paths)
    files = []
    try:
        for path in paths:
            files.append(open(path, encoding="utf-8", errors="replace", newline=""))
        streams = [in_time_order(filtered(read_entries(f, i), flt)) for i, f in enumerate(files)]
        for e in merge(streams):
            label = labels[e.source]
            for line in e.lines:
                yield f"{label}: {line}"
    finally:
        for f in files:
            f.close()


def run(args) -> int:
    try:
        paths, flt = _check(args)
    except UsageError as exc:
        sys.stderr.write(f"replikafka state-change-log-merger: error: {exc}\n")
        return 2
    out = sys.stdout
    try:
        for chunk in _batched(merged_lines(paths, flt), 512):
            out.write("\n".join(chunk) + "\n")
        out.flush()
    except BrokenPipeError:
        # the reader went away (e.g. `| head`): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError as exc:
        sys.stderr.write(f"replikafka state-change-log-merger: error: {exc}\n")
        return 1
    return 0


def _batched(it: Iterable[str], n: int) -> Iterator[list[str]]:
    it = iter(it)
    while chunk := list(itertools.islice(it, n)):
        yield chunk
