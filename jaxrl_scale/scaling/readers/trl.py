"""TRL runs (GRPOTrainer / any transformers Trainer): ``trainer_state.json``.

Layout followed: transformers ``src/transformers/trainer_callback.py`` ``TrainerState``
(``save_to_json``: ``json.dumps(dataclasses.asdict(state), indent=2, sort_keys=True)``), whose
``log_history`` is the list of what ``Trainer.log`` emitted, each with ``step`` (the optimizer
step, ``global_step``) and ``epoch``: training entries (TRL ``trl/trainer/grpo_trainer.py``
``GRPOTrainer.log``: ``reward``, ``num_tokens``, ``step_time`` where the TRL version logs it,
averaged over the logging interval), eval entries (``eval_`` prefix: ``eval_reward``,
``eval_runtime``, ...) and the final ``train_runtime`` entry. The trainer writes it to
``output_dir/trainer_state.json`` (``Trainer.save_state``) and into every
``checkpoint-<step>/``; the run directory's own file wins, else the latest checkpoint's.

Responses per optimizer step = per_device_train_batch_size x gradient_accumulation_steps x
world size (TRL's GRPO batch counts completions). They come from a TrainingArguments YAML/JSON
beside the state (TRL's CLI ``--config``; an accelerate config's ``num_processes`` gives the
world size), else TrainerState's ``train_batch_size`` (per device); the overrides fill what
they lack; the multipliers default to 1 with a warning; GRPOConfig ``num_iterations`` > 1 (each
completion used for that many updates) divides the new responses per step.
``training_args.bin`` is a pickle and is never read. The run's task is the config's
``dataset_name`` (+ ``dataset_config``; TRL ``trl/scripts/utils.py`` ``ScriptArguments``).

Wall time: cumulative ``step_time`` x steps since the previous entry; else entry timestamps
(``timestamp``/``_timestamp``, when a callback added them); else ``train_runtime`` spread
evenly over the steps (warned: it includes eval time); else the run is refused.
"""

from __future__ import annotations

import glob
import json
import os
import re

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers.common import (ReaderError, SkipRun, build_run, config_files,
                                                load_structured, positive, with_task)

STATE_FILE = "trainer_state.json"
DEFAULT_SCORE_KEYS = ("eval_reward",)
_EVAL_REWARD_RE = re.compile(r"^eval_rewards/.+/mean$")
_TS_KEYS = ("timestamp", "_timestamp")


def state_path(run_dir: str) -> str | None:
    """``run_dir/trainer_state.json``, else the one in the highest ``checkpoint-<step>/``."""
    p = os.path.join(run_dir, STATE_FILE)
    if os.path.isfile(p):
        return p
    best = None
    for c in glob.glob(os.path.join(run_dir, "checkpoint-*", STATE_FILE)):
        m = re.search(r"checkpoint-(\d+)", c)
        if m and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), c)
    return best[1] if best else None


def is_run(run_dir: str) -> bool:
    return state_path(run_dir) is not None


def _configs_beside(run_dir: str):
    """(path, dict) of every readable structured config beside the state (not the state)."""
    for p in config_files(run_dir):
        if os.path.basename(p) == STATE_FILE:
            continue
        try:
            d = load_structured(p)
        except (ValueError, OSError):
            continue
        if isinstance(d, dict):
            yield p, d


def _args(run_dir: str) -> tuple[dict, list[str]]:
    """Training-argument keys found beside the state: {key: value} and the files read."""
    keys = ("per_device_train_batch_size", "gradient_accumulation_steps", "world_size",
            "num_processes", "num_iterations")
    found, used = {}, []
    for p, d in _configs_beside(run_dir):
        hit = False
        for k in keys:
            if k in d and k not in found:
                found[k] = d[k]
                hit = True
        if hit:
            used.append(os.path.basename(p))
    return found, used


def task(run_dir: str) -> str | None:
    """``dataset_name`` (``:dataset_config`` when set) from the first config beside the state
    that names one; None when none does."""
    for _, d in _configs_beside(run_dir):
        name, conf = d.get("dataset_name"), d.get("dataset_config")
        if isinstance(name, str) and name:
            return f"{name}:{conf}" if isinstance(conf, str) and conf else name
    return None


