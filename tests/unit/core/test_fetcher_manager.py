"""ReplicaFetcherManager: partitions added and removed in batches (a LeaderAndIsr for
thousands of partitions), one fetcher per leader, idle fetchers stopped."""
from __future__ import annotations

from replikafka.broker.replica import messages as M
from replikafka.broker.replica.replica_fetcher import ReplicaFetcherManager


class IdleLeader:
    def fetch(self, request, timeout_s):
        return M.FetchResponse()

    def offsets_for_leader_epoch(self, replica_id, queries, timeout_s):
        return []

    def close(self):
        pass


def manager(num_fetchers=1):
    made = []

    def endpoint(leader_id):
        made.append(leader_id)
        return IdleLeader()

    m = ReplicaFetcherManager(1, num_fetchers, lambda tp: None, endpoint, max_wait_ms=10, min_bytes=1,
                              max_bytes=1 << 20, backoff_ms=10, request_timeout_s=1.0)
    return m, made


def states(m):
    return {k: dict(f.states) for k, f in m.fetchers.items()}


def test_batches_go_to_one_fetcher_per_leader_and_move_with_their_leader():
    m, made = manager()
    try:
        m.add_partitions({("t", p): (2 if p % 2 else 3, 5) for p in range(1000)})
        assert sorted(made) == [2, 3]
        got = states(m)
        assert len(got[(2, 0)]) == len(got[(3, 0)]) == 500
        assert got[(2, 0)][("t", 1)].leader_epoch == 5 and got[(2, 0)][("t", 1)].truncating
        # A new leader for some: they leave their old fetcher in the same pass.
        m.add_partitions({("t", p): (3, 6) for p in range(1, 1000, 2)})
        got = states(m)
        assert (2, 0) not in got                    # left idle: stopped
        assert len(got[(3, 0)]) == 1000 and got[(3, 0)][("t", 1)].leader_epoch == 6
        m.remove_partitions([("t", p) for p in range(500)] + [("nope", 0)])
        assert len(states(m)[(3, 0)]) == 500
        m.remove_partitions([("t", p) for p in range(1000)])
        assert m.fetchers == {} and m.owner == {}
        m.add_partition(("t", 7), 4, 1)             # the single-partition calls are the same path
        assert states(m) == {(4, 0): {("t", 7): m.fetchers[(4, 0)].states[("t", 7)]}}
        m.remove_partition(("t", 7))
        assert m.fetchers == {}
    finally:
        m.shutdown()
