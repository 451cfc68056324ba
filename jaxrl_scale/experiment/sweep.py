"""Batch-scaling study: an lr-tuning stage at the reference batch, then a grid of runs with
seeds, resumable, then the time-to-target analysis with intervals and the report.

The study's design (SweepConfig, its runs and their names) is experiment/study.py; this module
runs it. The lr-tuning stage records every lr at every tune seed in lr_tune.json
(scaling.lr_bracket tells the choice from noise). Running the study again skips runs that
finished (DONE.json) and resumes partial ones from their checkpoints, so a killed study loses
at most the steps since a run's last checkpoint, never a finished run.

Scale-out: executor="ray" runs each run as a Ray task (same directories, same skipping, the
same analysis after the last one); `run_one` runs one run of `study.all_runs` alone, for a job
array whose tasks each take an index. A study run needs the tuned lr, so its index is refused
until every tuning run has finished.
"""
from __future__ import annotations

import dataclasses
import os
import time
import traceback
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from jaxrl_scale import interrupt
from jaxrl_scale import sharding as shd
from jaxrl_scale.experiment.checks import check_mesh
from jaxrl_scale.experiment.common import write_json
from jaxrl_scale.experiment.config import ConfigError, TrainConfig, check_resume, validate
from jaxrl_scale.experiment.errors import one_line
from jaxrl_scale.experiment.rundir import is_finished, write_error
from jaxrl_scale.experiment.study import (SweepConfig, all_runs, check_sweep_fields,
                                          is_reference_run, plan, reference_batch,
                                          sequential_plan, tune_batches, tune_plan,
                                          tune_run)
from jaxrl_scale.experiment.timing import write_timing_pass, write_warm_start_timing_pass
from jaxrl_scale.experiment.train import run_training
from jaxrl_scale.numbers import is_number


TUNE_FILE = "lr_tune.json"
EVAL0_DIR = "_eval0"            # step-0 evals shared by runs that start alike (eval_cache.py)
COMPILE_CACHE = "~/.cache/jaxrl_scale/jax_cache"


def extend_tuning(sweep: SweepConfig, base: TrainConfig, tune: list[TrainConfig]
                  ) -> list[TrainConfig]:
    """Tuning runs to add, every tune seed of each: per algo whose best mean lr is at an edge
    of its scored grid, or whose flat set reaches one, the edge times / divided by
    tune_factor (scaling.lr_bracket.extension); [] when all bracketed."""
    from jaxrl_scale.scaling import lr_bracket
    have = {c.run_dir for c in tune}
    out = []
    for algo in sweep.algos:
        for B in tune_batches(sweep, algo):
            for lr in lr_bracket.extension(_tune_scores(tune, algo, B), sweep.tune_factor):
                more = [tune_run(sweep, base, algo, lr, B, seed) for seed in sweep.tune_seeds]
                out += [c for c in more if c.run_dir not in have]
    return out


def _tune_scores(tune_runs: list[TrainConfig], algo: str, B: int
                 ) -> dict[float, dict[int, float | None]]:
    """{lr: {seed: tune_score}} of the tuning runs of `algo` at batch B."""
    out: dict[float, dict[int, float | None]] = {}
    for c in tune_runs:
        if c.algo == algo and c.batch_train == B:
            out.setdefault(c.optim.base_lr, {})[c.seed] = tune_score(c.run_dir)
    return out


def tune_score(run_dir: str) -> float | None:
    """Mean of the monotone-smoothed eval curve over the run (area under it per response):
    the sample efficiency the tuned lr should maximise at the reference batch."""
    from jaxrl_scale.scaling import io as sio, stats
    run = sio.read_run(run_dir)
    n, s = run.eval_curve()
    if n.size < 2 or n[-1] <= n[0]:
        return None
    fit = stats.isotonic(s)
    area = np.sum(0.5 * (fit[1:] + fit[:-1]) * np.diff(n))   # trapezoid rule
    return float(area / (n[-1] - n[0]))


