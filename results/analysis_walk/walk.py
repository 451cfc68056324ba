"""The walk from runs to report: every jaxrl_scale file that `jaxrl-analyze` enters, from its
main to the written report, followed call by call (sys.setprofile). Run from the repository
root on a recorded study:

    python results/analysis_walk/walk.py results/main_job/logs

Prints the files in the order first entered, how many distinct steps of the walk return to
each from a file entered later, and the totals: files visited, and returns to a file already
visited. A return to a shared helper (numbers, stats, values, io) is reading, not a detour.

Then the returns to files that are not shared helpers, split by who made the call that steps
back: the file's own code (a stage composing its steps, e.g. `analyze` calling its next stage
or a comprehension, after a call into a later file returned), an earlier file (a composer
calling into a file it called before), or a file entered later than the one returned to: a
reach-back, the direction the walk should not take.
"""
import collections
import os
import sys
import tempfile

import jaxrl_scale

PKG = os.path.dirname(jaxrl_scale.__file__)
HELPERS = {"numbers.py", "scaling/stats.py", "scaling/values.py", "scaling/io.py",
           "scaling/records.py", "scaling/summary.py", "report/base.py"}


def main(sweep_dir: str) -> None:
    from absl import flags
    from jaxrl_scale.cli import analyze as cli
    seq, callers = [], []

    def prof(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if f.startswith(PKG) and "/cli/" not in f:
            rel = os.path.relpath(f, PKG)
            if not seq or seq[-1] != rel:
                seq.append(rel)
                callers.append(_caller(frame))

    out = tempfile.mkdtemp()
    flags.FLAGS(["jaxrl-analyze", f"--sweep_dir={sweep_dir}", f"--out={out}", "--n_boot=50"])
    sys.setprofile(prof)
    try:
        cli.main([])
    finally:
        sys.setprofile(None)
    # Structure, not loop counts: the distinct file-to-file steps of the walk; a return is a
    # step into a file first entered earlier than the file it leaves.
    first, edges = [], set()
    for a, b in zip(seq, seq[1:]):
        edges.add((a, b))
    for f in seq:
        if f not in first:
            first.append(f)
    rank = {f: i for i, f in enumerate(first)}
    back = collections.Counter(b for a, b in edges if rank[b] < rank[a])
    print("| file | returned to from later files | shared helper |\n|---|---|---|")
    for f in first:
        print(f"| {f} | {back[f]} | {'yes' if f in HELPERS else ''} |")
    other = sum(n for f, n in back.items() if f not in HELPERS)
    print(f"\nfiles visited: {len(first)}; returns to a file already visited (distinct "
          f"steps): {sum(back.values())}, {other} of them to files that are not shared helpers")
    # Who called into the file stepped back to, per distinct step: the file itself, an
    # earlier file, or a later one (a reach-back); a step made several ways counts as its
    # latest caller.
    how: dict = {}
    for (a, b), c in zip(zip(seq, seq[1:]), callers[1:]):
        if rank[b] < rank[a] and b not in HELPERS:
            kind = "own" if c == b else "reach-back" if c in rank and rank[c] > rank[b] \
                else "earlier"
            order = ("own", "earlier", "reach-back")
            how[(a, b)] = max(how.get((a, b), kind), kind, key=order.index)
    kinds = collections.Counter(how.values())
    print(f"non-helper returns by caller: {kinds['own']} from the file's own code, "
          f"{kinds['earlier']} from an earlier file, {kinds['reach-back']} reach-backs "
          f"(from a later file)")
    for (a, b), k in how.items():
        if k == "reach-back":
            print(f"  reach-back: {a} -> {b}")


def _caller(frame) -> str | None:
    """The package file of the code that made this call (None: outside the package)."""
    b = frame.f_back
    if b is None or not b.f_code.co_filename.startswith(PKG):
        return None
    return os.path.relpath(b.f_code.co_filename, PKG)

if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/main_job/logs")
