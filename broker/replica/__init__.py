"""Replication on one broker: partitions, the replica manager and the follower fetchers.

The pure cores (``partition_state``, ``leader_epoch_truncation``, ``producer_state``) decide;
the shells (``partition``, ``replica_manager``, ``replica_fetcher``) hold the locks and do the I/O.
"""
