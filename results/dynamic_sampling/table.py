"""Per-arm step statistics of the runs run.py made: python table.py RUNS_DIR"""
import glob
import json
import os
import statistics as st
import sys


def main(root):
    print("| arm | steps | retained | generated | generated / retained | rounds per step: mean, "
          "max | zero-variance share of generated | steps short at the cap | gen_s, train_s "
          "per step (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in ("plain", "filter", "refill", "refillq4"):
        rows = []
        for d in sorted(glob.glob(os.path.join(root, f"{arm}_P16_G8_s*"))):
            with open(os.path.join(d, "metrics.jsonl")) as f:
                recs = [json.loads(line) for line in f]
            tr = [r for r in recs if r["step"] > 0 and "score" not in r]
            gen = sum(r["generated"] for r in tr)
            rows.append(dict(
                steps=len(tr), ret=tr[-1]["responses"], gen=tr[-1]["responses_generated"],
                ratio=tr[-1]["responses_generated"] / tr[-1]["responses"],
                rmean=st.mean(r.get("gen_rounds", 1) for r in tr),
                rmax=max(r.get("gen_rounds", 1) for r in tr),
                zv=sum(r["zero_var_groups"] for r in tr) * 8 / gen,
                short=sum(1 for r in tr if r.get("refill_short", 0)),
                gs=st.median(r["gen_s"] for r in tr), ts=st.median(r["train_s"] for r in tr)))

        def col(k):
            return "/".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k])
                            for r in rows)
        print(f"| {arm} | {col('steps')} | {col('ret')} | {col('gen')} | {col('ratio')} | "
              f"{col('rmean')}, {col('rmax')} | {col('zv')} | {col('short')} | {col('gs')}, "
              f"{col('ts')} |")


if __name__ == "__main__":
    main(sys.argv[1])
