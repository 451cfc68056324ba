"""The walk from runs to report: every jaxrl_scale file that `jaxrl-analyze` enters, from its
main to the written report, followed call by call (sys.setprofile). Run from the repository
root on a recorded study:

    python results/analysis_walk/walk.py results/main_job/logs

Prints the files in the order first entered, how many distinct steps of the walk return to
each from a file entered later, and the totals: files visited, and returns to a file already
visited. A return to a shared helper (numbers, stats, values, io) is reading, not a detour.
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
    seq = []

    def prof(frame, event, arg):
        if event != "call":
            return
        f = frame.f_code.co_filename
        if f.startswith(PKG) and "/cli/" not in f:
            rel = os.path.relpath(f, PKG)
            if not seq or seq[-1] != rel:
                seq.append(rel)

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


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/main_job/logs")
