"""A tuned learning rate that brackets its optimum and tells its choice from noise (several
seeds per lr). Pure functions.

The tuning stage scores a log-spaced grid of base lrs at the reference batch; a best value at
an edge of the grid says only that the optimum lies beyond it. `extension` names the lrs to
add (the edge times or divided by ``factor``) until the best value is interior, with a worse
value on each side, up to a cap of extensions; `tune` runs that loop on a score function, and
`lr_tuning` is the summary.json record.

Scores are {lr: score} (one seed per lr) or {lr: {seed: score}}. With several seeds per lr
the record compares every lr with the best mean under `familywise`'s model (score =
mu_lr + s_seed + e, the seed effects paired out when every lr ran the same seeds), with the
variance of e a log-linear function of log lr fitted to every lr's own scatter
(`variance_per_lr`; pooled over lrs when fewer than 3 lrs are scored): an lr is
*significantly worse* than the best when the LEVEL (90%)
two-sided t interval of best - lr lies above 0 (a one-sided test at 5% per comparison). The
*flat set* is the run of grid lrs around the best that are not significantly worse; the
*bracket* the nearest significantly worse lr on each side; the choice the declared RULE (the
middle of the flat set). With one seed per lr the noise is not measured: the best score is
chosen and "worse" means any lower score, as before.

A missing score (a run that failed or diverged) counts as worse than any score; an lr with
any seed missing counts as failed, significantly worse than every scored lr.

The intervals of best - lr are simultaneous over the lrs compared (Bonferroni over the
scored lrs but the best), so under a flat true curve some lr is called significantly worse,
and so the grid bracketed, with probability <= 0.05 however many lrs the extensions added
(tests/test_lr_bracket.py measures it on a 3-lr grid and after 3 extensions).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

from jaxrl_scale.numbers import or_none
from jaxrl_scale.scaling import familywise as fw

LEVEL = 0.9
RULE = ("the lr of the flat set (the grid lrs around the best mean not significantly worse "
        "than it: the simultaneous 90% interval of best - lr does not lie above 0) nearest in "
        "log lr to the geometric mean of its ends (ties: the smaller lr)")
RULE_ONE_SEED = "the best score (ties: the smaller lr); one seed per lr: noise not measured"


def _table(scores: Mapping) -> tuple[dict[float, dict], bool]:
    """({lr: {seed: score | None}}, whether seeds were given); plain scores get seed 0."""
    given = any(isinstance(v, Mapping) for v in scores.values())
    out = {}
    for lr, v in scores.items():
        d = v if isinstance(v, Mapping) else {0: v}
        out[float(lr)] = {k: or_none(s) for k, s in d.items()}
    return out, given


def _sorted(keys) -> list:
    try:
        return sorted(keys)
    except TypeError:
        return sorted(keys, key=str)


def _means(tab: dict[float, dict]) -> dict[float, float]:
    """Mean score per lr; -inf for an lr with any seed (or all seeds) missing."""
    return {lr: (sum(d.values()) / len(d) if d and all(s is not None for s in d.values())
                 else -math.inf) for lr, d in tab.items()}


def _best(means: Mapping[float, float]) -> float | None:
    ok = {lr: m for lr, m in means.items() if m > -math.inf}
    return max(ok, key=lambda lr: (ok[lr], -lr)) if ok else None


def _middle(flat: Sequence[float]) -> float:
    """RULE: the lr of `flat` nearest in log lr to the geometric mean of its ends."""
    centre = 0.5 * (math.log(flat[0]) + math.log(flat[-1]))
    return min(flat, key=lambda lr: (round(abs(math.log(lr) - centre), 9), lr))


VARIANCE_MODEL = "log-linear in log lr"


def _loglinear(xs: Sequence[float], ss: Sequence[float], nu: Sequence[float]) -> list[float]:
    """Fitted variances of log v = a + b x from sums of squares ss with nu df each, the
    bias of a log chi-square taken out (scipy.special.digamma)."""
    from scipy.special import digamma
    ys = [math.log(s / n) - (digamma(n / 2) - math.log(n / 2)) for s, n in zip(ss, nu)]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    return [math.exp(my + b * (x - mx)) for x in xs]


def variance_per_lr(ok: Mapping[float, Mapping], var: dict) -> dict | None:
    """The residual variance of each lr's scores as a log-linear function of log lr (an lr
    near divergence scatters 50x more than a small one, so one pooled variance would make
    every small-lr difference look like noise). Seeds paired over the lrs (the same data
    order): the seed effects are estimated with weights 1 / variance (the quiet lrs carry
    them), each lr's residual sum of squares about its mean and those effects is fitted by
    log v = a + b log lr, and the two alternate 5 times. Unpaired: each lr's own sample
    variance, fitted once. {"sigma": {lr: sd}, "df": the residual df - 2}, or None with
    fewer than 3 lrs of 2+ seeds (the pooled variance is then used)."""
    lrs = sorted(ok)
    if len(lrs) < 3 or min(len(ok[lr]) for lr in lrs) < 2:
        return None
    xs = [math.log(lr) for lr in lrs]
    means = [sum(ok[lr].values()) / len(ok[lr]) for lr in lrs]
    if var["paired"]:
        seeds = var["seeds"]
        dev = [[ok[lr][k] - m for k in seeds] for lr, m in zip(lrs, means)]
        K, L = len(seeds), len(lrs)
        nu = [(K - 1) * (1 - 1 / L)] * L        # each lr's share of the (K-1)(L-1) df
        df = (K - 1) * (L - 1)
        v = [sum(d * d for d in row) / (K - 1) for row in dev]      # start: no seed effect
        for _ in range(5):
            w = [1 / max(x, 1e-300) for x in v]
            eff = [sum(w[i] * dev[i][j] for i in range(L)) / sum(w) for j in range(K)]
            ss = [sum((dev[i][j] - eff[j]) ** 2 for j in range(K)) for i in range(L)]
            if min(ss) <= 0:
                return None
            v = _loglinear(xs, ss, nu)
    else:
        ss = [sum((x - m) ** 2 for x in ok[lr].values()) for lr, m in zip(lrs, means)]
        nu = [len(ok[lr]) - 1 for lr in lrs]
        df = sum(nu)
        if min(ss) <= 0:
            return None
        v = _loglinear(xs, ss, nu)
    if df - 2 < 1:
        return None
    return {"sigma": {lr: math.sqrt(x) for lr, x in zip(lrs, v)}, "df": df - 2}


def _contrast(ok: Mapping[float, Mapping], best: float, lr: float, var: dict,
              per_lr: dict | None) -> tuple[float, float]:
    """(mean of best - lr, its SE): the pooled model's (`familywise.contrast`), its SE from
    the two lrs' own variances when `variance_per_lr` fitted them."""
    d, se = fw.contrast(ok, best, lr, var)
    if per_lr is None:
        return d, se
    sb, sl = per_lr["sigma"][best], per_lr["sigma"][lr]
    return d, math.sqrt(sb ** 2 / len(ok[best]) + sl ** 2 / len(ok[lr]))


