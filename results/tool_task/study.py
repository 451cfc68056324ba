"""What the calculator tool and the retry environment do after RL, over independent
warm-starts (the README beside this file records one run of each).

    PYTHONPATH=. python results/tool_task/study.py --out=/tmp/tool --study=tool
    PYTHONPATH=. python results/tool_task/study.py --out=/tmp/retry --study=retry
    PYTHONPATH=. python results/tool_task/study.py --out=/tmp/tool --study=tool --analyze_only

`tool`: arith_chain with 1-3 operations (`max_ops=3`; the default 1-6 is out of this CPU's
reach at 8 warm-starts), 32 tokens per episode. Warm-start w is its own SFT (seed w, a fixed
500 steps for every w, no accuracy stop) on examples of which half are calculator
conversations (`--tool_demos=0.5`) and half shown-work solutions, so one warm-start holds
both skills. From it, two GRPO runs with RL seed w and the same budget of episodes: `tool`
(`--env=jaxrl_scale.data.envs:calc`) and `none` (no environment: the answer by shown work).
They start from the same weights, so their difference is what the tool adds during RL and
evaluation for one model, paired by warm-start.

`retry`: the default arithmetic task from the main job's warm-starts (SFT seed w to 0.3
greedy accuracy, cached in the home cache): `retry` (`--env=jaxrl_scale.data.envs:retry`,
at most 3 answers, 48 tokens per episode) and `single` (the plain run).

Every variance source is drawn per warm-start (SFT init and data order, RL seed, eval
samples), so the 90% t intervals over warm-starts (scipy.stats.t, df = W - 1) are about the
population of warm-starts. Runs resume: run again after a stop and finished work is kept.
Writes OUT/results.json and prints the tables the README records.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import time

import numpy as np
from scipy import stats

CHAIN = ["--task=arith_chain", '--task_kwargs={"digits": 2, "ops": "+-", "max_ops": 3}',
         "--max_new_tokens=32"]
ARITH = ["--task=arithmetic", "--num_test_examples=1500"]
# study: (task flags, warm-start flags, {arm: RL flags}); the first two arms are paired
STUDIES = {
    "tool": (CHAIN, ["--max_steps=500", "--eval_every=250", "--target_accuracy=1.0",
                     "--tool_demos=0.5"],
             {"tool": ["--env=jaxrl_scale.data.envs:calc"], "none": []}),
    "retry": (ARITH, [],   # the main job's warm-starts (SFT to 0.3 greedy accuracy)
              {"retry": ["--env=jaxrl_scale.data.envs:retry", "--max_new_tokens=48"],
               "single": []}),
}
RL = ["--prompts_per_step=16", "--group_size=8", "--max_steps=1000", "--eval_prompts=128",
      "--eval_samples=4", "--checkpoint_every=8", "--tensorboard=false"]
LEVEL = 0.90


def _cli(module: str, args: list[str], log: str) -> str:
    """Run a jaxrl_scale CLI in a subprocess, its output to `log`; its stdout on success."""
    cmd = [sys.executable, "-c", f"from jaxrl_scale.cli.{module} import run; run()", *args]
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=f, text=True)
        f.write(p.stdout)
    if p.returncode:
        raise RuntimeError(f"{module} failed (exit {p.returncode}); see {log}")
    return p.stdout


def warm_start(out: str, study: str, w: int) -> str:
    task, sft, _ = STUDIES[study]
    cache = [f"--cache_dir={out}/sft", f"--data_dir={out}/data"] if study == "tool" else []
    text = _cli("sft", [*task, *sft, f"--seed={w}", *cache],
                os.path.join(out, "logs", f"sft_{study}_w{w}.log"))
    return re.search(r"warm-start checkpoint: (\S+)", text).group(1)


def rl_run(out: str, study: str, arm: str, w: int, ckpt: str, budget: int) -> str:
    task, _, arms = STUDIES[study]
    run_dir = os.path.join(out, "runs", f"{arm}_w{w}")
    data = [f"--data_dir={out}/data"] if study == "tool" else []
    _cli("train", [*task, *RL, *arms[arm], *data, f"--run_dir={run_dir}",
                   f"--init_checkpoint={ckpt}", f"--seed={w}", f"--max_responses={budget}",
                   f"--eval_every={budget // 128 // 4}"],
         os.path.join(out, "logs", f"{arm}_w{w}.log"))
    return run_dir


def run_all(out: str, study: str, warm_starts: int, budget: int, jobs: int) -> None:
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        ckpts = dict(zip(range(warm_starts), pool.map(lambda w: warm_start(out, study, w),
                                                      range(warm_starts))))
        print(f"[{time.time() - t0:6.0f} s] {warm_starts} warm-starts", flush=True)
        futs = {pool.submit(rl_run, out, study, arm, w, ckpts[w], budget): f"{arm}_w{w}"
                for w in range(warm_starts) for arm in STUDIES[study][2]}
        for f in concurrent.futures.as_completed(futs):
            f.result()
            print(f"[{time.time() - t0:6.0f} s] run {futs[f]} done", flush=True)


def _records(run_dir: str) -> list[dict]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_summary(run_dir: str) -> dict:
    recs = _records(run_dir)
    evals = [r for r in recs if "score" in r]
    train = [r for r in recs if "reward_mean" in r]
    late = train[len(train) // 2:]   # the second half of training
    mean = lambda k: float(np.mean([r[k] for r in late])) if late and k in late[0] else None
    return {"start": evals[0]["score"], "end": evals[-1]["score"],
            "responses": evals[-1]["responses"], "time_s": evals[-1]["time_s"],
            "turns": mean("env_turns"), "tool_calls": mean("env_tool_calls"),
            "response_len": mean("response_len")}


def interval(xs: list[float]) -> dict:
    """Mean and its two-sided LEVEL t interval over the units in `xs`."""
    x = np.asarray(xs, float)
    half = stats.t.ppf(0.5 + LEVEL / 2, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return {"mean": float(x.mean()), "lo": float(x.mean() - half),
            "hi": float(x.mean() + half), "n": len(x)}


def analyze(out: str, study: str, warm_starts: int) -> dict:
    arms = list(STUDIES[study][2])
    runs = {arm: [run_summary(os.path.join(out, "runs", f"{arm}_w{w}"))
                  for w in range(warm_starts)] for arm in arms}
    res = {"study": study, "level": LEVEL, "warm_starts": warm_starts, "runs": runs,
           "arms": {}, "paired": {}}
    for arm, rs in runs.items():
        res["arms"][arm] = {k: interval([r[k] for r in rs]) for k in ("start", "end")}
        res["arms"][arm]["gain"] = interval([r["end"] - r["start"] for r in rs])
    a, b = arms[:2]
    for k in ("start", "end"):
        res["paired"][f"{a}_minus_{b}_{k}"] = interval(
            [x[k] - y[k] for x, y in zip(runs[a], runs[b])])
    return res


def show(res: dict) -> None:
    f = lambda d: f"{d['mean']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"
    print(f"{res['warm_starts']} warm-starts; means with {res['level']:.0%} t intervals")
    print(f"{'arm':6} {'before RL':>22} {'after RL':>22} {'gain':>22}  turns  calls")
    for arm, a in res["arms"].items():
        rs = res["runs"][arm]
        turns = np.mean([r["turns"] or 1.0 for r in rs])
        calls = np.mean([r["tool_calls"] or 0.0 for r in rs])
        print(f"{arm:6} {f(a['start']):>22} {f(a['end']):>22} {f(a['gain']):>22}  "
              f"{turns:5.2f}  {calls:5.2f}")
    for k, d in res["paired"].items():
        print(f"{k}: {f(d)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--study", choices=sorted(STUDIES), default="tool")
    ap.add_argument("--warm_starts", type=int, default=8)
    ap.add_argument("--budget", type=int, default=4096, help="episodes per RL run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--analyze_only", action="store_true")
    a = ap.parse_args()
    if not a.analyze_only:
        run_all(a.out, a.study, a.warm_starts, a.budget, a.jobs)
    res = analyze(a.out, a.study, a.warm_starts)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    show(res)


if __name__ == "__main__":
    main()