def responses_per_step(run_dir: str, state: dict, overrides: dict
                       ) -> tuple[float, list[str]]:
    """(responses per optimizer step, warnings): the run's own files first, the overrides
    for what they lack (``responses_per_step`` for the whole product); ReaderError naming the
    flag when the per-device batch is nowhere."""
    args, used = _args(run_dir)
    src = ", ".join(used) or "no TrainingArguments YAML/JSON"
    warnings = []
    pd = positive(args.get("per_device_train_batch_size")) or \
        positive(state.get("train_batch_size"))
    ga = positive(args.get("gradient_accumulation_steps"))
    ws = positive(args.get("world_size")) or positive(args.get("num_processes"))
    rps = positive(overrides.get("responses_per_step"))
    if rps and not (pd and ga and ws):
        return rps, []
    pd = pd or positive(overrides.get("per_device_train_batch_size"))
    if pd is None:
        raise ReaderError(
            "responses_per_step",
            f"run {os.path.basename(os.path.normpath(run_dir))}: per_device_train_batch_size is "
            f"not in {src} beside {STATE_FILE}, nor is train_batch_size in {STATE_FILE}",
            "pass --responses_per_step=<per_device_train_batch_size x "
            "gradient_accumulation_steps x world size>, or put the run's TRL config YAML "
            "(per_device_train_batch_size, gradient_accumulation_steps) in its directory")
    ga = ga or positive(overrides.get("gradient_accumulation_steps"))
    if ga is None:
        ga = 1.0
        warnings.append(f"gradient_accumulation_steps not found ({src}); assumed 1")
    ws = ws or positive(overrides.get("world_size"))
    if ws is None:
        ws = 1.0
        warnings.append(f"world size not found ({src}; no num_processes or world_size); "
                        "assumed 1 (set --world_size)")
    mu = positive(args.get("num_iterations"))
    if mu and mu > 1:
        warnings.append(f"num_iterations = {mu:g}: each completion is used {mu:g} times, so "
                        f"new responses per optimizer step = batch / {mu:g}")
        return pd * ga * ws / mu, warnings
    return pd * ga * ws, warnings


def score_key(history: list[dict], chosen: str | None) -> str | None:
    keys = {k for e in history for k in e if is_number(e.get(k))}
    if chosen:
        return chosen if chosen in keys else None
    for k in DEFAULT_SCORE_KEYS:
        if k in keys:
            return k
    hits = sorted(k for k in keys if _EVAL_REWARD_RE.match(k))
    return hits[0] if hits else None


def read_run(run_dir: str, name: str | None = None, **overrides) -> sio.Run:
    """One TRL run directory as the analysis's run record (see the module docstring)."""
    name = name or os.path.basename(os.path.normpath(run_dir))
    path = state_path(run_dir)
    if path is None:
        raise SkipRun(f"no {STATE_FILE}")
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except json.JSONDecodeError as e:
        raise SkipRun(f"{path}: not valid JSON (truncated?): {e}") from None
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise SkipRun(f"{path}: no log_history list")
    history = [e for e in history if isinstance(e, dict) and is_number(e.get("step"))]
    batch, warnings = responses_per_step(run_dir, state, overrides)

    key = score_key(history, overrides.get("score_key"))
    if key is None:
        want = overrides.get("score_key") or " or ".join(DEFAULT_SCORE_KEYS + (
            "eval_rewards/<func>/mean",))
        raise SkipRun(f"{path}: no eval score ({want}) in log_history (set eval_strategy "
                      "in the run, or choose a key with --score_key)")
    evals = [{"step": e["step"], "score": e[key]} for e in history if is_number(e.get(key))]
    evals.sort(key=lambda e: e["step"])

    train_entries = sorted((e for e in history if not any(k.startswith("eval_") for k in e)
                            and "train_runtime" not in e), key=lambda e: e["step"])
    train = _times(train_entries, history, path, warnings)
    warnings.append(f"eval score from {key}; eval sample count and generation time not "
                    "logged")
    return with_task(build_run(name, run_dir, "trl", batch, train, evals,
                               algo=_algo(overrides), warnings=warnings, source=path),
                     task(run_dir))


def _algo(overrides: dict) -> str:
    a = overrides.get("algo")
    return a.lower() if isinstance(a, str) and a else "grpo"


def _times(entries: list[dict], history: list[dict], path: str, warnings: list[str]
           ) -> list[dict]:
    """Per-entry ``dt`` from step_time, else timestamps, else train_runtime."""
    if entries and all(is_number(e.get("step_time")) for e in entries):
        out, prev = [], 0
        for e in entries:
            out.append({"step": e["step"], "dt": e["step_time"] * (e["step"] - prev)})
            prev = e["step"]
        return out
    ts_key = next((k for k in _TS_KEYS if entries and all(is_number(e.get(k))
                                                         for e in entries)), None)
    if ts_key and len(entries) > 1:
        # The first logged interval has no start time: its rate is the second's.
        out = []
        for a, b in zip(entries[:-1], entries[1:]):
            out.append({"step": b["step"], "dt": b[ts_key] - a[ts_key]})
        first = entries[0]
        rate = out[0]["dt"] / max(entries[1]["step"] - first["step"], 1)
        out.insert(0, {"step": first["step"], "dt": rate * first["step"]})
        warnings.append(f"wall time from log {ts_key} (includes eval time)")
        return out
    runtime = next((e["train_runtime"] for e in history if is_number(e.get("train_runtime"))),
                   None)
    last = max((e["step"] for e in history), default=0)
    if runtime and last > 0:
        warnings.append("no step_time in log_history: wall time is train_runtime spread "
                        "evenly over the steps (it includes eval time)")
        steps = sorted({e["step"] for e in entries} | {last})
        out, prev = [], 0
        for s in steps:
            out.append({"step": s, "dt": runtime * (s - prev) / last})
            prev = s
        return out
    raise SkipRun(f"{path}: no wall time (no step_time entries, no timestamps, no "
                  "train_runtime): the run has not finished a logging interval with times")
