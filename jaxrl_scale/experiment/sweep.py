"""Batch-scaling sweep: a grid of runs, resumable, then the time-to-target analysis + report.

Each run lives in SWEEP_DIR/<algo>_P<P>_G<G>_<rule>_s<seed>. Running the sweep again skips
runs that finished (DONE.json) and resumes partial ones from their checkpoints, so a killed
sweep loses at most the steps since a run's last checkpoint, never a finished run.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
import traceback
from typing import Any

from tqdm.auto import tqdm

from jaxrl_scale import sharding as shd
from jaxrl_scale.experiment.config import TrainConfig, validate
from jaxrl_scale.experiment.train import is_finished, run_training


@dataclasses.dataclass(frozen=True)
class SweepConfig:
    """The grid. Batch per update B = P * G; lr follows each rule relative to the reference
    batch base_prompts * base_group (the smallest grid point by default)."""

    sweep_dir: str = "runs/sweep"
    algos: tuple[str, ...] = ("grpo",)
    prompts: tuple[int, ...] = (4, 8, 16, 32, 64)
    group_sizes: tuple[int, ...] = (8,)
    lr_rules: tuple[str, ...] = ("sqrt", "fixed")
    seeds: tuple[int, ...] = (0,)
    base_prompts: int = 0              # 0: smallest P of the grid
    base_group: int = 0                # 0: smallest G of the grid
    max_responses: int = 8192          # response budget per run
    eval_every_responses: int = 512    # evals at (about) the same N for every batch
    target: float = 0.0                # 0: no early stop at a target
    target_margin: float = 0.25
    analysis_target: float = 0.0       # 0: use `target`; else analyse at this score

    def base_batch(self) -> int:
        P0 = self.base_prompts or min(self.prompts)
        G0 = self.base_group or min(self.group_sizes)
        return P0 * G0


def run_name(algo: str, P: int, G: int, rule: str, seed: int) -> str:
    return f"{algo}_P{P}_G{G}_{rule}_s{seed}"


def plan(sweep: SweepConfig, base: TrainConfig) -> list[TrainConfig]:
    """Every run of the grid as a TrainConfig. The fixed-lr run at the reference batch is the
    sqrt run (same lr), so it is run once. PPO uses G = 1 whatever the grid says."""
    B0 = sweep.base_batch()
    runs, seen = [], set()
    for algo in sweep.algos:
        groups = (1,) if algo == "ppo" else sweep.group_sizes
        for G in groups:
            for P in sweep.prompts:
                for rule in sweep.lr_rules:
                    for seed in sweep.seeds:
                        B = P * G
                        eff_rule = "sqrt" if (B == B0 and rule in ("fixed", "linear")) else rule
                        name = run_name(algo, P, G, eff_rule, seed)
                        if name in seen:
                            continue
                        seen.add(name)
                        runs.append(base.replace(
                            run_dir=os.path.join(sweep.sweep_dir, name), algo=algo,
                            prompts_per_step=P, group_size=G, lr_rule=eff_rule, seed=seed,
                            base_batch=B0, max_responses=sweep.max_responses,
                            max_steps=10 ** 9,
                            eval_every=max(1, sweep.eval_every_responses // B),
                            checkpoint_every=max(1, 4 * sweep.eval_every_responses // B),
                            target=sweep.target, target_margin=sweep.target_margin))
    return runs


def run_sweep(sweep: SweepConfig, base: TrainConfig, *, progress: bool = True,
              analyse: bool = True) -> dict[str, Any]:
    """Run (or finish) every run of the grid, then analyse. Returns the summary dict."""
    runs = plan(sweep, base)
    for cfg in runs:  # every configuration error surfaces before the first run starts
        mesh = shd.make_mesh(cfg.mesh_data, cfg.mesh_fsdp, cfg.mesh_tensor)
        validate(cfg, data_parallel=shd.data_parallel_size(mesh))
    os.makedirs(sweep.sweep_dir, exist_ok=True)
    with open(os.path.join(sweep.sweep_dir, "sweep.json"), "w") as f:
        json.dump({"sweep": dataclasses.asdict(sweep), "base": base.to_json(),
                   "runs": [os.path.basename(c.run_dir) for c in runs]}, f, indent=2)
    errors, timings = {}, {}
    bar = tqdm(runs, desc="sweep", unit="run", disable=not progress)
    for cfg in bar:
        name = os.path.basename(cfg.run_dir)
        bar.set_postfix(run=name)
        if is_finished(cfg.run_dir):
            continue
        t0 = time.time()
        try:
            run_training(cfg, progress=progress)
        except Exception as e:  # keep going: one broken run must not cost the others
            errors[name] = f"{type(e).__name__}: {e}"
            os.makedirs(cfg.run_dir, exist_ok=True)
            with open(os.path.join(cfg.run_dir, "ERROR.txt"), "w") as f:
                f.write(traceback.format_exc())
        timings[name] = time.time() - t0
    bar.close()
    with open(os.path.join(sweep.sweep_dir, "sweep_status.json"), "w") as f:
        json.dump({"errors": errors, "wall_s_this_call": timings}, f, indent=2)
    if not analyse:
        return {"errors": errors}
    from jaxrl_scale.experiment.report import analyze_and_report
    target = sweep.analysis_target or sweep.target
    if not target:
        raise ValueError("SweepConfig.analysis_target: no target to analyse at. Fix: pass "
                         "--target or --analysis_target.")
    from jaxrl_scale.scaling.analysis import AnalysisError
    try:
        summary = analyze_and_report(sweep.sweep_dir, target=target)
    except AnalysisError as e:  # the runs are safe on disk; say why there is no report
        return {"errors": errors, "analysis_error": str(e)}
    summary["errors"] = errors
    return summary
