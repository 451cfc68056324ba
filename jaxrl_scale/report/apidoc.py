"""The field tables of docs/api.md (generated from the summary's dataclasses) and their check.

docs/api.md documents summary.json with one table per dataclass (a section headed by the
class name, one row per field: name, type, unit, meaning). The field names and types come
from the dataclasses (`dataclasses.fields`, the annotations as written); the unit and the
meaning are prose, kept in docs/api.md itself. So:

    python -m jaxrl_scale.report.apidoc --check docs/api.md   # exit 1 listing each problem
    python -m jaxrl_scale.report.apidoc --write docs/api.md   # regenerate every table

``--write`` rewrites each table in declaration order with the current names and types, keeps
the unit and meaning of every field it already had, and gives a new field "TODO" (which
``--check`` then reports until someone writes it); a field that no longer exists is dropped.
``--check`` (and tests/test_docs.py) fail on a field without a row, a row without a field, a
type that differs from the annotation, a TODO, and a reachable dataclass without a section.
Numpy only, no JAX.
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import typing

from jaxrl_scale.scaling.findings import Finding
from jaxrl_scale.scaling.records import (CriticalGenerationBatch, CriticalTrainingBatch, Drift,
                                         Power, Regime)
from jaxrl_scale.scaling.summary import (ALIASES, PRIMARY_KEYS, AlgoSummary, ConfigStats,
                                         RunStats, Summary, json_fields)
from jaxrl_scale.scaling.values import FLAT_KEYS, ConfigRatios, FamilyTest, Ratio

# The documented classes, in the order of docs/api.md's sections.
CLASSES = (Summary, AlgoSummary, RunStats, ConfigStats, ConfigRatios, Ratio, FamilyTest,
           CriticalTrainingBatch, CriticalGenerationBatch, Regime, Power, Drift, Finding)

# Fields annotated as a plain container whose values are dataclasses: (class, field) -> type.
CONTAINS = {(Summary, "algos"): AlgoSummary, (Summary, "runs"): RunStats,
            (Summary, "configs"): ConfigStats, (Summary, "power"): Power,
            (Summary, "findings"): Finding, (ConfigRatios, "boot"): Ratio,
            (ConfigRatios, "t"): Ratio, (FamilyTest, "ratios"): Ratio}


def _flat_type(key: str) -> str:
    return "list | None" if key.endswith(("_ci", "_ci_boot", "_sci")) else "float | None"


def _summary_extras() -> dict[str, str]:
    """summary.json's top-level keys that are not Summary fields: the primary algorithm's
    numbers (`summary.PRIMARY_KEYS`), their short aliases and the per-algorithm maps."""
    algo = {f.name: f.type for f in dataclasses.fields(AlgoSummary)}
    out = {k: algo[k] for k in PRIMARY_KEYS}
    out.update({k: algo[v] for k, v in ALIASES.items()})
    out.update(targets="dict", reference_configs="dict")
    return out


# JSON keys a class writes beyond its fields: name -> type.
EXTRA_KEYS = {Summary: _summary_extras(), ConfigStats: {k: _flat_type(k) for k in FLAT_KEYS}}


def json_names(cls) -> dict[str, str]:
    """{name: type} of every row `cls`'s table must have: its fields, then its extra keys."""
    out = {f.name: str(f.type) for f in json_fields(cls)}   # not the in-memory arrays
    out.update(EXTRA_KEYS.get(cls, {}))
    return out


def _types_in(hint) -> set:
    """Dataclasses named anywhere in a resolved annotation (Optional, unions, generics)."""
    found = set()
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        found.add(hint)
    for arg in typing.get_args(hint):
        found |= _types_in(arg)
    return found


def reachable(root=Summary) -> set:
    """Every dataclass reachable from `root` through field annotations and `CONTAINS`."""
    seen, todo = set(), [root]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            todo += list(_types_in(hints.get(f.name)))
            if (cls, f.name) in CONTAINS:
                todo.append(CONTAINS[(cls, f.name)])
    return seen


# ----------------------------------------------------------------------------- markdown

_HEADING = re.compile(r"^(#{2,4})\s+(.*?)\s*$")
_ROW = re.compile(r"^\|\s*`([^`]+)`\s*\|(.*)\|\s*$")
HEADER = "| field | type | unit | meaning |\n|---|---|---|---|"


