"""`replikafka consumer-lag` on a real Spark streaming checkpoint (issue 15)."""
from __future__ import annotations

import json
import os

import pytest
from spark_helpers import await_available_now

from replikafka.cli.main import main

pytestmark = [pytest.mark.spark, pytest.mark.integration]


def lag_table(capsys, *args) -> tuple[int, dict[tuple[str, int], tuple[str, str, str]], str]:
    code = main(["consumer-lag", *args])
    out = capsys.readouterr()
    rows = {}
    for line in out.out.splitlines():
        cells = line.split()
        if len(cells) == 5 and cells[1].isdigit():
            rows[(cells[0], int(cells[1]))] = tuple(cells[2:])
    return code, rows, out.out + out.err


def test_consumer_lag_of_a_spark_checkpoint_and_of_an_offsets_file(spark, bootstrap, topics, checkpoint, tmp_path,
                                                                   capsys):
    t = topics.new(3)
    topics.fill(t, {0: 900, 1: 90, 2: 10})
    df = (spark.readStream.format("replikafka").option("bootstrap.servers", bootstrap).option("subscribe", t)
          .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "250").load())
    q = (df.select("partition", "offset").writeStream.format("parquet").option("path", str(tmp_path / "out"))
         .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    await_available_now(q)
    assert not q.isActive and q.exception() is None
    topics.fill(t, {0: 100, 1: 5})          # arrives after the query stopped: that is its lag

    code, rows, out = lag_table(capsys, "--bootstrap-server", bootstrap, "--checkpoint", checkpoint)
    assert code == 0, out
    assert rows == {(t, 0): ("900", "1000", "100"), (t, 1): ("90", "95", "5"), (t, 2): ("10", "10", "0")}, out
    assert "TOTAL-LAG 105" in out and "(batch 3)" in out          # 4 batches of <= 250 records

    # An in-flight batch (offsets written, no commit yet) is not counted as processed.
    last = max(int(n) for n in os.listdir(os.path.join(checkpoint, "offsets")) if n.isdigit())
    os.remove(os.path.join(checkpoint, "commits", str(last)))
    code, rows, out = lag_table(capsys, "--bootstrap-server", bootstrap, "--checkpoint", checkpoint)
    assert code == 0 and f"(batch {last - 1})" in out and int(rows[(t, 0)][2]) > 100, out

    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({t: {"0": 1000, "1": 40}}))
    code, rows, out = lag_table(capsys, "--bootstrap-server", bootstrap, "--offsets", str(offsets))
    assert code == 0, out
    assert rows == {(t, 0): ("1000", "1000", "0"), (t, 1): ("40", "95", "55"), (t, 2): ("-", "10", "-")}, out


def test_consumer_lag_names_what_is_wrong(bootstrap, tmp_path, capsys):
    code, _rows, out = lag_table(capsys, "--bootstrap-server", bootstrap, "--checkpoint", str(tmp_path))
    assert code == 1 and "has no offsets/ directory" in out
    (tmp_path / "offsets").mkdir()
    code, _rows, out = lag_table(capsys, "--bootstrap-server", bootstrap, "--checkpoint", str(tmp_path))
    assert code == 1 and "no committed micro-batch yet" in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"t": {"0": -4}}')
    code, _rows, out = lag_table(capsys, "--bootstrap-server", bootstrap, "--offsets", str(bad))
    assert code == 1 and "not replikafka offsets" in out and "t-0" in out
