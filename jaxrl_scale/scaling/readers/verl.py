"""verl runs: the file logger's JSONL (or its TensorBoard event files) plus the run's Hydra
config.

Layout followed: verl ``verl/utils/tracking.py`` ``FileLogger`` (``trainer.logger`` includes
"file"; path from ``VERL_FILE_LOGGER_PATH``, else ``VERL_FILE_LOGGER_ROOT``/project/experiment
.jsonl): one JSON object per ``Tracking.log(data, step)`` call, ``{"step": s, "data": {metric:
value}}`` (newer versions add ``"elapsed_seconds"``). The metric names are those of
``verl/trainer/ppo/ray_trainer.py`` ``RayPPOTrainer.fit`` and ``verl/trainer/ppo/
metric_utils.py`` (``compute_timing_metrics``, ``compute_data_metrics``): ``training/global_step``,
``timing_s/step`` (the whole step, the validation inside it: ``timing_s/testing``),
``timing_s/gen``, ``timing_s/update_actor``, ``critic/score/mean``, ``perf/throughput``, and the
validation metrics ``val-core/<data_source>/<var>/mean@<n>`` merged into the step's record (the
``val_before_train`` record is step 0, before the first update). Without a JSONL, the same
tags from the event files of ``_TensorboardAdapter`` (``SummaryWriter.add_scalar(key, value,
step)``, read with tensorboard's own event reader).

Responses per step = ``data.train_batch_size`` (prompts) x ``actor_rollout_ref.rollout.n``
from ``.hydra/config.yaml`` or ``config.yaml`` in the run directory (YAML via PyYAML when
installed, else JSON); the overrides fill what it lacks. Wall time = cumulative
``timing_s/step`` minus ``timing_s/testing`` (without timing_s/step: the differences of
``elapsed_seconds``); generation and update time per step from ``timing_s/gen`` and
``timing_s/update_actor``. With DAPO dynamic sampling (``algorithm.filter_groups.enable``)
N still counts retained responses (``data.train_batch_size`` x ``rollout.n`` per step, the
source's axis); the extra generation batches are charged to throughput, their time being in
``timing_s/step``.
The eval score is the first ``val-core/.../mean@N`` key (sorted), or the chosen key. verl does
not log the number of eval samples: eval noise is estimated from the curve. The run's task is
its config's ``data.train_files`` and ``data.val_files`` (a sweep mixing tasks is refused).
"""

from __future__ import annotations

import glob
import json
import os
import re


from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers.common import (ReaderError, SkipRun, build_run, data_path_id,
                                                load_structured, nested_get, positive,
                                                with_task)
from jaxrl_scale.scaling.readers.tensorboard import cut_noted, event_files, read_event_records

CONFIG_FILES = (os.path.join(".hydra", "config.yaml"), "config.yaml")
_VAL_RE = re.compile(r"^val-core/.+/mean@\d+$")
ELAPSED = "elapsed_seconds"   # the line's own key (not a metric), kept beside the step's data


def _first_record(path: str):
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    return None
    return None


def is_log(path: str) -> bool:
    """A JSONL whose first record is ``{"step": int, "data": {...}}``."""
    try:
        rec = _first_record(path)
    except (OSError, UnicodeDecodeError):
        return False
    return isinstance(rec, dict) and isinstance(rec.get("data"), dict) and \
        is_number(rec.get("step"))


def log_path(run_dir: str) -> str | None:
    """The run's FileLogger JSONL: the first ``*.jsonl`` in ``run_dir`` in verl's layout."""
    for p in sorted(glob.glob(os.path.join(run_dir, "*.jsonl"))):
        if is_log(p):
            return p
    return None


def is_run(run_dir: str) -> bool:
    return log_path(run_dir) is not None


def is_tags(tags: set[str]) -> bool:
    """TensorBoard tags (or W&B columns) that only verl's trainer logs."""
    return "timing_s/step" in tags or "training/global_step" in tags or any(
        t.startswith("val-core/") for t in tags)


def read_config(run_dir: str) -> tuple[dict, str | None]:
    """(the Hydra config, its path) or ({}, None)."""
    for rel in CONFIG_FILES:
        p = os.path.join(run_dir, rel)
        if os.path.isfile(p):
            d = load_structured(p)
            return (d if isinstance(d, dict) else {}), p
    return {}, None


def task(config: dict) -> str | None:
    """The run's task: its ``data.train_files`` and ``data.val_files`` (last two path
    components each, `data_path_id`); None when the config names neither."""
    parts = [f"{k}={v}" for k, v in (
        ("train_files", data_path_id(nested_get(config, "data.train_files"))),
        ("val_files", data_path_id(nested_get(config, "data.val_files")))) if v]
    return " ".join(parts) or None


def responses_per_step(run_dir: str, config: dict, cpath: str | None, overrides: dict
                       ) -> float:
    tbs = positive(nested_get(config, "data.train_batch_size"))
    n = positive(nested_get(config, "actor_rollout_ref.rollout.n"))
    if tbs and n:
        return tbs * n
    rps = positive(overrides.get("responses_per_step"))
    if rps:
        return rps
    tbs = tbs or positive(overrides.get("train_batch_size"))
    n = n or positive(overrides.get("rollout_n"))
    if tbs and n:
        return tbs * n
    name = os.path.basename(os.path.normpath(run_dir))
    where = cpath or f"{name}/.hydra/config.yaml or {name}/config.yaml (absent)"
    missing = [k for k, v in (("data.train_batch_size", tbs),
                              ("actor_rollout_ref.rollout.n", n)) if not v]
    raise ReaderError(
        "responses_per_step",
        f"run {name}: {' and '.join(missing)} not found in {where}",
        "pass --responses_per_step=<data.train_batch_size x actor_rollout_ref.rollout.n>, or "
        "copy the run's .hydra/config.yaml into its directory")


