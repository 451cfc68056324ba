"""prime-rl runs (``rl`` entrypoint: trainer + orchestrator): the run directory's
``metrics.jsonl``.

Layout followed: prime-rl ``src/prime_rl/monitors/file.py`` ``FileMonitor.log_metrics``
(commit 559b447, 2026-08; the file monitor exists since #3111, 2026-07; on by default,
``monitors.file.path`` = ``metrics.jsonl`` under the component's ``output_dir``, which the
``rl`` entrypoint sets to ``output_dir/run.name`` for trainer and orchestrator alike): one
``json.dumps({"step": step, "time": time.time(), **metrics})`` line per ``monitors.log``
call, from both processes, appended. The orchestrator's step line
(``src/prime_rl/orchestrator/orchestrator.py`` ``finalize_train_batch``) holds
``progress/rollouts`` (the step's rollouts; W&B-era logs: ``progress/num_samples``),
``progress/total_rollouts`` (before the step) and ``time/step`` (batch-to-batch wall time;
the first step's runs from startup); its eval line (``finalize_eval_batch``) holds
``eval/<env>/{all,effective}/<agent>/avg@<k>`` (``orchestrator/metrics.py``
``EvalMetrics.to_wandb``; W&B-era: ``eval/<env>/avg@<k>``) and
``eval/<env>/policy_version``. The trainer's lines also carry ``time/step`` (its own step)
and ``time/forward_backward``.

Responses: the cumulative ``progress/rollouts`` of the orchestrator's lines. Wall time:
their cumulative ``time/step`` (the trainer's lines are not mixed in); update time per step
from the trainer's ``time/forward_backward``. The eval score is the first ``avg@k`` key
(sorted: ``all`` before ``effective``) or ``--score_key``; it is placed at its
``policy_version`` (the updates the evaluated policy had; without it, the step before the
line's, with a warning). prime-rl does not log the eval sample count.

The run's task: the ``env`` block of each training source (``train.source[i].env``, the
verifiers environment and its knobs) in the resolved config the ``rl`` entrypoint writes to
``<run dir>/configs/`` (``src/prime_rl/entrypoints/rl.py`` ``write_subconfigs``:
``orchestrator.json``; ``write_config``: ``rl.json``, under ``orchestrator``;
``utils/pathing.py`` ``get_config_dir``); unknown without those files.
"""

from __future__ import annotations

import json
import os
import re

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers import mapped
from jaxrl_scale.scaling.readers.common import SkipRun, load_structured, nested_get, with_task

METRICS_FILE = "metrics.jsonl"
SAMPLES_KEYS = ("progress/rollouts", "progress/num_samples")
SCORE_RE = re.compile(r"^eval/.+/avg@\d+$")
SCORE_DESC = "eval/<env>/all/<agent>/avg@k"
_MAP = {"time": "time", "samples": "samples", "train": "train", "score": "score",
        "eval_step": "eval_step"}


_UNREADABLE = object()


def _first_record(path: str):
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line)
                except ValueError:
                    return _UNREADABLE
    return None


def is_run(run_dir: str, unreadable: bool = False) -> bool:
    """``metrics.jsonl`` whose first line is ``{"step", "time", "<group>/<metric>": ...}``
    (ours has ``time_s`` and no ``time``; verl's FileLogger nests its metrics in ``data``).
    ``unreadable``: also one whose first line is not JSON (--format=prime-rl reads it, to
    name what is missing)."""
    p = os.path.join(run_dir, METRICS_FILE)
    try:
        rec = _first_record(p) if os.path.isfile(p) else None
    except (OSError, UnicodeDecodeError):
        return unreadable
    if rec is _UNREADABLE:
        return unreadable
    return isinstance(rec, dict) and is_number(rec.get("step")) and \
        is_number(rec.get("time")) and "data" not in rec and any("/" in k for k in rec)


CONFIG_FILES = ((os.path.join("configs", "orchestrator.json"), "train.source"),
                (os.path.join("configs", "rl.json"), "orchestrator.train.source"))


def task(run_dir: str) -> str | None:
    """The training sources' ``env`` blocks (compact JSON, sorted keys, joined by "+") from
    the run's resolved config; None when it is not there or names no source."""
    for rel, key in CONFIG_FILES:
        p = os.path.join(run_dir, rel)
        if not os.path.isfile(p):
            continue
        try:
            sources = nested_get(load_structured(p), key)
        except (ValueError, OSError):
            continue
        envs = [json.dumps(x["env"], sort_keys=True, separators=(",", ":"))
                for x in sources or [] if isinstance(x, dict) and isinstance(x.get("env"), dict)]
        if envs:
            return "+".join(envs)
    return None


def read_run(run_dir: str, name: str | None = None, **overrides) -> sio.Run:
    """One prime-rl run directory (see the module docstring)."""
    name = name or os.path.basename(os.path.normpath(run_dir))
    path = os.path.join(run_dir, METRICS_FILE)
    records, bad = sio.read_jsonl(path)
    records = [r for r in records if is_number(r.get("step"))]
    if not records:
        raise SkipRun(f"{path}: no {{\"step\", ...}} lines (empty or truncated)")
    warnings = [f"{bad} unreadable line(s) in {path} (truncated?)"] if bad else []
    keys = sorted({k for r in records for k, v in r.items() if is_number(v)})
    score = overrides.get("score_key") or next((k for k in keys if SCORE_RE.match(k)), None)
    if score is None or score not in keys:
        raise SkipRun(f"{path}: no eval score ({score or SCORE_DESC}) in any line (set "
                      "[orchestrator.eval], or choose a key with --score_key)")
    m = re.match(r"^(eval/[^/]+)/", score)
    version_key = f"{m.group(1)}/policy_version" if m else None
    skey = next((k for k in SAMPLES_KEYS if k in keys), None)

    rows, guessed = [], 0
    for r in records:
        s = r["step"]
        if skey and is_number(r.get(skey)):          # the orchestrator's step line
            rows.append((s, {"samples": r[skey], "time": r.get("time/step")}))
        elif is_number(r.get("time/forward_backward")):   # the trainer's
            rows.append((s, {"train": r["time/forward_backward"]}))
        if is_number(r.get(score)):
            v = r.get(version_key) if version_key else None
            if not is_number(v):
                v, guessed = s - 1, guessed + 1
            rows.append((s, {"score": r[score], "eval_step": v}))
    if guessed:
        warnings.append(f"{path}: {guessed} eval line(s) without {version_key}: placed at the "
                        "step before their line's")
    if skey is None:
        # Without the orchestrator's counts (e.g. only the trainer's lines): the trainer's
        # time/step and --responses_per_step.
        rows = [(r["step"], {"time": r["time/step"]}) for r in records
                if is_number(r.get("time/step"))] + [x for x in rows if "score" in x[1]]
        warnings.append(f"{path}: no {' or '.join(SAMPLES_KEYS)} lines: wall time from the "
                        "trainer's time/step")
    rows = [(s, {k: v for k, v in d.items() if is_number(v)}) for s, d in rows]
    have = {k for _, d in rows for k in d}
    tmap = {f: k for f, k in _MAP.items() if k in have}
    return with_task(mapped.run_from_rows(name, run_dir, "prime-rl", rows, tmap, source=path,
                                          overrides=dict(overrides, score_key=None),
                                          step_is_update=True, warnings=warnings,
                                          score_name=score), task(run_dir))
