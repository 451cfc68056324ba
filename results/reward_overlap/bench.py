"""Reward scoring overlapped with decode (--reward_overlap, rl/scoring.py): a rollout's wall time
with a slow reward, scored during the decode vs after it. A benchmark, not a test.

    python results/reward_overlap/bench.py      # about 2 minutes on 2 CPU cores

Prints the medians and writes results/reward_overlap/results.json (README.md quotes it).

The reward sleeps --reward_s seconds per response (a simulated judge or remote verifier: the
thread waits, the CPU is free). Two rollouts on the default CPU policy (rl_cpu, random
weights; lengths set per example, a long tail, as in tests/test_engine.py):
- engine: the slot engine's asynchronous partial rollout (rl/partial.py), B_gen = 2 B_train;
  one step = one `next_batch` (+ score_rollout when off);
- generate: `generate_rollout` in 4 chunks (--generate_chunk = B / 4); one step = one rollout.
Each round runs every (rollout, on/off) for --steps consecutive steps, the four in a random
order (interleaved, so drift hits them alike); a round's figure is its mean step time (the
engine's steps are bursty: a batch may be ready at once, the next wait for the long tail),
and the figures printed are medians over --rounds rounds.
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

import jax
import numpy as np

from jaxrl_scale.data.reward_runner import RewardFn
from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer
from jaxrl_scale.rl.partial import PartialRollout
from jaxrl_scale.rl.rollout import SamplingSettings, generate_rollout, score_rollout
from jaxrl_scale.rl.scoring import RewardScorer
from jaxrl_scale.sampling import SamplingConfig
from jaxrl_scale.sampling.engine import SlotEngine

HERE = os.path.dirname(os.path.abspath(__file__))
TOK = CharTokenizer()


def sleepy(seconds):
    def reward(response, example):
        time.sleep(seconds)
        return float(response[:1].isdigit())
    return reward


def examples(seed, M):
    """An endless stream of prompts whose responses are capped at a long-tail length."""
    rng, i = np.random.default_rng(seed), 0
    while True:
        cap = int(M if rng.random() < 0.2 else rng.integers(M // 8, M // 3))
        yield {"prompt": f"{i % 89}+{i % 7}=", "answer": "", "cap": cap}
        i += 1


class EngineCase:
    def __init__(self, cfg, params, args, on):
        stream = examples(0, args.max_new_tokens)
        eng = SlotEngine(cfg, slots=2 * args.P * args.G, prompt_len=8,
                         max_new_tokens=args.max_new_tokens, eos_id=None, pad_id=TOK.pad_id,
                         steps_per_call=8)
        self.reward = RewardFn(sleepy(args.reward_s))
        self.pr = PartialRollout(eng, lambda: next(stream), TOK.encode_prompt,
                                 prompts_per_step=args.P, group_size=args.G, max_staleness=1,
                                 limit_fn=lambda ex: ex["cap"],
                                 scorer=RewardScorer(TOK, self.reward) if on else None)
        self.params, self.on, self.v = params, on, 0

    def step(self):
        r = self.pr.next_batch(self.params, version=self.v, seed=self.v)
        self.v += 1
        rewards = r.rewards_B if self.on else score_rollout(r, TOK, self.reward)[0]
        return r, rewards


class GenerateCase:
    def __init__(self, cfg, params, args, on):
        self.stream = examples(1, args.max_new_tokens)
        self.cfg, self.params, self.args, self.on, self.v = cfg, params, args, on, 0
        self.reward = RewardFn(sleepy(args.reward_s))
        self.scorer = RewardScorer(TOK, self.reward) if on else None
        # every row at the stream's caps would need limits generate does not take: M for all
        self.s = SamplingSettings(SamplingConfig(1.0, 0, 1.0), args.max_new_tokens, None,
                                  TOK.pad_id, args.P * args.G // 4)

    def step(self):
        ex = [next(self.stream) for _ in range(self.args.P)]
        r = generate_rollout(self.cfg, self.params, ex, self.args.G, TOK.encode_prompt, self.s,
                             seed=self.v, scorer=self.scorer)
        self.v += 1
        rewards = r.rewards_B if self.on else score_rollout(r, TOK, self.reward)[0]
        return r, rewards


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reward_s", type=float, default=0.02, help="seconds per response")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per case per round")
    ap.add_argument("--P", type=int, default=8)
    ap.add_argument("--G", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=112)
    ap.add_argument("--model", default="rl_cpu")
    args = ap.parse_args()
    cfg = get_config(args.model)
    params = init_params(cfg, 0)
    cases = {(kind, on): make(cfg, params, args, on)
             for kind, make in (("engine", EngineCase), ("generate", GenerateCase))
             for on in (True, False)}
    for c in cases.values():          # compile, and fill the engine's pipeline
        c.step()
        c.step()
    times = {k: [] for k in cases}
    waits = {k: [] for k in cases}
    rng = random.Random(0)
    t_all, load0 = time.perf_counter(), os.getloadavg()[0]
    for _ in range(args.rounds):
        order = list(cases)
        rng.shuffle(order)
        for k in order:
            t0, wait = time.perf_counter(), 0.0
            for _ in range(args.steps):
                r, _ = cases[k].step()
                wait += r.reward_wait_s or 0.0
            times[k].append((time.perf_counter() - t0) / args.steps)
            waits[k].append(wait / args.steps)
    out = {"command": " ".join(["python results/reward_overlap/bench.py", *sys.argv[1:]]),
           "reward_s_per_response": args.reward_s, "P": args.P, "G": args.G,
           "max_new_tokens": args.max_new_tokens, "model": args.model, "rounds": args.rounds,
           "steps_per_round": args.steps, "cpus": os.cpu_count(),
           "jax_backend": jax.default_backend(), "wall_s": time.perf_counter() - t_all,
           "load_avg_1min_start": load0, "load_avg_1min_end": os.getloadavg()[0],
           "cases": {}}
    for kind in ("engine", "generate"):
        on, off = (statistics.median(times[(kind, x)]) for x in (True, False))
        wait = statistics.median(waits[(kind, True)])
        out["cases"][kind] = {"step_s_on": on, "step_s_off": off, "off_over_on": off / on,
                              "reward_wait_s_on": wait,
                              "reward_s_per_step": args.reward_s * args.P * args.G,
                              "round_means_on": times[(kind, True)],
                              "round_means_off": times[(kind, False)],
                              "round_ratios": [b / a for a, b in zip(times[(kind, True)],
                                                                     times[(kind, False)])]}
        print(f"{kind:9s} median step: overlap on {on:.3f} s, off {off:.3f} s, off/on "
              f"{off / on:.2f}; waited for rewards after decode (on) {wait:.3f} s; reward "
              f"time per step {args.reward_s * args.P * args.G:.2f} s")
    with open(os.path.join(HERE, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(f"wall {out['wall_s']:.0f} s; results.json written")


if __name__ == "__main__":
    main()
