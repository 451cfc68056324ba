"""A short timing pass over candidate batches: the inputs of the step-cost model
(docs/science.md, Step-cost model).

The source picks the batch by maximising q / r_N within memory limits (docs/science.md,
Critical batches); q needs the rollout and update seconds per step at each candidate B, which
only the real loop gives (sampler, engine, rewards, packing and the jitted update all
included). Nothing is learned here: a few `Run.train_step` calls per batch, no eval, no
checkpoints, nothing written to a run directory. `scaling.step_cost.fit_step_times` fits the
result and `predict_r_q` turns it into r_q at any batch.

Scheduling (why interleaved): a shared machine's speed drifts over minutes. Timing batch 64
for a minute and then batch 512 for a minute would compare two machine states; instead every
Run is built and compiled first, then each round runs one step of every batch, in an order
drawn at random per round (`seed`), so each batch sees the same minutes and no batch always
follows the same neighbour (caches, allocator state). `time_blocks` repeats that in blocks,
each building every Run afresh, until r_q's between-block interval is narrow enough
(scaling.drift says why rounds alone understate the spread between passes). The price is memory:
all candidates' parameters, optimizer states and caches live at once, which at this scale
(CPU presets) is small; `interleave=False` times one batch at a time and releases each before
building the next, for models where only one fits.

`timing_pass` is the sweep's pass over its batches (SweepConfig.timing_steps), written to
SWEEP_DIR/timing.json by `write_timing_pass`; the analysis takes r_q from it.
"""
from __future__ import annotations

import gc
import json
import os
import tempfile
import time
import traceback
from typing import Sequence

import numpy as np
from tqdm.auto import tqdm

from jaxrl_scale.experiment.common import write_json
from jaxrl_scale.experiment.config import TrainConfig
from jaxrl_scale.experiment.errors import one_line
from jaxrl_scale.experiment.rundir import write_error
from jaxrl_scale.experiment.schedule import reachable_prompts
from jaxrl_scale.experiment.study import SweepConfig, reference_batch
from jaxrl_scale.experiment.train import Run

# What each timed step records, from `Run.train_step` (train.py defines them):
#   gen_s    rollout: generation (or the engine's next batch) + rewards
#   train_s  batch packing + (reference scores) + update, transfers included
#   decode_s the jitted decode alone (part of gen_s); update_s the update alone (part of train_s)
#   reward_s the reward function's wall time (part of gen_s)
#   response_len  mean response tokens of the step (what the rollout's length depends on)
#   env_s    multi-turn runs only (--env): the environment's wall time (part of gen_s);
#            recorded only where the step records have it, so single-turn passes are as before
STEP_FIELDS = ("gen_s", "train_s", "decode_s", "update_s", "reward_s", "response_len")
OPTIONAL_FIELDS = ("env_s",)


def timing_config(base: TrainConfig, batch: int, run_dir: str) -> TrainConfig:
    """`base` at B = batch responses per update (P = B // G, G kept), writing nothing.

    filter_zero_variance and refill are turned off: a random policy's groups all have one
    reward, and filtering them would skip the update the pass is there to time (and refill
    would run every step to its cap). The pass so times one round per update: a refilled
    run's extra rounds are in its own (in-run) throughput only.
    """
    G = base.group_size
    if batch < G or batch % G:
        raise ValueError(f"time_batches: batch {batch} is not a positive multiple of "
                         f"group_size={G} (B = P * G responses per update)")
    return base.replace(prompts_per_step=batch // G, run_dir=run_dir, filter_zero_variance=False,
                        refill=False, refill_cap=0, tensorboard=False, wandb_project="",
                        batch_schedule="none", batch_ramp="")   # one fixed batch per entry


def _entry(cfg: TrainConfig, compile_s: float) -> dict:
    return {"batch": cfg.batch_train, "batch_gen": cfg.batch_gen,
            "gen_batch_ratio": cfg.gen_batch_ratio, "prompts_per_step": cfg.prompts_per_step,
            "group_size": cfg.group_size, "compile_s": compile_s,
            **{k: [] for k in STEP_FIELDS}, "step_s": []}


def _step(run: Run, update, loop, entry: dict | None):
    """One timed `Run.train_step`; returns the loop state after it."""
    t0 = time.perf_counter()
    loop, rec = run.train_step(loop, update)
    if entry is not None:
        entry["step_s"].append(time.perf_counter() - t0)
        for k in STEP_FIELDS:
            entry[k].append(float(rec.get(k, float("nan"))))
        for k in OPTIONAL_FIELDS:
            if k in rec:
                entry.setdefault(k, []).append(float(rec[k]))
    return loop


