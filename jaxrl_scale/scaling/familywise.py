"""Family-wise decisions over the configs of a sweep, and the power of the design. Pure
numpy functions; `scaling.analysis` calls `sweep_tests`.

Model. Per run (config c, seed k) the analysis has y_ck = log N*_ck (or log q_ck, or
log T_ck = log N*_ck - log q_ck). Seed-to-seed learning speed and eval noise both enter y_ck;
on the log scale their spread is taken to be the same for every config of an algorithm:

    y_ck = mu_c + s_k + e_ck,   e_ck ~ N(0, sigma^2)

- paired (every config of the algorithm ran the same K >= 2 seeds, as the sweep designs them:
  a config and the reference share seeds and the step-0 eval): a randomised complete block
  design, sigma^2 from the two-way residuals with (C - 1)(K - 1) degrees of freedom, and each
  contrast mu_c - mu_0 is the mean over seeds of y_ck - y_0k, SE = sigma sqrt(2 / K);
- unpaired (seed sets differ): one-way, sigma^2 pooled within configs with sum(K_c - 1) df,
  SE = sigma sqrt(1 / K_c + 1 / K_0).

Warm-starts as blocks. When the runs come from two or more warm-starts (Run.block), the
unit is a warm-start: y_cw is config c's mean over its seeds from warm-start w, and the model
above applies with w in place of k. Its error term then holds the warm-start x config
interaction (sd tau, `interaction_sd`), which one warm-start can never average out, so the
verdicts are about the population of warm-starts (docs/science.md, Warm-starts as blocks).

The small-sample correction is Student's t with those df (pooling over configs keeps 3-5
seeds usable: 8 configs x 3 seeds give 14 df instead of 2). Family-wise: Holm's step-down over
the two-sided p-values of every config's T/T0 test in the sweep (all algorithms together), so
a sweep of identical configs names a faster or slower config with probability <= alpha =
1 - ci_level. "Alike" is an equivalence claim: the simultaneous (Bonferroni) interval of the
ratio lies inside [0.8, 1.25]. The fastest set is Hsu's multiple comparison with the best
(Bonferroni critical value): it holds the truly fastest config with probability >= ci_level.
Without df (one seed per config), the bootstrap replicates give the p-values instead.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from jaxrl_scale.scaling.reproducibility import holm_steps, is_fragile
from jaxrl_scale.scaling.values import FamilyTest, Ratio

if TYPE_CHECKING:
    from jaxrl_scale.scaling.summary import RunStats

EQUIV_MARGIN = (0.8, 1.25)
POWER = 0.8


# ----------------------------------------------------------------------------- Student t


def t_sf(t, df) -> np.ndarray:
    """Survival function of Student's t (scipy.stats.t) at a fractional df, e.g. a
    Welch-Satterthwaite df; inf df: the normal."""
    from scipy import stats as sps
    return sps.t.sf(np.asarray(t, float), df) if math.isfinite(df) else \
        sps.norm.sf(np.asarray(t, float))


@functools.lru_cache(maxsize=4096)
def t_ppf(p: float, df: float) -> float:
    """Quantile of Student's t (scipy.stats.t, fractional df; inf df: the normal); cached,
    since the family's tests ask for the same few quantiles many times."""
    from scipy import stats as sps
    return float(sps.t.ppf(p, df) if math.isfinite(df) else sps.norm.ppf(p))


