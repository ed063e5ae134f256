"""The client library behind ``import replikafka``.

- :mod:`.connection`  gRPC channel pool, bootstrap parsing, error translation
- :mod:`.metadata`    thread-safe cache of brokers, topics and leaders
- :mod:`.offsets`     ListOffsets to partition leaders (earliest, latest, by time)
- :mod:`.admin`       :class:`Admin`: create/describe/list/delete topics, add partitions
- :mod:`.accumulator` the producer's per-partition batching and sequence numbers
- :mod:`.producer`    :class:`Producer`: futures, batching, retries, idempotence
- :mod:`.consumer`    :class:`Consumer`: assign/seek/poll returning Arrow tables
- :mod:`.partitioner` Kafka's murmur2 key partitioner
"""
