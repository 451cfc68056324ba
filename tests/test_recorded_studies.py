"""Every recorded study in results/ re-analyses to the summary.json it holds, number for number.

A study directory holds its runs' logs (logs/), the analysis command (the last
``experiments/analyze.py`` line of command.txt) and the summary.json that command wrote. This
guards refactors of scaling/ (the same numbers before and after) and shows that a
record can be reproduced from its logs alone.
"""

import glob
import json
import math
import os
import re
import shlex

import pytest

from jaxrl_scale.numbers import to_jsonable
from jaxrl_scale.scaling import analysis

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _studies() -> list[str]:
    """Study directories: command.txt and summary.json, and the runs it analyses (its logs/,
    or the studies its command names, e.g. several warm-starts analysed together)."""
    def runs_there(d):
        if os.path.isdir(os.path.join(d, "logs")):
            return True
        try:
            flags = analyze_flags(os.path.join(d, "command.txt"))
        except AssertionError:      # no analysis command: not a study record
            return False
        dirs = [x for x in flags.get("sweep_dir", "").split(",") if x]
        return bool(dirs) and all(os.path.isdir(os.path.join(ROOT, x)) for x in dirs)
    return sorted(os.path.dirname(p) for p in glob.glob(os.path.join(ROOT, "results", "*",
                                                                       "command.txt"))
                  if os.path.isfile(os.path.join(os.path.dirname(p), "summary.json"))
                  and runs_there(os.path.dirname(p)))


def analyze_flags(command_txt: str) -> dict:
    """The flags of the last `experiments/analyze.py` command in a command.txt (lines joined
    at a trailing backslash, comments skipped)."""
    text = re.sub(r"\\\n\s*", " ", open(command_txt).read())
    lines = [ln for ln in text.splitlines()
             if ln.strip().startswith("python experiments/analyze.py")]
    if not lines:
        raise AssertionError(f"{command_txt}: no `python experiments/analyze.py` line")
    flags = {}
    for arg in shlex.split(lines[-1])[2:]:
        k, _, v = arg.lstrip("-").partition("=")
        flags[k] = v
    return flags


def _same(a, b, where="summary") -> list[str]:
    """Paths at which two JSON values differ (floats compared exactly, NaN equal to NaN)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{where}.{k}: only in one" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _same(a[k], b[k], f"{where}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{where}: length {len(a)} vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _same(x, y, f"{where}[{i}]")]
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return []
    return [] if a == b and type(a) is type(b) else [f"{where}: {a!r} vs {b!r}"]


STUDIES = _studies()


def test_results_hold_recorded_studies():
    assert len(STUDIES) >= 4, STUDIES   # sweep_default, sweep_replicate, study_full,
    # dynamic_sampling


@pytest.mark.parametrize("study", STUDIES, ids=os.path.basename)
def test_recorded_study_reanalyses_to_its_summary(study, monkeypatch):
    flags = analyze_flags(os.path.join(study, "command.txt"))
    monkeypatch.chdir(ROOT)   # sweep_dir is recorded relative to the repository root
    kw = {"target_fraction": float(flags["target_fraction"])} if "target_fraction" in flags \
        else {}
    if "target" in flags:
        kw["target"] = float(flags["target"]) if flags["target"] != "auto" else "auto"
    if "reference" in flags:
        kw["reference"] = flags["reference"]
    got = json.loads(json.dumps(to_jsonable(analysis.analyze_sweep(flags["sweep_dir"], **kw))))
    with open(os.path.join(study, "summary.json")) as f:
        want = json.load(f)
    if "n_unit" not in want:   # recorded before summary.json declared N's unit
        assert got.pop("n_unit") == "responses"
    diffs = _same(got, want)
    assert not diffs, f"{len(diffs)} differences, first: {diffs[:10]}"


def _summaries() -> list[str]:
    """The summaries of the recorded studies (re-analysed, the runs' own and the reruns'):
    older records elsewhere in results/ predate fields that from_json renames."""
    return sorted(p for s in STUDIES for p in glob.glob(os.path.join(s, "**", "summary.json"),
                                                        recursive=True))


@pytest.mark.parametrize("path", _summaries(), ids=lambda p: os.path.relpath(p, ROOT))
def test_typed_summary_round_trips_recorded_summaries(path):
    """summary.json -> Summary (typed ratios, each with its source) -> summary.json: the same
    keys and numbers, for every recorded summary (the studies' re-analyses and the runs' own)."""
    from jaxrl_scale.scaling.summary import Summary
    with open(path) as f:
        want = json.load(f)
    got = json.loads(json.dumps(to_jsonable(Summary.from_json(want).to_json())))
    derived = {"summary_path", "report_path", "errors", "lr_tune"}   # beside the summary
    if "n_unit" not in want:   # recorded before summary.json declared N's unit
        assert got.pop("n_unit") == "responses"
    diffs = _same(got, {k: v for k, v in want.items() if k not in derived})
    assert not diffs, f"{len(diffs)} differences, first: {diffs[:10]}"


def test_headline_ratios_name_their_source():
    """r_q from the timing pass where it ran, the in-run estimate kept beside it; T/T0 = r_N /
    r_q in every row of the recorded default study (the pass's r_q is the one T/T0 used)."""
    from jaxrl_scale.scaling.summary import Summary
    from jaxrl_scale.scaling.values import BOOTSTRAP, TIMING_PASS
    with open(os.path.join(ROOT, "results", "sweep_default", "summary.json")) as f:
        s = Summary.from_json(json.load(f))
    tested = [st for st in s.configs.values() if not st.is_reference]
    assert tested
    for st in tested:
        r = st.ratios
        assert r.headline("r_q").source == TIMING_PASS and r.in_run("r_q").is_t
        assert r.headline("r_N").is_t and r.boot["r_N"].source == BOOTSTRAP
        assert st.r_q == r.r_q_pass.value and st.r_q_in_run == r.in_run("r_q").value
        assert abs(st.T_over_T0 - st.r_N / st.r_q) <= 1e-9 * st.T_over_T0
