r"""Where a GRPO step's time goes, per task, measured side by side: generation vs update.

Real LLM RL spends most of a step generating long, long-tailed responses; the built-in
arithmetic task (answers of ~3 characters) spends most of it in the update. This times both
tasks (and any other built-in task) at one batch, each from its own cached SFT warm-start
(the main job's: same task, data, model and response cap), with `timing.time_configs`: every
config compiled first, then rounds of one step per task in alternating order, so each task
sees the same minutes of a shared machine. Then one held-out eval per task, alternating.

Per task, medians over the timed steps of: step, rollout (generation + rewards), decode (the
jitted generation alone), update (batch packing + update) seconds, the rollout's fraction of
its step, and the mean response length; per round, the ratio of the tasks' step times.

    python experiments/workload_bench.py                     # arithmetic vs arith_chain, P=16 x G=8
    python experiments/workload_bench.py --steps=4 --eval_prompts=64
"""
from __future__ import annotations

import dataclasses
import os
import platform
import statistics
import tempfile
import time

from absl import flags

from jaxrl_scale.cli import one_line_errors, quiet_logging, run_main
from jaxrl_scale.numbers import write_json

FLAGS = flags.FLAGS
flags.DEFINE_list("tasks", ["arithmetic", "arith_chain"], "Built-in tasks to time side by side.")
flags.DEFINE_integer("prompts", 16, "Prompts per step P (the main job's reference: 16).")
flags.DEFINE_integer("group", 8, "Samples per prompt G (the main job's reference: 8).")
flags.DEFINE_integer("micro_batches", 2, "Micro-batches of whole groups (the main job's: 2).")
flags.DEFINE_integer("warmup", 2, "Untimed steps per task after compiling.")
flags.DEFINE_integer("steps", 8, "Timed steps per task (interleaved rounds).")
flags.DEFINE_integer("eval_prompts", 64, "Held-out prompts of the timed eval (0: none).")
flags.DEFINE_integer("eval_samples", 16, "Samples per prompt of the timed eval.")
flags.DEFINE_integer("eval_rounds", 2, "Timed evals per task (alternating order).")
flags.DEFINE_float("warmstart_accuracy", 0.3, "Greedy held-out accuracy the warm-start stops at.")
flags.DEFINE_list("sft_max_steps", [], "TASK:STEPS caps on a task's warm-start steps (default: "
                  "the main job's SFTConfig.max_steps), e.g. arith_chain:300 on a busy machine.")
flags.DEFINE_string("data_dir", "~/.cache/jaxrl_scale/data", "Where the task data is built.")
flags.DEFINE_string("json_out", "results/workload/workload_bench.json", "Where to write them.")

# The main job's base fields that decide the SFT cache key and the step (cli/sweep.STUDY_BASE),
# so the warm-starts built here are the ones `experiments/sweep_batch.py --task=...` reuses.
_STUDY = {"num_test_examples": 1500, "micro_batches": 2, "max_grad_norm": 10.0,
          "base_lr": 2e-4}


def _med(xs):
    xs = [x for x in xs if x is not None and x == x]
    return statistics.median(xs) if xs else None


def task_config(task: str, run_dir: str):
    """The main job's base config for `task` at the bench's batch, with the task's own
    response cap (config.task_max_new_tokens; the flags' default otherwise)."""
    from jaxrl_scale.experiment.config import (DEFAULT_TASK_KWARGS, TrainConfig,
                                               task_max_new_tokens)
    cap = task_max_new_tokens(task, DEFAULT_TASK_KWARGS) or TrainConfig().max_new_tokens
    return TrainConfig.make(**{**_STUDY, "micro_batches": FLAGS.micro_batches}, task=task,
                            data_dir=FLAGS.data_dir, max_new_tokens=cap,
                            prompts_per_step=FLAGS.prompts, group_size=FLAGS.group,
                            eval_prompts=max(FLAGS.eval_prompts, 1),
                            eval_samples=FLAGS.eval_samples, run_dir=run_dir,
                            tensorboard=False, filter_zero_variance=False)


def summarize(entry: dict) -> dict:
    """Medians of one task's timed steps; `gen_frac` is the median of per-step fractions."""
    fr = [g / s for g, s in zip(entry["gen_s"], entry["step_s"]) if s > 0]
    return {k: _med(entry[k]) for k in ("step_s", "gen_s", "decode_s", "train_s", "update_s",
                                        "response_len")} | {"gen_frac": _med(fr),
                                                            "compile_s": entry["compile_s"]}


def _time_evals(cfgs) -> list[list[float]]:
    from jaxrl_scale.experiment.train import Run
    runs = [Run(c) for c in cfgs]
    loops = [r.initial_state() for r in runs]
    for r, loop in zip(runs, loops):
        r.evaluate(loop)                      # compiles the eval shapes, untimed
    out: list[list[float]] = [[] for _ in runs]
    for k in range(FLAGS.eval_rounds):
        order = range(len(runs)) if k % 2 == 0 else reversed(range(len(runs)))
        for i in order:
            t0 = time.perf_counter()
            runs[i].evaluate(loops[i])
            out[i].append(time.perf_counter() - t0)
    return out