def choose_lrs(sweep: SweepConfig, tune_runs: list[TrainConfig], extensions: int = 0
               ) -> dict[str, Any]:
    """{algo: {"lr", "scores": {lr: mean score}, "per_seed": {lr: {seed: score}},
    "lr_tuning": record}} from finished tuning runs: "lr" is the record's "chosen"
    (scaling.lr_bracket.lr_tuning: the best mean with one seed per lr, else the rule's lr of
    the flat set)."""
    from jaxrl_scale.scaling import lr_bracket
    out = {}
    for algo in sweep.algos:
        per_seed = _tune_scores(tune_runs, algo, reference_batch(sweep, algo))
        t = lr_bracket.lr_tuning(per_seed, extensions)
        if t["chosen"] is not None:
            out[algo] = {"lr": t["chosen"], "scores": dict(zip(t["grid"], t["scores"])),
                         "per_seed": per_seed,
                         "criterion": "mean of the monotone-smoothed eval curve",
                         "lr_tuning": t}
    return out


def choose_batch_lrs(sweep: SweepConfig, tune_runs: list[TrainConfig], extensions: int = 0
                     ) -> dict[str, dict[int, dict]]:
    """retune_lr_per_batch: {algo: {B: lr_tuning record}} from the tuning runs at every
    batch (the reference's too); {} without the option."""
    from jaxrl_scale.scaling import lr_bracket
    if not sweep.retune_lr_per_batch:
        return {}
    out: dict[str, dict[int, dict]] = {}
    for algo in sweep.algos:
        for B in tune_batches(sweep, algo):
            t = lr_bracket.lr_tuning(_tune_scores(tune_runs, algo, B), extensions)
            if t["chosen"] is not None:
                out.setdefault(algo, {})[B] = t
    return out


def tuning_cost(sweep: SweepConfig, tune_runs: list[TrainConfig]) -> dict[str, dict[int, dict]]:
    """{algo: {B: {"runs", "responses", "wall_s"}}} of the finished tuning runs: what tuning
    at each batch cost (wall seconds = training time_s + every eval's eval_s, as logged)."""
    from jaxrl_scale.scaling import io as sio
    out: dict[str, dict[int, dict]] = {}
    for c in tune_runs:
        try:
            recs = sio.read_jsonl(os.path.join(c.run_dir, "metrics.jsonl"))[0]
        except (OSError, ValueError):
            continue
        n = max((r["responses"] for r in recs if is_number(r.get("responses"))), default=0)
        t = max((r["time_s"] for r in recs if is_number(r.get("time_s"))), default=0.0)
        t += sum(r["eval_s"] for r in recs if is_number(r.get("eval_s")))
        row = out.setdefault(c.algo, {}).setdefault(c.batch_train, {"runs": 0, "responses": 0,
                                                                     "wall_s": 0.0})
        row["runs"] += 1
        row["responses"] += int(n)
        row["wall_s"] += float(t)
    return out


def enable_compile_cache(path: str = COMPILE_CACHE) -> str:
    """JAX persistent compilation cache: runs that share shapes (seeds, the same batch) load
    their compiled update and sampler instead of compiling again."""
    import jax
    path = os.path.expanduser(path)
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    return path


def _run_one(cfg: TrainConfig, progress: bool, eval0_cache: str | None) -> str | None:
    """Train (or finish) one run. None, or its error as one line (traceback: ERROR.txt)."""
    try:
        run_training(cfg, progress=progress, eval0_cache=eval0_cache)
    except Exception as e:  # keep going: one broken run must not cost the others
        write_error(cfg.run_dir, traceback.format_exc())
        return one_line(e)
    return None


def _ray_task(cfg: TrainConfig, compile_cache: bool, verbosity: int, cwd: str,
              eval0_cache: str | None = None) -> tuple[str | None, float]:
    """One run inside a Ray worker: the driver's directory (relative run dirs), log level and
    compilation cache first."""
    from absl import logging
    if os.path.isdir(cwd):
        os.chdir(cwd)
    logging.set_verbosity(verbosity)
    if compile_cache:
        enable_compile_cache()
    t0 = time.time()
    return _run_one(cfg, False, eval0_cache), time.time() - t0


