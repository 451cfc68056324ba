"""No library module over MAX_LINES lines: a module that outgrows it is split where its data
lives, so a reader finds one subject per file."""
import os

MAX_LINES = 600
LIBRARY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "jaxrl_scale")


def line_counts(root: str) -> dict[str, int]:
    """{path relative to root's parent: lines} of every .py file under root (as `wc -l`)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                with open(path, "rb") as f:
                    out[os.path.relpath(path, os.path.dirname(root))] = f.read().count(b"\n")
    return out


def test_no_library_module_is_over_the_limit():
    counts = line_counts(LIBRARY)
    assert counts, f"no .py files found under {LIBRARY}"
    over = sorted((n, path) for path, n in counts.items() if n > MAX_LINES)
    assert not over, (f"{len(over)} module(s) over {MAX_LINES} lines; split each where its "
                      "data lives: " + ", ".join(f"{path} ({n})" for n, path in reversed(over)))
