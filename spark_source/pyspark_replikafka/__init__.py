"""Makes ``spark.read.format("replikafka")`` work with no registration call.

pyspark registers the ``DefaultSource`` of every importable top-level module
whose name starts with ``pyspark_``, under ``DefaultSource.name()``. The
implementation lives in :mod:`replikafka.spark`; importing this module loads
only pyspark, so it can never break Spark's lookup of other data sources.
"""
from replikafka.spark.data_source import ReplikafkaDataSource as DefaultSource

__all__ = ["DefaultSource"]