def _run_all(cfgs: list[TrainConfig], desc: str, progress: bool,
             eval0_cache: str | None = None, sweep: SweepConfig | None = None
             ) -> tuple[dict, dict]:
    """Every unfinished run of `cfgs`; ({name: error}, {name: wall s}). sweep.executor "ray":
    one Ray task each, gathered as they finish, so a failed task costs only its own run."""
    if sweep is not None and sweep.executor == "ray":
        todo = [c for c in cfgs if not is_finished(c.run_dir)]
        return _run_all_ray(todo, desc, progress, sweep, eval0_cache) if todo else ({}, {})
    errors, timings = {}, {}
    bar = tqdm(cfgs, desc=desc, unit="run", disable=not progress)
    for cfg in bar:
        name = os.path.basename(cfg.run_dir)
        bar.set_postfix(run=name)
        if is_finished(cfg.run_dir):
            continue
        if interrupt.requested():   # Ctrl-C after a run ended: the next one does not start
            raise interrupt.Interrupted(f"sweep stopped before run {name}; every finished run "
                                        "is kept")
        t0 = time.time()
        err = _run_one(cfg, progress, eval0_cache)
        if err is not None:
            errors[name] = err
        timings[name] = time.time() - t0
    bar.close()
    return errors, timings


def _run_block(cfgs: list[TrainConfig], desc: str, progress: bool, eval0_cache: str | None,
               sweep: SweepConfig) -> tuple[dict, dict]:
    """`_run_all` over one warm-start's runs. With sweep.target_stop_evals, its reference runs
    go first (to the full budget); every other run then stops target_stop_evals evals after
    reaching the target `block_targets` reads from them, the one the analysis will set."""
    if not sweep.target_stop_evals:
        return _run_all(cfgs, desc, progress, eval0_cache, sweep)
    refs = [c for c in cfgs if is_reference_run(sweep, c)]
    errors, timings = _run_all(refs, f"{desc} (reference)", progress, eval0_cache, sweep)
    targets = block_targets(sweep, [c for c in refs if is_finished(c.run_dir)])
    rest = [c.replace(target=targets[c.algo], target_evals=sweep.target_stop_evals)
            if c.algo in targets else c for c in cfgs if c not in refs]
    e2, t2 = _run_all(rest, desc, progress, eval0_cache, sweep)
    return {**errors, **e2}, {**timings, **t2}


def block_targets(sweep: SweepConfig, refs: list[TrainConfig]) -> dict[str, float]:
    """{algo: target} for the non-reference runs of one warm-start: sweep.target when it is a
    number, else the analysis' auto target (`scaling.analysis.auto_target`) of these finished
    reference runs; an algo without finished reference runs has none (its runs then go to
    the full budget)."""
    from jaxrl_scale.scaling import analysis, io as sio, run_stats
    target = analysis.parse_target(sweep.target)
    out = {}
    for algo in sorted({c.algo for c in refs}):
        if isinstance(target, float):
            out[algo] = target
            continue
        probe = [run_stats.run_stats(sio.read_run(c.run_dir), float("inf"), 1,
                                     np.random.default_rng(0), 0.9)
                 for c in refs if c.algo == algo]
        out[algo] = analysis.auto_target(probe, sweep.target_fraction)[0]
    return out


