"""What the report's figures, tables and text share: file names, styles, and read-only views
of the summary (configs sorted, per algorithm, references). Renders nothing itself."""

from __future__ import annotations

import math

import numpy as np

from jaxrl_scale.numbers import Interval, fmt, is_number
from jaxrl_scale.scaling.summary import AlgoSummary, ConfigStats, Summary


REPORT_FILE = "report.md"
FIGURES = ("learning_curves.png", "grad_norm.png", "collection_time.png", "time_to_target.png",
           "critical_batches.png")
RULE_STYLES = {"sqrt": "-", "fixed": "--", "linear": ":", "malladi": "-.", "tuned": "-"}
OTHER_STYLE = (0, (3, 1, 1, 1, 1, 1))
ALGO_MARKERS = ("o", "s", "^", "D", "v")
MIN_SNR = 6.0  # signal-to-noise (target - start) / eval SE below which verdicts may be noise


_ok = is_number

# What N counts (summary.n_unit, docs/science.md, Time to target): the axis label, the unit
# in running text, and q's unit in a table header.
N_AXIS = {"responses": "cumulative retained responses N",
          "tokens": "cumulative response tokens N (in the loss)"}
N_WORDS = {"responses": "responses", "tokens": "response tokens"}
Q_HEAD = {"responses": "resp/s", "tokens": "tok/s"}


def n_unit(s) -> str:
    """What the summary's N counts: "responses" (also for summaries recorded before the
    choice) or "tokens"."""
    return getattr(s, "n_unit", None) or "responses"


def n_unit_sentence(s) -> str:
    """report.md's sentence on what N, N* and q count."""
    if n_unit(s) == "tokens":
        return ("N counts tokens (--n_unit=tokens): the cumulative tokens of the retained "
                "responses that are in the loss (each record's response_tokens; an "
                "episode's observation tokens excluded), so N* is in tokens and q in tokens "
                "per second; the batch B still counts responses.")
    return ("N counts responses (--n_unit=responses): cumulative retained responses (an "
            "--env run's episodes), so N* is in responses and q in responses per second.")


def _ci(ci) -> tuple:
    """(lo, hi) of an interval that may be None or hold None ends."""
    iv = Interval.of(ci)
    return iv.lo, iv.hi


def _level(s: Summary) -> str:
    return f"{s.ci_level:.0%}"


def _configs(s: Summary) -> dict[str, ConfigStats]:
    return s.configs


def _algos(s: Summary) -> list[str]:
    """Algorithms, the primary first."""
    return sorted(s.algos, key=lambda a: (a != s.primary_algo, a))


def _algo_of(st: ConfigStats) -> str:
    return st.algo or "?"


def _algo_info(s: Summary, algo: str) -> AlgoSummary:
    return s.algos[algo]


def _multi(s: Summary) -> bool:
    return len(s.algos) > 1


def _sorted_configs(s: Summary, algo: str | None = None) -> list[tuple[str, ConfigStats]]:
    items = [(g, st) for g, st in s.configs.items() if algo is None or _algo_of(st) == algo]
    return sorted(items, key=lambda kv: (_algo_of(kv[1]), kv[1].batch or math.inf,
                                         kv[1].lr_rule or "", kv[0]))


def _is_ref(s: Summary, g: str, st: ConfigStats) -> bool:
    return bool(st.is_reference) or g in s.reference_configs.values()


def _ratio(st) -> float:
    """k = gen_batch_ratio of a config (1: synchronous rollout)."""
    return st.gen_batch_ratio or 1


def _desc(st: ConfigStats) -> str:
    bits = [f"B={fmt(st.batch)}"]
    if _ratio(st) != 1:
        bits.append(f"partial rollout k={fmt(_ratio(st))}, B_gen={fmt(st.batch_gen)}")
    if st.lr_rule:
        bits.append(f"lr {st.lr_rule}")
    if st.group_size is not None:
        bits.append(f"G={st.group_size}")
    return ", ".join(bits)


def _per_batch(s: Summary, key: str) -> tuple[list[float], list[float]]:
    """Config means of ``key`` per batch, synchronous rollout only (a partial-rollout update
    collects B_train responses from k * B_train in flight: another cost curve)."""
    by_b: dict[float, list[float]] = {}
    for st in s.configs.values():
        v = getattr(st, key)
        if _ok(st.batch) and _ok(v) and v > 0 and _ratio(st) == 1:
            by_b.setdefault(st.batch, []).append(v)
    bs = sorted(by_b)
    return bs, [float(np.mean(by_b[b])) for b in bs]
