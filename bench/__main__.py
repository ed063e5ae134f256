"""`./build.sh bench [name ...]`: run benchmarks and print one table.

Each benchmark module ``bench/<name>_bench.py`` exposes ``run() -> list[dict]``;
every row has ``bench``, ``metric``, ``value``, ``unit`` and, where there is a
baseline measured in the same run, ``baseline`` and ``ratio``.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time

NAMES = ["storage", "cluster", "replication", "spark", "tls", "scale", "monitoring"]


def _fmt(v):
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def print_table(rows: list[dict]) -> None:
    cols = ["bench", "metric", "value", "unit", "baseline", "ratio"]
    table = [[_fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in table)) if table else len(c) for i, c in enumerate(cols)]
    print("| " + " | ".join(c.ljust(w) for c, w in zip(cols, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for t in table:
        print("| " + " | ".join(v.ljust(w) for v, w in zip(t, widths)) + " |")


def main(argv: list[str]) -> int:
    names = argv or NAMES
    rows: list[dict] = []
    for name in names:
        try:
            mod = importlib.import_module(f"bench.{name}_bench")
        except ModuleNotFoundError:
            print(f"bench: no benchmark named {name!r} in this tree", file=sys.stderr)
            if argv:
                return 2
            continue
        t0 = time.time()
        try:
            rows.extend(mod.run())
        except Exception as exc:  # one broken benchmark must not hide the others' figures
            print(f"bench {name} FAILED: {type(exc).__name__}: {exc}", file=sys.stderr)
            rows.append(dict(bench=name, metric="FAILED", value=f"{type(exc).__name__}: {exc}"[:80]))
        print(f"bench {name}: {time.time() - t0:.1f}s", file=sys.stderr)
    print_table(rows)
    out = os.path.join(os.path.dirname(__file__), "results")
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "latest.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