def _cells(rest: str) -> list[str]:
    """The cells after the first of a table row, split on unescaped pipes."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", rest)]


def sections(text: str) -> dict[str, tuple[int, int]]:
    """{class name: (first line, end line)} of each section headed by a documented class name
    (`### Name`, the name alone)."""
    lines = text.split("\n")
    names = {c.__name__ for c in CLASSES}
    starts = [(i, m.group(2)) for i, line in enumerate(lines)
              if (m := _HEADING.match(line))]
    out = {}
    for j, (i, title) in enumerate(starts):
        if title in names:
            out[title] = (i, starts[j + 1][0] if j + 1 < len(starts) else len(lines))
    return out


def parse_rows(text: str, cls) -> dict[str, list[str]] | None:
    """{field: [type, unit, meaning]} of the table in `cls`'s section; None without one."""
    span = sections(text).get(cls.__name__)
    if span is None:
        return None
    rows = {}
    for line in text.split("\n")[span[0]:span[1]]:
        m = _ROW.match(line)
        if m:
            cells = _cells(m.group(2))
            rows[m.group(1)] = [c.strip("`") if k == 0 else c for k, c in enumerate(cells)]
    return rows


def _esc(s: str) -> str:
    return s.replace("|", "\\|")


def render_table(cls, old: dict[str, list[str]] | None = None) -> str:
    """`cls`'s markdown table: one row per name of `json_names`, unit and meaning from `old`
    where it has the name, else TODO."""
    old = old or {}
    lines = [HEADER]
    for name, typ in json_names(cls).items():
        unit, meaning = (old[name][1:3] + ["", ""])[:2] if name in old else ("TODO", "TODO")
        lines.append(f"| `{name}` | `{_esc(typ)}` | {_esc(unit)} | {_esc(meaning)} |")
    return "\n".join(lines)


def problems(text: str) -> list[str]:
    """What docs/api.md's tables lack or have too many of, one line each (empty: in sync)."""
    out = []
    for cls in sorted(reachable() - set(CLASSES), key=lambda c: c.__name__):
        out.append(f"{cls.__name__}: a dataclass reachable from Summary without a section in "
                   "apidoc.CLASSES")
    for cls in CLASSES:
        rows = parse_rows(text, cls)
        if rows is None:
            out.append(f"{cls.__name__}: no section '### {cls.__name__}' with a field table")
            continue
        want = json_names(cls)
        for name in want:
            if name not in rows:
                out.append(f"{cls.__name__}.{name}: a field with no line in the table")
        for name, cells in rows.items():
            if name not in want:
                out.append(f"{cls.__name__}.{name}: documented, but no such field")
                continue
            if not cells or cells[0] != want[name]:
                out.append(f"{cls.__name__}.{name}: type {cells[0] if cells else None!r}, "
                           f"the annotation is {want[name]!r}")
            if "TODO" in cells[1:]:
                out.append(f"{cls.__name__}.{name}: unit or meaning is TODO")
    return out


def update(text: str) -> str:
    """`text` with every class's table regenerated (`render_table`), descriptions kept; a
    class without a section gets one at the end."""
    for cls in CLASSES:
        span = sections(text).get(cls.__name__)
        old = parse_rows(text, cls)
        table = render_table(cls, old)
        if span is None:
            text = text.rstrip("\n") + f"\n\n### {cls.__name__}\n\n{table}\n"
            continue
        lines = text.split("\n")
        body = lines[span[0]:span[1]]
        rows = [i for i, line in enumerate(body) if line.startswith("|")]
        if rows:
            body = body[:rows[0]] + table.split("\n") + body[rows[-1] + 1:]
        else:
            body = body + table.split("\n") + [""]
        text = "\n".join(lines[:span[0]] + body + lines[span[1]:])
    return text


def main(argv: typing.Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path", nargs="?", default="docs/api.md")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--check", action="store_true", help="report problems, exit 1 if any")
    g.add_argument("--write", action="store_true", help="regenerate the tables in place")
    a = p.parse_args(argv)
    with open(a.path) as f:
        text = f.read()
    if a.write:
        new = update(text)
        if new != text:
            with open(a.path, "w") as f:
                f.write(new)
        text = new
    if not a.write and not a.check:
        for cls in CLASSES:
            print(f"### {cls.__name__}\n\n{render_table(cls, parse_rows(text, cls))}\n")
        return 0
    found = problems(text)
    for line in found:
        print(f"{a.path}: {line}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
