"""Roofline decode step time (jaxrl_scale.scaling.roofline) vs the recorded decode_bench
medians on this CPU, with the relative error per batch; writes roofline_validation.json and
the table in README.md's marked block.

The chip is "this machine as decode_bench measured it": per row, the fastest 2048^3 float32
matmul timed between that row's calls, and the run's copy bandwidth (read + write bytes/s).
Two predictions: the pure roofline (a lower bound), and one with efficiencies calibrated on the
two end points of the r5 record (MBU from the smallest batch, MFU from the largest), so the
batches in between are held out.

    python results/roofline_validation/validate_roofline.py
"""
import json
import os

from jaxrl_scale.scaling.roofline import compare_decode_bench

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
RECORDS = ["results/decode_bench_r5.json", "results/decode_bench.json"]
BEGIN, END = "<!-- validation table: begin -->", "<!-- validation table: end -->"


def main():
    out = {"records": {}}
    r5 = json.load(open(os.path.join(ROOT, RECORDS[0])))
    pure = compare_decode_bench(r5)
    # calibration: the smallest batch is memory-bound, the largest compute-bound (see "bound")
    lo, hi = pure[0], pure[-1]
    assert lo["bound"] == "memory" and hi["bound"] == "compute", (lo["bound"], hi["bound"])
    eff = {"bandwidth_efficiency": lo["predicted_step_s"] / lo["measured_step_s"],
           "flops_efficiency": hi["predicted_step_s"] / hi["measured_step_s"]}
    out["calibration"] = {**eff, "from": RECORDS[0],
                          "batches": [lo["batch"], hi["batch"]]}
    lines = []
    for path in RECORDS:
        rec = json.load(open(os.path.join(ROOT, path)))
        rows = compare_decode_bench(rec)
        cal = {r["batch"]: r for r in compare_decode_bench(rec, **eff)}
        for r in rows:
            r["calibrated_step_s"] = cal[r["batch"]]["predicted_step_s"]
            r["calibrated_rel_error"] = cal[r["batch"]]["rel_error"]
        out["records"][path] = {"flags": rec["flags"], "model": rec["model"]["num_params"],
                                "copy_bytes_per_s": rec["machine"]["copy"]["bytes_per_s"],
                                "rows": rows}
        lines.append(f"\n**{path}** ({rec['flags']['model']}, {rec['flags']['dtype']}, "
                     f"prompt {rec['flags']['prompt_len']}, {rec['flags']['new_tokens']} new "
                     f"tokens, median of {rec['flags']['repeats']} calls; copy bandwidth "
                     f"{rec['machine']['copy']['bytes_per_s'] / 1e9:.1f} GB/s)\n")
        lines.append("| B | measured step ms | roofline ms | rel. error | bound | "
                     "calibrated ms | rel. error | matmul peak GF/s | measured prefill ms | "
                     "roofline prefill ms | rel. error |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            held = "" if path != RECORDS[0] or r["batch"] not in (lo["batch"], hi["batch"]) \
                else " (fit)"
            lines.append(
                f"| {r['batch']} | {1e3 * r['measured_step_s']:.2f} | "
                f"{1e3 * r['predicted_step_s']:.2f} | {100 * r['rel_error']:+.0f}% | "
                f"{r['bound']} | {1e3 * r['calibrated_step_s']:.2f} | "
                f"{100 * r['calibrated_rel_error']:+.0f}%{held} | "
                f"{r['peak_flops_per_s'] / 1e9:.0f} | "
                f"{1e3 * r['measured_prefill_s']:.1f} | {1e3 * r['predicted_prefill_s']:.1f} | "
                f"{100 * r['prefill_rel_error']:+.0f}% |")
    lines.append(f"\nCalibrated: bandwidth_efficiency = {eff['bandwidth_efficiency']:.3f} "
                 f"(B={lo['batch']}), flops_efficiency = {eff['flops_efficiency']:.3f} "
                 f"(B={hi['batch']}), both from {RECORDS[0]}.")
    with open(os.path.join(HERE, "roofline_validation.json"), "w") as f:
        json.dump(out, f, indent=2)
    table = "\n".join(lines)
    readme = os.path.join(HERE, "README.md")
    text = open(readme).read() if os.path.exists(readme) else f"{BEGIN}\n{END}\n"
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    with open(readme, "w") as f:
        f.write(text[:a] + "\n" + table + "\n" + text[b:])
    print(table)


if __name__ == "__main__":
    main()
