"""Logs of named scalars (TensorBoard tags, W&B history columns, prime-rl's metrics.jsonl keys)
into the analysis's run record, through a tag map that says what each name means. The one
place that turns "a row of named numbers at a step" into steps, times, responses and evals;
the framework readers only choose the map (their presets) and the rows.

A tag map is ``{field: tag}`` with the fields of `FIELDS`. The analysis needs, per run:
an eval score (``score``), the wall time (``time``: seconds of each step, or ``elapsed``:
seconds since the run started) and the responses (``samples``: responses in each step, or
``responses``: cumulative, or the ``--responses_per_step`` flag).

Steps: rows either carry the optimizer step (a TensorBoard event's step, or the tag named by
``step``), or only their position in the log (a W&B export's ``_step`` counts ``wandb.log``
calls, train and eval alike). In the second case the train rows are numbered 1, 2, ... in
log order and an eval row gets the number of train rows logged before it (it evaluated the
policy they produced).
"""

from __future__ import annotations

import os
import re

import numpy as np

from jaxrl_scale.numbers import is_number
from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers.common import (ReaderError, SkipRun, build_run,
                                                load_structured, positive)

FIELDS = {
    "score": "the eval score",
    "time": "seconds of each step",
    "elapsed": "seconds since the run started",
    "samples": "responses generated in each step",
    "responses": "cumulative responses",
    "step": "the optimizer step (default: the event's step; W&B: the train row's number)",
    "eval_step": "the step of an eval row, when eval rows carry their own",
    "gen": "generation seconds of each step",
    "train": "update seconds of each step",
    "eval_time": "eval seconds inside a step's time (taken out)",
    "eval_n": "eval sample count",
}
_TRAIN_FIELDS = ("time", "elapsed", "samples", "responses", "gen", "train", "eval_time")
MAP_FIX = "pass --tag_map=score=<tag>,time=<tag>,samples=<tag> (or a JSON/YAML file of them)"


def parse_tag_map(spec) -> dict[str, str]:
    """``"score=eval/acc,time=perf/step_s"``, a JSON/YAML file of ``{field: tag}``, or a dict
    -> ``{field: tag}``; ReaderError (field ``tag_map``) for an unknown field or an empty
    tag."""
    if spec is None or spec == "":
        return {}
    if isinstance(spec, dict):
        d = spec
    elif os.path.isfile(spec):
        try:
            d = load_structured(spec)
        except (ValueError, OSError) as e:
            raise ReaderError("tag_map", str(e), "pass a JSON/YAML file of {field: tag}, or "
                              "field=tag,... on the command line") from None
        if not isinstance(d, dict):
            raise ReaderError("tag_map", f"{spec} holds a {type(d).__name__}, not a mapping",
                              "write it as {field: tag}, e.g. {score: eval/accuracy}")
    else:
        d = {}
        for item in str(spec).split(","):
            if not item.strip():
                continue
            if "=" not in item:
                raise ReaderError("tag_map", f"item {item.strip()!r} is not field=tag (and "
                                  f"{spec!r} is not a file)", MAP_FIX)
            k, v = item.split("=", 1)
            d[k.strip()] = v.strip()
    unknown = sorted(set(d) - set(FIELDS))
    if unknown:
        raise ReaderError("tag_map", f"unknown field(s) {', '.join(map(str, unknown))}",
                          f"use {', '.join(FIELDS)}")
    bad = sorted(k for k, v in d.items() if not isinstance(v, str) or not v)
    if bad:
        raise ReaderError("tag_map", f"empty or non-text tag for {', '.join(bad)}",
                          "give each field the name of a tag in the log")
    return dict(d)


def present_only(tmap: dict[str, str], keys) -> dict[str, str]:
    """A preset's fields whose tags the log has: a preset tag the log lacks is not an error
    (what it would give comes from elsewhere, or its absence is named), unlike a tag the user
    mapped."""
    return {f: t for f, t in tmap.items() if t in keys}


def _num(r: dict, key: str | None):
    return r[key] if key and is_number(r.get(key)) else None


