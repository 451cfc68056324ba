"""Reading runs for the scaling analysis: numpy only, so logs from any framework work.

A run directory holds ``metrics.jsonl`` (one JSON record per line) and optionally
``config.json``. Training records carry ``{"step", "responses", "time_s"}`` (cumulative
retained responses, cumulative wall seconds with eval excluded); a record with
``"score"`` is an eval record. A CSV with a column map can stand in for ``metrics.jsonl``.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import re
from typing import Any, Iterable, Sequence

import numpy as np

from jaxrl_scale.lr_rules import ADAM_RULES   # not optim: the analysis needs no JAX
from jaxrl_scale.numbers import is_number

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.json"
SWEEP_FILE = "sweep.json"          # the study's SweepConfig, written by experiment/sweep.py

_SEED_RE = re.compile(r"[_\-.](?:s|seed)(\d+)$")
_RATIO_RE = re.compile(r"_k(\d+)$")   # the sweep's gen_batch_ratio tag (k != 1 only)
# updates_per_rollout tag (u != 1 only), before any update_epochs and gen_batch_ratio tags
_UPDATES_RE = re.compile(r"_u(\d+)(?=(?:_e\d+)?(?:_k\d+)?$)")
_EPOCHS_RE = re.compile(r"_e(\d+)(?=(?:_k\d+)?$)")   # update_epochs tag (E != 1 only)


@dataclasses.dataclass
class Run:
    """One run: its records split into training and eval, plus what the analysis needs.

    ``batch`` is retained responses per optimizer update (GRPO P*G, PPO P);
    ``batch_source`` says where it came from ("config", "increments" or "" when unknown).
    ``gen_batch_ratio`` k = B_gen / B_train (1: synchronous rollout; k > 1: asynchronous
    partial rollout with k * B_train sequences in flight). ``updates_per_rollout`` u:
    optimizer updates per rollout batch (the sweep's ``_u<u>`` tag; the sample axis stays
    responses generated, whatever u); ``update_epochs`` E: passes over those u minibatches
    (config.json only; E != 1 runs are grouped apart, ``_e<E>``). A refilled run (``refill``,
    DAPO dynamic sampling) stays on the axis of retained responses.
    """
    name: str
    train: list[dict]
    evals: list[dict]
    config: dict = dataclasses.field(default_factory=dict)
    path: str | None = None
    batch: float | None = None
    batch_source: str = ""
    batch_gen: float | None = None
    gen_batch_ratio: float = 1
    updates_per_rollout: int = 1
    update_epochs: int = 1
    lr_rule: str | None = None
    algo: str | None = None
    seed: int | None = None
    group: str = ""
    warnings: list[str] = dataclasses.field(default_factory=list)
    score_is_accuracy: bool = False   # a jaxrl metrics.jsonl: the score is a fraction in [0, 1]
    # DAPO dynamic sampling (config refill): ``responses`` still counts retained responses,
    # the source's N; the refill rounds' generation time is in time_s, so in q.
    refill: bool = False
    # The warm-start the run started from (config.json init_checkpoint or hf_checkpoint):
    # runs from different warm-starts are different blocks of the family-wise test.
    block: str | None = None
    # What the records' ``responses`` (the analysis' N) count: "responses" (as logged) or
    # "tokens" (each record's ``response_tokens`` moved there by `scaling.units.in_n_unit`).
    n_unit: str = "responses"

    def eval_curve(self) -> tuple[np.ndarray, np.ndarray]:
        """(responses, scores) of the eval records, sorted by responses."""
        n = np.array([r["responses"] for r in self.evals], dtype=float)
        s = np.array([r["score"] for r in self.evals], dtype=float)
        return n, s

    def train_series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(responses, values) of training records that carry a finite ``key``."""
        pts = [(r["responses"], r[key]) for r in self.train
                if is_number(r.get(key)) and is_number(r.get("responses"))]
        if not pts:
            return np.zeros(0), np.zeros(0)
        a = np.array(pts, dtype=float)
        return a[:, 0], a[:, 1]




def sweep_dirs(sweep_dir: str | None) -> list[str]:
    """The studies of ``sweep_dir``: one directory, or several given comma-separated (e.g.
    the same study from several warm-starts, analysed together with the warm-starts as
    blocks)."""
    return [d.strip() for d in (sweep_dir or "").split(",") if d.strip()]


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def config_get(config: dict, *keys: str) -> Any:
    """First value found for any of ``keys``, at top level or nested (matched on the last part)."""
    for k in keys:
        if k in config:
            return config[k]
    flat = _flatten(config)
    for k in keys:
        for fk, v in flat.items():
            if fk.rsplit(".", 1)[-1] == k:
                return v
    return None


