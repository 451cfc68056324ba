"""The project's own documentation stays true and self-contained: docs/api.md has one line per
summary.json field (and no line for a field that is gone), every link in README.md and docs/
resolves inside the repository, and the code cites docs/science.md and docs/api.md by
sections that exist. Reads files only (no JAX)."""
import glob
import os
import re

import pytest

from jaxrl_scale.report import apidoc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API_MD = os.path.join(ROOT, "docs", "api.md")
DOC_FILES = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs",
                                                                              "*.md")))
CODE_DIRS = ("jaxrl_scale", "tests", "experiments")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


# ----------------------------------------------------------------------------- api.md


def test_api_md_has_a_line_for_every_summary_field_and_none_for_a_gone_one():
    found = apidoc.problems(_read(API_MD))
    assert not found, ("docs/api.md is out of step with the summary's dataclasses (regenerate "
                       "with `python -m jaxrl_scale.report.apidoc --write docs/api.md` and "
                       "write the TODOs):\n" + "\n".join(found))


def test_every_dataclass_reachable_from_the_summary_has_a_table():
    reach = {c.__name__ for c in apidoc.reachable()}
    assert {"Summary", "AlgoSummary", "RunStats", "ConfigStats", "Power", "Drift"} <= reach
    assert reach <= {c.__name__ for c in apidoc.CLASSES}


def test_every_key_a_summary_json_holds_is_documented():
    """A small simulated sweep through the real analysis (numpy only, under a second): each
    key its summary.json writes at each level has a line in that level's table."""
    import dataclasses

    import numpy as np

    from jaxrl_scale.scaling import calibration
    from jaxrl_scale.scaling.analysis import analyze_runs
    design = dataclasses.replace(calibration.SAMPLED_3_SEEDS, seeds=2,
                                 configs=calibration.SAMPLED_3_SEEDS.configs[:3])
    s = analyze_runs(calibration.simulate_runs(design, np.random.default_rng(0)), "auto",
                     n_boot=20)
    doc = {c.__name__: set(apidoc.json_names(c)) for c in apidoc.CLASSES}
    levels = [("Summary", s), ("Drift", s["drift"]),
              ("CriticalTrainingBatch", s["critical_training_batch"]),
              ("CriticalGenerationBatch", s["critical_generation_batch"])]
    levels += [("ConfigStats", x) for x in s["configs"].values()]
    levels += [("RunStats", x) for x in s["runs"].values()]
    levels += [("AlgoSummary", x) for x in s["algos"].values()]
    levels += [("Power", x) for x in s["power"].values()]
    levels += [("Finding", x) for x in s["findings"]]
    missing = sorted({f"{cls}.{k}" for cls, d in levels for k in set(d) - doc[cls]})
    assert not missing, f"summary.json keys without a line in docs/api.md: {missing}"


def _row(text: str, cls: str, field: str) -> str:
    """The line of `field` in `cls`'s table."""
    start, end = apidoc.sections(text)[cls]
    return next(line for line in text.split("\n")[start:end]
                if line.startswith(f"| `{field}` |"))


def test_the_check_fails_on_a_deleted_a_stale_or_a_mistyped_line():
    text = _read(API_MD)
    row = _row(text, "RunStats", "N_star_ci")
    deleted = text.replace(row + "\n", "", 1)
    assert "RunStats.N_star_ci: a field with no line in the table" in apidoc.problems(deleted)
    stale = text.replace(row, row + "\n| `N_star_gone` | `float` | responses | gone |", 1)
    assert "RunStats.N_star_gone: documented, but no such field" in apidoc.problems(stale)
    mistyped = text.replace(row, row.replace("Interval", "tuple"), 1)
    assert any(p.startswith("RunStats.N_star_ci: type") for p in apidoc.problems(mistyped))
    todo = text.replace(row, "| `N_star_ci` | `Interval \\| None` | TODO | TODO |", 1)
    assert "RunStats.N_star_ci: unit or meaning is TODO" in apidoc.problems(todo)


