"""state-change-log-merger: parsing, the k-way merge, filters and the command's arguments."""
from __future__ import annotations

import io
import re
from datetime import datetime, timezone

import pytest

from replikafka.cli import state_change_log_merger_cmd as M
from replikafka.cli.main import main


def entries(text: str, source: int = 0):
    return list(M.read_entries(io.StringIO(text), source))


def write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


BROKER1 = """\
[2026-11-21 01:50:48,100] INFO controller 1 epoch 1: orders-0 NewPartition -> LeaderAndIsr(leader=1, isr=(1, 2))
[2026-11-21 01:50:48,200] INFO broker 1: orders-0 becomes LEADER epoch 0 isr [1, 2] (controller epoch 1)
[2026-11-21 01:50:49,000] ERROR broker 1: orders-1 StopReplica failed
Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: boom
[2026-11-21 01:50:50,000] INFO controller 1 epoch 1: topic orders deleted
"""

BROKER2 = """\
[2026-11-21 01:50:48,150] INFO broker 2: orders-1 becomes LEADER epoch 0 isr [2, 1] (controller epoch 1)
[2026-11-21 01:50:48,200] INFO broker 2: orders-0 becomes FOLLOWER of 1 epoch 0 (controller epoch 1)
[2026-11-21 01:50:49,500] INFO broker 2: orders.eu-1-0 becomes LEADER epoch 0 isr [2] (controller epoch 1)
"""


# ---------------------------------------------------------------- parsing
def test_entries_keep_their_continuation_lines():
    got = entries(BROKER1)
    assert [len(e.lines) for e in got] == [1, 1, 4, 1]
    assert got[2].lines[-1] == "ValueError: boom"
    assert got[2].time == datetime(2026, 11, 21, 1, 50, 49)
    assert got[0].time == datetime(2026, 11, 21, 1, 50, 48, 100_000)
    assert got[1].message.startswith("broker 1: orders-0 becomes LEADER")


def test_lines_before_the_first_entry_and_bad_timestamps_are_not_entries():
    got = entries("  at the tail of an older traceback\n"
                  "[2026-11-21 01:50:48,100] INFO broker 1: t-0 becomes LEADER\n"
                  "[2026-13-21 01:50:48,100] not a real time\n")
    assert len(got) == 1
    assert got[0].lines == ("[2026-11-21 01:50:48,100] INFO broker 1: t-0 becomes LEADER",
                            "[2026-13-21 01:50:48,100] not a real time")


def test_user_times_in_kafka_and_iso_formats():
    want = datetime(2026, 11, 21, 1, 50, 48, 123_000)
    assert M.parse_user_time("2026-11-21 01:50:48,123") == want
    assert M.parse_user_time("2026-11-21T01:50:48.123") == want
    assert M.parse_user_time("2026-11-21") == datetime(2026, 11, 21)
    utc = M.parse_user_time("2026-11-21T01:50:48.123+00:00")
    assert utc == datetime(2026, 11, 21, 1, 50, 48, 123_000, tzinfo=timezone.utc).astimezone().replace(tzinfo=None)
    with pytest.raises(M.UsageError, match="--start-time 'yesterday'"):
        M.parse_user_time("yesterday", "--start-time")


def test_partitions_argument():
    assert M.parse_partitions("0, 1,7") == {0, 1, 7}
    with pytest.raises(M.UsageError, match="'x'"):
        M.parse_partitions("0,x")


# ---------------------------------------------------------------- merging
def test_merge_is_in_time_order_and_stable_for_equal_times():
    merged = list(M.merge([entries(BROKER1, 0), entries(BROKER2, 1)]))
    times = [e.time for e in merged]
    assert times == sorted(times)
    assert [(e.source, e.seq) for e in merged] == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3)]


def test_merge_is_lazy():
    def endless(source):
        for i in range(10**9):
            yield M.Entry(datetime.fromtimestamp(1_700_000_000 + i), source, i, (f"{source}:{i}",))
    first = []
    for e in M.merge([endless(0), endless(1)]):
        first.append(e.lines[0])
        if len(first) == 4:
            break
    assert first == ["0:0", "1:0", "0:1", "1:1"]


