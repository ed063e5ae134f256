"""The command-line tools reach the cluster's formats and rules through one admin
API (``replikafka.cluster_admin``), never through a broker module: only
``replikafka broker`` runs one."""
from __future__ import annotations

import ast
import pathlib
import random

import pytest

import replikafka.cli
from replikafka import cluster_admin
from replikafka import errors as E

CLI_DIR = pathlib.Path(replikafka.cli.__file__).parent
RUNS_A_BROKER = {"broker_cmd.py"}


def imported_modules(path: pathlib.Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def test_no_command_imports_a_broker_module():
    files = sorted(CLI_DIR.glob("*.py"))
    assert len(files) > 10
    offenders = {f.name: sorted(m for m in imported_modules(f) if m.startswith("replikafka.broker"))
                 for f in files if f.name not in RUNS_A_BROKER}
    assert {name: mods for name, mods in offenders.items() if mods} == {}


def test_reassignment_json_errors_name_the_fault():
    assert cluster_admin.parse_reassignment(
        b'{"version":1,"partitions":[{"topic":"t","partition":1,"replicas":[2,3]}]}') == {("t", 1): [2, 3]}
    with pytest.raises(E.InvalidRequestError, match="listed twice"):
        cluster_admin.parse_reassignment(b'{"partitions":[{"topic":"t","partition":1,"replicas":[2]},'
                                         b'{"topic":"t","partition":1,"replicas":[3]}]}')


def test_proposed_assignments_place_distinct_replicas_on_the_brokers_given():
    got = cluster_admin.propose_assignment(6, 2, [4, 5, 7], random.Random(1))
    assert sorted(got) == list(range(6))
    assert all(len(set(r)) == 2 and set(r) <= {4, 5, 7} for r in got.values())
    assert sorted(r[0] for r in got.values()) == [4, 4, 5, 5, 7, 7]   # leaders spread evenly


def test_overrides_and_properties_read_as_the_broker_reads_them(tmp_path):
    assert cluster_admin.parse_overrides(["a=1", "b = 2", "a=3"]) == {"a": "3", "b": "2"}
    with pytest.raises(E.InvalidConfigError, match="malformed override 'x'"):
        cluster_admin.parse_overrides(["x"])
    f = tmp_path / "c.properties"
    f.write_text("# comment\nk=v\n")
    assert cluster_admin.read_properties(str(f)) == {"k": "v"}
    with pytest.raises(E.InvalidConfigError, match="does not exist"):
        cluster_admin.read_properties(str(tmp_path / "none"))


class _TrailingStore:
    """A view whose answers reach the wanted one only after ``stale`` reads, as a
    broker's metadata cache trails ZooKeeper."""
    metadata_settle_s = 5.0

    def __init__(self, stale: int):
        self.reads = 0
        self.stale = stale

    def read(self) -> str:
        self.reads += 1
        return "new" if self.reads > self.stale else "old"


def test_settled_rereads_a_trailing_view_until_it_shows_the_outcome():
    store = _TrailingStore(stale=3)
    assert cluster_admin.settled(store, store.read, lambda got: got == "new", poll_s=0.001) == "new"
    assert store.reads == 4


def test_settled_reports_the_last_answer_once_the_settle_time_is_over():
    store = _TrailingStore(stale=10**9)
    store.metadata_settle_s = 0.05
    assert cluster_admin.settled(store, store.read, lambda got: got == "new", poll_s=0.001) == "old"
    assert store.reads > 1


def test_settled_reads_zookeeper_once():
    class Record:   # ZooKeeper's view (ZkStore) is the record itself: no settle time
        reads = 0

        def read(self):
            self.reads += 1
            return "old"
    store = Record()
    assert cluster_admin.settled(store, store.read, lambda got: got == "new") == "old"
    assert store.reads == 1