def _analyse(scores: Mapping) -> dict:
    """The whole record but "extensions" (see `lr_tuning`)."""
    tab, given = _table(scores)
    grid = sorted(tab)
    means = _means(tab)
    best = _best(means)
    ok = {lr: tab[lr] for lr in grid if means[lr] > -math.inf}
    var = fw.pooled_variance(ok) if ok else {"df": 0, "sigma": math.nan, "paired": False}
    noise = best is not None and var["df"] > 0
    per_lr = variance_per_lr(ok, var) if noise else None
    seeds = _sorted({k for d in tab.values() for k in d}) if given else None
    rec = {"grid": grid, "scores": [means[lr] if means[lr] > -math.inf else None for lr in grid],
           "seeds": seeds, "per_seed": [{str(k): s for k, s in tab[lr].items()} for lr in grid],
           "best_mean_lr": best, "noise_measured": noise, "level": LEVEL,
           "sigma": var["sigma"] if noise else None,
           "df": (per_lr["df"] if per_lr else var["df"]) if noise else 0,
           "paired": bool(var["paired"]) if noise else None,
           "rule": RULE if noise else RULE_ONE_SEED}
    if per_lr:
        rec.update(variance_model=VARIANCE_MODEL,
                   sigma_per_lr=[per_lr["sigma"].get(lr) for lr in grid])
    rec["means"] = list(rec["scores"])
    if best is None:
        return {**rec, "chosen": None, "bracketed": False, "bracket": [None, None],
                "flat": None, "diff_from_best": []}
    m = max(1, len(ok) - 1)   # comparisons with the best: simultaneous (Bonferroni) intervals
    c = fw.t_ppf(1 - (1 - LEVEL) / (2 * m), rec["df"]) if noise else math.nan
    diffs, worse = [], {}
    for lr in grid:
        if lr == best:
            continue
        if lr not in ok:       # failed: worse than every scored lr
            diffs.append({"lr": lr, "diff": None, "se": None, "ci": None, "p": None,
                          "worse": True, "failed": True})
            worse[lr] = True
            continue
        if noise:
            d, se = _contrast(ok, best, lr, var, per_lr)
            ci = [d - c * se, d + c * se]
            diffs.append({"lr": lr, "diff": d, "se": se, "ci": ci,
                          "p": fw.t_test(d, se, rec["df"], LEVEL)["p"], "worse": ci[0] > 0})
        else:
            d = means[best] - means[lr]
            diffs.append({"lr": lr, "diff": d, "se": None, "ci": None, "p": None,
                          "worse": d > 0})
        worse[lr] = diffs[-1]["worse"]
    i = grid.index(best)
    lo_i, hi_i = i, i
    if noise:                 # the contiguous run of lrs not significantly worse
        while lo_i > 0 and not worse[grid[lo_i - 1]]:
            lo_i -= 1
        while hi_i < len(grid) - 1 and not worse[grid[hi_i + 1]]:
            hi_i += 1
    below = [lr for lr in grid[:lo_i] if worse[lr]]
    above = [lr for lr in grid[hi_i + 1:] if worse[lr]]
    flat = grid[lo_i:hi_i + 1]
    return {**rec, "chosen": _middle(flat) if noise else best,
            "bracketed": bool(below and above),
            "bracket": [below[-1] if below else None, above[0] if above else None],
            "flat": [flat[0], flat[-1]] if noise else None, "diff_from_best": diffs}


