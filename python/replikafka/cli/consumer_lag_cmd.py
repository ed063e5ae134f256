"""`replikafka consumer-lag`: how far a Spark streaming query (or any reader that
keeps its own offsets) is behind, per partition, like ``kafka-consumer-groups
--describe``.

    replikafka consumer-lag --bootstrap-server H:P --checkpoint DIR
    replikafka consumer-lag --bootstrap-server H:P --offsets FILE.json

``--checkpoint`` reads a Spark checkpoint: the end offsets of the latest
*committed* micro-batch (``offsets/<N>`` where ``commits/<N>`` exists), i.e.
what the query has processed, as a consumer group's committed offsets.
``--offsets`` reads ``{"topic": {"partition": offset}}`` (the replikafka source's
offset format). The lag of a partition is its high watermark minus that offset;
partitions of those topics the offsets do not name show ``-`` (the query has
not seen them yet).
"""
from __future__ import annotations

import json
import os
import sys

from replikafka import errors as E
from replikafka.cli import command_config

HEADER = ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG")


def add_parser(sub, name):
    p = sub.add_parser(name, help="per-partition lag of a Spark query's checkpoint (or an offsets file)")
    p.add_argument("--bootstrap-server", required=True, metavar="H:P", help="brokers to connect to")
    command_config.add_argument(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--checkpoint", metavar="DIR", help="a Spark streaming query's checkpoint location")
    src.add_argument("--offsets", metavar="FILE", help='a JSON file {"topic": {"partition": offset}}')
    p.add_argument("--source", type=int, default=0, metavar="N",
                   help="--checkpoint: which of the query's sources (0 = the first)")
    p.set_defaults(func=run)


def _batch_ids(directory: str) -> list[int]:
    try:
        return sorted(int(n) for n in os.listdir(directory) if n.isdigit())
    except FileNotFoundError:
        return []


def checkpoint_offsets(checkpoint: str, source: int = 0) -> tuple[int, dict]:
    """(batch id, offsets JSON) of the latest committed micro-batch of a Spark checkpoint."""
    if not os.path.isdir(checkpoint):
        raise E.InvalidRequestError(f"--checkpoint: {checkpoint!r} is not a directory")
    if not os.path.isdir(os.path.join(checkpoint, "offsets")):
        raise E.InvalidRequestError(f"--checkpoint: {checkpoint!r} has no offsets/ directory "
                                    f"(not a Spark streaming checkpoint?)")
    committed = set(_batch_ids(os.path.join(checkpoint, "commits")))
    done = [b for b in _batch_ids(os.path.join(checkpoint, "offsets")) if b in committed]
    if not done:
        raise E.InvalidRequestError(f"--checkpoint: {checkpoint!r} has no committed micro-batch yet")
    batch = done[-1]
    path = os.path.join(checkpoint, "offsets", str(batch))
    with open(path) as f:
        lines = f.read().splitlines()
    # Spark's OffsetSeqLog: a version line ("v1"), the metadata JSON, then one line per source.
    sources = lines[2:]
    if not lines or not lines[0].startswith("v") or source >= len(sources):
        raise E.InvalidRequestError(f"{path}: no source #{source} in this offsets file "
                                    f"({len(sources)} sources)")
    if sources[source] == "-":
        raise E.InvalidRequestError(f"{path}: source #{source} has no offsets in batch {batch}")
    return batch, _parse(sources[source], path)


def _parse(text: str, where: str) -> dict[tuple[str, int], int]:
    from replikafka.spark.offsets_planning import offsets_from_json
    try:
        return offsets_from_json(json.loads(text))
    except (json.JSONDecodeError, ValueError) as exc:
        raise E.InvalidRequestError(f"{where}: not replikafka offsets: {exc}") from None


def lag_rows(offsets: dict[tuple[str, int], int], partitions: dict[str, list[int]],
             high_watermarks: dict[tuple[str, int], int]) -> list[tuple]:
    """(topic, partition, current or None, HW, lag or None), sorted."""
    rows = []
    for topic in sorted(partitions):
        for p in sorted(partitions[topic]):
            hw = high_watermarks[(topic, p)]
            current = offsets.get((topic, p))
            rows.append((topic, p, current, hw, None if current is None else max(hw - current, 0)))
    return rows


def format_table(rows: list[tuple]) -> str:
    cells = [HEADER] + [(t, str(p), "-" if c is None else str(c), str(hw), "-" if lag is None else str(lag))
                        for t, p, c, hw, lag in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells) + "\n"


def run(args) -> int:
    from replikafka.client.consumer import Consumer

    if args.checkpoint:
        batch, offsets = checkpoint_offsets(args.checkpoint, args.source)
        where = f"checkpoint {args.checkpoint} (batch {batch})"
    else:
        try:
            with open(args.offsets) as f:
                text = f.read()
        except OSError as exc:
            raise E.InvalidRequestError(f"--offsets: cannot read {args.offsets!r}: {exc.strerror}") from None
        offsets, where = _parse(text, args.offsets), args.offsets
    if not offsets:
        raise E.InvalidRequestError(f"{where}: names no partition")
    with Consumer(args.bootstrap_server, security=command_config.security_of(args)) as consumer:
        partitions = {t: consumer.partitions_for(t) for t in sorted({t for t, _ in offsets})}
        hws = consumer.end_offsets([(t, p) for t, ps in partitions.items() for p in ps])
    rows = lag_rows(offsets, partitions, {tuple(tp): o for tp, o in hws.items()})
    sys.stdout.write(f"Lag of {where}\n\n" + format_table(rows))
    total = sum(r[4] or 0 for r in rows)
    sys.stdout.write(f"\nTOTAL-LAG {total}\n")
    return 0
