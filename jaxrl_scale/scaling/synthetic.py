"""Synthetic run directories with known answers, for tests and for trying the analyser.

A run has a linear learning curve J(N) = target * N / n_star (optionally capped, so it never
reaches the target) and constant throughput q: its N* is n_star exactly and its q is q.
"""

from __future__ import annotations

import json
import os
from typing import Callable

import numpy as np
from jaxrl_scale.numbers import write_json


def write_synthetic_run(root: str, name: str, batch: int, n_star: float, q: float, *,
                        target: float = 0.5, cap: float | None = None, lr_rule: str = "sqrt",
                        algo: str = "grpo", seed: int = 0, steps: int = 40, eval_every: int = 2,
                        config: bool = True, grad_norm: float | None = 1.0,
                        gen_s: tuple[float, float] | None = (1.0, 1e-3),
                        extra_config: dict | None = None,
                        curve: Callable[[float], float] | None = None,
                        eval_n: int | None = None, noise_seed: int | None = None,
                        step_jitter: float = 0.0) -> str:
    """Write ``root/name/{config.json, metrics.jsonl}``; returns the run dir.

    grad_norm: actor grad norm = grad_norm / sqrt(batch) (the invariant-range signature);
    gen_s: (d0, d1) of per-step generation seconds d0 + d1 * batch.
    curve: true score J(N) (replaces the linear curve; n_star is then only the batch label);
    eval_n: each eval score is Binomial(eval_n, J(N)) / eval_n (seeded by noise_seed) and the
    record carries eval_n; step_jitter: relative spread of per-step wall seconds.
    """
    rng = np.random.default_rng(noise_seed)
    true = curve or (lambda n: min(cap, target * n / n_star) if cap is not None
                     else target * n / n_star)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    if config:
        cfg = {"name": name, "batch_train": batch, "lr_rule": lr_rule, "algo": algo,
               "seed": seed}
        cfg.update(extra_config or {})
        write_json(os.path.join(d, "config.json"), cfg)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        t = 0.0
        if eval_n is not None or curve is not None:
            f.write(json.dumps(_eval(0, 0, true(0), eval_n, rng)) + "\n")
        for s in range(1, steps + 1):
            n = s * batch
            t += batch / q * (1 + step_jitter * rng.standard_normal()) if step_jitter else \
                batch / q
            rec = {"step": s, "responses": n, "time_s": t}
            if grad_norm is not None:
                rec["actor_grad_norm"] = grad_norm / batch ** 0.5
            if gen_s is not None:
                rec["gen_s"] = gen_s[0] + gen_s[1] * batch
            f.write(json.dumps(rec) + "\n")
            if s % eval_every == 0:
                f.write(json.dumps(_eval(s, n, true(n), eval_n, rng)) + "\n")
    return d


def _eval(step, n, p, eval_n, rng) -> dict:
    if eval_n is None:
        return {"step": step, "responses": n, "score": p}
    p = float(np.clip(p, 0.0, 1.0))
    return {"step": step, "responses": n, "score": rng.binomial(eval_n, p) / eval_n,
            "eval_n": eval_n}