def _run_all_ray(todo: list[TrainConfig], desc: str, progress: bool, sweep: SweepConfig,
                 eval0_cache: str | None = None) -> tuple[dict, dict]:
    """Runs that start alike share the step-0 eval as in the sequential sweep (tasks started
    together may each compute it; the cache file is written atomically per process)."""
    import ray
    from absl import logging
    if not ray.is_initialized():   # a caller's ray.init (e.g. num_cpus) is kept
        ray.init(address=sweep.ray_address or None, log_to_driver=progress)
    task = ray.remote(num_cpus=sweep.ray_cpus_per_run, max_retries=0)(_ray_task)
    args = (sweep.compile_cache, logging.get_verbosity(), os.getcwd(), eval0_cache)
    pending = {task.remote(c, *args): c for c in todo}
    errors, timings = {}, {}
    bar = tqdm(total=len(pending), desc=f"{desc} (ray)", unit="run", disable=not progress)
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
        if interrupt.requested():   # Ctrl-C: the runs under way are cancelled, resumable
            for ref in pending:
                ray.cancel(ref)
            raise interrupt.Interrupted(f"sweep stopped; {len(pending)} Ray runs cancelled "
                                        "(each resumes from its last checkpoint)")
        if not done:
            continue
        cfg = pending.pop(done[0])
        name = os.path.basename(cfg.run_dir)
        try:
            err, timings[name] = ray.get(done[0])
        except Exception as e:  # the worker died (OOM, node lost): only this run is lost
            write_error(cfg.run_dir, str(e))
            err = one_line(e)
        if err is not None:
            errors[name] = err
            if progress:   # as it happens; the summary lists it again
                tqdm.write(f"run {name} failed: {err}")
        bar.update(1)
    bar.close()
    return errors, timings


def validate_sweep(sweep: SweepConfig, base: TrainConfig,
                   resume_base: TrainConfig | None = None,
                   resume_sweep: SweepConfig | None = None) -> None:
    """Every configuration error of the study (its own fields, every run's config, the mesh,
    and run directories left by another configuration), before the first run starts: a
    ConfigError naming the field. `resume_base`: the base the runs will really get (e.g. with
    the warm-start path that is only trained later) and `resume_sweep` the study they will
    really run (e.g. with the warm-start checkpoints trained later), for that check."""
    check_sweep_fields(sweep)
    runs, tune = plan(sweep, base), tune_plan(sweep, base)
    for algo in sweep.algos:
        B0 = reference_batch(sweep, algo)
        grid = sorted({c.batch_train for c in runs if c.algo == algo})
        if B0 not in grid:
            raise ConfigError("base_prompts", f"the {algo} reference batch {B0} (base_prompts x "
                              f"base_group) is not among the study's batches {grid}",
                              "set --base_prompts to one of --prompts (0: the smallest)")
    mesh = check_mesh(base)
    for cfg in runs + tune:
        validate(cfg, data_parallel=shd.data_parallel_size(mesh))
    if resume_base is not None or resume_sweep is not None:
        final = (resume_sweep or sweep, resume_base or base)
        runs, tune = plan(*final), tune_plan(*final)
    for cfg in tune:
        check_resume(cfg)
    for cfg in runs:        # their base_lr is the tuned one, known after tuning
        check_resume(cfg, ignore=("base_lr",))


def _prepare(sweep: SweepConfig) -> str:
    """The compilation cache and the sweep directory; returns the shared step-0 eval dir (runs
    from one checkpoint share it)."""
    if sweep.compile_cache:
        enable_compile_cache()
    os.makedirs(sweep.sweep_dir, exist_ok=True)
    return os.path.join(sweep.sweep_dir, EVAL0_DIR)


def _tuned_plan(sweep: SweepConfig, base: TrainConfig, tune: list[TrainConfig],
                extensions: int = 0) -> tuple[dict[str, Any], list[TrainConfig]]:
    """The lr chosen from the finished tuning runs (recorded in lr_tune.json) and the study's
    runs with it (recorded in sweep.json)."""
    lrs = choose_lrs(sweep, tune, extensions)
    per_batch = choose_batch_lrs(sweep, tune, extensions)
    if tune:
        write_json(os.path.join(sweep.sweep_dir, TUNE_FILE), {
            "reference_batch": {a: reference_batch(sweep, a) for a in sweep.algos},
            "tuned": lrs, "runs": [c.run_dir for c in tune],
            "tuning_cost": tuning_cost(sweep, tune),
            **({"tuned_per_batch": per_batch} if per_batch else {})}, indent=2)
    base_lrs = {a: v["lr"] for a, v in lrs.items()}
    batch_lrs = {(a, B): t["chosen"] for a, d in per_batch.items() for B, t in d.items()
                 if t.get("chosen")}
    runs = plan(sweep, base, base_lrs, batch_lrs)
    from jaxrl_scale.scaling.analysis import SWEEP_FILE   # its reader: the target fraction
    write_json(os.path.join(sweep.sweep_dir, SWEEP_FILE), {
        "sweep": dataclasses.asdict(sweep), "base": base.to_json(), "base_lrs": base_lrs,
        "runs": [os.path.basename(c.run_dir) for c in runs]}, indent=2)
    return lrs, runs