def read_records(path: str) -> tuple[list[dict], int]:
    """{step, **data} of each well-formed line, and the number of unreadable lines. A later
    record for the same step updates the earlier one (verl logs a step once; a resumed run
    logs it again)."""
    records, bad = sio.read_jsonl(path)   # bad: lines that are not JSON objects
    by_step: dict[float, dict] = {}
    for rec in records:
        if not (isinstance(rec.get("data"), dict) and is_number(rec.get("step"))):
            bad += 1
            continue
        merged = by_step.setdefault(rec["step"], {"step": rec["step"]})
        merged.update(rec["data"])
        if is_number(rec.get("elapsed_seconds")):
            merged[ELAPSED] = rec["elapsed_seconds"]
    return [by_step[s] for s in sorted(by_step)], bad


def read_run(run_dir: str, name: str | None = None, **overrides) -> sio.Run:
    """One verl run directory as the analysis's run record (see the module docstring)."""
    name = name or os.path.basename(os.path.normpath(run_dir))
    path = log_path(run_dir)
    if path is None and not event_files(run_dir):
        raise SkipRun("no verl FileLogger JSONL ({\"step\", \"data\"} per line) and no "
                      "TensorBoard event files")
    try:
        config, cpath = read_config(run_dir)
    except ValueError as e:
        raise SkipRun(str(e)) from None
    batch = responses_per_step(run_dir, config, cpath, overrides)
    cut: list[str] = []
    if path is not None:
        records, bad = read_records(path)
        warnings = [f"{bad} unreadable line(s) in {path} (truncated?)"] if bad else []
    else:
        records, path, cut = read_event_records(run_dir)
        warnings = list(cut)
    with cut_noted(cut):
        run = _from_records(name, run_dir, path, records, warnings, config, batch, overrides)
    return with_task(run, task(config))


def _from_records(name: str, run_dir: str, path: str, records: list[dict],
                  warnings: list[str], config: dict, batch: float, overrides: dict
                  ) -> sio.Run:

    keys = sorted({k for r in records for k in r if is_number(r.get(k))})
    chosen = overrides.get("score_key")
    if chosen:
        key = chosen if chosen in keys else None
    else:
        key = next((k for k in keys if _VAL_RE.match(k)), None)
    if key is None:
        raise SkipRun(f"{path}: no eval score ({chosen or 'val-core/<source>/<var>/mean@N'}) "
                      "in any record (set trainer.test_freq, or choose a key with --score_key)")
    evals = [{"step": r["step"], "score": r[key]} for r in records if is_number(r.get(key))]

    train = []
    for r in records:
        dt = r.get("timing_s/step")
        if not is_number(dt) or r["step"] <= 0:
            continue
        test = r.get("timing_s/testing")
        rec = {"step": r["step"], "dt": dt - (test if is_number(test) else 0.0)}
        if is_number(r.get("timing_s/gen")):
            rec["gen_s"] = r["timing_s/gen"]
        if is_number(r.get("timing_s/update_actor")):
            rec["train_s"] = r["timing_s/update_actor"]
        train.append(rec)
    if not train:
        train = _elapsed_times(records)
        if train:
            warnings.append(f"{path}: no timing_s/step; wall time from elapsed_seconds")
    if not train:
        raise SkipRun(f"{path}: no timing_s/step (nor elapsed_seconds) in any record")
    steps = [r["step"] for r in train]
    gaps = sum(1 for a, b in zip(steps[:-1], steps[1:]) if b - a != 1)
    if gaps or steps[0] != 1:
        warnings.append(f"{path}: timing_s/step missing for some steps; their time is not "
                        "counted")
    algo = nested_get(config, "algorithm.adv_estimator")
    algo = overrides.get("algo") or ({"gae": "ppo"}.get(algo, algo) if isinstance(algo, str)
                                     else "grpo")
    warnings.append(f"eval score from {key}; eval sample count not logged")
    refill = nested_get(config, "algorithm.filter_groups.enable") is True
    if refill:
        warnings.append("dynamic sampling (filter_groups): N counts retained responses; the "
                        "extra generation batches are in timing_s/step, so in q")
    run = build_run(name, run_dir, "verl", batch, train, evals, algo=algo,
                    warnings=warnings, source=path)
    run.refill = refill
    return run


def _elapsed_times(records: list[dict]) -> list[dict]:
    """Per-step ``dt`` from the FileLogger's ``elapsed_seconds`` (seconds since the logger
    started), validation time (``timing_s/testing``) taken out; [] when it is not logged."""
    pts = [r for r in records if is_number(r.get(ELAPSED))]
    out = []
    for a, b in zip(pts[:-1], pts[1:]):
        if b["step"] <= 0:
            continue
        test = b.get("timing_s/testing")
        rec = {"step": b["step"], "dt": b[ELAPSED] - a[ELAPSED]
               - (test if is_number(test) else 0.0)}
        if is_number(b.get("timing_s/gen")):
            rec["gen_s"] = b["timing_s/gen"]
        out.append(rec)
    first = pts[0] if pts else None
    if out and first["step"] > 0:
        # No record before the first step's: its time (not the setup before it) at the next
        # interval's rate.
        rate = out[0]["dt"] / max(out[0]["step"] - first["step"], 1)
        out.insert(0, {"step": first["step"], "dt": rate * first["step"]})
    return out
