"""The walk from runs to report: every jaxrl_scale file that `jaxrl-analyze` enters, from its
main to the written report, followed call by call (sys.setprofile). Run from the repository
root on a recorded study:

    python results/analysis_walk/walk.py results/main_job/logs

Prints the files in the order first entered, how often each is re-entered after the walk
has left it, and the totals: files visited, and returns to a file already visited. A
return to a shared helper (numbers, stats, values, io) is reading, not a detour.
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
    first, returns = [], collections.Counter()
    for f in seq:
        if f in first:
            returns[f] += 1
        else:
            first.append(f)
    print("| file | re-entered | shared helper |\n|---|---|---|")
    for f in first:
        print(f"| {f} | {returns[f]} | {'yes' if f in HELPERS else ''} |")
    other = sum(n for f, n in returns.items() if f not in HELPERS)
    print(f"\nfiles visited: {len(first)}; returns to a file already visited: "
          f"{sum(returns.values())} ({other} to files that are not shared helpers)")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "results/main_job/logs")
