"""What every framework reader shares: the error a user must fix, config files, and turning
per-step values into the analysis's run record (`scaling.io.Run`). Pure Python + numpy."""

from __future__ import annotations

import glob
import json
import os
from typing import Any

import numpy as np

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import io as sio


class ReaderError(ValueError):
    """A log the analysis cannot use as it is. str() is ``<field>: <problem>. Fix: <fix>.``
    (the layout of `experiment.config.ConfigError`; <field> is the flag that supplies what is
    missing, when a flag can). The command prints it as one line and exits 2."""

    def __init__(self, field: str, problem: str, fix: str):
        self.field, self.problem, self.fix = field, problem, fix
        super().__init__(f"{field}: {problem}. Fix: {fix}.")


class SkipRun(Exception):
    """A run directory that is listed as skipped, with this reason (e.g. no evals)."""


def load_structured(path: str) -> Any:
    """A YAML (PyYAML when installed) or JSON file; ValueError naming the file when it is
    neither."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        json_err = e
    try:
        import yaml
    except ImportError:
        raise ValueError(f"{path}: not JSON ({json_err}) and PyYAML is not installed to read "
                         "it as YAML") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None


def config_files(run_dir: str, names: tuple[str, ...] = ()) -> list[str]:
    """``names`` (relative paths) that exist in ``run_dir``, then every other top-level
    .yaml/.yml/.json file, in a stable order."""
    out = [os.path.join(run_dir, n) for n in names if os.path.isfile(os.path.join(run_dir, n))]
    for pat in ("*.yaml", "*.yml", "*.json"):
        for p in sorted(glob.glob(os.path.join(run_dir, pat))):
            if p not in out:
                out.append(p)
    return out


def nested_get(d: Any, dotted: str) -> Any:
    """``d["a"]["b"]`` for "a.b"; also accepts a flat key "a.b"; None when absent."""
    if not isinstance(d, dict):
        return None
    if dotted in d:
        return d[dotted]
    cur = d
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def positive(x: Any) -> float | None:
    """A positive finite number (numbers written as strings too), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, str):
        try:
            x = float(x)
        except ValueError:
            return None
    return float(x) if is_number(x) and x > 0 else None


def responses_at(cum_SR: tuple[list, list] | None, batch: float):
    """step -> cumulative responses: linear in the logged (step, cumulative responses) points
    (from (0, 0)) when the log counts them, else step x batch."""
    if cum_SR is None:
        return lambda s: s * batch
    steps = np.r_[0.0, np.asarray(cum_SR[0], dtype=float)]
    cum = np.r_[0.0, np.asarray(cum_SR[1], dtype=float)]
    # past the last logged step: at the last logged rate (an eval logged after the last update)
    rate = (cum[-1] - cum[-2]) / max(steps[-1] - steps[-2], 1e-12) if len(steps) > 1 else batch
    return lambda s: float(np.interp(s, steps, cum)) if s <= steps[-1] else \
        float(cum[-1] + rate * (s - steps[-1]))


def build_run(name: str, run_dir: str, framework: str, batch: float,
              train: list[dict], evals: list[dict], *, algo: str | None = None,
              warnings: list[str] = (), source: str,
              cum_SR: tuple[list, list] | None = None) -> sio.Run:
    """The analysis's run record from per-step records: ``train`` items carry ``step`` and
    ``dt`` (wall seconds since the previous record, eval excluded) and optionally per-step
    ``gen_s`` / ``train_s``; ``evals`` carry
    ``step`` and ``score`` (and ``eval_n`` when known). Responses = step x batch (retained
    responses per optimizer step), or, when the log counts them, ``cum_SR`` = (steps,
    cumulative responses at those steps); wall time = cumulative sum of dt."""
    if not evals:
        raise SkipRun(f"no eval scores in {source}")
    at = responses_at(cum_SR, batch)
    records, t, prev = [], 0.0, 0
    for r in sorted(train, key=lambda r: r["step"]):
        s = r["step"]
        if s <= prev:
            continue
        t += r["dt"]
        rec = {"step": s, "responses": at(s), "time_s": t}
        for k in ("gen_s", "train_s"):
            if is_number(r.get(k)):
                rec[k] = float(r[k])
        records.append(rec)
        prev = s
    if not records:
        raise SkipRun(f"no step times in {source}")
    for e in evals:
        rec = {"step": e["step"], "responses": at(e["step"]), "score": float(e["score"])}
        if is_number(e.get("eval_n")):
            rec["eval_n"] = e["eval_n"]
        records.append(rec)
    config = {"name": name, "batch_train": batch, "framework": framework}
    if algo:
        config["algo"] = algo
    run = sio.make_run(name, records, config, path=run_dir)
    run.warnings.extend(warnings)
    return run


def with_task(run: sio.Run, task: str | None) -> sio.Run:
    """``run`` carrying its task identity (``config["task"]``) when its files say it."""
    if task:
        run.config["task"] = task
    return run


def task_of(run: sio.Run) -> str | None:
    """What the run was trained and evaluated on, as far as its files say; None when unknown.
    Ours: config.json ``task`` plus its ``task_kwargs`` (arithmetic with 2 digits is not
    arithmetic with 4); another framework's run: what its reader found (`with_task`)."""
    task = run.config.get("task") if isinstance(run.config, dict) else None
    if not isinstance(task, str) or not task:
        return None
    kwargs = run.config.get("task_kwargs")
    if run.config.get("framework") is None and isinstance(kwargs, dict) and kwargs:
        return f"{task} {json.dumps(kwargs, sort_keys=True, separators=(',', ':'))}"
    return task


def data_path_id(value: Any) -> str | None:
    """A data-file setting (a path, a list of paths, or a list written as a string) as its
    files' last two path components ("gsm8k/train.parquet"), comma-joined: the same data
    under another home directory or mount is the same task, another directory is not."""
    if isinstance(value, str) and value.strip().startswith("["):
        value = [v.strip().strip("'\"") for v in value.strip()[1:-1].split(",")]
    items = value if isinstance(value, (list, tuple)) else [value]
    out = []
    for v in items:
        if not isinstance(v, str) or not v.strip():
            continue
        parts = [p for p in os.path.normpath(v.strip()).replace("\\", "/").split("/") if p]
        out.append("/".join(parts[-2:]))
    return ",".join(out) or None


def check_one_task(runs: list[sio.Run], where: str | None) -> None:
    """ReaderError naming two runs and their tasks when the known task identities of
    ``runs`` differ: time-to-target on different tasks compares nothing. Runs whose task is
    unknown pass."""
    first: tuple[str, str] | None = None
    for r in runs:
        t = task_of(r)
        if t is None:
            continue
        if first is None:
            first = (r.name, t)
        elif t != first[1]:
            raise ReaderError("task", f"{where or 'the sweep'} mixes runs of different tasks "
                              f"(run {first[0]}: {first[1]}; run {r.name}: {t})",
                              "analyse one task's runs per sweep directory (move the others "
                              "out); if it is the same data, make their configs name it alike")
