"""A sequential study: warm-start blocks added in rounds, each config decided as soon as its
evidence allows, with the family-wise error of the fixed design (docs/science.md, Sequential
study). Pure numpy / scipy; the per-look estimates come from `familywise.sweep_tests`.

Looks. The study adds warm-start blocks in rounds and looks after W_1 < W_2 < ... < W_K = W_max
of them; the information fraction of look k is t_k = W_k / W_max (the SE of a block mean
contrast falls as 1 / sqrt(W)).

Error spending (Lan & DeMets 1983). A two-sided level-a test spends a(t) of its error by
information t: O'Brien-Fleming type a(t) = 2 - 2 Phi(z_{1-a/2} / sqrt(t)) (the default: almost
nothing early, so the last look keeps nearly the fixed design's power) or Pocock type
a(t) = a log(1 + (e - 1) t) (earlier stops, less power at the cap). The boundaries c_1..c_K of
the canonical joint normal (corr(Z_j, Z_k) = sqrt(t_j / t_k)) solve
P(|Z_j| < c_j for all j <= k) = 1 - a(t_k), by scipy's multivariate normal CDF (Genz). A look's
statistic is Student t with that look's df: it is compared with the t quantile at the
boundary's normal tail probability (Jennison & Turnbull 2000, section 3.8).

Several configs. Holm within the group-sequential design (Maurer & Bretz 2013, the complete
graph with equal weights): each hypothesis not yet rejected is tested at a / (number not yet
rejected), against that level's boundaries at every look so far; a rejection frees its level
for the others, re-checked until none more falls. A rejected config is "faster" or "slower"
by the sign of its estimate.

Intervals and the other stops. The repeated confidence interval of look k,
exp(d_k +- c_k(a / m) se_k) with m the configs tested, covers every config at every look with
probability >= 1 - a (Jennison & Turnbull 1989), so stopping on it costs no error:
- "equivalent": the interval lies inside the margin (default [0.8, 1.25]);
- "stopped: not faster by the margin": its lower end is at or above `futility` (default
  0.9; the config cannot be 10% faster than the reference). Non-binding: the boundaries
  ignore it, so it only makes the study conservative.
A decided or stopped config gets no more runs; the study stops when every config has, or
after W_max blocks; the configs still open are "undecided", with their last interval. A
config some of whose runs missed the target has a lower bound only (`censored`): it can be
"slower", never faster or equivalent.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from jaxrl_scale.scaling.familywise import EQUIV_MARGIN, t_ppf

SPENDING = ("obf", "pocock")
FUTILITY = 0.9
DECIDED = ("faster", "slower", "equivalent", "not faster by the margin")


def spent(t: float, alpha: float, kind: str = "obf") -> float:
    """Error spent by information fraction t in (0, 1] (Lan-DeMets)."""
    from scipy.stats import norm
    t = min(max(float(t), 1e-12), 1.0)
    if kind == "obf":
        return float(2 - 2 * norm.cdf(norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    if kind == "pocock":
        return float(alpha * math.log(1 + (math.e - 1) * t))
    raise ValueError(f"spending {kind!r}: use one of {SPENDING}")


@functools.lru_cache(maxsize=256)
def boundaries(fractions: tuple[float, ...], alpha: float, kind: str = "obf") -> tuple:
    """Two-sided z boundaries c_1..c_K for looks at information `fractions` (increasing, the
    last 1) spending `alpha` by `kind`: P(|Z_j| < c_j, j <= k) = 1 - spent(t_k)."""
    from scipy.optimize import brentq
    from scipy.stats import multivariate_normal, norm
    t = np.asarray(fractions, float)
    if t.ndim != 1 or t.size == 0 or np.any(np.diff(t) <= 0) or t[0] <= 0 or t[-1] > 1:
        raise ValueError(f"information fractions must increase within (0, 1]: {fractions}")
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    c = [float(norm.ppf(1 - spent(t[0], alpha, kind) / 2))]
    for k in range(1, t.size):
        want = 1 - spent(t[k], alpha, kind)
        if want >= 1 - spent(t[k - 1], alpha, kind):   # nothing left to spend at this look
            c.append(math.inf)
            continue

        def stay(ck, k=k):
            hi = np.array(c + [ck])
            return multivariate_normal.cdf(
                hi, np.zeros(k + 1), cov[:k + 1, :k + 1], lower_limit=-hi, abseps=1e-8,
                releps=1e-7, maxpts=200_000 * k, rng=np.random.default_rng(0)) - want
        c.append(float(brentq(stay, 0.1, 12.0, xtol=1e-6)))
    return tuple(c)


def t_boundary(z: float, df: float) -> float:
    """The t critical value with the same two-sided tail as the normal boundary z."""
    from scipy.stats import norm
    if not math.isfinite(z):
        return math.inf
    return t_ppf(float(norm.cdf(z)), df) if df > 0 else math.inf


@dataclasses.dataclass(frozen=True)
class Look:
    """One config's T/T0 test at one look: log ratio, SE and df (`familywise.sweep_tests`'s
    T_over_T0_test on the blocks so far); censored: a lower bound (runs that missed)."""
    blocks: int
    log_ratio: float
    se: float
    df: float
    censored: bool = False

    @property
    def ok(self) -> bool:
        return (math.isfinite(self.log_ratio) and math.isfinite(self.se) and self.se > 0
                and self.df > 0)


@dataclasses.dataclass(frozen=True)
class Decision:
    """A config's state after a look: verdict (DECIDED, or "undecided" / "open"), the look
    (1-based) and blocks at which it was decided, its estimate and repeated interval there."""
    verdict: str
    look: int | None
    blocks: int | None
    ratio: float | None
    rci: list | None

    @property
    def stopped(self) -> bool:
        return self.verdict in DECIDED


@dataclasses.dataclass(frozen=True)
class Plan:
    """The study's looks (warm-start blocks at each), level, spending and margins."""
    looks: tuple[int, ...] = (3, 4, 6)
    level: float = 0.9
    spending: str = "obf"
    margin: tuple[float, float] = EQUIV_MARGIN
    futility: float | None = FUTILITY

    def __post_init__(self):
        if not self.looks or any(b <= a for a, b in zip(self.looks, self.looks[1:])):
            raise ValueError(f"looks must be increasing block counts, got {self.looks}")
        if self.looks[0] < 2:
            raise ValueError("the first look needs at least 2 blocks (a paired test's df)")
        if self.spending not in SPENDING:
            raise ValueError(f"spending {self.spending!r}: use one of {SPENDING}")

    @property
    def fractions(self) -> tuple[float, ...]:
        return tuple(w / self.looks[-1] for w in self.looks)

    def z(self, alpha: float) -> tuple:
        return boundaries(self.fractions, round(alpha, 12), self.spending)