def test_regenerating_the_tables_keeps_docs_api_md_as_it_is():
    text = _read(API_MD)
    assert apidoc.update(text) == text
    row = _row(text, "ConfigStats", "q_std")
    restored = apidoc.update(text.replace(row + "\n", "", 1))
    assert "| `q_std` |" in restored and apidoc.problems(restored) == [
        "ConfigStats.q_std: unit or meaning is TODO"]


# ----------------------------------------------------------------------------- links

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(\S+)", re.M)
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: the rendered text (code spans and link texts kept),
    lower case, punctuation but '-' and '_' dropped, each space a '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: str) -> set[str]:
    """Every heading anchor of a markdown file (repeats get -1, -2, ... as on GitHub)."""
    seen: dict[str, int] = {}
    out = set()
    for h in _HEADING.findall(_FENCE.sub("", _read(path))):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(path: str) -> list[str]:
    """Link targets of a markdown file, outside code blocks and code spans."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", _read(path)))
    return _LINK.findall(text) + _REF_DEF.findall(text)


def test_slugs_are_githubs():
    assert slug("Analyse your verl / TRL runs") == "analyse-your-verl--trl-runs"
    assert slug("`RunStats`") == "runstats"
    assert slug("metrics.jsonl") == "metricsjsonl"
    assert slug("Predicting the best batch (jaxrl-plan)") == "predicting-the-best-batch-jaxrl-plan"
    assert slug("lr_tuning") == "lr_tuning"


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_every_link_resolves_inside_the_repository(path):
    bad = []
    for target in links(path):
        where, _, anchor = target.partition("#")
        if re.match(r"^[a-z][a-z0-9+.-]*:", where) or where.startswith("//"):
            bad.append(f"{target}: links outside the repository")
            continue
        dest = os.path.realpath(os.path.join(os.path.dirname(path), where)) if where else path
        if os.path.commonpath([dest, ROOT]) != ROOT:
            bad.append(f"{target}: outside the repository")
        elif not os.path.exists(dest):
            bad.append(f"{target}: no such file")
        elif anchor and (not dest.endswith(".md") or anchor not in anchors(dest)):
            bad.append(f"{target}: no heading #{anchor} in {os.path.relpath(dest, ROOT)}")
    assert not bad, f"{os.path.relpath(path, ROOT)}: " + "; ".join(bad)


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: os.path.relpath(p, ROOT))
def test_no_doc_points_at_files_a_clone_does_not_have(path):
    text = _read(path)
    # the design notes beside the repository, which a clone does not have (spelt in pieces
    # so that this file does not name them itself)
    for gone in ("../" + "shared", "shared/" + "docs", "SCIENCE" + ".md", "API" + ".md",
                 "STYLE" + ".md"):
        assert gone not in text, f"{os.path.relpath(path, ROOT)} mentions {gone!r}"


# ----------------------------------------------------------------------------- citations

_CITE = re.compile(r"docs/(science|api)\.md,((?:[ \t]|\n[ \t]*#?)+)(\S[^\n]*(?:\n[^\n]*)?)")


def _code_files():
    for d in CODE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, d)):
            for name in files:
                path = os.path.join(dirpath, name)
                if name.endswith(".py") and path != os.path.abspath(__file__):
                    yield path


def test_code_cites_the_repositorys_own_docs_by_existing_sections():
    headings = {doc: sorted((re.sub(r"`", "", h) for h in _HEADING.findall(
        _FENCE.sub("", _read(os.path.join(ROOT, "docs", f"{doc}.md"))))), key=len, reverse=True)
        for doc in ("science", "api")}
    bad = []
    for path in _code_files():
        text = _read(path)
        rel = os.path.relpath(path, ROOT)
        for old in ("SCIENCE.md", "API.md"):
            if old in text:
                bad.append(f"{rel}: cites {old}, a file the repository does not have")
        for m in _CITE.finditer(text):
            after = re.sub(r"\s*\n[ \t]*#?\s*", " ", m.group(3))
            if not any(after.startswith(h) for h in headings[m.group(1)]):
                bad.append(f"{rel}: 'docs/{m.group(1)}.md, {after[:40]}...' names no heading "
                           f"of docs/{m.group(1)}.md")
    assert not bad, "\n".join(bad)