def strip_seed(name: str) -> str:
    """Config name without a trailing seed tag: ``grpo_P64_G8_sqrt_s0`` -> ``grpo_P64_G8_sqrt``."""
    return _SEED_RE.sub("", name)


def strip_ratio(group: str) -> str:
    """Config name without a gen_batch_ratio tag: ``grpo_P64_G8_sqrt_k2`` -> ``grpo_P64_G8_sqrt``
    (the name of its synchronous twin in a sweep)."""
    return _RATIO_RE.sub("", group)


def seed_from_name(name: str) -> int | None:
    m = _SEED_RE.search(name)
    return int(m.group(1)) if m else None


def lr_rule_from_name(name: str) -> str | None:
    parts = re.split(r"[_\-.]", name.lower())
    for rule in ADAM_RULES:
        if rule in parts:
            return rule
    return None


def batch_from_config(config: dict) -> float | None:
    """Retained responses per update: ``batch_train``, else ``prompts_per_step * group_size``."""
    b = config_get(config, "batch_train", "train_batch", "B_train")
    if is_number(b) and b > 0:
        return float(b)
    p = config_get(config, "prompts_per_step", "num_prompts", "P")
    g = config_get(config, "group_size", "G")
    if is_number(p) and p > 0:
        if is_number(g) and g > 0:
            return float(p) * float(g)
        algo = config_get(config, "algo")
        if isinstance(algo, str) and algo.lower() == "ppo":
            return float(p)
    return None


def gen_batch_ratio(config: dict, batch: float | None, batch_gen: float | None) -> float:
    """k from config.json ``gen_batch_ratio``, else B_gen / B_train, else 1 (synchronous);
    an int when whole."""
    k = config_get(config, "gen_batch_ratio")
    if not (is_number(k) and k > 0):
        k = batch_gen / batch if is_number(batch_gen) and is_number(batch) and batch > 0 else 1
    return int(round(k)) if abs(k - round(k)) < 1e-9 else float(k)


def batch_from_increments(train: list[dict]) -> float | None:
    """Median responses per optimizer step from consecutive training records.

    Uses d(responses)/d(step) when steps are logged, so logging every k steps still
    gives the per-update batch.
    """
    rates = []
    for a, b in zip(train[:-1], train[1:]):
        dn = b.get("responses", np.nan) - a.get("responses", np.nan)
        if not (is_number(dn) and dn > 0):
            continue
        sa, sb = a.get("step"), b.get("step")
        ds = (sb - sa) if (is_number(sa) and is_number(sb)) else 1
        if ds > 0:
            rates.append(dn / ds)
    if not rates and len(train) == 1 and is_number(train[0].get("step")) and train[0]["step"] > 0:
        rates.append(train[0]["responses"] / train[0]["step"])
    return float(np.median(rates)) if rates else None


class DataError(ValueError):
    """Records the analysis refuses (nonsense, not noise). str() is one line:
    `<field>: <file> step <step>: <problem>. Fix: <fix>.`"""

    def __init__(self, field: str, where: str, step, problem: str, fix: str):
        self.field, self.where, self.step = field, where, step
        super().__init__(f"{field}: {where} step {step}: {problem}. Fix: {fix}.")


_CUMULATIVE = ("responses", "time_s")   # cumulative counters: finite, >= 0, non-decreasing
_NUMERIC = ("step", "responses", "time_s", "score")


def check_records(records: list[dict], where: str) -> list[str]:
    """Refuse (DataError) non-finite, negative or decreasing cumulative ``responses`` /
    ``time_s`` (in file order, training and eval records separately); return warnings counting
    what the analysis will ignore: non-finite scores and string-typed numeric fields."""
    last: dict[tuple[bool, str], tuple[float, Any]] = {}
    nan_scores, strings = [], {}
    for r in records:
        step = r.get("step", "?")
        for k in _NUMERIC:
            if isinstance(r.get(k), str):
                strings.setdefault(k, []).append(step)
        if isinstance(r.get("score"), (int, float, np.number)) and \
                not isinstance(r.get("score"), bool) and not math.isfinite(r["score"]):
            nan_scores.append(step)
        for k in _CUMULATIVE:
            v = r.get(k)
            if not isinstance(v, (int, float, np.number)) or isinstance(v, bool):
                continue
            if not math.isfinite(v):
                raise DataError(k, where, step, f"is {v}, not a finite number",
                                f"fix or remove that record (a cumulative {k} is finite)")
            if v < 0:
                raise DataError(k, where, step, f"is negative ({v})",
                                f"fix or remove that record (a cumulative {k} is >= 0)")
            key = ("score" in r, k)
            if key in last and v < last[key][0]:
                raise DataError(k, where, step, f"decreases ({v} after {last[key][0]} at step "
                                f"{last[key][1]})", f"{k} must be cumulative: fix the log, or "
                                "split restarted runs into separate files")
            last[key] = (v, step)
    warnings = []
    if nan_scores:
        warnings.append(f"{len(nan_scores)} eval record(s) with a non-finite score ignored "
                        f"(first at step {nan_scores[0]}) in {where}")
    for k, steps in strings.items():
        warnings.append(f"{len(steps)} record(s) with a string-typed {k!r} ignored "
                        f"(first at step {steps[0]}) in {where}")
    return warnings


