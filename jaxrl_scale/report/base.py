"""What the report's figures, tables and text share: file names, styles, and read-only views
of the summary (configs sorted, per algorithm, references). Renders nothing itself."""

from __future__ import annotations

import math

import numpy as np

from jaxrl_scale.numbers import Interval, fmt, is_number


REPORT_FILE = "report.md"
FIGURES = ("learning_curves.png", "grad_norm.png", "collection_time.png", "time_to_target.png",
           "critical_batches.png")
RULE_STYLES = {"sqrt": "-", "fixed": "--", "linear": ":", "malladi": "-."}
OTHER_STYLE = (0, (3, 1, 1, 1, 1, 1))
ALGO_MARKERS = ("o", "s", "^", "D", "v")
MIN_SNR = 6.0  # signal-to-noise (target - start) / eval SE below which verdicts may be noise


_ok = is_number


def _ci(ci) -> tuple:
    """(lo, hi) of an interval that may be None or hold None ends."""
    iv = Interval.of(ci)
    return iv.lo, iv.hi


def _below(ci, v) -> bool:
    return Interval.of(ci).below(v)


def _above(ci, v) -> bool:
    return Interval.of(ci).above(v)


def _contains(ci, v) -> bool:
    return Interval.of(ci).contains(v)


def _level(summary: dict) -> str:
    return f"{summary.get('ci_level', 0.9):.0%}"


def _configs(summary: dict) -> dict:
    return summary.get("configs") or {}


def _algos(summary: dict) -> list[str]:
    """Algorithms, the primary first."""
    algos = list((summary.get("algos") or {}).keys())
    p = summary.get("primary_algo")
    return sorted(algos, key=lambda a: (a != p, a))


def _algo_of(st: dict) -> str:
    return st.get("algo") or "?"


def _algo_info(summary: dict, algo: str) -> dict:
    return (summary.get("algos") or {}).get(algo) or {}


def _multi(summary: dict) -> bool:
    return len(summary.get("algos") or {}) > 1


def _sorted_configs(summary: dict, algo: str | None = None) -> list[tuple[str, dict]]:
    items = [(g, st) for g, st in _configs(summary).items()
             if algo is None or _algo_of(st) == algo]
    return sorted(items, key=lambda kv: (_algo_of(kv[1]), kv[1].get("batch") or math.inf,
                                         kv[1].get("lr_rule") or "", kv[0]))


def _is_ref(summary: dict, g: str, st: dict) -> bool:
    return bool(st.get("is_reference")) or g in (summary.get("reference_configs") or {}).values()


def _ratio(st: dict):
    return st.get("gen_batch_ratio", 1) or 1


def _desc(st: dict) -> str:
    bits = [f"B={fmt(st.get('batch'))}"]
    if _ratio(st) != 1:
        bits.append(f"partial rollout k={fmt(_ratio(st))}, B_gen={fmt(st.get('batch_gen'))}")
    if st.get("lr_rule"):
        bits.append(f"lr {st['lr_rule']}")
    if st.get("group_size") is not None:
        bits.append(f"G={st['group_size']}")
    return ", ".join(bits)


def _per_batch(summary: dict, key: str) -> tuple[list[float], list[float]]:
    """Config means of ``key`` per batch, synchronous rollout only (a partial-rollout update
    collects B_train responses from k * B_train in flight: another cost curve)."""
    by_b: dict[float, list[float]] = {}
    for st in _configs(summary).values():
        if _ok(st.get("batch")) and _ok(st.get(key)) and st[key] > 0 and _ratio(st) == 1:
            by_b.setdefault(st["batch"], []).append(st[key])
    bs = sorted(by_b)
    return bs, [float(np.mean(by_b[b])) for b in bs]
