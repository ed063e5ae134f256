"""The broker's metadata cache keeps each topic's Metadata answer ready and
brings only what changed up to date: its answers must stay exactly what a
from-scratch build of the same state gives, through every kind of change."""
from __future__ import annotations

import random

from replikafka.broker.metadata_cache import MetadataCache
from replikafka.broker.replica import messages as M
from replikafka.protocol import replikafka_pb2 as pb

SCHEMA = b"schema-bytes"


def from_scratch(cache: MetadataCache, topics: list[str], all_topics: bool) -> pb.MetadataResponse:
    """The answer built from the cache's plain state, one partition at a time (the oracle)."""
    names = sorted(cache.topics) if all_topics or not topics else list(topics)
    out = pb.MetadataResponse(controller_id=cache.controller_id, brokers=[
        pb.BrokerEndpoint(id=b, host=h, port=p, endpoints=cache.broker_endpoints.get(b, ()))
        for b, (h, p) in sorted(cache.brokers.items())])
    for name in names:
        entry = cache.topics.get(name)
        if entry is None:
            out.topics.append(pb.TopicMetadata(name=name, error=pb.Error(
                code="UNKNOWN_TOPIC_OR_PARTITION", message=f"topic {name!r} does not exist")))
            continue
        tm = pb.TopicMetadata(name=name, schema=entry.schema, config=entry.config)
        for p, s in sorted(entry.partitions.items()):
            err = pb.Error()
            if s.leader < 0 or s.leader not in cache.brokers:
                err = pb.Error(code="LEADER_NOT_AVAILABLE", message=f"{name}-{p} has no live leader")
            tm.partitions.append(pb.PartitionMetadata(partition=p, leader=s.leader, leader_epoch=s.leader_epoch,
                                                      replicas=s.replicas, isr=s.isr, error=err))
        out.topics.append(tm)
    return out


def brokers(ids) -> tuple[M.BrokerEndpoint, ...]:
    return tuple(M.BrokerEndpoint(b, "127.0.0.1", 9000 + b, (f"PLAINTEXT://127.0.0.1:{9000 + b}",), 10 * b)
                 for b in sorted(ids))


def role(topic, p, leader, epoch, version=0, controller_epoch=1) -> M.PartitionRole:
    replicas = (1, 2, 3)
    isr = tuple(r for r in replicas if r == leader or r != (leader % 3) + 1)
    return M.PartitionRole(topic, p, leader, epoch, isr, replicas, version, controller_epoch)


def assert_same(cache: MetadataCache, asks=((["a"], False), (["b", "a", "gone"], False), ([], True))):
    for topics, all_topics in asks:
        got = cache.metadata_response(list(topics), all_topics)
        want = from_scratch(cache, list(topics), all_topics)
        assert got == want
        assert got.SerializeToString(deterministic=True) == want.SerializeToString(deterministic=True)


def test_answers_equal_a_from_scratch_build_through_random_changes():
    rng = random.Random(7)
    cache = MetadataCache()
    epochs: dict[tuple[str, int], int] = {}
    counts = {"a": 40, "b": 7}
    info = {t: M.TopicInfo(SCHEMA, {"retention.ms": "1"}, f"id-{t}", n) for t, n in counts.items()}
    cache.update(M.UpdateMetadataRequest(1, 1, tuple(role(t, p, 1 + p % 3, 0) for t, n in counts.items()
                                                     for p in range(n)),
                                         brokers({1, 2, 3}), info, full=True))
    assert_same(cache)
    live = {1, 2, 3}
    for step in range(300):
        kind = rng.choice(["lai", "update", "brokers", "config", "remove", "add", "delete", "stale-epoch"])
        topic = rng.choice(list(counts))
        if kind in ("lai", "update", "stale-epoch"):
            changed = []
            for p in rng.sample(range(counts[topic]), k=min(counts[topic], rng.randint(1, 9))):
                e = epochs.get((topic, p), 0) + (0 if kind == "stale-epoch" else 1)
                if kind == "stale-epoch":   # an older state: the cache keeps what it has
                    e -= 1
                else:
                    epochs[(topic, p)] = e
                changed.append(role(topic, p, rng.choice([-1, 1, 2, 3, 4]), e, version=e))
            if kind == "lai":
                cache.apply_leader_and_isr(M.LeaderAndIsrRequest(1, 1, 0, tuple(changed), {topic: info[topic]}))
            else:
                cache.update(M.UpdateMetadataRequest(1, 1, tuple(changed), brokers(live), {topic: info[topic]}))
        elif kind == "brokers":   # a broker comes or goes: errors of the partitions it leads change
            live = set(rng.sample([1, 2, 3, 4], k=rng.randint(1, 4)))
            cache.update(M.UpdateMetadataRequest(1, 1, (), brokers(live)))
        elif kind == "config":
            info[topic] = M.TopicInfo(SCHEMA, {"retention.ms": str(step)}, f"id-{topic}", counts[topic])
            if rng.random() < 0.5:
                cache.set_topic_config(topic, {"retention.ms": f"dyn{step}"})
            else:
                cache.update(M.UpdateMetadataRequest(1, 1, (), brokers(live), {topic: info[topic]}))
        elif kind == "remove" and counts[topic] > 2:   # partitions at or past the count go (seed 000 H)
            counts[topic] -= 1
            info[topic] = M.TopicInfo(SCHEMA, info[topic].config, f"id-{topic}", counts[topic])
            cache.update(M.UpdateMetadataRequest(1, 1, (), brokers(live), {topic: info[topic]}))
        elif kind == "add":
            p = counts[topic]
            counts[topic] += 1
            info[topic] = M.TopicInfo(SCHEMA, info[topic].config, f"id-{topic}", counts[topic])
            cache.update(M.UpdateMetadataRequest(1, 1, (role(topic, p, 2, 0),), brokers(live), {topic: info[topic]}))
        elif kind == "delete" and rng.random() < 0.2:   # deleted, then created again under a new id
            cache.update(M.UpdateMetadataRequest(1, 1, (), brokers(live), deleted_topics=(topic,)))
            assert_same(cache)
            counts[topic] = rng.randint(1, 12)
            info[topic] = M.TopicInfo(SCHEMA, {}, f"id-{topic}-{step}", counts[topic])
            for p in range(counts[topic]):
                epochs[(topic, p)] = 0
            cache.update(M.UpdateMetadataRequest(1, 1, tuple(role(topic, p, 1, 0) for p in range(counts[topic])),
                                                 brokers(live), {topic: info[topic]}))
        if rng.random() < 0.6:   # answers between changes too, not only after several
            assert_same(cache)
    assert_same(cache)


def test_an_answer_given_out_is_not_changed_by_later_updates():
    cache = MetadataCache()
    info = {"a": M.TopicInfo(SCHEMA, {}, "id-a", 3)}
    cache.update(M.UpdateMetadataRequest(1, 1, tuple(role("a", p, 1, 0) for p in range(3)), brokers({1, 2, 3}),
                                         info, full=True))
    first = cache.metadata_response(["a"], False)
    kept = first.SerializeToString()
    cache.update(M.UpdateMetadataRequest(1, 1, (role("a", 1, 2, 1, 1),), brokers({1, 2}), info))
    second = cache.metadata_response(["a"], False)
    assert first.SerializeToString() == kept      # the caller's copy, serialized outside the lock
    assert second.topics[0].partitions[1].leader == 2
    assert second.topics[0].partitions[1].leader_epoch == 1
    assert second == from_scratch(cache, ["a"], False)