SCORE_RANGE = (0.0, 1.0)   # a jaxrl eval score: the fraction of samples with reward > 0


def check_scores(runs: Sequence["Run"], score_range: tuple[float, float] | str | None = "auto"
                 ) -> None:
    """DataError for the first eval score outside `score_range`: (lo, hi) for every run; None
    for any finite score (a reward on another scale); "auto": SCORE_RANGE for the runs whose
    score is an accuracy (jaxrl's metrics.jsonl, `score_is_accuracy`), nothing for the others
    (TRL's eval_reward, verl's val-core means, CSV columns are on their task's own scale). An
    accuracy of 1.5 or -0.2 is no accuracy: a corrupt record or a reward logged as the score,
    which N* would read silently."""
    if score_range is None:
        return
    for run in runs:
        if score_range == "auto":
            if not run.score_is_accuracy:
                continue
            lo, hi = SCORE_RANGE
        else:
            lo, hi = score_range
        for r in run.evals:
            v = r.get("score")
            if is_number(v) and not lo <= v <= hi:
                where = os.path.join(run.path, METRICS_FILE) if run.score_is_accuracy and \
                    run.path else (run.path or run.name)
                raise DataError("score", where, r.get("step", "?"),
                                f"is {v:g}, outside [{lo:g}, {hi:g}]" +
                                (" (this score is an accuracy)" if run.score_is_accuracy else ""),
                                "pass --score_range=any (or LO,HI) if the score is a reward on "
                                "another scale, or fix the score key / the record")


def make_run(name: str, records: Iterable[dict], config: dict | None = None,
             path: str | None = None, source: str | None = None) -> Run:
    """Split records into training and eval, fill eval ``responses`` from ``step`` if needed,
    and infer batch, lr rule, algo, seed and config group. DataError for nonsense records
    (`check_records`; ``source`` names the file in the message, else ``path`` or ``name``)."""
    config = dict(config or {})
    records = [r for r in records if isinstance(r, dict)]
    warnings: list[str] = check_records(records, source or path or name)
    train = [r for r in records if "score" not in r and is_number(r.get("responses"))
                and is_number(r.get("time_s"))]
    if not train:
        # Some exporters put time on the eval rows too: use them rather than lose q.
        train = [r for r in records if is_number(r.get("responses")) and is_number(r.get("time_s"))]
    train.sort(key=lambda r: (r["responses"], r.get("step", 0)))

    evals = []
    steps_n = [(r["step"], r["responses"]) for r in records
                if is_number(r.get("step")) and is_number(r.get("responses"))]
    steps_n.sort()
    for r in records:
        if not is_number(r.get("score")):
            continue
        r = dict(r)
        if not is_number(r.get("responses")):
            if is_number(r.get("step")) and steps_n:
                s, n = np.array(steps_n, dtype=float).T
                r["responses"] = float(np.interp(r["step"], np.r_[0.0, s], np.r_[0.0, n]))
            else:
                warnings.append(f"eval record without responses or step dropped: {r}")
                continue
        evals.append(r)
    evals.sort(key=lambda r: r["responses"])

    run = Run(name=name, train=train, evals=evals, config=config, path=path, warnings=warnings,
              refill=refilled(config),
              block=config_get(config, "init_checkpoint", "hf_checkpoint") or None)
    b = batch_from_config(config)
    if scheduled(config):   # the batch moves during the run: no one B (scaling/configs.py)
        run.batch, run.batch_source = None, "schedule"
    elif b is not None:
        run.batch, run.batch_source = b, "config"
    else:
        b = batch_from_increments(train)
        if b is not None:
            run.batch, run.batch_source = b, "increments"
    bg = config_get(config, "batch_gen", "B_gen")
    if not is_number(bg):
        bgs = [r["batch_gen"] for r in train if is_number(r.get("batch_gen"))]
        bg = float(np.median(bgs)) if bgs else None
    run.batch_gen = float(bg) if is_number(bg) else None
    run.gen_batch_ratio = gen_batch_ratio(config, run.batch, run.batch_gen)

    # Top level only: a nested "name" is usually the model's or the dataset's.
    cname = config.get("name") or config.get("run_name")
    cname = cname if isinstance(cname, str) and cname else name
    rule = config_get(config, "lr_rule", "lr_scaling", "lr_scale_rule")
    run.lr_rule = rule.lower() if isinstance(rule, str) else lr_rule_from_name(cname)
    algo = config_get(config, "algo", "algorithm")
    run.algo = algo.lower() if isinstance(algo, str) else None
    seed = config_get(config, "seed")
    run.seed = int(seed) if is_number(seed) else seed_from_name(name)
    run.updates_per_rollout = updates_per_rollout(config, cname)
    E = config_get(config, "update_epochs")
    run.update_epochs = int(E) if is_number(E) and E >= 1 else 1
    group = _with_updates(strip_seed(cname), run.updates_per_rollout)
    run.group = _with_ratio(_with_epochs(group, run.update_epochs), run.gen_batch_ratio)
    return run