def check_run_index(sweep: SweepConfig, base: TrainConfig, index: int) -> None:
    """ConfigError("run_index", ...) for an index outside all_runs, a run on Ray, or a study
    run whose tuned lr is not known yet (some lr-tuning run has not finished)."""
    runs, n_tune = all_runs(sweep, base), len(tune_plan(sweep, base))
    if not 0 <= index < len(runs):
        raise ConfigError("run_index", f"{index} is out of range: the study has {len(runs)} "
                          f"runs, 0..{len(runs) - 1}", "pick one of the indices --list_runs prints")
    if sweep.executor != "local":
        raise ConfigError("run_index", "runs one run in this process, not with --executor="
                          f"{sweep.executor}", "drop --executor (or --run_index)")
    left = [i for i, (_, c) in enumerate(runs[:n_tune]) if not is_finished(c.run_dir)]
    if index >= n_tune and left:
        raise ConfigError("run_index", f"run {index} ({runs[index][0]}) needs the tuned lr, but "
                          f"lr-tuning runs {left} have not finished", f"run --run_index=0..."
                          f"{n_tune - 1} first (SLURM: the study's array with "
                          f"--dependency=afterok:<tuning job id>)")


def run_one(sweep: SweepConfig, base: TrainConfig, index: int, *,
            progress: bool = True) -> dict[str, Any]:
    """Run (or finish) run `index` of `all_runs` alone: one task of a job array. No analysis
    (run the analysis once every index has finished). Returns {"run", "error"}; a finished
    run is skipped, as in run_sweep."""
    validate_sweep(sweep, base)
    check_run_index(sweep, base, index)
    eval0 = _prepare(sweep)
    tune = tune_plan(sweep, base)
    cfg = tune[index] if index < len(tune) else _tuned_plan(sweep, base, tune)[1][index - len(tune)]
    name = os.path.relpath(cfg.run_dir, sweep.sweep_dir)
    if is_finished(cfg.run_dir):
        return {"run": name, "error": None, "skipped": True}
    return {"run": name, "error": _run_one(cfg, progress, eval0), "skipped": False}


def run_sweep(sweep: SweepConfig, base: TrainConfig, *, progress: bool = True,
              analyse: bool = True, before_block=None) -> dict[str, Any]:
    """Tune (if asked), run (or finish) every run of the study, then analyse and report.
    Returns the summary dict, with "errors" (failed runs) and, when the analysis itself could
    not run, "analysis_error"; a reference that misses the target is reported, not an error.
    ``before_block(w)``: called before warm-start w's runs (the CLI trains its SFT there, so
    a sequential study that ends early never trains the warm-starts it does not use)."""
    tune = tune_plan(sweep, base)
    validate_sweep(sweep, base)
    eval0 = _prepare(sweep)
    t_start = time.time()
    errors, timings = _run_all(tune, "lr tuning", progress, eval0, sweep)
    n_ext = 0   # extend the lr grid until its best value is interior
    while n_ext < sweep.tune_max_extensions:
        more = extend_tuning(sweep, base, tune)
        if not more:
            break
        n_ext += 1
        e, t = _run_all(more, f"lr tuning (extension {n_ext})", progress, eval0, sweep)
        errors.update(e)
        timings.update(t)
        tune = tune + more
    lrs, runs = _tuned_plan(sweep, base, tune, n_ext)
    if sweep.warm_start_checkpoints:   # block by block, each timed in its learning's state
        e2, t2 = _run_warm_starts(sweep, runs, progress, eval0, before_block)
        errors.update(e2)
        timings.update(t2)
    else:
        e2, t2 = _run_block(runs, "sweep", progress, eval0, sweep)
        errors.update(e2)
        timings.update(t2)
        err = sweep.timing_steps > 0 and write_timing_pass(sweep, runs, progress)
        if err:
            errors["_timing"] = err
    write_json(os.path.join(sweep.sweep_dir, STATUS_FILE),
               {**sweep_status(errors, len(tune) + len(runs)), "errors": errors,
                "wall_s_this_call": timings,
                "total_wall_s_this_call": time.time() - t_start}, indent=2)
    if not analyse:
        return {"errors": errors}
    from jaxrl_scale.experiment.analyze import analyze_and_report
    from jaxrl_scale.scaling.analysis import AnalysisError
    from jaxrl_scale.scaling.io import DataError
    try:
        summary = analyze_and_report(sweep.sweep_dir, target=sweep.target,
                                     target_fraction=sweep.target_fraction,
                                     n_unit=sweep.n_unit)
    except (AnalysisError, DataError) as e:  # the runs are safe on disk; say why there is no report
        return {"errors": errors, "analysis_error": str(e)}
    if errors:
        mark_lost_runs(summary["report_path"], errors)
    summary["errors"] = errors
    summary["lr_tune"] = lrs
    return summary