def time_batches(base: TrainConfig, batches: Sequence[int], warmup: int = 2, steps: int = 3,
                 progress: bool = True, interleave: bool = True, seed: int = 0) -> list[dict]:
    """Per-step rollout and update seconds of the real loop at each batch in `batches`.

    For each B: `Run(base at P = B // G)`, `compile()`, `warmup` untimed steps (first-call
    work the AOT compile does not cover: host caches, weight preparation, allocator growth),
    then `steps` timed steps. Interleaved rounds by default (module docstring).
    gen_batch_ratio > 1 works as in training (B_gen = k * B sequences in flight, the slot
    engine); per-update rollout times then alternate long/short, so use warmup and steps that
    are multiples of k.

    Returns, in the order of `batches`: {"batch": B, "batch_gen": B_gen, "gen_s": [steps],
    "train_s": [steps], "compile_s": s, plus "decode_s", "update_s", "step_s" (whole
    train_step) lists, "gen_batch_ratio", "prompts_per_step", "group_size"}.
    """
    if warmup < 0 or steps < 1:
        raise ValueError(f"time_batches: warmup={warmup} must be >= 0 and steps={steps} >= 1")
    batches = [int(b) for b in batches]
    if len(set(batches)) != len(batches):
        raise ValueError(f"time_batches: batches {batches} repeat a value")
    with tempfile.TemporaryDirectory(prefix="time_batches_") as tmp:
        cfgs = [timing_config(base, b, os.path.join(tmp, f"B{b}")) for b in batches]
        return time_configs(cfgs, warmup, steps, progress, interleave, seed)


def time_blocks(base: TrainConfig, batches: Sequence[int], reference_batch: int, *,
                warmup: int = 2, steps: int = 8, min_blocks: int = 4, max_blocks: int = 8,
                tolerance: float = 0.07, level: float = 0.9, progress: bool = True
                ) -> dict:
    """`time_batches` in blocks (each a fresh build of every Run, its own random order of
    rounds) until r_q's between-block interval is narrow enough. Stopping rule: after
    `min_blocks` blocks, stop as soon as every batch's `level` interval of log r_q against
    `reference_batch` has half-width <= `tolerance` (scaling.drift.half_widths), else at
    `max_blocks`. Returns {"entries": per batch, every step list with a "block" list beside
    it, and the 1-minute load average after each block ("load_1min") beside "cpus"; "blocks",
    "stopping": {rule, half_widths after each block, stopped}}."""
    from jaxrl_scale.scaling.drift import half_widths
    if not 1 <= min_blocks <= max_blocks:   # one block: a pass per warm-start, the spread
        raise ValueError(f"time_blocks: need 1 <= min_blocks={min_blocks} <= "  # between passes
                         f"max_blocks={max_blocks}")
    entries: list[dict] = []
    history = []
    stopped = "max_blocks"
    for b in range(max_blocks):
        out = time_batches(base, batches, warmup, steps, progress, True, seed=b)
        if not entries:
            entries = [{**e, "block": [b] * len(e["step_s"]), "compile_s": [e["compile_s"]]}
                       for e in out]
        else:
            for e, o in zip(entries, out):
                for k in (*STEP_FIELDS, "step_s", *(f for f in OPTIONAL_FIELDS if f in o)):
                    e[k] = e.get(k, []) + o[k]
                e["block"] += [b] * len(o["step_s"])
                e["compile_s"].append(o["compile_s"])
        load = os.getloadavg()[0]   # the machine's load over the block's last minute
        for e in entries:
            e["load_1min"] = e.get("load_1min", []) + [load]
            e["cpus"] = os.cpu_count()
        hw = half_widths(entries, reference_batch, level)
        history.append({str(k): v for k, v in hw.items()})
        if b + 1 >= min_blocks and all(v <= tolerance for v in hw.values()):
            stopped = "tolerance"
            break
    return {"entries": entries, "blocks": len(history),
            "stopping": {"rule": f"blocks of {steps} rounds (fresh build each, random order); "
                                 f"after {min_blocks} blocks stop when every batch's "
                                 f"{level:.0%} interval of log r_q has half-width <= "
                                 f"{tolerance:g}, else at {max_blocks} blocks",
                         "half_widths": history, "stopped": stopped}}