def scheduled(config: dict) -> str | None:
    """The run's batch schedule (config.json ``batch_schedule``: "noise" or "steps"; None for
    a fixed batch): its batch per update is a trajectory, not one B."""
    kind = config_get(config, "batch_schedule")
    return kind if isinstance(kind, str) and kind not in ("", "none") else None


def refilled(config: dict) -> bool:
    """A run with DAPO dynamic sampling (config.json ``refill``; rl/refill.py)."""
    return config_get(config, "refill") is True


def updates_per_rollout(config: dict, name: str) -> int:
    """u from config.json ``updates_per_rollout``, else the name's ``_u<u>`` tag, else 1."""
    u = config_get(config, "updates_per_rollout")
    if is_number(u) and u >= 1:
        return int(u)
    m = _UPDATES_RE.search(strip_seed(name))
    return int(m.group(1)) if m else 1


def _with_updates(group: str, u: int) -> str:
    """A u != 1 run never shares a group with the one-update seeds of its config: the sweep's
    names carry ``_u<u>`` already (before any ``_k<k>``); other names get it there."""
    if u == 1 or _UPDATES_RE.search(group):
        return group
    m = _EPOCHS_RE.search(group) or _RATIO_RE.search(group)
    at = m.start() if m else len(group)
    return f"{group[:at]}_u{u}{group[at:]}"


def _with_epochs(group: str, E: int) -> str:
    """An update_epochs E != 1 run never shares a group with the one-pass seeds of its
    config (E passes make E times the updates on the same samples): ``_e<E>`` after any
    ``_u<u>``, before any ``_k<k>``; a name that carries it already is kept."""
    if E == 1 or _EPOCHS_RE.search(group):
        return group
    m = _RATIO_RE.search(group)
    at = m.start() if m else len(group)
    return f"{group[:at]}_e{E}{group[at:]}"


def _with_ratio(group: str, k: float) -> str:
    """A k != 1 run never shares a group with the synchronous seeds of its config: the sweep's
    names carry ``_k<k>`` already; other names get it."""
    if k == 1 or _RATIO_RE.search(group):
        return group
    return f"{group}_k{k:g}"


def read_jsonl(path: str) -> tuple[list[dict], int]:
    """Records (JSON objects) of a JSONL file and the number of other lines (e.g. a half-written
    tail)."""
    records, _, bad = read_jsonl_lines(path)
    return records, bad


def read_jsonl_lines(path: str) -> tuple[list[dict], list[int], int]:
    """`read_jsonl` plus each record's 1-based line number in the file."""
    records, lines, bad = [], [], 0
    with open(path) as f:
        for i, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                bad += 1
                continue
            if isinstance(rec, dict):
                records.append(rec)
                lines.append(i)
            else:   # valid JSON but not a record (a list, a number): counted, not dropped silently
                bad += 1
    return records, lines, bad


def check_step_order(records: list[dict], lines: Sequence[int], where: str) -> None:
    """DataError where a record's step does not increase over the previous record of its kind
    (training records and eval records each in file order). One training loop writes steps
    1, 2, 3, ... and a resume first cuts the file back to its checkpoint, so a repeated or
    smaller step means two trainings wrote into one run directory (0,1,2,2,3,0,...) or logs
    were concatenated: the interleaved curves would be read as one run."""
    last: dict[bool, tuple[float, int]] = {}
    for r, line in zip(records, lines):
        step = r.get("step")
        if not is_number(step):
            continue
        kind = "score" in r
        if kind in last and step <= last[kind][0]:
            prev, prev_line = last[kind]
            what = "eval" if kind else "training"
            raise DataError("step", f"{where} line {line}", step,
                            (f"repeats the {what} record of line {prev_line}" if step == prev
                             else f"goes back from {what} step {prev:g} at line {prev_line}") +
                            " (two trainings wrote into one run directory, or logs were "
                            "concatenated)",
                            "give each training its own --run_dir; split or trim this file "
                            "to one training's records")
        last[kind] = (step, line)