STATUS_FILE = "sweep_status.json"
SEQUENTIAL_FILE = "sequential.json"


def _run_warm_starts(sweep: SweepConfig, runs: list[TrainConfig], progress: bool,
                     eval0: str | None, before_block=None) -> tuple[dict, dict]:
    """Warm-start by warm-start, each followed by its timing pass. A sequential design
    (`study.sequential_plan`) looks after the warm-start counts of its plan: the configs
    decided there (`scaling.replay.decisions` on the runs so far, as the analysis will
    decide) get no runs from later warm-starts, and the study ends when none is open; each
    look is recorded in SWEEP_DIR/sequential.json and said on stdout."""
    plan = sequential_plan(sweep)
    W = len(sweep.warm_start_checkpoints)
    errors: dict = {}
    timings: dict = {}
    open_ = None      # None: every config
    for w, path in enumerate(sweep.warm_start_checkpoints):
        if open_ is not None and not open_:
            break
        if before_block is not None:
            before_block(w)
        mine = [c for c in runs if c.init_checkpoint == path and (
            open_ is None or is_reference_run(sweep, c) or config_name(c) in open_)]
        e2, t2 = _run_block(mine, f"sweep, warm-start {w + 1}/{W}", progress, eval0, sweep)
        errors.update(e2)
        timings.update(t2)
        err = sweep.timing_steps > 0 and write_warm_start_timing_pass(sweep, mine, path,
                                                                      progress)
        if err:
            errors[f"_timing_w{w}"] = err
        if plan is not None and w + 1 in plan.looks and not errors:
            open_ = _look(sweep, plan, w + 1)
        if sweep.plan_first and w == 0 and W > 1 and not errors:
            open_ = _plan_first(sweep)
    return errors, timings


def _plan_first(sweep: SweepConfig) -> set[str] | None:
    """The configs the first warm-start's plan keeps (`plan_compare.block_plan`: its reference
    runs and timing pass), recorded in SWEEP_DIR/plan_first.json and said on stdout; None
    (every config) when it cannot plan, said why."""
    import json
    from jaxrl_scale.scaling import plan_compare
    from jaxrl_scale.scaling.analysis import load_runs
    runs, _ = load_runs(sweep.sweep_dir)
    try:
        with open(os.path.join(sweep.sweep_dir, "timing.json")) as f:
            timing = json.load(f)
    except (OSError, ValueError):
        timing = None
    plan, why = plan_compare.block_plan(runs, timing, sweep.target_fraction)
    if plan is None:
        print(f"plan_first: no plan ({why}); every config runs from every warm-start",
              flush=True)
        return None
    keep_b = set(plan["recommended"]["batches"])
    # a scheduled config (no one batch, scaling.io.scheduled) is no candidate of the plan
    keep = {r.group for r in runs if r.batch in keep_b or r.batch_source == "schedule"}
    dropped = sorted({r.group for r in runs} - keep)
    plan["plan_first"] = {"kept": sorted(keep), "dropped": dropped}
    write_json(os.path.join(sweep.sweep_dir, PLAN_FIRST_FILE), plan, indent=1)
    print(f"plan_first after warm-start 1: recommended B = {plan['recommended']['batch']:g}; "
          f"no more runs of {', '.join(dropped) or 'none'}", flush=True)
    return keep


