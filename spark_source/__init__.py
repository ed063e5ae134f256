"""replikafka's Spark data source: ``format("replikafka")`` for batch and
streaming reads and writes (Spark's Python Data Source API, pyspark 4.3).

Modules, in the order a read flows through them:

- :mod:`~replikafka.spark.options` — the options, validated; errors name the option.
- :mod:`~replikafka.spark.data_source` — the ``DataSource`` (``DefaultSource`` of
  the top-level :mod:`pyspark_replikafka`).
- :mod:`~replikafka.spark.cluster_access` — questions to the cluster (partitions,
  high watermarks, offsets for times) over the client library.
- :mod:`~replikafka.spark.offsets_planning` — ranges, splitting, admission control,
  checkpoint JSON (pure).
- :mod:`~replikafka.spark.filters` — filter pushdown (pure).
- :mod:`~replikafka.spark.batch_reader`, :mod:`~replikafka.spark.stream_reader` —
  the readers.
- :mod:`~replikafka.spark.range_fetcher` — the executor loop that returns exactly a
  planned range.
- :mod:`~replikafka.spark.arrow_convert` — Arrow <-> Spark types and batches (vectorised).
- :mod:`~replikafka.spark.writer` — the exactly-once sink.
- :mod:`~replikafka.spark.environment` — making Spark's Python workers run the
  right interpreter and find ``pyspark_replikafka``.

Import-light on purpose: importing this package loads nothing but the helpers
below.
"""
from replikafka.spark.environment import local_session, prepare_spark_environment

__all__ = ["local_session", "prepare_spark_environment"]