def _points(rows, tmap, score, step_is_update):
    """(train points {step: {field: value}}, eval points [{step, score, eval_n}], the number
    of eval rows without a step)."""
    train: dict[float, dict] = {}
    evals, stepless = [], 0
    if step_is_update:
        for s, r in rows:
            ts = _num(r, tmap.get("step")) if tmap.get("step") else s
            if ts is not None:
                got = {f: _num(r, tmap.get(f)) for f in _TRAIN_FIELDS}
                train.setdefault(ts, {}).update({f: v for f, v in got.items() if v is not None})
            if _num(r, score) is not None:
                es = _num(r, tmap.get("eval_step"))
                es = es if es is not None else ts
                if es is not None:
                    evals.append({"step": es, "score": r[score],
                                  "eval_n": _num(r, tmap.get("eval_n"))})
                else:
                    stepless += 1
        train = {s: v for s, v in train.items() if v}
        return train, evals, stepless
    # Rows numbered by log order: a train row is one with the first mapped per-step count or
    # time present in the log (elapsed alone: every row without the score).
    present = {k for _, r in rows for k, v in r.items() if is_number(v)}
    sel = next((tmap[f] for f in ("samples", "responses", "time")
                if tmap.get(f) in present), None)
    k = 0
    for _, r in rows:
        is_train = (_num(r, sel) is not None) if sel else (_num(r, score) is None and
                                                            _num(r, tmap.get("elapsed")))
        if is_train:
            k += 1
            train[k] = {f: v for f in _TRAIN_FIELDS if (v := _num(r, tmap.get(f))) is not None}
        if _num(r, score) is not None:
            evals.append({"step": k, "score": r[score], "eval_n": _num(r, tmap.get("eval_n"))})
    return train, evals, 0


def run_from_rows(name: str, run_dir: str, framework: str, rows: list[tuple[float, dict]],
                  tmap: dict[str, str], *, source: str, overrides: dict,
                  step_is_update: bool, score_pattern: str | None = None,
                  score_desc: str | None = None, warnings: list[str] = (),
                  algo: str | None = None, score_name: str | None = None) -> sio.Run:
    """One run from ``rows`` = [(row step, {name: value})] in log order and a tag map (see
    the module docstring). ``score_pattern`` (a regex) picks the score when the map and
    ``--score_key`` do not (the first match, sorted). ReaderError naming the map field or the
    flag for what the analysis needs and the map or the log lacks; SkipRun (listed as
    skipped) for a run without evals. ``score_name``: the score's name in the log, when the
    rows were renamed."""
    warnings = list(warnings)
    present = sorted({k for _, r in rows for k, v in r.items() if is_number(v)})

    def missing(field: str, tag: str):
        shown = ", ".join(present[:12]) + (", ..." if len(present) > 12 else "")
        return ReaderError("tag_map", f"run {name}: {source} has no {tag!r} values (the "
                           f"{field} tag: {FIELDS[field]}); its tags: {shown or 'none'}",
                           f"map {field}= to a tag the log has")

    score = overrides.get("score_key") or tmap.get("score")
    if not score and score_pattern:
        score = next((k for k in present if re.match(score_pattern, k)), None)
        if score is None:
            raise SkipRun(f"{source}: no eval score ({score_desc or score_pattern}) in any "
                          "record (run evals, or choose a tag with --score_key)")
    if not score:
        raise ReaderError("tag_map", f"run {name}: no score tag given", "add score=<eval tag> "
                          f"to --tag_map ({MAP_FIX})")
    if score not in present:
        raise SkipRun(f"{source}: no eval score ({score}) in any record (run evals, or choose "
                      "a tag with --score_key / the map's score=)")

    tkey = tmap.get("time") if tmap.get("time") in present else None
    ekey = tmap.get("elapsed") if tmap.get("elapsed") in present else None
    if tkey is None and ekey is None:
        if tmap.get("time") or tmap.get("elapsed"):
            f = "time" if tmap.get("time") else "elapsed"
            raise missing(f, tmap[f])
        raise ReaderError("tag_map", f"run {name}: no time tag given (time=: {FIELDS['time']}; "
                          f"or elapsed=: {FIELDS['elapsed']})",
                          "add time=<tag> or elapsed=<tag> to --tag_map")
    for f in ("samples", "responses"):
        if tmap.get(f) and tmap[f] not in present:
            raise missing(f, tmap[f])

    train, evals, stepless = _points(rows, tmap, score, step_is_update)
    if stepless:
        warnings.append(f"{source}: {stepless} {score} value(s) without a step "
                        f"({tmap.get('eval_step') or tmap.get('step')}) left out")
    steps = sorted(s for s in train if s > 0)
    dts = _times(train, steps, "time" if tkey else "elapsed", step_is_update)
    if not dts:
        raise SkipRun(f"{source}: no step with {tkey or ekey} after the first update")
    if ekey and not tkey:
        warnings.append(f"wall time from {ekey} (seconds since the run started: it includes "
                        "eval and logging time)")
    logged = [s for s in steps if "time" in train[s] or "elapsed" in train[s]]
    if step_is_update and (logged[0] != 1 or any(b - a != 1 for a, b in zip(logged, logged[1:]))):
        warnings.append(f"{source}: {tkey or ekey} not logged at every step; the steps between "
                        "are counted at the next logged step's values")

    cum_SR, batch = _responses(train, step_is_update)
    if cum_SR is None:
        batch = positive(overrides.get("responses_per_step"))
        if batch is None:
            raise ReaderError("responses_per_step", f"run {name}: {source} counts no responses "
                              "(no samples= or responses= tag mapped, or none logged)",
                              "pass --responses_per_step=<responses per optimizer step>, or "
                              "map samples=<tag> in --tag_map")
    shown = score_name or score
    warnings.append(f"eval score from {shown}" + ("" if any(
        is_number(e.get("eval_n")) for e in evals) else "; eval sample count not logged"))
    return build_run(name, run_dir, framework, batch, dts, evals, algo=overrides.get("algo")
                     or algo, warnings=warnings, source=source, cum_SR=cum_SR)


