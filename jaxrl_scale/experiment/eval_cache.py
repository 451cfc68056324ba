"""The step-0 eval shared by runs that start alike (`initial_eval`), and the sealed JSON files
it is cached in: a file carries the sha256 of its content (`sealed`), and one that does not
match it is moved aside and recomputed (`read_sealed_json`), never read as a result."""
from __future__ import annotations

import hashlib
import json
import os
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from jaxrl_scale import distributed as dist
from jaxrl_scale.experiment.common import write_json
from jaxrl_scale.rl.rollout import LoopState

if TYPE_CHECKING:
    from jaxrl_scale.experiment.train import Run


# What the step-0 eval depends on: the initial params, the eval prompts and the sampler; and
# the pass@k it reports and the prompts' chat template, each keyed only when set (so caches
# made before them still match).
_EVAL0_FIELDS = ("model", "hf_checkpoint", "init_checkpoint", "tokenizer", "task", "task_kwargs",
                 "data_dir", "num_train_examples", "num_test_examples", "max_prompt_len",
                 "eval_prompts", "eval_samples", "eval_mode", "temperature", "top_k", "top_p",
                 "max_new_tokens", "seed", "generate_chunk", "pass_k", "chat_template",
                 "reward_fn")
_UNSET = {"pass_k": (), "chat_template": "none", "reward_fn": ""}
# A server's, a judge's or a reward model's scores are no function of the config (the
# server, the judge or the directory may change between runs): those runs evaluate afresh.
_UNCACHED = ("reward_url", "judge_url", "reward_model")


def initial_eval(run: "Run", loop: LoopState, cache_dir: str | None = None
                 ) -> tuple[LoopState, dict[str, Any]]:
    """run.evaluate(loop) at step 0, shared through `cache_dir` by runs whose _EVAL0_FIELDS agree.

    The step-0 eval is a pure function of those fields (same params, prompts and sampling
    seed), so the runs of a sweep that start from one warm-start checkpoint with the same seed
    get bit-identical results; a cached copy saves one full eval per such run. The key
    includes the checkpoint's modification time, so a retrained checkpoint is re-evaluated.
    """
    if not cache_dir or any(getattr(run.cfg, k) for k in _UNCACHED):
        return run.evaluate(loop)
    flat = run.cfg.flat()
    key = {k: flat[k] for k in _EVAL0_FIELDS if k not in _UNSET or flat[k] != _UNSET[k]}
    for k in ("hf_checkpoint", "init_checkpoint"):
        if key[k]:
            key[k + "_mtime"] = os.path.getmtime(os.path.expanduser(key[k]))
    digest = _digest(key)
    path = os.path.join(cache_dir, digest[:20] + ".json")
    # every process must take the same branch: the eval is a collective computation
    cached = read_sealed_json(path) if dist.is_primary() else None
    if bool(dist.broadcast(np.int32(cached is not None))):
        if cached is None:   # process 0 checked the file; the others read it
            with open(path) as f:
                cached = json.load(f)
        return loop, cached["eval"]
    loop, ev = run.evaluate(loop)
    if dist.is_primary():
        os.makedirs(cache_dir, exist_ok=True)
        write_json(path, sealed({"key": key, "eval": ev}), default=str)
    return loop, ev


def _digest(payload: dict) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def sealed(payload: dict) -> dict:
    """`payload` plus the sha256 of its canonical JSON, checked by `read_sealed_json`."""
    return {**payload, "sha256": _digest(payload)}


def read_sealed_json(path: str) -> dict | None:
    """The payload of a `sealed` JSON file, or None when there is none to trust: missing, or
    unreadable or not matching its digest (then moved aside to <path>.corrupt with a warning,
    so the caller recomputes it; a cache entry must never feed a run silently wrong numbers)."""
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            d = json.load(f)
        ok = isinstance(d, dict) and d.pop("sha256", None) == _digest(d)
    except (OSError, ValueError) as e:
        d, ok = None, False
        why = f"{type(e).__name__}: {str(e)[:200]}"
    else:
        why = "its sha256 does not match its contents"
    if ok:
        return d
    warnings.warn(f"Cache file {path} is corrupt ({why}); moved to {path}.corrupt and "
                  f"recomputed.", RuntimeWarning, stacklevel=2)
    os.replace(path, path + ".corrupt")
    return None
