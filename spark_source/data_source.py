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


def _log_ignored(opts) -> None:
    """One warning naming the options accepted but not used (Spark's source
    ignores what it does not know; we name it so a typo is still seen)."""
    if opts.ignored:
        import logging
        logging.getLogger("replikafka.spark").warning(
            "replikafka: ignoring option(s) %s", "; ".join(f"{n!r} ({why})" for n, why in opts.ignored))


class ReplikafkaDataSource(DataSource):
    """Batch and streaming reads and writes of replikafka topics. Options: see
    :mod:`replikafka.spark.options` and ``INTERFACE.md``."""

    @classmethod
    def name(cls) -> str:
        return "replikafka"

    # ------------------------------------------------------------ reads
    def _resolve(self, opts, user_schema=None):
        """The output layout, from the subscribed topics' schema on the cluster now.
        No topic yet (a stream waiting for its topics): the Kafka shape, which a
        topic created without a schema has; a topic that later appears with
        another schema is refused when it is read, naming the option."""
        from replikafka.records import KAFKA_SCHEMA, schema_to_bytes
        from replikafka.spark.arrow_convert import output_layout
        from replikafka.spark.batch_reader import check_same_schema
        from replikafka.spark.cluster_access import client_for
        _, topics = client_for(opts.bootstrap, opts.security).subscribed(opts.subscription, require_topics=False)
        if topics:
            first = topics[sorted(topics)[0]].schema
            check_same_schema(topics, first, opts.subscription.option)
        else:
            first = KAFKA_SCHEMA
        default = output_layout(first, include_headers=opts.include_headers, columns=opts.columns)
        if user_schema is not None and user_schema.json() != default.spark_schema.json():
            layout = output_layout(first, include_headers=opts.include_headers, columns=opts.columns,
                                   user_schema=user_schema)
        else:
            layout = default
        return layout, schema_to_bytes(first)

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
        _log_ignored(opts)
        layout, schema_bytes = self._resolve(opts, schema)
        cls = BatchReader if pushdown_enabled_by_planner() is False else FilteringBatchReader
        return cls(opts, layout, schema_bytes)

    def streamReader(self, schema):
        _imports()
        from replikafka.errors import ReplikafkaError
        from replikafka.spark.options import parse_source_options
        from replikafka.spark.stream_reader import RefusedStreamReader, StreamReader
        try:
            opts = parse_source_options(self.options, streaming=True)
            _log_ignored(opts)
            layout, schema_bytes = self._resolve(opts, schema)
        except ReplikafkaError as exc:
            # pyspark 4.3's stream runner masks an error raised here with an
            # UnboundLocalError of its own (its ``finally`` calls ``reader.stop()``);
            # a reader that raises ours on the query's first call fails the query
            # with our message instead.
            return RefusedStreamReader(exc)
        return StreamReader(opts, layout, schema_bytes)

    # ------------------------------------------------------------ writes
    def _targets(self, schema, overwrite: bool, streaming: bool):
        from replikafka.records import KAFKA_SCHEMA, is_kafka_shaped, schema_from_bytes
        from replikafka.spark.arrow_convert import check_sink_input, check_sink_types
        from replikafka.spark.cluster_access import client_for
        from replikafka.spark.options import OptionError, parse_sink_options
        from replikafka.spark.writer import plan_targets
        opts = parse_sink_options(self.options)
        _log_ignored(opts)
        if overwrite and not streaming:
            raise OptionError("mode", "a topic is append-only: use mode('append'), not overwrite")
        client = client_for(opts.bootstrap, opts.security)
        names = list(schema.names) if schema is not None else []
        fields = [(f.name, f.dataType.simpleString()) for f in schema.fields] if schema is not None else []
        if opts.topic is not None:
            targets = plan_targets(client, [opts.topic])
            if names:
                topic_schema = schema_from_bytes(targets[opts.topic].schema_bytes)
                check_sink_input(names, topic_schema, opts.topic)
                check_sink_types(fields, topic_schema, opts.topic)
        else:
            if names and "topic" not in names:
                raise OptionError("topic", "is required (or give the input a 'topic' column)")
            targets = plan_targets(client, sorted(client.all_topics()))
            if "topic" in names:
                check_sink_types([f for f in fields if f[0] == "topic"], KAFKA_SCHEMA, "(from the 'topic' column)")
            if targets and all(is_kafka_shaped(schema_from_bytes(t.schema_bytes)) for t in targets.values()):
                check_sink_types(fields, KAFKA_SCHEMA, "(from the 'topic' column)")
        return opts, targets

    def writer(self, schema, overwrite: bool):
        _imports()
        from replikafka.spark.writer import BatchWriter
        return BatchWriter(*self._targets(schema, overwrite, streaming=False))

    def streamWriter(self, schema, overwrite: bool):
        """``overwrite`` is Spark's Complete output mode (it truncates a table):
        a topic is a log of updates, so each batch's full result is appended,
        as Spark's Kafka sink does; replays still add nothing. (Update mode is
        refused by pyspark 4.3 itself: its write builder lacks
        ``SupportsStreamingUpdateAsAppend``.)"""
        _imports()
        from replikafka.spark.writer import StreamWriter
        return StreamWriter(*self._targets(schema, overwrite, streaming=True))