def chosen(scores: Mapping) -> float | None:
    """The lr the record chooses (`lr_tuning`'s "chosen"); None when no lr has a score."""
    return _analyse(scores)["chosen"]


def is_bracketed(scores: Mapping) -> bool:
    """The best lr has a worse lr below and above it (significantly worse when the noise is
    measured)."""
    return _analyse(scores)["bracketed"]


def _extension(rec: dict, factor: float) -> list[float]:
    best, grid = rec["best_mean_lr"], rec["grid"]
    if best is None:
        return []
    m = {lr: (s if s is not None else -math.inf) for lr, s in zip(grid, rec["means"])}
    flat = rec["flat"] or [None, None]
    out = []
    if not any(lr < best and m[lr] < m[best] for lr in grid) or flat[0] == grid[0]:
        out.append(grid[0] / factor)
    if not any(lr > best and m[lr] < m[best] for lr in grid) or flat[1] == grid[-1]:
        out.append(grid[-1] * factor)
    return [float(f"{x:.6g}") for x in out]


def extension(scores: Mapping, factor: float = 2.0) -> list[float]:
    """The lrs to try next: min / factor when no mean below the best mean is lower, or when
    the flat set reaches the grid's lowest lr; max * factor likewise above; [] when bracketed
    (or nothing scored)."""
    return _extension(_analyse(scores), factor)


def lr_tuning(scores: Mapping, extensions: int = 0) -> dict:
    """summary.json "lr_tuning": {grid, scores (the means per lr), means, per_seed [{seed:
    score} per lr], seeds, chosen, bracketed, bracket (the nearest worse lr on each side of
    the best mean, None where none), flat ([lo, hi]; None without noise), diff_from_best
    [{lr, diff, se, ci, p, worse}: best - lr, its LEVEL t interval and two-sided p],
    best_mean_lr, noise_measured, level, sigma, df, paired, rule, extensions}."""
    return {**_analyse(scores), "extensions": extensions}


def tune(score: Callable[[float], Any], grid: Sequence[float], factor: float = 2.0,
         max_extensions: int = 4) -> dict:
    """Score `grid` (score(lr): a score, or {seed: score}), then extend it by `extension`
    until nothing is to add or `max_extensions` rounds were added; returns `lr_tuning` of the
    whole curve."""
    scores = {float(lr): score(float(lr)) for lr in grid}
    n = 0
    while n < max_extensions:
        new = [lr for lr in extension(scores, factor) if lr not in scores]
        if not new:
            break
        scores.update({lr: score(lr) for lr in new})
        n += 1
    return lr_tuning(scores, n)


def upgrade(rec: dict | None) -> dict | None:
    """An older record (no "noise_measured"; one seed per lr) rebuilt from its
    grid and scores, so every reader sees the same keys."""
    if not rec or "noise_measured" in rec or "grid" not in rec:
        return rec
    return lr_tuning(dict(zip(rec["grid"], rec.get("scores") or [])), rec.get("extensions", 0))


def from_lr_tune_file(data: dict) -> dict:
    """{algo: lr_tuning} from a sweep's lr_tune.json ("tuned": {algo: {"lr_tuning": record}},
    or before the record existed {algo: {"scores": {lr: s}}})."""
    out = {}
    for algo, t in (data.get("tuned") or {}).items():
        if t.get("lr_tuning"):
            out[algo] = upgrade(t["lr_tuning"])
        elif t.get("scores"):
            out[algo] = lr_tuning({float(k): v for k, v in t["scores"].items()},
                                  t.get("extensions", 0))
    return out


def _read(sweep_dir: str | None, name: str) -> dict | None:
    import json
    import os
    path = os.path.join(sweep_dir, name) if sweep_dir else None
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


def read_lr_tuning(sweep_dir: str | None, name: str = "lr_tune.json") -> dict:
    """{algo: lr_tuning} of SWEEP_DIR/lr_tune.json; {} when there is none."""
    data = _read(sweep_dir, name)
    return from_lr_tune_file(data) if data is not None else {}


def read_tuning_extras(sweep_dir: str | None, name: str = "lr_tune.json") -> dict:
    """{"per_batch": {algo: {B: lr_tuning}}, "cost": {algo: {B: {runs, responses, wall_s}}}}
    of SWEEP_DIR/lr_tune.json (batches as ints; {} parts when absent)."""
    data = _read(sweep_dir, name)
    if data is None:
        return {}
    ints = lambda d, f=lambda v: v: {a: {int(B): f(v) for B, v in per.items()}
                                     for a, per in (d or {}).items()}
    return {"per_batch": ints(data.get("tuned_per_batch"), upgrade),
            "cost": ints(data.get("tuning_cost"))}
