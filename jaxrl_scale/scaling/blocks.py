"""Warm-start blocks: which runs start from which warm-start (w0, w1, ... by the path of the
checkpoint they start from), and the timing pass each warm-start's runs were timed by
(docs/science.md, Warm-starts as blocks). Pure Python."""

from __future__ import annotations

import os
from typing import Sequence

from jaxrl_scale.scaling import drift as sdrift
from jaxrl_scale.scaling.io import Run


BLOCK_PASSES_NOTE = ("r_q from each of the {n} warm-starts' own timing pass, run in the machine "
                     "state of that warm-start's learning: the state's effect on r_q varies "
                     "with the warm-starts and is in the test's error term")


def block_timing(runs: Sequence[Run], blocks: dict[str, str]) -> dict[str, list[dict]]:
    """{block: the timing pass entries of that warm-start}: entries tagged with the block's
    warm-start (timing.json "warm_start", the init_checkpoint its runs start from), else
    the untagged pass of the one directory that holds the block's runs and no other
    block's (a pass shared by several warm-starts is not theirs each)."""
    out: dict[str, list[dict]] = {}
    paths = {blocks[r.name]: r.block for r in runs if r.name in blocks}
    dirs = {r.name: os.path.dirname(os.path.abspath(r.path)) for r in runs if r.path}
    for b in sorted(set(blocks.values())):
        where = {dirs.get(r.name) for r in runs if blocks.get(r.name) == b}
        if len(where) != 1 or None in where:
            continue
        d = where.pop()
        entries = sdrift.read_timing(d) or []
        mine = [e for e in entries if e.get("warm_start") == paths[b]]
        alone = all(blocks.get(n) == b for n, x in dirs.items() if x == d and n in blocks)
        if not mine and alone:
            mine = [e for e in entries if "warm_start" not in e]
        if mine:
            out[b] = mine
    return out


def warm_start_blocks(runs: Sequence[Run]) -> dict[str, str]:
    """{run: block label} when the runs start from two or more warm-starts (Run.block), the
    labels w0, w1, ... in the order of the warm-starts' paths; {} for one warm-start (the
    family-wise test then takes seeds as its blocks, and its verdicts hold for that
    warm-start only)."""
    paths = sorted({r.block for r in runs if r.block})
    if len(paths) < 2:
        return {}
    label = {p: f"w{i}" for i, p in enumerate(paths)}
    return {r.name: label[r.block] for r in runs if r.block}
