"""Synthetic run directories with known answers, for tests and for trying the analyser.

A run has a linear learning curve J(N) = target * N / n_star (optionally capped, so it never
reaches the target) and constant throughput q: its N* is n_star exactly and its q is q.
"""

from __future__ import annotations

import json
import os


def write_synthetic_run(root: str, name: str, batch: int, n_star: float, q: float, *,
                        target: float = 0.5, cap: float | None = None, lr_rule: str = "sqrt",
                        algo: str = "grpo", seed: int = 0, steps: int = 40, eval_every: int = 2,
                        config: bool = True, grad_norm: float | None = 1.0,
                        gen_s: tuple[float, float] | None = (1.0, 1e-3),
                        extra_config: dict | None = None) -> str:
    """Write ``root/name/{config.json, metrics.jsonl}``; returns the run dir.

    grad_norm: actor grad norm = grad_norm / sqrt(batch) (the invariant-range signature);
    gen_s: (d0, d1) of per-step generation seconds d0 + d1 * batch.
    """
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    if config:
        cfg = {"name": name, "batch_train": batch, "lr_rule": lr_rule, "algo": algo,
               "seed": seed}
        cfg.update(extra_config or {})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
    with open(os.path.join(d, "metrics.jsonl"), "w") as f:
        for s in range(1, steps + 1):
            n = s * batch
            rec = {"step": s, "responses": n, "time_s": n / q}
            if grad_norm is not None:
                rec["actor_grad_norm"] = grad_norm / batch ** 0.5
            if gen_s is not None:
                rec["gen_s"] = gen_s[0] + gen_s[1] * batch
            f.write(json.dumps(rec) + "\n")
            if s % eval_every == 0:
                score = target * n / n_star
                if cap is not None:
                    score = min(cap, score)
                f.write(json.dumps({"step": s, "responses": n, "score": score}) + "\n")
    return d
