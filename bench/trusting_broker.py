"""A broker process whose leader skips its validation of records produced to topics
named ``trusted-*``: no CRC-32C check of the payload, no full Arrow validation
(``records.decode_produced`` is a plain zero-copy ``decode_stream`` for them).
Every other topic is validated as by any broker. For `./build.sh bench cluster`
only: the validation's cost is the ratio of produce throughput to a validated
topic to that to a trusted one, on this one broker in the same run. Never used
outside the benchmark (it stores what a normal leader refuses).

Usage, as ``python -m replikafka broker``: ``python bench/trusting_broker.py <properties>``."""
from __future__ import annotations

import sys

from replikafka import records

TRUSTED_PREFIX = "trusted-"
_validating_decode = records.decode_produced


def _decode(data, crc32c_sent, where):
    if where.startswith(TRUSTED_PREFIX):      # where: "<topic>-<partition>"
        return records.decode_stream(data)
    return _validating_decode(data, crc32c_sent, where)


records.decode_produced = _decode

if __name__ == "__main__":
    from replikafka.cli.main import main
    sys.exit(main(["broker", *sys.argv[1:]]))
