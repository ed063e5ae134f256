"""ZkStore against a real ZooKeeper: partition states read with multiRead."""
from __future__ import annotations

import pytest

from replikafka.broker.zk_store import LeaderAndIsr, ZkStore

pytestmark = pytest.mark.integration


def test_many_states_in_multi_reads_missing_ones_left_out(kazoo_client):
    store = ZkStore(kazoo_client)           # a chroot: paths go through it
    store.ensure_paths()
    states = {("a", p): LeaderAndIsr(1 + p % 3, p, (1 + p % 3, 2), 4) for p in range(2500)}
    store.create_partition_states(states)
    store.update_partition_state("a", 7, LeaderAndIsr(2, 8, (2,), 5), 0)
    asked = [("a", p) for p in range(2500)] + [("missing", 0), ("a", 9999)]
    got = store.get_partition_states(asked)
    assert store._multi_read_ok                           # 3 multiReads of up to 1000, not 2502 gets
    assert set(got) == set(states)
    assert got[("a", 7)] == (LeaderAndIsr(2, 8, (2,), 5), 1)
    assert all(got[tp] == (s, 0) for tp, s in states.items() if tp != ("a", 7))
    assert got == store._read_states_pipelined(asked)     # the fallback reads the same
    assert store.get_partition_states([]) == {}


def test_state_creates_in_multis_leave_existing_states_alone(kazoo_client):
    store = ZkStore(kazoo_client)
    store.ensure_paths()
    first = {("b", p): LeaderAndIsr(1, 0, (1, 2), 4) for p in range(0, 1200, 2)}
    assert store.create_partition_states(first) == {tp: 0 for tp in first}
    store.update_partition_state("b", 4, LeaderAndIsr(2, 1, (2,), 4), 0)
    # A retry (controller failover) over a range where every other partition exists:
    # each multi holding one fails whole, then goes one create at a time.
    again = {("b", p): LeaderAndIsr(3, 0, (3,), 5) for p in range(1200)}
    assert store.create_partition_states(again) == {("b", p): 0 for p in range(1, 1200, 2)}
    got = store.get_partition_states(list(again))
    assert got[("b", 4)] == (LeaderAndIsr(2, 1, (2,), 4), 1) and got[("b", 2)] == (first[("b", 2)], 0)
    assert all(got[("b", p)] == (again[("b", p)], 0) for p in range(1, 1200, 2))
    # Pipelined conditional writes (a leader's ISR changes): each applied or refused on its own.
    new = LeaderAndIsr(1, 0, (1,), 4)
    assert store.update_partition_states([("b", 2, new, 0), ("b", 4, new, 0), ("b", 3, new, 0),
                                          ("missing", 0, new, 0)]) == [1, None, 1, None]
    assert store.get_partition_state("b", 4) == (LeaderAndIsr(2, 1, (2,), 4), 1)


def test_registration_publishes_every_listener(kazoo_client):
    store = ZkStore(kazoo_client)
    store.ensure_paths()
    epoch = store.register_broker(7, "h7", 9092, endpoints=("PLAINTEXT://h7:9092", "FLIGHT://h7:9192"))
    store.register_broker(8, "h8", 9093)                   # an older registration: no endpoints field
    endpoints, epochs = {}, {}
    assert store.live_brokers(epochs=epochs, endpoints=endpoints) == {7: ("h7", 9092), 8: ("h8", 9093)}
    assert endpoints == {7: ("PLAINTEXT://h7:9092", "FLIGHT://h7:9192"), 8: ()}
    assert epochs[7] == epoch


def test_topic_config_changes_write_notifications_that_are_listed_and_purged(kazoo_client):
    import time

    store = ZkStore(kazoo_client)
    store.ensure_paths()
    store.create_topic("t", {0: [1]}, b"schema-bytes", {"topic.id": "abc"})
    store.set_topic_config("t", {"topic.id": "abc", "retention.ms": "5"})
    store.set_topic_config("t", {"topic.id": "abc"})
    assert store.get_topic_config("t") == ({"topic.id": "abc"}, b"schema-bytes")  # the schema stays
    changes = store.config_changes()
    assert [e for _, e in changes] == ["topics/t", "topics/t"] and changes[0][0] < changes[1][0]
    now = int(time.time() * 1000)
    assert store.purge_config_changes(60_000, now) == 0          # young: kept
    assert store.purge_config_changes(60_000, now + 120_000) == 2  # old: gone
    assert store.config_changes() == []


