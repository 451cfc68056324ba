"""Readers of other frameworks' logs into the analysis's run record (`scaling.io.Run`):
one module per framework, the only format-specific code. Pure Python + numpy: no torch, no
framework installed at analysis time.

    sweep = read_sweep_dir(DIR, fmt="auto")    # one run per subdirectory, as read_sweep
    # fmt: auto | jaxrl | trl | verl | openrlhf | prime-rl | tensorboard | wandb; overrides:
    # responses_per_step, world_size, gradient_accumulation_steps,
    # per_device_train_batch_size (TRL), train_batch_size, rollout_n (verl), score_key (the
    # eval metric), tag_map (tensorboard / wandb: what each tag means), algo

Auto-detection by the files present: ``trainer_state.json`` (also in ``checkpoint-*/``) is TRL;
a ``*.jsonl`` of ``{"step", "data"}`` records is verl's FileLogger (checked before our own
``metrics.jsonl``, since verl users often name their log that); a ``metrics.jsonl`` of
``{"step", "time", "<group>/<metric>": ...}`` lines is prime-rl's; another ``metrics.jsonl`` is
ours; TensorBoard event files without a ``metrics.jsonl`` are verl's (``timing_s/step``,
``val-core/...`` tags) or OpenRLHF's (``train/timing/step_total``, ``eval/eval_*_pass1``), else
any TensorBoard run (read through ``--tag_map``); a CSV/parquet with ``_step`` and
``_runtime`` columns is a W&B history export (each such file directly in the sweep directory
is a run, as is a subdirectory holding one).
A sweep mixing frameworks is refused (`ReaderError`), as is one mixing tasks (where the runs'
files name their task: ours config.json ``task`` + ``task_kwargs``, verl ``data.train_files``
/ ``data.val_files``, TRL ``dataset_name`` / ``dataset_config``, prime-rl its training
envs; OpenRLHF logs none) and a run whose batch cannot be determined; a run without evals or with an unreadable log is listed as skipped with the reason.
"""

from __future__ import annotations

import dataclasses
import os

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers import (mapped, openrlhf, primerl, tensorboard, trl, verl,
                                         wandb)
from jaxrl_scale.scaling.readers.common import (ReaderError, SkipRun, check_one_task, positive,
                                                task_of)

FORMATS = ("auto", "jaxrl", "trl", "verl", "openrlhf", "prime-rl", "tensorboard", "wandb")
_READERS = {"trl": trl.read_run, "verl": verl.read_run, "openrlhf": openrlhf.read_run,
            "prime-rl": primerl.read_run, "tensorboard": tensorboard.read_run,
            "wandb": wandb.read_run}
_WANT = {"trl": f"no {trl.STATE_FILE} (nor checkpoint-*/{trl.STATE_FILE})",
         "verl": 'no verl FileLogger *.jsonl ({"step": s, "data": {...}} per line) or '
                 'verl TensorBoard event files',
         "openrlhf": "no OpenRLHF TensorBoard event files (train/timing/step_total, "
                     "eval/eval_*_pass1 tags)",
         "prime-rl": f'no prime-rl {primerl.METRICS_FILE} ({{"step", "time", ...}} per line)',
         "tensorboard": "no TensorBoard event files",
         "wandb": "no W&B history export (CSV/parquet with _step and _runtime columns)",
         "jaxrl": f"no {sio.METRICS_FILE}"}
_EVENTS = ("verl", "openrlhf", "tensorboard")    # formats found from event files
OVERRIDE_KEYS = ("responses_per_step", "world_size", "gradient_accumulation_steps",
                 "per_device_train_batch_size", "train_batch_size", "rollout_n", "score_key",
                 "tag_map", "algo")

__all__ = ["FORMATS", "ReaderError", "FrameworkSweep", "check_one_task", "detect_format",
           "read_sweep_dir", "task_of"]


@dataclasses.dataclass
class FrameworkSweep(sio.Sweep):
    format: str = "jaxrl"


def detect_format(run_dir: str) -> str | None:
    """One of FORMATS[1:] or None, from the files in ``run_dir`` (or the file itself: a W&B
    export)."""
    if os.path.isfile(run_dir):
        return "wandb" if wandb.is_export(run_dir, unreadable=True) else None
    if trl.is_run(run_dir):
        return "trl"
    if verl.is_run(run_dir):
        return "verl"
    if primerl.is_run(run_dir):
        return "prime-rl"
    if os.path.isfile(os.path.join(run_dir, sio.METRICS_FILE)):
        return "jaxrl"     # ours (its tensorboard/ event files are a copy of metrics.jsonl)
    if tensorboard.event_files(run_dir):
        tags = tensorboard.tags(run_dir)
        if verl.is_tags(tags):
            return "verl"          # verl's TensorBoard logger alone
        if openrlhf.is_tags(tags):
            return "openrlhf"
        return "tensorboard"
    if wandb.exports(run_dir):
        return "wandb"
    return None


def _as(fmt: str, found: str | None, d: str) -> str | None:
    """--format=tensorboard reads any event directory through the tag map (verl's and
    OpenRLHF's too, unless verl's JSONL is there); --format=verl|openrlhf an event directory
    without a readable scalar, and --format=prime-rl a metrics.jsonl whose first line is cut
    (their readers name the file)."""
    if fmt == "tensorboard" and found in _EVENTS and not verl.is_run(d):
        return "tensorboard"
    if fmt in ("verl", "openrlhf") and found == "tensorboard" and not tensorboard.tags(d):
        return fmt            # no scalar to tell by: the reader names the file
    if fmt == "prime-rl" and found == "jaxrl" and primerl.is_run(d, unreadable=True):
        return "prime-rl"     # its first line cut: the prime-rl reader names the file
    return found