def main(argv):
    del argv
    quiet_logging()
    from jaxrl_scale.experiment.config import ConfigError
    with one_line_errors():
        from jaxrl_scale.data.builders import TASKS
        bad = [t for t in FLAGS.tasks if t not in TASKS or t == "math_jsonl"]
        if bad or len(set(FLAGS.tasks)) != len(FLAGS.tasks) or not FLAGS.tasks:
            raise ConfigError("tasks", f"{FLAGS.tasks} must be distinct built-in generated "
                              "tasks", f"use some of {', '.join(t for t in TASKS if t != 'math_jsonl')}")
        for name in ("prompts", "group", "steps", "eval_samples"):
            if FLAGS[name].value < 1:
                raise ConfigError(name, f"must be >= 1, got {FLAGS[name].value}",
                                  f"set --{name} >= 1")
        caps = {}
        for item in FLAGS.sft_max_steps:
            t, _, n = item.partition(":")
            if t not in FLAGS.tasks or not n.isdigit() or int(n) < 1:
                raise ConfigError("sft_max_steps", f"{item!r} is not TASK:STEPS with one of "
                                  f"{FLAGS.tasks} and STEPS >= 1", "pass e.g. arith_chain:300")
            caps[t] = int(n)
        from jaxrl_scale.experiment.config import validate
        with tempfile.TemporaryDirectory() as tmp:
            for t in FLAGS.tasks:
                validate(task_config(t, os.path.join(tmp, t)))
    from jaxrl_scale.experiment.sft import sft_config_for, sft_warmstart
    from jaxrl_scale.experiment.timing import time_configs
    with tempfile.TemporaryDirectory(prefix="workload_bench_") as tmp:
        cfgs, sft = [], {}
        for t in FLAGS.tasks:
            cfg = task_config(t, os.path.join(tmp, t))
            sft_cfg = sft_config_for(cfg, FLAGS.warmstart_accuracy)
            if t in caps:
                sft_cfg = dataclasses.replace(sft_cfg, max_steps=caps[t])
            path, info = sft_warmstart(sft_cfg)
            sft[t] = {"accuracy": info["accuracy"], "steps": info["steps"],
                      "max_steps": sft_cfg.max_steps, "seconds": info["seconds"],
                      "history": info["history"], "path": path}
            print(f"{t}: warm-start {path} (greedy held-out accuracy {info['accuracy']:.3f}, "
                  f"{info['steps']} steps, {info['seconds']:.0f} s)", flush=True)
            cfgs.append(cfg.replace(init_checkpoint=path))
        t0 = time.time()
        entries = time_configs(cfgs, FLAGS.warmup, FLAGS.steps)
        evals = _time_evals(cfgs) if FLAGS.eval_prompts else [[] for _ in cfgs]
        wall = time.time() - t0
    tasks = {}
    for t, cfg, e, ev in zip(FLAGS.tasks, cfgs, entries, evals):
        tasks[t] = {"max_new_tokens": cfg.max_new_tokens, "warmstart": sft[t],
                    "median": summarize(e), "eval_s": ev, "eval_s_median": _med(ev),
                    "steps": {k: e[k] for k in ("step_s", "gen_s", "decode_s", "train_s",
                                                "update_s", "response_len", "accuracy")
                              if k in e}}
        m = tasks[t]["median"]
        print(f"{t:12s} step {m['step_s']:.3f} s  rollout {m['gen_s']:.3f} s "
              f"(decode {m['decode_s']:.3f})  update {m['train_s']:.3f} s  "
              f"rollout share {m['gen_frac']:.2f}  response {m['response_len']:.1f} tokens  "
              f"eval {tasks[t]['eval_s_median'] or float('nan'):.1f} s")
    ref = FLAGS.tasks[0]
    ratios = {t: _med([a / b for a, b in zip(entries[i]["step_s"], entries[0]["step_s"])])
              for i, t in enumerate(FLAGS.tasks) if i}
    out = {"command": "python experiments/workload_bench.py " + " ".join(
               f"--{n}={FLAGS[n].value if not isinstance(FLAGS[n].value, list) else ','.join(FLAGS[n].value)}"
               for n in ("tasks", "prompts", "group", "micro_batches", "warmup", "steps",
                         "eval_prompts", "eval_samples", "eval_rounds", "sft_max_steps")),
           "batch": {"prompts": FLAGS.prompts, "group": FLAGS.group},
           "interleaved": True, "wall_s": wall, "tasks": tasks,
           f"step_ratio_vs_{ref}": ratios,
           "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                       "loadavg_at_end": list(os.getloadavg())}}
    write_json(FLAGS.json_out, out, indent=2)
    print(f"wrote {FLAGS.json_out}")
    return 0


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
