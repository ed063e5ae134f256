"""A broker process whose leader skips its validation of records produced to topics
named ``trusted-*``; every other topic is validated as by any broker. Skipped:

- gRPC Produce: the payload's CRC-32C check, the one-stream check and Arrow's full
  validation (``produce_decoding.decode_produce_entries`` decodes those entries with
  a plain zero-copy ``decode_stream``; their messages still go to the log verbatim);
- Flight DoPut: Arrow's full validation (``records.validate_untrusted_batches``);
  its CRC check stays, as it compares the CRC the log computes to store the batch
  anyway.

For `./build.sh bench cluster` only: the validation's cost is the ratio of produce
throughput to a validated topic to that to a trusted one, on this one broker in
the same run. Never used outside the benchmark (it stores what a normal leader
refuses).

Usage, as ``python -m replikafka broker``: ``python bench/trusting_broker.py <properties>``."""
from __future__ import annotations

import sys

import pyarrow as pa

from replikafka import records
from replikafka.broker import produce_decoding

TRUSTED_PREFIX = "trusted-"
_validating_decode_entries = produce_decoding.decode_produce_entries
_validating_check = records.validate_untrusted_batches


def _decode_entries(entries):
    """Entries of a validated topic as any leader decodes them; the others trusted."""
    out: list = [None] * len(entries)
    checked = [i for i, (_data, _crc, where) in enumerate(entries) if not where.startswith(TRUSTED_PREFIX)]
    for i, decoded in zip(checked, _validating_decode_entries([entries[i] for i in checked])):
        out[i] = decoded
    for i, (data, _crc, where) in enumerate(entries):
        if where.startswith(TRUSTED_PREFIX):      # where: "<topic>-<partition>"
            buf = pa.py_buffer(data)
            framed = produce_decoding._frame_plain(buf)
            batches = records.decode_stream(buf)[1]
            sent = framed[1] if framed is not None and len(framed[1]) == len(batches) else [None] * len(batches)
            kept = [j for j, b in enumerate(batches) if b.num_rows]
            out[i] = produce_decoding.ProducedRecords(tuple(batches[j] for j in kept), tuple(sent[j] for j in kept))
    return out


def _check(batches, where):
    if not where.startswith(TRUSTED_PREFIX):
        _validating_check(batches, where)


produce_decoding.decode_produce_entries = _decode_entries
records.validate_untrusted_batches = _check

if __name__ == "__main__":
    from replikafka.cli.main import main
    sys.exit(main(["broker", *sys.argv[1:]]))
