"""A broker process whose leader skips its validation of records produced to topics
named ``trusted-*``; every other topic is validated as by any broker. Skipped:

- gRPC Produce: the payload's CRC-32C check, the one-stream check and Arrow's full
  validation (``records.decode_produced`` is a plain zero-copy ``decode_stream``, and
  ``records.validate_untrusted_many`` leaves those entries out);
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

from replikafka import records

TRUSTED_PREFIX = "trusted-"
_validating_decode = records.decode_produced
_validating_check = records.validate_untrusted_batches
_validating_check_many = records.validate_untrusted_many


def _decode(data, crc32c_sent, where, validate=True):
    if where.startswith(TRUSTED_PREFIX):      # where: "<topic>-<partition>"
        return records.decode_stream(data)
    return _validating_decode(data, crc32c_sent, where, validate)


def _check_many(entries):
    checked = [i for i, (where, _schema, _batches) in enumerate(entries) if not where.startswith(TRUSTED_PREFIX)]
    errors = _validating_check_many([entries[i] for i in checked])
    return {checked[j]: exc for j, exc in errors.items()}


def _check(batches, where):
    if not where.startswith(TRUSTED_PREFIX):
        _validating_check(batches, where)


records.decode_produced = _decode
records.validate_untrusted_batches = _check
records.validate_untrusted_many = _check_many

if __name__ == "__main__":
    from replikafka.cli.main import main
    sys.exit(main(["broker", *sys.argv[1:]]))