def _times(train: dict, steps: list, field: str, step_is_update: bool) -> list[dict]:
    """Per-step ``dt`` (and gen_s / train_s): a per-step time counts for the steps since the
    previous logged one; cumulative seconds are differenced (the first interval, with no
    start, at the next interval's rate); eval time inside a step is taken out."""
    out = []
    if field == "time":
        prev = 0
        for s in steps:
            p = train[s]
            if "time" not in p:
                continue
            gap = (s - prev) if step_is_update else 1
            rec = {"step": s, "dt": (p["time"] - p.get("eval_time", 0.0)) * gap}
            prev = s
            out.append(_extra(rec, p))
        return out
    pts = [(s, train[s]) for s in sorted(train) if "elapsed" in train[s]]
    for (a, pa), (b, pb) in zip(pts[:-1], pts[1:]):
        if b > 0:
            out.append(_extra({"step": b, "dt": pb["elapsed"] - pa["elapsed"]
                               - pb.get("eval_time", 0.0)}, pb))
    if pts and pts[0][0] > 0:
        first, p = pts[0]
        if out:
            rate = out[0]["dt"] / max(out[0]["step"] - first, 1e-12)
            dt = rate * (first if step_is_update else 1)
        else:
            dt = p["elapsed"]
        out.insert(0, _extra({"step": first, "dt": dt}, p))
    return out


def _extra(rec: dict, p: dict) -> dict:
    if "gen" in p:
        rec["gen_s"] = p["gen"]
    if "train" in p:
        rec["train_s"] = p["train"]
    return rec


def _responses(train: dict, step_is_update: bool):
    """((steps, cumulative responses), responses per step) from the logged counts, or
    (None, None) when the log counts none."""
    steps = sorted(s for s in train if s > 0)
    if any("samples" in train[s] for s in steps):
        cs, cum, prev, total = [], [], 0, 0.0
        for s in steps:
            if "samples" not in train[s]:
                continue
            total += train[s]["samples"] * ((s - prev) if step_is_update else 1)
            prev = s
            cs.append(s)
            cum.append(total)
    elif any("responses" in train[s] for s in steps):
        cs = [s for s in steps if "responses" in train[s]]
        cum = [train[s]["responses"] for s in cs]
    else:
        return None, None
    inc = np.diff(np.r_[0.0, cum]) / np.diff(np.r_[0.0, cs])
    return (cs, cum), float(np.median(inc))
