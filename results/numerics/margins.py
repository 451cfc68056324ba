"""Margin table from JAXRL_TOL_LOG files: the largest measured / tolerance per test, per run.

    JAXRL_TOL_LOG=/tmp/tol_native.jsonl python -m pytest -q tests/...            # native
    XLA_FLAGS=--xla_cpu_max_isa=AVX2 JAXRL_TOL_LOG=/tmp/tol_AVX2.jsonl python -m pytest ...
    python results/numerics/margins.py native=/tmp/tol_native.jsonl AVX2=/tmp/tol_AVX2.jsonl

A ratio of 1 is the tolerance; the table lists the tests with any ratio above 0.05.
"""
import collections
import json
import sys


def worst(path):
    out = collections.defaultdict(float)
    for line in open(path):
        r = json.loads(line)
        key = r["test"].split("::", 1)[-1] + f" ({r['kind']})"
        out[key] = max(out[key], r["ratio"] or 0.0)
    return out


def main(args):
    runs = dict(a.split("=", 1) for a in args)
    tables = {name: worst(path) for name, path in runs.items()}
    keys = sorted({k for t in tables.values() for k, v in t.items() if v > 0.05},
                  key=lambda k: -max(t.get(k, 0) for t in tables.values()))
    print("| test (check) | " + " | ".join(tables) + " |")
    print("|---|" + "---|" * len(tables))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{t[k]:.3f}" if k in t else "-" for t in tables.values())
              + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