PLAN_FIRST_FILE = "plan_first.json"


def config_name(c: TrainConfig) -> str:
    """The config a run belongs to: its directory name without the seed."""
    from jaxrl_scale.scaling.io import strip_seed
    return strip_seed(os.path.basename(c.run_dir))


def _look(sweep: SweepConfig, plan, blocks: int) -> set[str]:
    """The sequential decisions on the runs of the first ``blocks`` warm-starts, recorded in
    SWEEP_DIR/sequential.json and printed; returns the configs still open."""
    from jaxrl_scale.scaling import sequential as sq
    from jaxrl_scale.scaling.analysis import load_runs
    from jaxrl_scale.scaling.replay import decisions
    runs, _ = load_runs(sweep.sweep_dir)
    dec, ran, _ = decisions(runs, plan, sweep_dir=sweep.sweep_dir,
                            target_fraction=sweep.target_fraction)
    open_ = set(sq.open_configs(dec, sorted(dec)))
    k = plan.looks.index(blocks) + 1
    write_json(os.path.join(sweep.sweep_dir, SEQUENTIAL_FILE), {
        "looks_done": list(plan.looks[:k]), "open": sorted(open_),
        "decisions": {g: dataclasses.asdict(d) for g, d in dec.items()}, "runs": ran},
        indent=2)
    said = ", ".join(f"{g} {d.verdict}" for g, d in sorted(dec.items()) if d.stopped)
    rest = "undecided" if k == len(plan.looks) else "open"
    print(f"look {k}/{len(plan.looks)} after {blocks} warm-starts: "
          f"{said or 'nothing decided'}; {rest}: {', '.join(sorted(open_)) or 'none'}",
          flush=True)
    return open_


EXIT_RUNS_FAILED = 3   # the sweep ran but lost runs: its analysis is incomplete


def exit_status(summary: dict) -> tuple[int, str | None]:
    """(exit status, last stderr line) of a sweep command after `run_sweep`: EXIT_RUNS_FAILED
    when any run (or the timing pass) failed, whatever the analysis made of the rest; 1 when
    only the analysis failed; else 0."""
    errors = summary.get("errors") or {}
    if errors:
        return EXIT_RUNS_FAILED, (
            f"error: sweep: {len(errors)} run(s) failed ({', '.join(sorted(errors))}); the "
            f"analysis is incomplete. Fix: see {STATUS_FILE} and each run's ERROR.txt, then "
            "rerun the same command (finished runs are skipped).")
    return (1 if "analysis_error" in summary else 0), None


def sweep_status(errors: dict[str, str], n_runs: int) -> dict[str, Any]:
    """sweep_status.json's verdict on this call: "complete", or "runs_failed" with the lost
    runs named (a run that raised, e.g. on a corrupt line of its metrics.jsonl, has no
    DONE.json, so the analysis sees at most its partial curve)."""
    lost = sorted(k for k in errors if not k.startswith("_"))
    return {"status": "runs_failed" if errors else "complete", "runs": n_runs,
            "failed_runs": lost, "failed_steps": sorted(k for k in errors if k.startswith("_"))}


def lost_runs_line(errors: dict[str, str]) -> str:
    """The report's first line when runs failed: how many, which, and where the reasons are."""
    names = sorted(errors)
    return (f"**Incomplete sweep: {len(names)} run(s) or step(s) failed** ({', '.join(names)}): "
            f"the analysis below is missing them or their later evals. Reasons in "
            f"{STATUS_FILE} and each run's ERROR.txt; rerun the sweep to retry them.")


def mark_lost_runs(report_path: str, errors: dict[str, str]) -> None:
    """Put `lost_runs_line` first in report.md (rewritten atomically)."""
    with open(report_path) as f:
        text = f.read()
    with open(report_path + ".tmp", "w") as f:
        f.write(lost_runs_line(errors) + "\n\n" + text)
    os.replace(report_path + ".tmp", report_path)