def default_looks(W: int) -> tuple[int, ...]:
    """Looks after half, two thirds and all of W blocks (at least 2 blocks at the first)."""
    out: list[int] = []
    for f in (1 / 2, 2 / 3, 1.0):
        w = max(2, round(f * W))
        if not out or w > out[-1]:
            out.append(w)
    return tuple(out)


def plan_of(sweep: Mapping) -> Plan | None:
    """The Plan of a study's SweepConfig fields (a dict: sweep.json "sweep", or asdict), None
    unless its design is sequential."""
    if sweep.get("design") != "sequential":
        return None
    W = len(sweep.get("warm_start_checkpoints") or ()) or int(sweep.get("warm_starts") or 1)
    return Plan(looks=tuple(sweep.get("looks") or ()) or default_looks(W),
                spending=sweep.get("spending") or "obf",
                futility=sweep.get("futility") or None)


def decide(plan: Plan, history: Mapping[str, Sequence[Look]]) -> dict[str, Decision]:
    """Decisions after the looks so far. history: {config: [Look at look 1, 2, ...]}, each
    config's list as long as the looks it was tested at (a stopped config's list ends at the
    look that stopped it). Holm in the group-sequential design for faster / slower; the
    repeated intervals at a / m for equivalent and the futility stop."""
    alpha = 1 - plan.level
    m = len(history)
    if m == 0:
        return {}

    def crosses(g: str, level: float) -> int | None:      # first look whose boundary it crosses
        z = plan.z(level)
        for k, lk in enumerate(history[g]):
            if lk.ok and abs(lk.log_ratio) / lk.se >= t_boundary(z[k], lk.df) and (
                    not lk.censored or lk.log_ratio > 0):
                return k
        return None

    rejected: dict[str, int] = {}
    while True:       # Holm's step-down: a rejection frees its level for the rest
        open_ = [g for g in history if g not in rejected]
        if not open_:
            break
        new = {g: k for g in open_ if (k := crosses(g, alpha / len(open_))) is not None}
        if not new:
            break
        rejected.update(new)
    z_all = plan.z(alpha / m)
    out = {}
    for g, h in history.items():
        if g in rejected:
            lk = h[rejected[g]]
            out[g] = _decision("slower" if lk.log_ratio > 0 else "faster", rejected[g], lk,
                               z_all)
            continue
        verdict, at = ("undecided" if len(h) == len(plan.looks) else "open"), len(h) - 1
        for k, lk in enumerate(h):
            lo, hi = _rci(lk, z_all[k])
            if lk.censored or lo is None:
                continue
            if plan.margin[0] <= lo and hi <= plan.margin[1]:
                verdict, at = "equivalent", k
                break
            if plan.futility is not None and lo >= plan.futility:
                verdict, at = "not faster by the margin", k
                break
        out[g] = _decision(verdict, at, h[at] if h else None, z_all)
    return out


