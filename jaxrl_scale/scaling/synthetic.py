"""Synthetic run directories with known answers, for tests and for trying the analyser.

A run has a linear learning curve J(N) = target * N / n_star (optionally capped, so it never
reaches the target) and constant throughput q: its N* is n_star exactly and its q is q.
`SyntheticRun` is the spec; `write_synthetic_run(root, spec)` writes it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import numpy as np
from jaxrl_scale.numbers import write_json


@dataclasses.dataclass(frozen=True)
class SyntheticRun:
    """One run's truth and logging.

    grad_norm: actor grad norm = grad_norm / sqrt(batch) (the invariant-range signature);
    gen_s: (d0, d1) of per-step generation seconds d0 + d1 * batch;
    curve: true score J(N) (replaces the linear curve; n_star is then only the batch label);
    eval_n: each eval score is Binomial(eval_n, J(N)) / eval_n (seeded by noise_seed) and the
    record carries eval_n; step_jitter: relative spread of per-step wall seconds.
    """
    name: str
    batch: int
    n_star: float
    q: float
    target: float = 0.5
    cap: float | None = None
    lr_rule: str = "sqrt"
    algo: str = "grpo"
    seed: int = 0
    steps: int = 40
    eval_every: int = 2
    config: bool = True
    grad_norm: float | None = 1.0
    gen_s: tuple[float, float] | None = (1.0, 1e-3)
    extra_config: dict | None = None
    curve: Callable[[float], float] | None = None
    eval_n: int | None = None
    noise_seed: int | None = None
    step_jitter: float = 0.0

    def true_score(self, n: float) -> float:
        if self.curve is not None:
            return self.curve(n)
        lin = self.target * n / self.n_star
        return min(self.cap, lin) if self.cap is not None else lin


def write_synthetic_run(root: str, spec: SyntheticRun) -> str:
    """Write ``root/<spec.name>/{config.json, metrics.jsonl}``; returns the run dir."""
    rng = np.random.default_rng(spec.noise_seed)
    d = os.path.join(root, spec.name)
    os.makedirs(d, exist_ok=True)
    if spec.config:
        cfg = {"name": spec.name, "batch_train": spec.batch, "lr_rule": spec.lr_rule,
               "algo": spec.algo, "seed": spec.seed}
        cfg.update(spec.extra_config or {})
        write_json(os.path.join(d, "config.json"), cfg)
    B = spec.batch
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        t = 0.0
        if spec.eval_n is not None or spec.curve is not None:
            f.write(json.dumps(_eval(0, 0, spec.true_score(0), spec.eval_n, rng)) + "\n")
        for s in range(1, spec.steps + 1):
            n = s * B
            t += B / spec.q * (1 + spec.step_jitter * rng.standard_normal()) \
                if spec.step_jitter else B / spec.q
            rec = {"step": s, "responses": n, "time_s": t}
            if spec.grad_norm is not None:
                rec["actor_grad_norm"] = spec.grad_norm / B ** 0.5
            if spec.gen_s is not None:
                rec["gen_s"] = spec.gen_s[0] + spec.gen_s[1] * B
            f.write(json.dumps(rec) + "\n")
            if s % spec.eval_every == 0:
                f.write(json.dumps(_eval(s, n, spec.true_score(n), spec.eval_n, rng)) + "\n")
    return d


def _eval(step, n, p, eval_n, rng) -> dict:
    if eval_n is None:
        return {"step": step, "responses": n, "score": p}
    p = float(np.clip(p, 0.0, 1.0))
    return {"step": step, "responses": n, "score": rng.binomial(eval_n, p) / eval_n,
            "eval_n": eval_n}
