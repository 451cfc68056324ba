"""One sweep in, one summary dict out: the numbers behind ``summary.json`` and the report.

Per run (`scaling.run_stats`, one typed `RunStats` each): N* from the isotonic (monotone) fit
of its eval curve, with a parametric bootstrap of the eval noise; q = N* / t(N*) with a
bootstrap over step durations. Per config (a run name without its seed): seed means, a
hierarchical bootstrap (seeds, then each seed's replicates), N*, q, r_N, r_q, T/T0 with
intervals at ``ci_level`` and a verdict against the reference of its own algorithm
(docs/science.md, Time to target and Intervals). Then the set of configs not distinguishable
from the fastest, both critical batches, grad-norm slopes, noise scales and curve invariance
with a band derived from the measured eval noise; and, for configs run with asynchronous
partial rollout (gen_batch_ratio k > 1), their q, N* and T against the synchronous twin
(docs/science.md, Partial rollout). Verdicts and the fastest set are family-wise over all
configs of the sweep (`scaling.familywise`: Holm over seed-paired, pooled-variance t tests of
log T/T0; the t intervals replace the bootstrap ones as *_ci, which stay as *_ci_boot), with
the design's power (min_detectable_r_N); r_q prefers an interleaved timing pass
(`scaling.drift`).
Pure numpy: it never imports JAX.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
from typing import Any, Sequence

import numpy as np

from jaxrl_scale.numbers import is_number, to_jsonable, write_json
from jaxrl_scale.scaling import findings
from jaxrl_scale.scaling import drift as sdrift
from jaxrl_scale.scaling import familywise
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling import lr_bracket
from jaxrl_scale.scaling import noise as snoise
from jaxrl_scale.scaling import replay   # it imports this module only inside its functions
from jaxrl_scale.scaling import run_stats as rstats
from jaxrl_scale.scaling import stats
from jaxrl_scale.scaling import units
from jaxrl_scale.scaling import step_cost
from jaxrl_scale.scaling.io import Run
from jaxrl_scale.scaling.references import (AnalysisError, _group_size, _primary,  # noqa: F401
                                            check_references, check_runs,
                                            default_reference, default_references,
                                            resolve_reference, resolve_references)
from jaxrl_scale.scaling.rollout_compare import invariance, partial_rollout, rollout_means
from jaxrl_scale.scaling.records import (CriticalGenerationBatch, CriticalTrainingBatch, Drift,
                                         Power, Regime)
from jaxrl_scale.scaling.summary import AlgoSummary, ConfigStats, RunStats, Summary
from jaxrl_scale.scaling.configs import (compose_configs, config_stats,  # noqa: F401
                                         critical_training_batch, single_run_reference)
from jaxrl_scale.scaling.verdicts import VERDICTS  # noqa: F401
from jaxrl_scale.scaling.io import SWEEP_FILE, sweep_dirs  # noqa: F401
from jaxrl_scale.scaling.run_stats import (DEFAULT_TARGET_FRACTION, Targets,  # noqa: F401
                                           auto_target, eval_noise, recorded_target_fraction,
                                           run_table, set_targets, with_run_ratios)
from jaxrl_scale.scaling.blocks import BLOCK_PASSES_NOTE, block_timing, warm_start_blocks
from jaxrl_scale.scaling.stats import interval as _ci
from jaxrl_scale.scaling.throughput import step_costs

SUMMARY_FILE = "summary.json"


def parse_target(target: Any) -> float | str:
    """A finite score, or "auto" (chosen from the reference's curves, see `auto_target`)."""
    if isinstance(target, str) and target.strip().lower() == "auto":
        return "auto"
    try:
        t = float(target)
    except (TypeError, ValueError):
        raise AnalysisError(f"target: must be a number or 'auto', got {target!r}. Fix: pass "
                            "--target=auto or a score such as --target=0.6.") from None
    if not math.isfinite(t):
        raise AnalysisError(f"target: must be a finite number, got {target!r}. Fix: pass "
                            "--target=auto or a finite score such as --target=0.6.")
    return t


def write_summary(out_dir: str, summary) -> str:
    """summary.json in ``out_dir`` (atomic; a typed Summary or its dict)."""
    path = os.path.join(out_dir, SUMMARY_FILE)
    write_json(path, to_jsonable(summary), indent=2, allow_nan=False)
    return path


# ----------------------------------------------------------------------------- the stages


MIN_EVALS_BEFORE_N_STAR = 6   # where N* is decided by evals, not by the curve's shape


def evals_before_n_star(per_run: dict[str, RunStats], algo: str, needed: int) -> dict | None:
    """How many evals of each run of `algo` fall before its N* (N* decided by
    evals, not by the curve's shape between two of them): min, median, and the runs (and
    their configs) with fewer than `needed`. None when no run reached."""
    k = {n: x.evals_before_N_star for n, x in per_run.items()
         if (x.algo or "?") == algo and x.evals_before_N_star is not None}
    if not k:
        return None
    few = sorted(n for n, v in k.items() if v < needed)
    return {"needed": needed, "runs": len(k), "min": int(min(k.values())),
            "median": float(np.median(list(k.values()))), "runs_below": len(few),
            "configs_below": sorted({per_run[n].group or n for n in few})}


def power_and_evals(fw: dict, ci_level: float, primary: str,
                    per_run: dict[str, RunStats]) -> dict:
    """`familywise.power_fields`, each algorithm's power record with its
    "evals_before_N_star" (`evals_before_n_star`): what the design can detect and whether N*
    was decided by evals."""
    out = familywise.power_fields(fw, ci_level, primary)
    out["power"] = {algo: Power(**p, evals_before_N_star=evals_before_n_star(
        per_run, algo, MIN_EVALS_BEFORE_N_STAR)) for algo, p in out["power"].items()}
    return out


def grad_norm_slopes(runs: Sequence[Run], ref: ConfigStats, n_boot: int, rng, level: float,
                     flat_slope: float) -> dict:
    """log-log slope of the median actor / critic grad norm vs batch (reference's algo and lr
    rule and gen_batch_ratio, over the response range every such run covers), with an interval
    over runs."""
    pool = [r for r in runs if r.algo == ref.algo and r.lr_rule == ref.lr_rule and r.batch
            and r.gen_batch_ratio == ref.gen_batch_ratio]
    out = {}
    for key in ("actor_grad_norm", "critic_grad_norm"):
        ends = [r.train_series(key)[0] for r in pool]
        ends = [e.max() for e in ends if e.size]
        if not ends:
            continue
        n_common = float(min(ends))
        pts = []
        for r in pool:
            n, v = r.train_series(key)
            v = v[n <= n_common]
            if v.size and np.median(v) > 0:
                pts.append((r.batch, float(np.median(v)), r.name))
        if len({p[0] for p in pts}) < 2:
            continue
        b, v, names = zip(*pts)
        lb, lv = np.log(b), np.log(v)
        _, slope = stats.fit_line(lb, lv)
        boot = stats.bootstrap_line(lb, lv, names, n_boot, rng)
        by_b = collections.defaultdict(list)
        for bi, vi in zip(b, v):
            by_b[bi].append(vi)
        bs = sorted(by_b)
        means = [float(np.mean(by_b[x])) for x in bs]
        out[key] = {"batches": bs, "norms": means,
                    "norm_ranges": [[float(min(by_b[x])), float(max(by_b[x]))] for x in bs],
                    "slope": slope, "slope_ci": _ci(boot[:, 1], level),
                    "flattens_after": snoise.flattening_batch(bs, means, flat_slope),
                    "flat_threshold": flat_slope, "lr_rule": ref.lr_rule,
                    "algo": ref.algo, "responses_range": [0.0, n_common]}
    return out


# ----------------------------------------------------------------------------- the summary


def lora_configs(groups: dict[str, list[Run]]) -> dict:
    """{config: {"rank", "alpha", "targets"}} of the configs whose runs trained LoRA adapters
    (config.json lora_rank > 0): their lr is the adapters', so the report says so."""
    out = {}
    for g, rs in groups.items():
        rank = sio.config_get(rs[0].config, "lora_rank")
        if is_number(rank) and rank > 0:
            t = sio.config_get(rs[0].config, "lora_targets")
            out[g] = {"rank": int(rank), "alpha": sio.config_get(rs[0].config, "lora_alpha"),
                      "targets": list(t) if isinstance(t, (list, tuple)) else t}
    return out


@dataclasses.dataclass(frozen=True)
class Settings:
    """How the analysis decides (the knobs of `analyze`): interval level, bootstrap size, the
    sample-cost tolerance of the critical batch, the auto target's fraction (None: the
    study's own, `recorded_target_fraction`), the step-cost fit's minimum gain and the
    grad-norm slope that counts as flat."""
    ci_level: float = stats.CI_LEVEL
    n_boot: int = 1000
    tolerance: float = 0.25
    fit_sigmoid: bool = False
    target_fraction: float | None = None
    min_gain: float = 0.10
    flat_slope: float = -0.25
    design: str | None = None      # None: the study's own (sweep.json); "fixed": the fixed test
    n_unit: str | None = None      # what N counts (units.N_UNITS); None: the runs' own


@dataclasses.dataclass
class ConfigTable:
    """Per config: its statistics, bootstrap replicates, bootstrap ratios against its
    reference (`configs.config_stats`), and each run's step costs."""
    stats: dict[str, dict]
    reps: dict[str, dict]
    boot: dict[str, dict]
    costs: dict[str, dict]


@dataclasses.dataclass(frozen=True)
class Throughput:
    """Where r_q comes from: the drift record, the one timing pass's ratios, and each
    warm-start's own pass (None without warm-start passes)."""
    drift: dict
    offsets: dict
    block_offsets: dict | None


def analyze(runs: Sequence[Run], target: Any = "auto", reference: str | None = None,
            settings: Settings | None = None, *, skipped: Sequence[dict] = (), seed: int = 0,
            sweep_dir: str | None = None, timing: Sequence[dict] | None = None,
            **knobs) -> Summary:
    """The typed `Summary` of already-loaded runs (see :func:`analyze_sweep`): the stages
    below, in order (the bootstrap draws of one rng, so their order is part of the result).
    ``knobs``: `Settings` fields. ``timing``: the entries of an interleaved timing pass
    (`experiment.timing.time_batches`), which r_q then prefers over the in-run step times
    (`scaling.drift`); read from ``sweep_dir`` when None. ``sweep_dir`` also supplies the lr
    tuning record (lr_tune.json, `scaling.lr_bracket`) and the study's target fraction
    (sweep.json) when none is given."""
    cfg = dataclasses.replace(settings or Settings(), **knobs)
    target = parse_target(target)
    runs = units.in_n_unit(runs, cfg.n_unit)   # N in tokens: response_tokens, before the work
    n_unit = units.runs_unit(runs)
    warnings = check_runs(runs, target, cfg.ci_level)
    refs = resolve_references(runs, reference)
    check_references(refs)
    rng = np.random.default_rng(seed)
    blocks = warm_start_blocks(runs)
    if cfg.target_fraction is None:   # the study's own: a re-analysis decides at its target
        cfg = dataclasses.replace(cfg, target_fraction=recorded_target_fraction(sweep_dir))
    targets = set_targets(refs, blocks, target, cfg.target_fraction, cfg.ci_level, rng)
    per_run = run_table(runs, blocks, targets, _primary(refs), cfg.n_boot, rng, cfg.ci_level,
                        cfg.fit_sigmoid)
    per_cfg = config_table(runs, per_run, refs, cfg, rng)
    per_run = with_run_ratios(per_run, per_cfg.stats, refs)
    tp = throughput(runs, blocks, per_cfg, refs, sweep_dir, timing, cfg.ci_level, warnings)
    fw, cstats, drift_info, seq = decide(runs, per_run, per_cfg, refs, tp, sweep_dir, cfg)
    per_algo, cstats = algo_summaries(runs, refs, per_run, per_cfg, cstats, targets,
                                      fw["best_sets"], (cfg, rng))
    primary = _primary(refs)
    # Last: its bootstrap draws must not move the numbers above.
    partial = partial_rollout(cstats, per_cfg.reps, sio.group_runs(runs), per_run, rng,
                              cfg.ci_level)
    found = findings.source_findings(per_algo, cstats, per_cfg.reps, cfg.ci_level,
                                     cfg.tolerance, primary,
                                     per_algo[primary].critical_generation_batch)
    return Summary(
        ci_level=cfg.ci_level, primary_algo=primary, algos=per_algo, runs=per_run,
        configs=cstats, partial_rollout=partial, findings=tuple(found),
        tolerance=cfg.tolerance, n_boot=cfg.n_boot, skipped=list(skipped), warnings=warnings,
        sweep_dir=sweep_dir, n_unit=n_unit,
        familywise={k: fw[k] for k in ("families", "n_tests", "alpha", "margin", "method")},
        **power_and_evals(fw, cfg.ci_level, primary, per_run),
        drift=Drift.from_json(drift_info), sequential=seq or None,
        **study_records(runs, sweep_dir, primary))


def decide(runs: list[Run], per_run: dict[str, RunStats], per_cfg: ConfigTable, refs: dict,
           tp: Throughput, sweep_dir: str | None, cfg: Settings
           ) -> tuple[dict, dict[str, ConfigStats], dict, dict | None]:
    """The verdicts: the family-wise tests (`familywise.sweep_tests`) on r_q's source, a
    sequential study's decisions (its recorded plan, unless ``cfg.design`` says otherwise),
    and each config's ConfigStats built from them. Returns (the tests, the configs, the drift
    record with the in-run disagreements, the sequential record or None)."""
    fw = familywise.sweep_tests(per_cfg.stats, per_run, per_cfg.reps,
                                {a: n for a, (n, _) in refs.items()}, cfg.ci_level,
                                offsets=tp.offsets, block_offsets=tp.block_offsets)
    plan = replay.recorded_plan(sweep_dir) if cfg.design is None else None
    seq = plan and replay.sequential_summary(runs, plan, sweep_dir, cfg.ci_level,
                                             cfg.target_fraction)
    drift_info = tp.drift
    if tp.block_offsets is None:   # the one pass (if any) against the runs' own step times
        drift_info = sdrift.with_disagreements(drift_info, {
            g: f.r_q_in_run_test for g, f in fw["configs"].items()}, tp.offsets, cfg.ci_level)
    cstats = replay.with_sequential_verdicts(compose_configs(
        per_cfg.stats, per_cfg.boot, fw["configs"], sdrift.pass_ratios(drift_info, tp.offsets)),
        seq)
    return fw, cstats, drift_info, seq


def study_records(runs: list[Run], sweep_dir: str | None, primary: str) -> dict:
    """What the study's directory and configs record beside the runs: the lr tuning (the
    primary algorithm's and all of them, per batch, its cost) and the LoRA configs, as
    `Summary` fields."""
    dirs = sweep_dirs(sweep_dir)
    one_dir = dirs[0] if len(dirs) == 1 else None
    tuning = lr_bracket.read_lr_tuning(one_dir) if one_dir is not None else None
    extras = lr_bracket.read_tuning_extras(one_dir) if one_dir is not None else {}
    return dict(
        lr_tuning=(tuning.get(primary) or next(iter(tuning.values()))) if tuning else None,
        lr_tuning_by_algo=tuning or None, lora=lora_configs(sio.group_runs(runs)) or None,
        lr_tuning_per_batch=extras.get("per_batch") or None,
        lr_tuning_cost=extras.get("cost") or None)


def config_table(runs: list[Run], per_run: dict[str, RunStats], refs: dict, cfg: Settings,
                 rng: np.random.Generator) -> ConfigTable:
    """`configs.config_stats` of every config plus its step costs, clipping, rollout means,
    noise scales and (fit_sigmoid) the mean asymptote of its runs' ScaleRL curve fits."""
    groups = sio.group_runs(runs)
    # configs.py reads the runs as summary.json's dicts and {"N", "q"} replicates
    configs, creps, boot = config_stats(
        groups, {n: x.to_json() for n, x in per_run.items()},
        {n: {"N": x.N_star_boot, "q": x.q_boot} for n, x in per_run.items()}, refs, rng,
        cfg.ci_level)
    costs = {r.name: step_costs(r) for r in runs}
    for g, rs in groups.items():
        st, xs = configs[g], [per_run[r.name] for r in rs]
        st["responses_min"] = min(x.responses_total or 0.0 for x in xs)
        for k in ("collection_s_per_step", "train_s_per_step", "gen_throughput"):
            v = [costs[r.name][k] for r in rs if is_number(costs[r.name][k])]
            st[k] = float(np.mean(v)) if v else None
        cf = [x.clipped_update_fraction for x in xs if is_number(x.clipped_update_fraction)]
        st["clipped_update_fraction"] = float(np.mean(cf)) if cf else None
        st.update(rollout_means(rs))
        for who in ("actor", "critic"):
            ns = [snoise.noise_scale_from_run(r, who) for r in rs]
            bs = [z["b_simple"] for z in ns if z and is_number(z["b_simple"])]
            st[f"{who}_b_simple"] = float(np.mean(bs)) if bs else None
            st[f"{who}_b_simple_range"] = [min(bs), max(bs)] if bs else None
        if cfg.fit_sigmoid:
            a = [x.sigmoid["A"] for x in xs if x.sigmoid]
            st["sigmoid_A"] = float(np.mean(a)) if a else None
    return ConfigTable(configs, creps, boot, costs)


def throughput(runs: list[Run], blocks: dict[str, str], per_cfg: ConfigTable, refs: dict,
               sweep_dir: str | None, timing: Sequence[dict] | None, level: float,
               warnings: list[str]) -> Throughput:
    """r_q's source: each warm-start's own timing pass (every block timed), else the study's
    one pass (``timing`` or SWEEP_DIR/timing.json), else the runs' own step times; appends a
    warning when several studies are analysed together without per-warm-start passes."""
    dirs = sweep_dirs(sweep_dir)
    one_dir = dirs[0] if len(dirs) == 1 else None
    in_run_r_q = {g: b["r_q"].value for g, b in per_cfg.boot.items()}
    block_offsets = None
    if timing is None and blocks:   # one timing pass per warm-start, in its machine state
        block_offsets = {b: sdrift.interleaved_r_q(t, per_cfg.stats, refs, level,
                                                   same_entry=True)[1]
                         for b, t in block_timing(runs, blocks).items()}
        if not block_offsets or set(block_offsets) != set(blocks.values()):
            block_offsets = None
    if timing is None and one_dir is not None and block_offsets is None:
        timing = sdrift.read_timing(one_dir)
    elif timing is None and block_offsets is None and len(dirs) > 1:
        warnings.append(f"{len(dirs)} studies analysed together without a timing pass for "
                        "each warm-start: r_q from the runs' own step times")
    drift_info, offsets = sdrift.interleaved_r_q(timing, per_cfg.stats, refs, level,
                                                 in_run_r_q)
    if block_offsets is not None:
        drift_info = {**drift_info, "controlled": True,
                      "r_q_source": "each warm-start's timing pass",
                      "note": BLOCK_PASSES_NOTE.format(n=len(block_offsets))}
    return Throughput(drift_info, offsets, block_offsets)


def algo_summaries(runs: list[Run], refs: dict, per_run: dict[str, RunStats],
                   per_cfg: ConfigTable,
                   cstats: dict[str, ConfigStats], targets: Targets,
                   best_sets: dict[str, list[str]], how: tuple[Settings, np.random.Generator]
                   ) -> tuple[dict[str, AlgoSummary], dict[str, ConfigStats]]:
    """Per algorithm: its reference, target, noise, critical batches, grad-norm slopes,
    step-cost regime and fastest set; and every config's curve invariance against its
    reference (returned in the configs)."""
    cfg, rng = how
    groups = sio.group_runs(runs)
    per_algo, invariances = {}, {}
    for algo, (name, rs) in refs.items():
        # configs.py reads a single-run reference as summary.json's dict
        ref = cstats.get(name) or single_run_reference(per_run[name].to_json(), rs[0])
        xs = [per_run[z.name] for z in rs]
        ref_se = float(np.median([x.eval_se for x in xs]))
        jit = [x.curve_jitter_se for x in xs if is_number(x.curve_jitter_se)]
        start = float(np.mean([x.start_score for x in xs]))
        rule = targets.rules.get(algo) or {}
        climb_from = rule["start"] if "per_warm_start" in rule else start
        for g, grs in groups.items():
            if (grs[0].algo or "?") == algo and g != name:
                invariances[g] = invariance(grs, rs, per_run, rng, cfg.ci_level)
        t = targets.by_algo[algo]
        fields = {
            "reference_config": name, "reference_runs": [z.name for z in rs],
            "target": t, "target_rule": targets.rules.get(algo),
            "eval_se": ref_se, "eval_se_source": xs[0].eval_se_source,
            "curve_jitter_se": float(np.median(jit)) if jit else None,
            "start_score": climb_from,
            "signal_to_noise": (t - climb_from) / ref_se if ref_se > 0 else None,
            "reference_reached": bool(ref.reached),
            "reference_best_smoothed": max(x.smoothed_final or -math.inf for x in xs),
            "critical_training_batch": CriticalTrainingBatch(
                **critical_training_batch(cstats, ref, cfg.tolerance)),
            "grad_norm": grad_norm_slopes(runs, ref, cfg.n_boot, rng, cfg.ci_level,
                                          cfg.flat_slope),
            "best_set": best_sets.get(algo, []),
        }
        # Step costs differ by algorithm (PPO also runs a critic): one fit each.
        cgb = step_cost.fit_runs([r for r in runs if (r.algo or "?") == algo], per_cfg.costs,
                                 cfg.n_boot, rng, cfg.ci_level, cfg.min_gain, ref.batch)
        per_algo[algo] = AlgoSummary(**fields,
                                     critical_generation_batch=CriticalGenerationBatch(**cgb),
                                     regime=Regime(**step_cost.regime(rs, per_cfg.costs, cgb)))
    cstats = {g: dataclasses.replace(st, invariance=invariances[g]) if g in invariances
              else st for g, st in cstats.items()}
    return per_algo, cstats


def analyze_runs(runs: Sequence[Run], target: Any = "auto", reference: str | None = None,
                 **kwargs) -> dict:
    """summary.json's dict for already-loaded runs: `analyze(...).to_json()`."""
    return analyze(runs, target, reference, **kwargs).to_json()


def analyze_sweep(sweep_dir: str | None, target: Any = "auto", reference: str | None = None,
                  *, extra_runs: Sequence[Run] = (), **kwargs) -> dict:
    """summary.json dict of a sweep directory (plus ``extra_runs``, e.g. CSV imports).

    Keys (docs/api.md, summary.json): ci_level, eval_se, signal_to_noise,
    reference_config(s), configs {N_star(_ci), q(_ci), r_N(_ci), r_q(_ci), T_over_T0(_ci),
    verdict, ...}, best_set, critical_training_batch, critical_generation_batch, plus runs
    {name: {N_star, q, r_N, r_q, T_over_T0, reached, ...}}, grad-norm slopes, partial_rollout
    [{config, sync_config, gen_batch_ratio, q_ratio(_ci), r_N(_ci), T_ratio(_ci), verdict,
    ...}] (empty without k > 1 configs), skipped dirs and warnings. Raises AnalysisError naming
    the problem.
    """
    target = parse_target(target)
    runs, skipped = load_runs(sweep_dir, extra_runs)
    return analyze(runs, target, reference, skipped=skipped, sweep_dir=sweep_dir,
                   **kwargs).to_json()


def load_runs(sweep_dir: str | None, extra_runs: Sequence[Run] = ()
              ) -> tuple[list[Run], list[dict]]:
    """(runs, skipped directories) of a sweep directory (or several, `sweep_dirs`) plus
    ``extra_runs``; AnalysisError naming the problem when there is no run."""
    runs, skipped = [], []
    for d in sweep_dirs(sweep_dir):
        try:
            sweep = sio.read_sweep(d)
        except FileNotFoundError as e:
            raise AnalysisError(str(e)) from None
        runs, skipped = runs + sweep.runs, skipped + sweep.skipped
    runs = runs + list(extra_runs)
    if not runs:
        detail = "; ".join(f"{s['dir']}: {s['reason']}" for s in skipped) or "it is empty"
        raise AnalysisError(f"no runs in {sweep_dir!r} (a run is a subdirectory with "
                            f"{sio.METRICS_FILE}); {detail}")
    return runs, skipped