def test_guarded_state_writes_in_multis_fenced_by_the_controller_epoch(kazoo_client):
    """The controller's state writes (zk_store.state_multi_async: kazoo's multi request,
    serialized in one pass) through a chroot: every chunk is checked against the
    controller epoch's znode version; a state whose version moved is reported, the
    rest of its chunk written again; a moved epoch fences the whole write."""
    import json

    from replikafka.broker import zk_store as Z

    store = ZkStore(kazoo_client)
    store.ensure_paths()
    epoch, epoch_version = store.increment_controller_epoch()
    states = {("g", p): LeaderAndIsr(1, 0, (1, 2, 3), epoch) for p in range(2500)}
    store.create_partition_states(states)
    store.update_partition_state("g", 1500, LeaderAndIsr(1, 0, (1, 2), epoch), 0)   # a leader's own ISR write
    new = {tp: (LeaderAndIsr(2, 1, (2, 3), epoch), 0) for tp in states}
    ok, failed = Z.guarded_state_writes(kazoo_client, epoch_version, new)
    assert failed == [("g", 1500)] and set(ok) == set(states) - {("g", 1500)} and set(ok.values()) == {1}
    got = store.get_partition_states(list(states))
    assert got[("g", 1500)] == (LeaderAndIsr(1, 0, (1, 2), epoch), 1)
    assert all(got[tp] == (LeaderAndIsr(2, 1, (2, 3), epoch), 1) for tp in ok)
    data, _ = kazoo_client.get(Z.state_path("g", 0))      # the JSON json.dumps writes, byte for byte
    assert data == json.dumps({"version": 1, "leader": 2, "leader_epoch": 1, "controller_epoch": epoch,
                               "isr": [2, 3]}).encode()
    store.increment_controller_epoch()                     # another controller took over
    with pytest.raises(Z.ControllerMovedError):
        Z.guarded_state_writes(kazoo_client, epoch_version, {("g", 0): (LeaderAndIsr(3, 2, (3,), epoch), 1)})
    assert store.get_partition_state("g", 0) == (LeaderAndIsr(2, 1, (2, 3), epoch), 1)


def test_a_read_decodes_each_distinct_state_once(kazoo_client):
    """Equal state values read as one shared (frozen) LeaderAndIsr: a read of 50,000
    states meets tens of distinct values, and a JSON decode each was most of it."""
    store = ZkStore(kazoo_client)
    store.ensure_paths()
    states = {("d", p): LeaderAndIsr(1 + p % 2, 0, (1, 2), 3) for p in range(6)}
    store.create_partition_states(states)
    for read in (store._read_states_multi, store._read_states_pipelined):
        got = read(list(states))
        assert {tp: s for tp, (s, _v) in got.items()} == states
        assert got[("d", 0)][0] is got[("d", 2)][0] is got[("d", 4)][0]
        assert got[("d", 1)][0] is got[("d", 3)][0] and got[("d", 0)][0] is not got[("d", 1)][0]


def test_multi_read_replies_parse_data_missing_values_and_errors():
    """A multiRead reply as ZooKeeper frames it: per op a header, then the data (length
    -1: no value) and the stat, or an error code; then the closing header."""
    import struct

    from kazoo.exceptions import NoNodeError
    from kazoo.protocol.serialization import int_struct, multiheader_struct, stat_struct

    from replikafka.broker.zk_store import _MultiRead

    stat = tuple(range(1, 12))
    buf = (b"junk" + multiheader_struct.pack(4, False, 0) + int_struct.pack(3) + b"abc" + stat_struct.pack(*stat)
           + multiheader_struct.pack(-1, False, -101) + int_struct.pack(-101)
           + multiheader_struct.pack(4, False, 0) + int_struct.pack(-1) + stat_struct.pack(*stat)
           + multiheader_struct.pack(-1, True, -1))
    (d1, s1), missing, (d3, s3) = _MultiRead.deserialize(buf, 4)
    assert d1 == b"abc" and tuple(s1) == stat and s1.mzxid == 2 and s1.version == 5
    assert isinstance(missing, NoNodeError) and d3 is None and tuple(s3) == stat
    with pytest.raises(ValueError, match="unexpected result type 5"):
        _MultiRead.deserialize(multiheader_struct.pack(5, False, 0) + struct.pack("!i", 0), 0)


def test_state_multi_requests_are_kazoos_transaction_byte_for_byte(monkeypatch):
    """The controller's multi, serialized op by op once on the event thread, is the request
    kazoo's Transaction makes of the same check and sets: paths under the chroot, a
    non-ASCII topic, states shared between partitions, and each partition's own version."""
    from kazoo.protocol.serialization import CheckVersion, SetData, Transaction

    from replikafka.broker import zk_store as Z

    class Answer:
        def get(self):
            return self.value

    class Client:     # what state_multi_async asks of a KazooClient; each multi answered as all written
        chroot = "/c-é"
        handler = type("Handler", (), {"async_result": staticmethod(Answer)})

        def _call(self, request, answer):
            sent.append(request)
            answer.value = (True, [10 + i for i in range(len(request.writes))])

    sent: list = []
    shared = LeaderAndIsr(2, 7, (2, 3), 4)
    updates = {("tö", 0): (shared, 3), ("tö", 12): (shared, 0), ("u", 5): (LeaderAndIsr(-1, 8, (), 4), 2 ** 31 - 1)}
    monkeypatch.setattr(Z, "MULTI_OPS_MAX", 2)
    client = Client()
    assert Z.guarded_state_writes(client, 9, updates) == ({("tö", 0): 10, ("tö", 12): 11, ("u", 5): 10}, [])
    items = [(tp, s, v) for tp, (s, v) in updates.items()]
    assert len(sent) == 2
    for request, chunk in zip(sent, (items[:2], items[2:])):
        assert [tp for tp, _op in request.writes] == [tp for tp, _s, _v in chunk]
        theirs = Transaction([CheckVersion(client.chroot + Z.CONTROLLER_EPOCH, 9)] + [
            SetData(client.chroot + Z.state_path(*tp), s.to_json(), v) for tp, s, v in chunk])
        assert request.serialize() == theirs.serialize() and request.type == theirs.type


