"""`reassign-partitions` and `preferred-replica-election` against a real
ZooKeeper holding a cluster's znodes (no controller running, so nothing moves):
plan generation, validation, the errors they print and their exit codes."""
from __future__ import annotations

import json

import pytest

from replikafka.broker.zk_store import ZkStore
from replikafka.cli.main import main

pytestmark = pytest.mark.integration


@pytest.fixture
def store(kazoo_client):
    s = ZkStore(kazoo_client)
    s.ensure_paths()
    for b in (1, 2, 3, 4):
        s.register_broker(b, "127.0.0.1", 9000 + b)
    s.create_topic("t", {0: [1, 2, 3], 1: [2, 3, 1], 2: [3, 1, 2]}, b"", {})
    return s


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def plan_file(tmp_path, plan, name="plan.json"):
    p = tmp_path / name
    p.write_text(json.dumps({"version": 1, "partitions": [{"topic": t, "partition": n, "replicas": r}
                                                         for (t, n), r in plan.items()]}))
    return str(p)


def test_generate_proposes_round_robin_over_the_broker_list(store, zk_connect, tmp_path, capsys):
    topics = tmp_path / "topics.json"
    topics.write_text(json.dumps({"version": 1, "topics": [{"topic": "t"}]}))
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--topics-to-move-json-file",
                       str(topics), "--broker-list", "2,3,4", "--generate")
    assert rc == 0, err
    current, proposed = [json.loads(block.split("\n", 1)[1]) for block in out.strip().split("\n\n")]
    assert {(e["partition"], tuple(e["replicas"])) for e in current["partitions"]} == \
        {(0, (1, 2, 3)), (1, (2, 3, 1)), (2, (3, 1, 2))}
    assert sorted(e["partition"] for e in proposed["partitions"]) == [0, 1, 2]
    assert all(sorted(e["replicas"]) == [2, 3, 4] for e in proposed["partitions"])
    assert sorted(e["replicas"][0] for e in proposed["partitions"]) == [2, 3, 4]   # leaders spread
    assert store.get_reassignment() == {}   # nothing changed
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--topics-to-move-json-file",
                       str(topics), "--broker-list", "2,3", "--generate")
    assert rc == 1 and "replication factor 3 is larger" in err


@pytest.mark.parametrize("plan, named", [
    ({("nope", 0): [1, 2]}, "topic 'nope' does not exist"),
    ({("t", 7): [1, 2]}, "partitions t-7 do not exist"),
    ({("t", 0): [1, 9]}, "brokers [9] in the plan are not registered"),
])
def test_execute_refuses_a_plan_naming_what_is_wrong(store, zk_connect, tmp_path, capsys, plan, named):
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--reassignment-json-file",
                       plan_file(tmp_path, plan), "--execute", "--no-wait")
    assert rc == 1 and named in err, err
    assert store.get_reassignment() == {}


@pytest.mark.parametrize("content, named", [
    ("{not json", "is not valid JSON"),
    ('{"version": 1}', "bad reassignment JSON"),
    ('{"version": 1, "partitions": []}', "lists no partitions"),
    ('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 1]}]}', "distinct replicas"),
    ('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": "45"}]}', "must be a list"),
    ('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [true, 2]}]}', "not a whole number"),
    ('{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]},'
     ' {"topic": "t", "partition": 0, "replicas": [2, 3]}]}', "t-0 is listed twice"),
])
def test_a_malformed_plan_file_is_a_usage_error(store, zk_connect, tmp_path, capsys, content, named):
    p = tmp_path / "bad.json"
    p.write_text(content)
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--reassignment-json-file",
                       str(p), "--execute")
    assert rc == 2 and named in err and "Traceback" not in err, err


def test_execute_then_verify_in_progress_completed_and_failed(store, zk_connect, tmp_path, capsys):
    plan = {("t", 0): [2, 3, 4], ("t", 1): [3, 4, 2]}
    path = plan_file(tmp_path, plan)
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--reassignment-json-file", path,
                       "--execute", "--no-wait")
    assert rc == 0 and "Successfully started reassignment of 2 partitions" in out
    assert '"replicas": [1, 2, 3]' in out   # the current assignment, for a roll-back
    assert store.get_reassignment() == plan
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--reassignment-json-file", path,
                       "--execute", "--no-wait")
    assert rc == 1 and "already in progress" in err
    rc, out, _ = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--reassignment-json-file", path,
                     "--verify")
    assert rc == 1 and out.count("is still in progress") == 2
    # As the controller would: partition 0 done, partition 1 abandoned.
    store.update_assignment("t", {0: [2, 3, 4]})
    store.set_reassignment({})
    rc, out, _ = run(capsys, "reassign-partitions", "--zookeeper", zk_connect, "--reassignment-json-file", path,
                     "--verify")
    assert rc == 1
    assert "Reassignment of partition t-0 completed successfully" in out
    assert "Reassignment of partition t-1 failed" in out


def test_a_bad_zookeeper_address_is_one_line(capsys):
    rc, out, err = run(capsys, "reassign-partitions", "--zookeeper", "127.0.0.1:notaport", "--verify",
                       "--reassignment-json-file", "/dev/null")
    assert rc == 2 and "Traceback" not in err   # the file is checked first
    rc, out, err = run(capsys, "preferred-replica-election", "--zookeeper", "127.0.0.1:notaport")
    assert rc == 1 and "is not HOST:PORT" in err and "Traceback" not in err


def test_preferred_replica_election_checks_partitions_and_waits_for_the_controller(store, zk_connect, tmp_path,
                                                                                    capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"partitions": [{"topic": "t", "partition": 5}]}))
    rc, out, err = run(capsys, "preferred-replica-election", "--zookeeper", zk_connect, "--path-to-json-file",
                       str(bad))
    assert rc == 1 and "partitions t-5 do not exist" in err
    bad.write_text("[]")
    rc, out, err = run(capsys, "preferred-replica-election", "--zookeeper", zk_connect, "--path-to-json-file",
                       str(bad))
    assert rc == 2 and "want" in err
    # No controller runs here: the request is written, and the wait times out naming it.
    rc, out, err = run(capsys, "preferred-replica-election", "--zookeeper", zk_connect, "--timeout-ms", "300")
    assert rc == 1 and "did not finish the election" in err
    assert sorted(store.get_preferred_election()) == [("t", 0), ("t", 1), ("t", 2)]
    rc, out, err = run(capsys, "preferred-replica-election", "--zookeeper", zk_connect)
    assert rc == 1 and "already in progress" in err