def _rci(lk: Look, z: float) -> tuple[float | None, float | None]:
    if not lk.ok:
        return None, None
    c = t_boundary(z, lk.df)
    return math.exp(lk.log_ratio - c * lk.se), math.exp(lk.log_ratio + c * lk.se)


def _decision(verdict: str, k: int, lk: Look | None, z_all: tuple) -> Decision:
    if lk is None or not lk.ok:
        return Decision(verdict, k + 1 if verdict in DECIDED else None, lk and lk.blocks,
                        None, None)
    lo, hi = _rci(lk, z_all[k])
    stop = verdict in DECIDED
    return Decision(verdict, k + 1 if stop else None, lk.blocks if stop else None,
                    math.exp(lk.log_ratio), [lo, hi])


def open_configs(decisions: Mapping[str, Decision], configs: Sequence[str]) -> list[str]:
    """The configs that still get runs: those not decided (a config not yet looked at too)."""
    return [g for g in configs if g not in decisions or not decisions[g].stopped]


def run_looks(plan: Plan, configs: Sequence[str],
              test_at: Callable[[int, list[str]], Mapping[str, Look]],
              available: int | None = None
              ) -> tuple[dict[str, Decision], dict[str, int], dict[str, list[Look]]]:
    """The study's rounds: at each look's block count W, ``test_at(W, open configs)`` gives the
    open configs' tests on the first W blocks; decided configs drop out, and the study ends
    when none is open or after the last look (or the last look that ``available`` blocks
    allow: a study under way). Returns (decisions, {config: blocks it ran},
    {config: its Looks}). The simulated studies (`calibration_sequential`) and the replays of
    recorded ones pass their own ``test_at``; both end in `familywise.sweep_tests`."""
    history: dict[str, list[Look]] = {g: [] for g in configs}
    ran = {g: 0 for g in configs}
    open_, dec = list(configs), {}
    for W in plan.looks:
        if available is not None and W > available:
            break
        tests = test_at(W, open_)
        for g in open_:
            history[g].append(tests.get(g) or Look(W, math.nan, math.nan, 0.0))
            ran[g] = W
        dec = decide(plan, history)
        open_ = open_configs(dec, configs)
        if not open_:
            break
    return dec, ran, history


__all__ = ["SPENDING", "FUTILITY", "DECIDED", "Plan", "Look", "Decision", "spent",
           "boundaries", "t_boundary", "decide", "open_configs", "run_looks", "default_looks",
           "plan_of"]