def test_state_multi_replies_parse_as_kazoos_transaction_does():
    """The guarded writes' multi reply (check, sets, errors) parses as kazoo's own
    Transaction parser gives it, on an unrolled path that keeps each set's version only."""
    from kazoo.protocol.serialization import Transaction, int_struct, multiheader_struct, stat_struct

    from replikafka.broker.zk_store import _StateMulti

    stats = [tuple(range(i, i + 11)) for i in (1, 20)]
    ok = (b"--" + multiheader_struct.pack(13, False, 0) + multiheader_struct.pack(5, False, 0)
          + stat_struct.pack(*stats[0]) + multiheader_struct.pack(5, False, 0) + stat_struct.pack(*stats[1])
          + multiheader_struct.pack(-1, True, -1))
    failed = (multiheader_struct.pack(-1, False, -2) + int_struct.pack(-2)
              + multiheader_struct.pack(-1, False, -103) + int_struct.pack(-103)
              + multiheader_struct.pack(-1, False, -2) + int_struct.pack(-2) + multiheader_struct.pack(-1, True, -1))
    for buf, offset in ((ok, 2), (failed, 0)):
        (check, versions), theirs = _StateMulti.deserialize(buf, offset), Transaction.deserialize(buf, offset)
        assert [type(r) for r in [check, *versions]] == [
            type(r) if isinstance(r, (bool, Exception)) else int for r in theirs] and len(versions) == 2
        assert [r for r in versions if not isinstance(r, Exception)] == [
            r.version for r in theirs[1:] if not isinstance(r, Exception)]
    assert _StateMulti.deserialize(ok, 2) == (True, [stats[0][4], stats[1][4]])


# ZooKeeper drops the connection of a request over jute.maxbuffer (1 MiB): the client sees
# only ConnectionLoss. A long topic name makes 30,000 partitions about 2 MB of list.
LONG_TOPIC = "orders-" + "x" * 40
MANY = [(LONG_TOPIC, p) for p in range(30_000)]


def test_long_notifications_are_split_over_znodes_and_read_whole(kazoo_client):
    from replikafka.broker.zk_store import ISR_CHANGE, LOG_DIR_EVENT, ZNODE_DATA_BYTES_MAX

    store = ZkStore(kazoo_client)
    store.ensure_paths()
    store.notify_isr_change(MANY)
    store.notify_log_dir_failure(3, MANY)
    for parent in (ISR_CHANGE, LOG_DIR_EVENT):
        children = kazoo_client.get_children(parent)
        assert len(children) >= 2, f"{parent}: one znode for about 2 MB"
        assert all(len(kazoo_client.get(f"{parent}/{c}")[0]) <= ZNODE_DATA_BYTES_MAX for c in children)
    assert store.take_isr_change_notifications() == set(MANY)
    assert store.take_log_dir_events() == {3: set(MANY)}
    assert kazoo_client.get_children(ISR_CHANGE) == [] and kazoo_client.get_children(LOG_DIR_EVENT) == []
    store.notify_log_dir_failure(4, [])          # a dir with no partitions still tells the controller
    assert store.take_log_dir_events() == {4: set()}


def test_documents_too_big_for_a_znode_are_refused_by_name_and_the_client_keeps_working(kazoo_client):
    from replikafka import errors as E
    from replikafka.broker.zk_store import partition_list_batches

    store = ZkStore(kazoo_client)
    store.ensure_paths()
    with pytest.raises(E.InvalidRequestError, match=r"preferred replica election of 30,000 partitions would be "
                                                     r"[\d,]+ bytes.*jute.maxbuffer"):
        store.create_preferred_election(MANY)
    with pytest.raises(E.InvalidRequestError, match=r"reassignment of 30,000 partitions"):
        store.create_reassignment({tp: [1, 2, 3] for tp in MANY})
    with pytest.raises(E.InvalidPartitionsError, match=r"assignment of topic 'big' \(100,000 partitions\)"):
        store.create_topic("big", {p: [1, 2, 3] for p in range(100_000)}, b"schema", {})
    assert store.get_assignment("big") is None and store.get_preferred_election() is None
    # In rounds that each fit, the same election goes through, and the session never broke.
    batches = partition_list_batches(MANY)
    assert len(batches) >= 2 and [tp for b in batches for tp in b] == MANY
    for batch in batches:
        store.create_preferred_election(batch)
        assert store.get_preferred_election() == sorted(batch)
        store.delete_preferred_election()
