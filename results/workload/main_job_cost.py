"""What the main job would cost on arith_chain: the recorded default study's own step and eval
seconds (results/sweep_default_latest/logs, the arithmetic task) times the chain / arithmetic
ratios measured side by side by workload_bench.json.

Assumptions (stated in README.md): the per-step ratio measured at the reference batch B0 = 128
holds at the design's other batches (64..1024), and the eval ratio measured at 64 prompts x 16
samples holds at the main job's 1500 x 16. Compile, checkpoint and start-up time are left out.

    python results/workload/main_job_cost.py
"""
import glob
import json
import os
import statistics

HERE = os.path.dirname(os.path.abspath(__file__))
LOGS = os.path.join(HERE, "..", "sweep_default_latest", "logs")


def recorded_times(logs: str) -> dict:
    """Training-step and eval seconds of every run of the recorded default study."""
    steps, step_s, gen_s, evals, eval_s = 0, 0.0, 0.0, 0, 0.0
    for path in sorted(glob.glob(os.path.join(logs, "grpo_*", "metrics.jsonl"))):
        for line in open(path):
            r = json.loads(line)
            if "gen_s" in r:
                steps += 1
                step_s += r["gen_s"] + r["train_s"]
                gen_s += r["gen_s"]
            if r.get("eval_s") is not None:
                evals += 1
                eval_s += r["eval_s"]
    return {"steps": steps, "step_s": step_s, "gen_frac": gen_s / step_s, "evals": evals,
            "eval_s": eval_s}


def main() -> None:
    bench = json.load(open(os.path.join(HERE, "workload_bench.json")))
    old, new = bench["tasks"]["arithmetic"], bench["tasks"]["arith_chain"]
    step_ratio = bench["step_ratio_vs_arithmetic"]["arith_chain"]
    eval_ratio = statistics.median(a / b for a, b in zip(new["eval_s"], old["eval_s"]))
    rec = recorded_times(LOGS)
    out = {"recorded_arithmetic": rec, "step_ratio": step_ratio, "eval_ratio": eval_ratio,
           "arith_chain_step_s": rec["step_s"] * step_ratio,
           "arith_chain_eval_s": rec["eval_s"] * eval_ratio}
    out["arith_chain_total_min"] = (out["arith_chain_step_s"] + out["arith_chain_eval_s"]) / 60
    out["arithmetic_total_min"] = (rec["step_s"] + rec["eval_s"]) / 60
    with open(os.path.join(HERE, "main_job_cost.json"), "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