def read_run(run_dir: str, name: str | None = None) -> Run:
    """A run directory with ``metrics.jsonl`` and an optional ``config.json``."""
    mpath = os.path.join(run_dir, METRICS_FILE)
    if not os.path.isfile(mpath):
        raise FileNotFoundError(f"{run_dir}: no {METRICS_FILE}")
    records, lines, bad = read_jsonl_lines(mpath)
    check_step_order(records, lines, mpath)
    config = {}
    cpath = os.path.join(run_dir, CONFIG_FILE)
    if os.path.isfile(cpath):
        with open(cpath) as f:
            config = json.load(f)
    name = name or os.path.basename(os.path.normpath(run_dir))
    run = make_run(name, records, config, path=run_dir, source=mpath)
    run.score_is_accuracy = True
    if bad:
        run.warnings.append(f"{bad} unreadable line(s) in {mpath}")
    return run


def parse_columns(spec: str | dict | None) -> dict[str, str]:
    """``"step:global_step,responses:samples"`` -> {ours: theirs}."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, dict):
        return dict(spec)
    out = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        if ":" not in item:
            raise ValueError(f"column map item {item!r} is not ours:theirs")
        ours, theirs = item.split(":", 1)
        out[ours.strip()] = theirs.strip()
    return out


def _num(x: str) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def read_csv_run(path: str, columns: str | dict | None = None, name: str | None = None,
                 config: dict | None = None) -> Run:
    """A run from a CSV. ``columns`` maps our field names to CSV headers; unmapped headers
    keep their own names. Rows with a score are eval points; rows with time are training."""
    cmap = parse_columns(columns)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        headers = reader.fieldnames or []
        missing = [theirs for theirs in cmap.values() if theirs not in headers]
        if missing:
            raise ValueError(f"{path}: column(s) {missing} not in CSV header {headers}")
        inverse = {theirs: ours for ours, theirs in cmap.items()}
        records = []
        for row in reader:
            rec = {}
            for h, v in row.items():
                if h is None:
                    continue
                x = _num(v)
                if x is not None:
                    rec[inverse.get(h, h)] = x
            if rec:
                records.append(rec)
    name = name or os.path.splitext(os.path.basename(path))[0]
    # A CSV row often holds both a training point and a score: keep it in both roles.
    train_recs = [{k: v for k, v in r.items() if k != "score"} for r in records
                                if "time_s" in r]
    eval_recs = [r for r in records if "score" in r]
    return make_run(name, train_recs + eval_recs, config, path=path)


@dataclasses.dataclass
class Sweep:
    runs: list[Run]
    skipped: list[dict]  # {"dir", "reason"}


def read_sweep(sweep_dir: str) -> Sweep:
    """Every subdirectory with ``metrics.jsonl`` is a run; others are listed as skipped.

    A directory that itself holds ``metrics.jsonl`` is a one-run sweep.
    """
    if not os.path.isdir(sweep_dir):
        raise FileNotFoundError(f"sweep dir {sweep_dir!r} does not exist or is not a directory")
    if os.path.isfile(os.path.join(sweep_dir, METRICS_FILE)):
        return Sweep([read_run(sweep_dir)], [])
    runs, skipped = [], []
    for entry in sorted(os.listdir(sweep_dir)):
        d = os.path.join(sweep_dir, entry)
        if not os.path.isdir(d) or entry.startswith((".", "_")):  # "_": study stages
            continue
        if not os.path.isfile(os.path.join(d, METRICS_FILE)):
            skipped.append({"dir": entry, "reason": f"no {METRICS_FILE}"})
            continue
        try:
            runs.append(read_run(d))
        except DataError:
            raise           # nonsense data is refused, never skipped quietly
        except (OSError, ValueError) as e:
            skipped.append({"dir": entry, "reason": f"unreadable: {e}"})
    return Sweep(runs, skipped)


def group_runs(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs grouped by config name without the seed."""
    groups: dict[str, list[Run]] = {}
    for r in runs:
        groups.setdefault(r.group or r.name, []).append(r)
    return groups
