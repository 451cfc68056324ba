"""What the tracked files must not hold: absolute paths of the machines the records were made on
(a record names its paths relative to the repository root, or to ~ for the user's cache), and,
in the code, tests and docs, numbers of the issue tracker (a comment says what the code does
and why, which outlives the tracker).

The patterns are built from pieces so that this file does not match them; it is the one file
exempted all the same. Skipped where git or a git checkout is missing (e.g. an sdist).
"""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
THIS = os.path.relpath(os.path.abspath(__file__), ROOT).replace(os.sep, "/")

# A path that starts at the machine's root in the work, root or home/<name> directory (not the
# same names inside a relative path).
_START = rb"(?<![\w.~-])/"
MACHINE_PATH = re.compile(_START + rb"(?:wo" + rb"rk|ro" + rb"ot)/|" + _START + rb"ho" +
                          rb"me/[A-Za-z_][\w.-]*/")
# the word issue (or issues), a space, an optional '#', a number
TRACKER = re.compile(r"\b[Ii]ssues?" + r" #?[0-9]+")
# Where a tracker number must not appear: the code, tests, experiments, docs, and the prose and
# scripts of the records.
TRACKER_DIRS = ("jaxrl_scale/", "tests/", "experiments/", "docs/")
TRACKER_FILES = ("README.md",)


def _tracked() -> list[str]:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    try:
        top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True,
                               capture_output=True, text=True).stdout.split("\0")
    except (subprocess.CalledProcessError, OSError):
        pytest.skip("not a git checkout")
    if not top or os.path.realpath(top) != os.path.realpath(ROOT):
        pytest.skip("the repository root is not the top of a git checkout")
    # tracked but deleted in the work tree: nothing to read
    return [f for f in files if f and f != THIS and os.path.isfile(os.path.join(ROOT, f))]


def _read(path: str) -> bytes:
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


def _hits(path: str, pattern: re.Pattern, text) -> list[str]:
    """'path:line: text' of every line of `text` that `pattern` matches."""
    nl = b"\n" if isinstance(text, bytes) else "\n"
    out = []
    for i, line in enumerate(text.split(nl), 1):
        if pattern.search(line):
            shown = line.decode("utf-8", "replace") if isinstance(line, bytes) else line
            out.append(f"{path}:{i}: {shown.strip()[:160]}")
    return out


def _names_tracker(path: str) -> bool:
    if path in TRACKER_FILES or path.startswith(TRACKER_DIRS):
        return True
    return path.startswith("results/") and path.endswith((".md", ".py"))


def test_no_machine_paths_in_tracked_files():
    hits = []
    for path in _tracked():
        data = _read(path)
        if MACHINE_PATH.search(data):
            hits += _hits(path, MACHINE_PATH, data)
    assert not hits, (f"{len(hits)} line(s) name an absolute path of a machine; write it "
                      "relative to the repository root (or ~/ for the home cache):\n"
                      + "\n".join(hits[:50]))


def test_no_tracker_numbers_in_code_tests_and_docs():
    hits = []
    for path in filter(_names_tracker, _tracked()):
        data = _read(path)
        if b"\0" in data:   # binary
            continue
        text = data.decode("utf-8", "replace")
        if TRACKER.search(text):
            hits += _hits(path, TRACKER, text)
    assert not hits, (f"{len(hits)} line(s) name an issue-tracker number; say what the code "
                      "does and why instead:\n" + "\n".join(hits[:50]))


def test_the_patterns_catch_what_they_are_for():
    home = "/ho" + "me/"
    for bad in ("/wo" + "rk/main/results", '"/ro' + 'ot/.cache/x"', home + "alice/x",
                "--dir=/wo" + "rk/x"):
        assert MACHINE_PATH.search(bad.encode()), bad
    for fine in ("results/sweep_default/logs", "~/.cache/jaxrl_scale/sft", "results/wo" + "rk/x",
                 home[:-1], "/tmp/x"):
        assert not MACHINE_PATH.search(fine.encode()), fine
    for bad in ("Iss" + "ue 40: x", "(iss" + "ue 27, item 8)", "iss" + "ue #12",
                "iss" + "ues 39 and 40"):
        assert TRACKER.search(bad), bad
    for fine in ("a tissue 3", "the issue is", "sweep_default_iss" + "ue16"):
        assert not TRACKER.search(fine), fine
