"""``format("replikafka")``: the Spark Python data source.

Spark finds it without a ``spark.dataSource.register`` call: the top-level
module :mod:`pyspark_replikafka` exposes this class as ``DefaultSource``, and
pyspark registers every ``pyspark_*`` module's ``DefaultSource`` by its
``name()`` when a session first uses a Python data source.

Spark runs every method here in a Python *worker* process, not in the user's
process: ``schema()`` when the DataFrame is created, ``reader()`` /
``streamReader()`` / ``writer()`` when a query is planned, and the readers'
``read()`` / writers' ``write()`` in executor tasks. The workers must run an
interpreter with replikafka installed (``PYSPARK_PYTHON``; see
:mod:`replikafka.spark.environment`). This module imports only pyspark at load
time, so a worker without pyarrow fails with a message saying so, and the
lookup of other ``pyspark_*`` data sources never breaks because of us.
"""
from __future__ import annotations

import sys

from pyspark.sql.datasource import DataSource


def _imports():
    try:
        import pyarrow  # noqa: F401
        import grpc  # noqa: F401
        import replikafka.records  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"replikafka: the Spark Python worker {sys.executable} cannot import {exc.name!r}. Spark's workers "
            "must run the interpreter replikafka is installed in: set PYSPARK_PYTHON to it (./build.sh does; or "
            "call replikafka.spark.prepare_spark_environment() before creating the SparkSession)") from exc


class ReplikafkaDataSource(DataSource):
    """Batch and streaming reads and writes of replikafka topics. Options: see
    :mod:`replikafka.spark.options` and ``INTERFACE.md``."""

    @classmethod
    def name(cls) -> str:
        return "replikafka"

    # ------------------------------------------------------------ reads
    def _resolve(self, opts, user_schema=None):
        """The output layout, from the subscribed topics' schema on the cluster now."""
        from replikafka.records import schema_to_bytes
        from replikafka.spark.arrow_convert import output_layout
        from replikafka.spark.batch_reader import check_same_schema
        from replikafka.spark.cluster_access import client_for
        _, topics = client_for(opts.bootstrap, opts.security).subscribed(opts.subscription, require_topics=True)
        first = topics[sorted(topics)[0]]
        check_same_schema(topics, first.schema, opts.subscription.option)
        default = output_layout(first.schema, include_headers=opts.include_headers, columns=opts.columns)
        if user_schema is not None and user_schema.json() != default.spark_schema.json():
            layout = output_layout(first.schema, include_headers=opts.include_headers, columns=opts.columns,
                                   user_schema=user_schema)
        else:
            layout = default
        return layout, schema_to_bytes(first.schema)

    def schema(self):
        _imports()
        from replikafka.spark.options import parse_source_options
        layout, _ = self._resolve(parse_source_options(self.options, streaming=None))
        return layout.spark_schema

    def reader(self, schema):
        _imports()
        from replikafka.spark.batch_reader import BatchReader, FilteringBatchReader, pushdown_enabled_by_planner
        from replikafka.spark.options import parse_source_options
        opts = parse_source_options(self.options, streaming=False)
        layout, schema_bytes = self._resolve(opts, schema)
        cls = BatchReader if pushdown_enabled_by_planner() is False else FilteringBatchReader
        return cls(opts, layout, schema_bytes)

    def streamReader(self, schema):
        _imports()
        from replikafka.spark.options import parse_source_options
        from replikafka.spark.stream_reader import StreamReader
        opts = parse_source_options(self.options, streaming=True)
        layout, schema_bytes = self._resolve(opts, schema)
        return StreamReader(opts, layout, schema_bytes)

    # ------------------------------------------------------------ writes
    def _targets(self, schema, overwrite: bool):
        from replikafka.records import schema_from_bytes
        from replikafka.spark.arrow_convert import check_sink_input
        from replikafka.spark.cluster_access import client_for
        from replikafka.spark.options import OptionError, parse_sink_options
        from replikafka.spark.writer import plan_targets
        opts = parse_sink_options(self.options)
        if overwrite:
            raise OptionError("mode", "a topic is append-only: use mode('append'), not overwrite")
        client = client_for(opts.bootstrap, opts.security)
        names = list(schema.names) if schema is not None else []
        if opts.topic is not None:
            targets = plan_targets(client, [opts.topic])
            if names:
                check_sink_input(names, schema_from_bytes(targets[opts.topic].schema_bytes), opts.topic)
        else:
            if names and "topic" not in names:
                raise OptionError("topic", "is required (or give the input a 'topic' column)")
            targets = plan_targets(client, sorted(client.all_topics()))
        return opts, targets

    def writer(self, schema, overwrite: bool):
        _imports()
        from replikafka.spark.writer import BatchWriter
        return BatchWriter(*self._targets(schema, overwrite))

    def streamWriter(self, schema, overwrite: bool):
        _imports()
        from replikafka.spark.writer import StreamWriter
        return StreamWriter(*self._targets(schema, overwrite))