def test_slightly_out_of_order_file_is_put_in_order():
    text = ("[2026-11-21 01:50:48,005] INFO broker 1: t-0 a\n"
            "[2026-11-21 01:50:48,001] INFO broker 1: t-0 b\n"
            "[2026-11-21 01:50:49,500] INFO broker 1: t-0 c\n")
    got = list(M.in_time_order(entries(text)))
    assert [e.message[-1] for e in got] == ["b", "a", "c"]


# ---------------------------------------------------------------- filtering
def messages(flt, *texts):
    streams = [M.filtered(entries(t, i), flt) for i, t in enumerate(texts)]
    return [e.message for e in M.merge(streams)]


def test_topic_filter_matches_whole_topic_partition_tokens():
    text = ("[2026-11-21 01:50:48,000] INFO broker 1: orders-0 becomes LEADER\n"
            "[2026-11-21 01:50:48,001] INFO broker 1: orders.eu-1-0 becomes LEADER\n"
            "[2026-11-21 01:50:48,002] INFO broker 1: orders-eu-3 becomes LEADER\n"
            "[2026-11-21 01:50:48,003] INFO broker 1: xorders-4 becomes LEADER\n"
            "[2026-11-21 01:50:48,004] INFO broker 1: orders-5x becomes LEADER\n"
            "[2026-11-21 01:50:48,005] INFO controller 1 epoch 2: topic orders deleted\n"
            "[2026-11-21 01:50:48,006] INFO controller 1 epoch 2: topic orders.eu deleted\n")
    assert messages(M.EntryFilter(topic="orders"), text) == [
        "broker 1: orders-0 becomes LEADER", "controller 1 epoch 2: topic orders deleted"]
    assert messages(M.EntryFilter(topic="orders.eu-1"), text) == ["broker 1: orders.eu-1-0 becomes LEADER"]
    assert messages(M.EntryFilter(topic="orders-eu"), text) == ["broker 1: orders-eu-3 becomes LEADER"]
    assert messages(M.EntryFilter(topic="orders.eu"), text) == ["controller 1 epoch 2: topic orders.eu deleted"]


def test_partition_filter_with_and_without_topic():
    assert messages(M.EntryFilter(topic="orders", partitions=[1]), BROKER1, BROKER2) == [
        "broker 2: orders-1 becomes LEADER epoch 0 isr [2, 1] (controller epoch 1)",
        "broker 1: orders-1 StopReplica failed"]
    # Without a topic: the partition is what follows a topic's last '-'.
    assert messages(M.EntryFilter(partitions=[0]), BROKER1, BROKER2) == [
        "controller 1 epoch 1: orders-0 NewPartition -> LeaderAndIsr(leader=1, isr=(1, 2))",
        "broker 1: orders-0 becomes LEADER epoch 0 isr [1, 2] (controller epoch 1)",
        "broker 2: orders-0 becomes FOLLOWER of 1 epoch 0 (controller epoch 1)",
        "broker 2: orders.eu-1-0 becomes LEADER epoch 0 isr [2] (controller epoch 1)"]


def test_time_range_is_inclusive():
    flt = M.EntryFilter(start=datetime(2026, 11, 21, 1, 50, 48, 200_000), end=datetime(2026, 11, 21, 1, 50, 49))
    assert [m.split(":")[0] for m in messages(flt, BROKER1, BROKER2)] == ["broker 1", "broker 2", "broker 1"]


def test_reading_stops_after_the_end_time():
    read = []

    def lines():
        for i in range(10**6):
            read.append(i)
            yield f"[2026-11-21 01:{i // 60 % 60:02d}:{i % 60:02d},000] INFO broker 1: t-0 line {i}\n"
    flt = M.EntryFilter(end=datetime(2026, 11, 21, 1, 0, 10))
    got = list(M.filtered(M.read_entries(lines()), flt))
    assert len(got) == 11
    assert len(read) < 20


# ---------------------------------------------------------------- labels, files
def test_source_labels_are_the_shortest_distinguishing_suffix(tmp_path):
    a, b = str(tmp_path / "broker-1-logs" / "state-change.log"), str(tmp_path / "broker-2-logs" / "state-change.log")
    c = str(tmp_path / "other.log")
    assert M.source_labels([a, b, c]) == ["broker-1-logs/state-change.log", "broker-2-logs/state-change.log",
                                          "other.log"]