def holm(pvalues: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (monotone, capped at 1); NaN stays NaN."""
    p = np.asarray(pvalues, float)
    out = np.full(p.shape, np.nan)
    ok = np.nonzero(np.isfinite(p))[0]
    m = ok.size
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out[order] = adj
    return out


# ----------------------------------------------------------------------------- the model


def pooled_variance(values: Mapping[str, Mapping[Any, float]]) -> dict:
    """sigma^2 of `values` {config: {seed: y}} under the module's model: {"sigma", "df",
    "paired", "seeds"}; df 0 (sigma NaN) when no config has two seeds."""
    rows = {g: {k: float(v) for k, v in d.items() if np.isfinite(v)} for g, d in values.items()}
    rows = {g: d for g, d in rows.items() if d}
    seed_sets = {frozenset(d) for d in rows.values()}
    if len(seed_sets) == 1 and len(rows) >= 2 and len(next(iter(seed_sets))) >= 2:
        seeds = sorted(next(iter(seed_sets)), key=str)
        y = np.array([[rows[g][k] for k in seeds] for g in rows])
        resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
        df = (y.shape[0] - 1) * (y.shape[1] - 1)
        return {"sigma": float(math.sqrt(np.sum(resid ** 2) / df)), "df": df, "paired": True,
                "seeds": seeds}
    ss = sum(float(np.sum((np.array(list(d.values())) - np.mean(list(d.values()))) ** 2))
             for d in rows.values())
    df = sum(len(d) - 1 for d in rows.values())
    return {"sigma": float(math.sqrt(ss / df)) if df > 0 else math.nan, "df": df,
            "paired": False, "seeds": None}


def contrast(values: Mapping[str, Mapping[Any, float]], config: str, reference: str,
             var: dict) -> tuple[float, float]:
    """(estimate of mu_config - mu_reference, its SE) under `var` (from `pooled_variance`)."""
    a, b = values[config], values[reference]
    if var["paired"]:
        d = [a[k] - b[k] for k in var["seeds"]]
        return float(np.mean(d)), var["sigma"] * math.sqrt(2.0 / len(d))
    return (float(np.mean(list(a.values())) - np.mean(list(b.values()))),
            var["sigma"] * math.sqrt(1.0 / len(a) + 1.0 / len(b)))


def t_test(est: float, se: float, df: float, level: float, m: int = 1) -> dict:
    """Two-sided test of 0, the marginal interval at `level` and the simultaneous one (over m
    tests, Bonferroni), all on the log scale, returned as ratios."""
    if math.isfinite(est) and se == 0 and df > 0:   # noise-free data: the ratio is exact
        r = math.exp(est)
        return {"log_ratio": est, "se": 0.0, "df": df, "p": 1.0 if est == 0 else 0.0,
                "ci": [r, r], "sci": [r, r]}
    if not (math.isfinite(est) and math.isfinite(se) and se > 0 and df > 0):
        return {"log_ratio": est, "se": se, "df": df, "p": math.nan, "ci": [None, None],
                "sci": [None, None]}
    tstat = est / se
    p = float(min(1.0, 2 * t_sf(abs(tstat), df)))
    a = 1 - level
    c1 = t_ppf(1 - a / 2, df)
    cm = t_ppf(1 - a / (2 * max(m, 1)), df)
    return {"log_ratio": est, "se": se, "df": df, "t": tstat, "p": p,
            "ci": [math.exp(est - c1 * se), math.exp(est + c1 * se)],
            "sci": [math.exp(est - cm * se), math.exp(est + cm * se)]}


def bootstrap_p(reps: np.ndarray) -> float:
    """Two-sided bootstrap p-value of ratio = 1 (NaN replicates left out)."""
    r = np.asarray(reps, float)
    r = r[~np.isnan(r)]
    if r.size == 0:
        return math.nan
    return float(min(1.0, 2 * min(np.mean(r >= 1), np.mean(r <= 1)) + 1.0 / r.size))


def inside(ci, margin=EQUIV_MARGIN) -> bool | None:
    lo, hi = ci
    if lo is None or hi is None:
        return None
    return bool(margin[0] <= lo and hi <= margin[1])


# ----------------------------------------------------------------------------- power


def power(log_effect: float, se: float, df: float, alpha: float, m: int = 1) -> float:
    """Probability that a two-sided test at alpha / m detects a true log ratio `log_effect`
    with standard error `se` (shifted-t approximation of the noncentral t)."""
    if not (se > 0 and df > 0):
        return math.nan
    c = t_ppf(1 - alpha / (2 * max(m, 1)), df)
    d = log_effect / se
    return float(t_sf(c - d, df) + 1 - t_sf(-c - d, df))


def min_detectable_log_ratio(se: float, df: float, alpha: float, m: int = 1,
                             target_power: float = POWER) -> float:
    """Smallest |log ratio| detected with `target_power` by a two-sided test at alpha / m
    (Holm's first step, so a bound for every step): (t_{1-alpha/2m} + t_power) * se."""
    if not (se > 0 and df > 0):
        return math.nan
    return (t_ppf(1 - alpha / (2 * max(m, 1)), df) + t_ppf(target_power, df)) * se


# ----------------------------------------------------------------------------- the sweep


def _log_value(x: RunStats, key: str) -> float:
    n, q = x.N_star, x.q
    if n is None and x.censored_at:   # a lower bound: the budget it ran without reaching
        n = x.censored_at
    v = n if key == "N" else q if key == "q" else (n / q if n is not None and q else None)
    return math.log(v) if v is not None and v > 0 and math.isfinite(v) else math.nan


def _cells(configs: dict, per_run: dict, g: str, key: str, by_block: bool) -> dict:
    """{unit: [log value of each run]}: the unit is the run's warm-start block (by_block) or
    its seed (else; the run's name when it has none)."""
    out: dict = {}
    for name in configs[g]["runs"]:
        x = per_run[name]
        if by_block:
            unit = x.block
        else:
            unit = x.seed if x.seed is not None else name
        out.setdefault(unit, []).append(_log_value(x, key))
    return out


def _by_block(pool: Sequence[str], configs: dict, per_run: dict) -> bool:
    """Whether the pool's runs come from two or more warm-start blocks (every run tagged)."""
    blocks = {per_run[r].block for g in pool for r in configs[g]["runs"]}
    return None not in blocks and len(blocks) >= 2


def _values(configs: dict, per_run: dict, g: str, key: str, by_block: bool = False) -> dict:
    """{unit: y} for `pooled_variance`: per seed, or per warm-start block the mean over its
    seeds (a block with a run that missed the target has no value)."""
    return {u: float(np.mean(v)) for u, v in _cells(configs, per_run, g, key, by_block).items()}


def interaction_sd(configs: dict, per_run: dict, pool: Sequence[str], key: str, var: dict,
                   level: float) -> dict | None:
    """tau, the sd of the warm-start x config interaction in log N* (key "N") or log T, with
    an interval: the block cell means' two-way residual variance s2 (df (C-1)(W-1)) holds
    tau^2 + sigma_w^2 / K, sigma_w^2 the seeds' variance within a cell (pooled) and K the
    harmonic mean of seeds per cell; tau^2 = s2 - sigma_w^2 / K, its interval from the
    chi-square interval of s2 (scipy.stats.chi2), floored at 0. None without seeds to
    separate (one seed per cell: tau and the seed noise are then one error term)."""
    from scipy import stats as sps
    ss, df_w, sizes = 0.0, 0, []
    for g in pool:
        for v in _cells(configs, per_run, g, key, True).values():
            v = np.asarray(v, float)
            if np.all(np.isfinite(v)):
                ss += float(np.sum((v - v.mean()) ** 2))
                df_w += v.size - 1
                sizes.append(v.size)
    if not var.get("paired") or df_w == 0 or not np.isfinite(var["sigma"]):
        return None
    s2, df = var["sigma"] ** 2, var["df"]
    within = ss / df_w / (len(sizes) / np.sum(1.0 / np.asarray(sizes)))
    a = 1 - level
    lo = s2 * df / sps.chi2.ppf(1 - a / 2, df) - within
    hi = s2 * df / sps.chi2.ppf(a / 2, df) - within
    return {"tau": math.sqrt(max(0.0, s2 - within)),
            "ci": [math.sqrt(max(0.0, lo)), math.sqrt(max(0.0, hi))],
            "within_sd": math.sqrt(ss / df_w), "df": df}


def _with_block_passes(vals: dict, block_offsets: Mapping[str, Mapping[str, Any]],
                       ref: str) -> bool:
    """Put each warm-start's own timing pass into the units: log r_q of config g in block w
    is that block's pass (`drift.PassRatio`, the reference 0), and log T_gw = log N*_gw -
    log r_q,gw. True when the pass of every block a config ran in covers it (a sequential
    study's decided configs have no runs, and no pass entry, in later blocks); vals
    unchanged otherwise. The machine state of each pass then varies with the blocks: it is
    in the error term."""
    pool = list(vals["N"])
    blocks = {w for g in pool for w in vals["N"][g]}
    if not blocks <= set(block_offsets) or any(
            g != ref and g not in block_offsets[w] for g in pool for w in vals["N"][g]):
        return False
    for g in pool:
        lq = {w: (0.0 if g == ref else block_offsets[w][g].log) for w in vals["N"][g]}
        vals["q"][g] = lq
        vals["T"][g] = {w: y - lq[w] for w, y in vals["N"][g].items()}
    return True


def sweep_tests(configs: dict, per_run: dict, creps: dict, references: Mapping[str, str],
                level: float, margin: tuple[float, float] = EQUIV_MARGIN,
                offsets: Mapping[str, Any] | None = None,
                block_offsets: Mapping[str, Mapping[str, Any]] | None = None) -> dict:
    """Family-wise verdicts, intervals and fastest sets for a sweep.

    configs: the analysis' per-config dicts ("algo", "runs", "reached", "is_reference");
    per_run: {run: `summary.RunStats`} (N_star, q, censored_at, seed, block); creps:
    {config: {"T": bootstrap replicates of T, "r_N", ...}} (used when a design has no df);
    references: {algo: reference config}.
    offsets: {config: `drift.PassRatio`} from an interleaved timing pass; T/T0 then uses it
    (log T/T0 = log r_N - log r_q, Welch-Satterthwaite df) instead of the in-run q, and so do
    the fastest sets (the verdicts and the fastest set rest on one r_q). block_offsets:
    {warm-start block: {config: PassRatio}}, one timing pass per warm-start, each in its own
    machine state: with warm-starts as the units, each unit's log T takes its block's pass
    (`_with_block_passes`) and the test is the paired t over warm-starts.

    Returns {"configs": {config: `values.FamilyTest`}, "best_sets": {algo: [config, ...]},
    "families": {algo: {"sigma_log_N", "sigma_log_T", "df", "paired", "seeds"}},
    "n_tests", "alpha", "method"}.
    """
    alpha = 1 - level
    offsets = offsets or {}
    fields: dict[str, dict] = {}
    fam: dict[str, dict] = {}
    tests = []   # (config, p)
    tt_ref: dict[str, str] = {}
    for algo, ref in references.items():
        if ref not in configs:
            continue
        pool = [g for g, st in configs.items() if (st["algo"] or "?") == algo and st["reached"]]
        if not configs[ref]["reached"] or ref not in pool:
            continue
        # Warm-starts as blocks when the runs come from two or more: each config's mean
        # over its seeds in a block is one unit, so the warm-start x config interaction is
        # in the error term and the verdicts are about the population of warm-starts.
        by_block = _by_block(pool, configs, per_run)
        vals = {key: {g: _values(configs, per_run, g, key, by_block) for g in pool}
                for key in ("N", "q", "T")}
        passes = by_block and bool(block_offsets) and _with_block_passes(vals, block_offsets,
                                                                         ref)
        var = {key: pooled_variance(v) for key, v in vals.items()}
        fam[algo] = {"reference": ref, "paired": var["T"]["paired"], "df": var["T"]["df"],
                     "seeds": var["T"]["seeds"], "sigma_log_N": var["N"]["sigma"],
                     "sigma_log_q": var["q"]["sigma"], "sigma_log_T": var["T"]["sigma"],
                     "configs": len(pool)}
        if by_block:
            fam[algo]["units"] = "warm-starts"
            if passes:
                fam[algo]["r_q_from"] = "each warm-start's timing pass"
            fam[algo]["warm_starts"] = len({per_run[r].block for g in pool
                                            for r in configs[g]["runs"]})
            fam[algo]["tau_log_N"] = interaction_sd(configs, per_run, pool, "N", var["N"],
                                                    level)
        se_q = [offsets[g].se for g in pool if g in offsets and offsets[g].df > 0]
        if se_q:   # the timing pass's error enters every T/T0 test: the power includes it
            fam[algo].update(pass_se=float(np.sqrt(np.mean(np.square(se_q)))),   # RMS
                             pass_df=int(np.median(
                [offsets[g].df for g in pool if g in offsets and offsets[g].df > 0])))
        from jaxrl_scale.scaling.censored import censored_tests   # it reads this module
        tests += censored_tests(configs, per_run, algo, pool, ref, by_block, var, vals,
                                offsets, block_offsets if passes else None, level, fields,
                                tt_ref)
        for g in pool:
            if g == ref or configs[g].get("is_reference"):
                continue
            row = {}
            for key, name in (("N", "r_N"), ("q", "r_q"), ("T", "T_over_T0")):
                v = var[key]
                if v["df"] > 0:
                    est, se = contrast(vals[key], g, ref, v)
                    row[name] = {**t_test(est, se, v["df"], level), "method":
                                 ("paired t" if v["paired"] else "pooled t")
                                 + (" + per-warm-start timing pass"
                                    if passes and key != "N" else "")}
                else:
                    row[name] = {"method": "bootstrap", "p": math.nan}
            if g in offsets and var["N"]["df"] > 0 and not passes:   # the pass's r_q
                est, se, df = _with_pass(contrast(vals["N"], g, ref, var["N"]),
                                         var["N"]["df"], offsets[g].units)
                row["T_over_T0"] = {**t_test(est, se, df, level),
                                    "method": "paired t + interleaved r_q"}
            if row["T_over_T0"]["method"] == "bootstrap":
                with np.errstate(divide="ignore", invalid="ignore"):
                    row["T_over_T0"]["p"] = bootstrap_p(creps[g]["T"] / creps[ref]["T"])
                row["T_over_T0"]["ratio_reps"] = True
            fields[g] = row
            tt_ref[g] = ref
            tests.append((g, row["T_over_T0"]["p"]))
    m = len(tests)
    adj = holm([p for _, p in tests])
    steps = holm_steps([p for _, p in tests])
    out_cfg = {}
    for (g, p), pa, step in zip(tests, adj, steps):
        row = fields[g]
        tt = row["T_over_T0"]
        if row.get("lower_bound"):   # only "slower" follows from a lower bound
            out_cfg[g] = FamilyTest(
                verdict="slower" if np.isfinite(pa) and pa < alpha and tt["log_ratio"] > 0
                else "not reached", p_value=tt.get("p"), p_holm=float(pa),
                test=tt.get("method"), alike_T=None, alike_r_N=None, r_q_in_run_test={},
                T_over_T0_test={k: tt.get(k) for k in ("log_ratio", "se", "df")})
            continue
        # simultaneous intervals over the whole family
        for name in ("r_N", "r_q", "T_over_T0"):
            x = row[name]
            if x.get("ci", [None])[0] is not None:
                x.update({k: v for k, v in t_test(x["log_ratio"], x["se"], x["df"], level,
                                                  m).items() if k == "sci"})
        est = tt.get("log_ratio")
        if np.isfinite(pa) and pa < alpha:
            if est is None:
                with np.errstate(divide="ignore", invalid="ignore"):
                    est = math.log(np.nanmedian(creps[g]["T"] / creps[tt_ref[g]]["T"]))
            verdict = "faster" if est < 0 else "slower"
        else:
            verdict = "indistinguishable"
        ratios = {}
        for name in ("r_N", "r_q", "T_over_T0"):
            x = row[name]
            if x.get("ci", [None])[0] is not None:
                ratios[name] = Ratio(math.exp(x["log_ratio"]), x["ci"], x["method"],
                                     sci=x["sci"], log_ratio=x["log_ratio"], se=x["se"],
                                     df=x["df"])
        out_cfg[g] = FamilyTest(
            verdict=verdict, p_value=tt.get("p"), p_holm=float(pa),
            test=tt.get("method"), alike_T=inside(tt.get("sci", [None, None]), margin),
            alike_r_N=inside(row["r_N"].get("sci", [None, None]), margin),
            r_q_in_run_test={k: row["r_q"].get(k) for k in ("log_ratio", "se", "df")},
            T_over_T0_test={k: tt.get(k) for k in ("log_ratio", "se", "df")}, ratios=ratios,
            fragile=is_fragile(tt["log_ratio"] / tt["se"] if tt.get("log_ratio") is not None
                               and tt.get("se") else None, tt.get("df"), step, alpha))
    # Fastest sets: Hsu's MCB per algorithm on log T.
    best = {}
    for algo in sorted({st["algo"] or "?" for st in configs.values()}):
        ok = [g for g, st in configs.items() if (st["algo"] or "?") == algo and st["reached"]
              and st.get("T") is not None and math.isfinite(st["T"])]
        pass_units = ({g: offsets[g].units for g in ok if g in offsets}
                      if offsets and all(g in offsets or configs[g].get("is_reference")
                                         for g in ok) else None)
        best[algo] = best_set(ok, configs, per_run, creps, alpha, pass_units,
                              block_offsets, references.get(algo))
    return {"configs": out_cfg, "best_sets": best, "families": fam, "n_tests": m,
            "alpha": alpha, "margin": list(margin),
            "method": "Holm over two-sided t tests on log ratios (seed-paired when the "
                      "design pairs them, variance pooled over configs); alike: simultaneous "
                      "interval inside the margin; fastest set: Hsu's MCB"}


def _with_pass(est_se: tuple[float, float], df_n: float, units: np.ndarray
               ) -> tuple[float, float, float]:
    """(log T ratio, SE, Welch-Satterthwaite df) from a log N* contrast (est, SE with df_n)
    and the per-unit log r_q of the timing pass (`drift.PassRatio.units`, or a difference of
    two configs' units): log T = log N - log q."""
    est_n, se_n = est_se
    u = np.asarray(units, float)
    lq = float(u.mean())
    se_q = float(u.std(ddof=1) / math.sqrt(u.size)) if u.size >= 2 else 0.0
    df_q = u.size - 1
    se = math.sqrt(se_n ** 2 + se_q ** 2)
    den = se_n ** 4 / df_n + (se_q ** 4 / df_q if df_q > 0 else 0)
    return est_n - lq, se, (se ** 4 / den if den > 0 else df_n)


def best_set(ok: list[str], configs: dict, per_run: dict, creps: dict, alpha: float,
             pass_units: Mapping[str, np.ndarray] | None = None,
             block_offsets: Mapping[str, Mapping[str, Any]] | None = None,
             ref: str | None = None) -> list[str]:
    """Configs not distinguishable from the fastest (Hsu's MCB, Bonferroni constant): g stays
    unless log T_g - min_{h != g} log T_h > t_{1 - alpha/(C-1)} SE_gh. With `pass_units`
    ({config: per-unit log r_q of the timing pass}; the reference's is 0), log T = log N* -
    log r_q as in the verdicts: the contrast of g and h adds the pass's paired difference."""
    if len(ok) <= 1:
        return list(ok)
    if pass_units is not None:
        return _best_set_with_pass(ok, configs, per_run, alpha, pass_units)
    by_block = _by_block(ok, configs, per_run)
    vals = {g: _values(configs, per_run, g, "T", by_block) for g in ok}
    if by_block and block_offsets:   # log T per warm-start from its own pass, as the verdicts
        both = {"N": {g: _values(configs, per_run, g, "N", True) for g in ok}, "q": {}, "T": {}}
        if _with_block_passes(both, block_offsets, ref):
            vals = both["T"]
    var = pooled_variance(vals)
    key = lambda g: (configs[g]["T"], g)
    if var["df"] <= 0:   # no seeds to pool: the bootstrap replicates, as before
        fastest = min(ok, key=key)
        keep = []
        for g in ok:
            r = creps[g]["T"] / creps[fastest]["T"]
            r = r[~np.isnan(r)]
            lo = np.quantile(r, alpha / 2) if r.size else math.nan
            if g == fastest or not lo > 1:
                keep.append(g)
        return sorted(keep, key=key)
    c = t_ppf(1 - alpha / (len(ok) - 1), var["df"])
    keep = []
    for g in ok:
        worst = max(contrast(vals, g, h, var)[0] - c * contrast(vals, g, h, var)[1]
                    for h in ok if h != g)
        if not worst > 0:
            keep.append(g)
    return sorted(keep, key=key)


def _best_set_with_pass(ok: list[str], configs: dict, per_run: dict, alpha: float,
                        pass_units: Mapping[str, np.ndarray]) -> list[str]:
    vals = {g: _values(configs, per_run, g, "N", _by_block(ok, configs, per_run)) for g in ok}
    var = pooled_variance(vals)
    n = max(u.size for u in pass_units.values())
    u = {g: np.asarray(pass_units.get(g, np.zeros(n)), float) for g in ok}
    if var["df"] <= 0 or len({x.size for x in u.values()}) != 1:
        return sorted(ok, key=lambda g: (configs[g]["T"], g))

    def diff(g, h):   # (log T_g - log T_h, SE, df)
        return _with_pass(contrast(vals, g, h, var), var["df"], u[g] - u[h])

    est0 = {g: diff(g, ok[0])[0] for g in ok}
    keep = []
    for g in ok:
        worst = -math.inf
        for h in ok:
            if h != g:
                e, se, df = diff(g, h)
                worst = max(worst, e - t_ppf(1 - alpha / (len(ok) - 1), df) * se)
        if not worst > 0:
            keep.append(g)
    return sorted(keep, key=lambda g: (est0[g], g))


DESIGN_TARGET_R_N = 1.3   # the smallest r_N a design should detect
MAX_SEEDS = 64
SMALL_FAMILY = 4          # the reference and three other configs (Holm over 3 tests)


def seeds_needed(sigma: float, configs: int, m: int, alpha: float,
                 target: float = DESIGN_TARGET_R_N, paired: bool = True,
                 max_seeds: int = MAX_SEEDS) -> int | None:
    """Smallest seeds per config K at which a family of `configs` configs (Holm over m tests)
    detects r_N >= target with 80% power, given the per-run spread sigma of log N*: the
    contrast's SE is sigma sqrt(2 / K), its df (C - 1)(K - 1) paired or C (K - 1) pooled.
    None when even max_seeds do not reach it."""
    if not (sigma > 0 and configs >= 2 and target > 1):
        return None
    for k in range(2, max_seeds + 1):
        df = (configs - 1) * (k - 1) if paired else configs * (k - 1)
        if min_detectable_log_ratio(sigma * math.sqrt(2.0 / k), df, alpha, m) <= math.log(
                target):
            return k
    return None


def design_for_target(fam: dict, m: int, alpha: float, k: int,
                      target: float = DESIGN_TARGET_R_N) -> dict:
    """Seeds the measured spread asks for to detect r_N >= target with 80% power: at this
    sweep's family (its configs, m tests) and at a family of SMALL_FAMILY configs (fewer
    configs, so a milder Holm correction and fewer runs per seed), with the runs each needs
    as a multiple of this sweep's."""
    c, sig, paired = fam.get("configs") or 0, fam["sigma_log_N"], bool(fam.get("paired"))
    others = m - (c - 1)     # tests of other algorithms share the Holm family
    out = {"r_N": target}
    for name, cc, mm in (("this_family", c, m),
                         ("small_family", SMALL_FAMILY, SMALL_FAMILY - 1 + max(others, 0))):
        if cc < 2 or (name == "small_family" and cc >= c):
            continue
        kk = seeds_needed(sig, cc, mm, alpha, target, paired)
        out[name] = {"configs": cc, "tests": mm, "seeds": kk,
                     "runs": cc * kk if kk else None,
                     "runs_factor": cc * kk / (c * k) if kk and c else None}
    return out


def design_power(fam: dict, m: int, level: float, k: int | None = None,
                 effects: Sequence[float] = (1.15, 1.3, 1.5)) -> dict:
    """Power of this design (per algorithm family from `sweep_tests`): the smallest r_N and
    T/T0 detected with 80% power under Holm over m tests, and the power at `effects`."""
    alpha = 1 - level
    k = k or (len(fam["seeds"]) if fam.get("seeds") else None)
    if not k or not fam["df"]:
        return {"min_detectable_r_N": None, "min_detectable_T_over_T0": None,
                "reason": "no seed-to-seed spread to pool (one seed per config)"}
    f = math.sqrt(2.0 / k)
    out = {"seeds": k, "df": fam["df"], "tests": m, "alpha": alpha, "power": POWER,
           "sigma_log_N": fam["sigma_log_N"], "sigma_log_T": fam["sigma_log_T"]}
    if fam.get("units"):     # k counts warm-starts, the test's units
        out["units"] = fam["units"]
    tests = {"r_N": (fam["sigma_log_N"] * f, fam["df"]),
             "T_over_T0": (fam["sigma_log_T"] * f, fam["df"])}
    if fam.get("pass_se") is not None:
        # T/T0 = r_N / r_q with r_q from the timing pass: a config slower by r_N at equal
        # throughput is called by that test, whose SE adds the pass's (Welch df)
        se_n, se_q, df_q = fam["sigma_log_N"] * f, fam["pass_se"], fam.get("pass_df") or 0
        se = math.sqrt(se_n ** 2 + se_q ** 2)
        den = se_n ** 4 / fam["df"] + (se_q ** 4 / df_q if df_q > 0 else 0)
        tests["T_over_T0"] = tests["r_N"] = (se, se ** 4 / den if den > 0 else fam["df"])
        d = min_detectable_log_ratio(se_n, fam["df"], alpha, m)
        out.update(pass_se=se_q, pass_df=df_q,
                   min_detectable_r_N_learning_only=math.exp(d) if math.isfinite(d) else None)
    for name, (se, df) in tests.items():
        d = min_detectable_log_ratio(se, df, alpha, m)
        out["min_detectable_" + name] = math.exp(d) if math.isfinite(d) else None
        out["power_" + name] = {f"{e:g}": power(math.log(e), se, df, alpha, m)
                                for e in effects}
    out["min_detectable_T_over_T0_below"] = (1 / out["min_detectable_T_over_T0"]
                                             if out["min_detectable_T_over_T0"] else None)
    if fam.get("configs"):
        out["design_for_target"] = design_for_target(fam, m, alpha, k)
    return out


def power_fields(fw: dict, level: float, primary: str) -> dict:
    """summary.json keys: "min_detectable_r_N" (primary algorithm), "min_detectable_T_over_T0"
    and "power" {algo: `design_power`}."""
    per = {a: design_power(f, fw["n_tests"], level) for a, f in fw["families"].items()}
    p = per.get(primary) or {}
    return {"min_detectable_r_N": p.get("min_detectable_r_N"),
            "min_detectable_T_over_T0": p.get("min_detectable_T_over_T0"),
            "power": per}