def _read(fmt: str, run_dir: str, overrides: dict) -> sio.Run:
    if fmt == "jaxrl":
        return sio.read_run(run_dir)
    return _READERS[fmt](run_dir, **overrides)


def read_sweep_dir(sweep_dir: str, fmt: str = "auto", **overrides) -> FrameworkSweep:
    """Every subdirectory of ``sweep_dir`` in a known layout is a run (``sweep_dir`` itself,
    when it is one), as is every W&B export file in it; the others are listed as skipped
    with the reason. ``overrides`` (see
    OVERRIDE_KEYS; None values ignored) supply what a log lacks. FileNotFoundError when the
    directory is missing; ReaderError (one line naming the flag) for a sweep mixing frameworks
    or tasks, an unknown format or an undeterminable batch."""
    if fmt not in FORMATS:
        raise ReaderError("format", f"unknown format {fmt!r}",
                          f"pass one of {', '.join(FORMATS)}")
    unknown = sorted(set(overrides) - set(OVERRIDE_KEYS))
    if unknown:
        raise TypeError(f"unknown override(s) {unknown}; known: {OVERRIDE_KEYS}")
    overrides = {k: v for k, v in overrides.items() if v is not None and v != ""}
    mapped.parse_tag_map(overrides.get("tag_map"))      # a bad map: one line, before any data
    for k, v in overrides.items():
        if k not in ("score_key", "algo", "tag_map") and positive(v) is None:
            raise ReaderError(k, f"must be a positive number, got {v!r}",
                              f"pass --{k}=<a positive number> or leave it out")
    if not os.path.isdir(sweep_dir):
        raise FileNotFoundError(f"sweep dir {sweep_dir!r} does not exist or is not a directory")
    own = _as(fmt, detect_format(sweep_dir), sweep_dir)
    if own in _EVENTS and not verl.is_run(sweep_dir) and any(
            tensorboard.event_files(os.path.join(sweep_dir, e)) for e in os.listdir(sweep_dir)
            if os.path.isdir(os.path.join(sweep_dir, e))):
        own = None    # event files found under its runs, not a run's own
    if own == "wandb":
        own = None    # each export file in it is a run
    if own is not None and fmt in ("auto", own):
        dirs = [(os.path.basename(os.path.normpath(sweep_dir)), sweep_dir)]
    else:
        dirs = [(e, os.path.join(sweep_dir, e)) for e in sorted(os.listdir(sweep_dir))
                if os.path.isdir(os.path.join(sweep_dir, e)) and not e.startswith((".", "_"))]
        if fmt in ("auto", "wandb"):
            # every table is listed: an export is a run, another CSV is skipped with why
            dirs += [(os.path.basename(p), p) for p in wandb.tables(sweep_dir)]
    found, skipped = {}, []
    for entry, d in dirs:
        f = _as(fmt, detect_format(d), d)
        if f is None:
            skipped.append({"dir": entry, "reason": _WANT[fmt] if fmt != "auto" else
                            "no log of a known framework (" + "; ".join(
                                _WANT[k][3:] for k in FORMATS[1:]) + ")"})
        elif fmt not in ("auto", f):
            skipped.append({"dir": entry, "reason": f"{_WANT[fmt]} (it is a {f} run)"})
        else:
            found[entry] = (f, d)
    # Event files without a readable scalar cannot say whose they are: in a sweep of one
    # event-file framework they are that framework's (its reader names the broken file).
    blind = [e for e, (f, d) in found.items() if f == "tensorboard" and not tensorboard.tags(d)]
    seen = {f for e, (f, _) in found.items() if e not in blind}
    if blind and len(seen) == 1 and seen <= {"verl", "openrlhf"}:
        for e in blind:
            found[e] = (next(iter(seen)), found[e][1])
    kinds = sorted({f for f, _ in found.values()})
    if len(kinds) > 1:
        which = "; ".join(f"{k}: " + ", ".join(e for e, (f, _) in found.items() if f == k)
                          for k in kinds)
        raise ReaderError("format", f"{sweep_dir} mixes runs from different frameworks "
                          f"({which})", "analyse one framework's runs per sweep directory "
                          "(move the others out, or pass --format=<one> to read only that "
                          "framework's runs)")
    if kinds in ([], ["jaxrl"]) and fmt in ("auto", "jaxrl"):
        own_sweep = sio.read_sweep(sweep_dir)     # ours: read exactly as always
        check_one_task(own_sweep.runs, sweep_dir)
        return FrameworkSweep(own_sweep.runs, own_sweep.skipped, format="jaxrl")
    runs = []
    for entry, (f, d) in found.items():
        try:
            runs.append(_read(f, d, overrides))
        except SkipRun as e:
            skipped.append({"dir": entry, "reason": str(e)})
        except (OSError, ValueError) as e:
            if isinstance(e, (ReaderError, sio.DataError)):
                raise
            skipped.append({"dir": entry, "reason": f"unreadable: {e}"})
    check_one_task(runs, sweep_dir)
    return FrameworkSweep(runs, skipped, format=kinds[0] if kinds else
                          (fmt if fmt != "auto" else "jaxrl"))