def time_configs(cfgs: Sequence[TrainConfig], warmup: int = 2, steps: int = 3,
                 progress: bool = True, interleave: bool = True, seed: int = 0) -> list[dict]:
    """`time_batches` over any configs (e.g. two tasks at one batch), in the order given: the
    same entries, the same interleaved rounds. Give throwaway run_dirs (time_batches uses a
    temporary directory). Configs that differ in more than the batch are compared at the same
    minutes of the machine, which is the point of interleaving."""
    if warmup < 0 or steps < 1:
        raise ValueError(f"time_configs: warmup={warmup} must be >= 0 and steps={steps} >= 1")
    bar = tqdm(total=len(cfgs) * (warmup + steps), disable=not progress, desc="time_batches",
               unit="step", leave=False)
    if interleave:
        entries, runs = [], []
        for cfg in cfgs:
            run = Run(cfg)
            update, compile_s = run.compile()
            entries.append(_entry(cfg, compile_s))
            runs.append([run, update, run.initial_state()])
        rng = np.random.default_rng(seed)
        for r in range(warmup + steps):
            for i in rng.permutation(len(runs)):
                run, update, loop = runs[i]
                runs[i][2] = _step(run, update, loop, entries[i] if r >= warmup else None)
                bar.update()
        del runs
    else:
        entries = []
        for cfg in cfgs:
            run = Run(cfg)
            update, compile_s = run.compile()
            entry, loop = _entry(cfg, compile_s), run.initial_state()
            for r in range(warmup + steps):
                loop = _step(run, update, loop, entry if r >= warmup else None)
                bar.update()
            entries.append(entry)
            del run, loop
            gc.collect()
    bar.close()
    return entries


def timing_pass(sweep: SweepConfig, runs: list[TrainConfig], progress: bool = True) -> dict:
    """The sweep's interleaved timing pass (`time_blocks`) over every synchronous
    batch of each algorithm: timing.json's content {"entries", "interleaved", "steps",
    "algos": {algo: {"blocks", "stopping"}}}. Every batch is stepped once per round on the same
    machine state, in blocks, so r_q from it is not moved by a slow spell of the machine and
    its interval covers the spread between passes (scaling.drift)."""
    entries, meta = [], {}
    for algo in sweep.algos:
        cfgs = [c for c in runs if c.algo == algo and c.gen_batch_ratio == 1]
        if not cfgs:
            continue
        G = 1 if algo == "ppo" else (sweep.base_group or min(sweep.group_sizes))
        ref = min(cfgs, key=lambda c: (c.group_size != G, c.batch_train))
        # every batch a scheduled run may visit too: the analysis times it along its
        # trajectory from these entries (scaling/schedule_plan.py)
        batches = sorted({p * c.group_size for c in cfgs for p in reachable_prompts(c)
                          if p * c.group_size % G == 0})
        out = time_blocks(ref.replace(group_size=G), batches, reference_batch(sweep, algo),
                          warmup=2, steps=sweep.timing_steps, min_blocks=sweep.timing_blocks,
                          max_blocks=sweep.timing_max_blocks,
                          tolerance=sweep.timing_tolerance, progress=progress)
        entries += [{**e, "algo": algo} for e in out["entries"]]
        meta[algo] = {"blocks": out["blocks"], "stopping": out["stopping"]}
    return {"entries": entries, "interleaved": True, "steps": sweep.timing_steps,
            "algos": meta}


def write_warm_start_timing_pass(sweep: SweepConfig, runs: list[TrainConfig], warm_start: str,
                                 progress: bool = True) -> str | None:
    """The timing pass of one warm-start's runs, right after them (so in the machine state of
    its learning), its entries tagged ``warm_start`` and added to SWEEP_DIR/timing.json (a
    warm-start already there is kept: a resumed study does not time it again). None, or the
    error as one line."""
    from jaxrl_scale.scaling.drift import TIMING_FILE
    path = os.path.join(sweep.sweep_dir, TIMING_FILE)
    have = {"entries": [], "interleaved": True, "steps": sweep.timing_steps, "warm_starts": {}}
    if os.path.isfile(path):
        with open(path) as f:
            have = json.load(f)
    if warm_start in have.get("warm_starts", {}):
        return None
    try:
        out = timing_pass(sweep, runs, progress)
    except Exception as e:  # the study's runs stand; the analysis falls back to in-run q
        write_error(os.path.join(sweep.sweep_dir, "_timing"), traceback.format_exc())
        return one_line(e)
    have["entries"] += [{**e, "warm_start": warm_start} for e in out["entries"]]
    have.setdefault("warm_starts", {})[warm_start] = out["algos"]
    write_json(path, have, indent=2)
    return None


def write_timing_pass(sweep: SweepConfig, runs: list[TrainConfig], progress: bool = True
                      ) -> str | None:
    """`timing_pass` written to SWEEP_DIR/timing.json (kept when it exists). None, or the
    error as one line (the study's runs stand; the analysis falls back to in-run q)."""
    from jaxrl_scale.scaling.drift import TIMING_FILE
    path = os.path.join(sweep.sweep_dir, TIMING_FILE)
    if os.path.isfile(path):
        return None
    try:
        write_json(path, timing_pass(sweep, runs, progress), indent=2)
    except Exception as e:  # the study's runs stand; the analysis falls back to in-run q
        write_error(os.path.join(sweep.sweep_dir, "_timing"), traceback.format_exc())
        return one_line(e)
    return None
