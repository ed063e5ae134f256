"""Replication on one broker: partitions, the replica manager and the follower fetchers.

The pure cores decide (``partition_state``: HW, ISR, the leader's and the
follower's facts; ``leader_epoch_truncation``; ``producer_state``; ``fetch_session``:
both sides of the followers' incremental fetch sessions); the shells
(``partition``, ``replica_manager``, ``replica_fetcher``) hold the locks and do
the I/O. Everything here takes and returns the plain data of ``messages`` and
raises the one error tree; protobuf, the follower wire codec and the produce wire
checks are the RPC layer's (``broker/replica_rpc.py``).

Lock order (as Kafka's ``Partition.scala`` writes its own down). A thread holding
a lock may take only locks further down its line, never one above::

    ReplicaManager._sessions_lock            followers' fetch sessions (fetch_session.py)
      -> ChangeJournal.lock                  what moved, for those sessions
    ReplicaManager.role_change_lock          one LeaderAndIsr (or zombie demotion) at a time
      -> ReplicaManager.lock                 the partition map, offline set, controller epoch
           -> LogManager's locks             creating a partition's log
      -> MetadataCache.lock                  a LeaderAndIsr's topics, once accepted
      -> ReplicaFetcherManager.lock          which fetcher follows which partition
           -> ReplicaFetcher.lock            that fetcher's partitions and their states
      -> Partition.lock (= Partition.cond)   role, LeaderState / FollowerState, producer state
           -> Log's locks                    appends, truncation, the leader epoch cache
           -> ChangeJournal.lock             (its append: only when it outgrows its bound)

``ReplicaManager.data_arrived`` (long-polling fetches) is taken with no other lock
held. No lock is held across ZooKeeper I/O (``do_isr_work``'s conditional writes)
or a call to a leader (a fetcher's round), except that a fetcher's or an acks=all
produce's wait on a partition's ``cond`` releases its lock while waiting.
"""