def test_logs_regex_finds_files_in_several_directories(tmp_path):
    for b in (1, 2):
        write(tmp_path, f"broker-{b}-logs/state-change.log", "")
    write(tmp_path, "broker-3-logs/server.log", "")
    found = M.expand_logs_regex(re.escape(str(tmp_path)) + r"/broker-\d-logs/state-change\.log")
    assert found == [str(tmp_path / f"broker-{b}-logs" / "state-change.log") for b in (1, 2)]


def test_logs_regex_searches_below_its_literal_directory():
    assert M._literal_prefix(r"/var/log/kafka\-1/broker-.*/state") == "/var/log/kafka-1/broker-"
    assert M._literal_prefix(r"/a/b?/c") == "/a/"
    assert M._literal_prefix(r"\d+/x") == ""


# ---------------------------------------------------------------- the command
def run_cli(capsys, *argv):
    code = main(["state-change-log-merger", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_command_merges_prefixes_and_filters(tmp_path, capsys):
    f1 = write(tmp_path, "broker-1-logs/state-change.log", BROKER1)
    f2 = write(tmp_path, "broker-2-logs/state-change.log", BROKER2)
    code, out, err = run_cli(capsys, "--logs", f"{f1},{f2}")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert len(lines) == BROKER1.count("\n") + BROKER2.count("\n")
    assert lines[0] == ("broker-1-logs/state-change.log: [2026-11-21 01:50:48,100] INFO controller 1 epoch 1: "
                        "orders-0 NewPartition -> LeaderAndIsr(leader=1, isr=(1, 2))")
    assert lines[1].startswith("broker-2-logs/state-change.log: [2026-11-21 01:50:48,150]")
    # the traceback stays right after its entry, with the same prefix
    i = next(i for i, line in enumerate(lines) if "StopReplica failed" in line)
    assert lines[i + 1:i + 4] == [f"broker-1-logs/state-change.log: {t}" for t in
                                  ('Traceback (most recent call last):', '  File "x.py", line 1, in <module>',
                                   'ValueError: boom')]

    code, out, _ = run_cli(capsys, "--logs-regex", str(tmp_path) + r"/broker-.*/state-change\.log",
                           "--topic", "orders", "--partitions", "0", "--start-time", "2026-11-21 01:50:48,150",
                           "--end-time", "2026-11-21T01:50:48.200")
    assert code == 0
    assert [line.split(": ", 1)[0] for line in out.splitlines()] == ["broker-1-logs/state-change.log",
                                                                     "broker-2-logs/state-change.log"]
    assert all("orders-0 " in line for line in out.splitlines())


@pytest.mark.parametrize("argv, message", [
    ([], "--logs (or --logs-regex) is required"),
    (["--logs", "/nonexistent/state-change.log"], "'/nonexistent/state-change.log' does not exist"),
    (["--logs", "{f}", "--partitions", "0,a"], "--partitions: 'a'"),
    (["--logs", "{f}", "--start-time", "noon"], "--start-time 'noon' is not a time"),
    (["--logs", "{f}", "--start-time", "2026-11-22", "--end-time", "2026-11-21"], "is after --end-time"),
    (["--logs", "{f}", "--topic", "a b"], "--topic 'a b' is not a topic name"),
    (["--logs-regex", "([", ], "--logs-regex '([' is not a regular expression"),
    (["--logs-regex", "/nonexistent-dir-xyz/.*"], "no file matches --logs-regex"),
])
def test_bad_arguments_give_one_line_and_exit_2(tmp_path, capsys, argv, message):
    f = write(tmp_path, "state-change.log", BROKER1)
    code, out, err = run_cli(capsys, *[a.replace("{f}", f) for a in argv])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err
    assert err.startswith("replikafka state-change-log-merger: error: ")


def test_a_directory_is_refused(tmp_path, capsys):
    code, _, err = run_cli(capsys, "--logs", str(tmp_path))
    assert code == 2 and "is not a file" in err
