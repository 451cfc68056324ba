r"""Synchronous vs asynchronous partial rollout at equal B_train, measured side by side.

Two settings, each run as rotating rounds of sync (gen_batch_ratio 1), partial
(gen_batch_ratio --ratio, max_staleness ratio - 1, in-flight KV caches kept across updates) and
partial_rkv (the same with --recompute_kv: in-flight caches rebuilt under the new weights), so
every ratio compares measurements taken minutes apart on the same machine state:

  rl_cpu  the full GRPO loop (experiment.train.Run: rollout, rewards, update) on the built-in
          task, from --init_checkpoint (e.g. the SFT warm-start; random init if empty);
          sync uses `generate`, partial the slot engine.
  small   rollout only (the ~29M `small` preset, random init, --small_updates: the policy
          version advances as if updates happened, params fixed), responses of varied length:
          each prompt group gets a length cap drawn from a long tail (lognormal, median
          --small_median tokens, capped at --small_max_new); sync is the slot engine at ratio 1
          (the same tokens as `generate`), so only the scheduling differs.

  engine_vs_generate  the decode cost itself: one full round (every row --small_max_new
          tokens, EOS off) of --small_prompts x --small_group rows on `small`, the slot engine
          (one ring of cache columns) vs `generate` (phased cache chunks), alternating.

Per setting and mode, medians over rounds of: retained responses/s (rl_cpu: responses / loop
time; small: responses / rollout time), rollout and update seconds per step, decode steps per
update, slot occupancy (mean live fraction of the B_gen slots per decode step), live rows per
decode step, staleness mean/max and the off-policy token fraction; plus the per-round ratio
partial / sync of responses/s.

    python experiments/rollout_bench.py                       # both settings, ~10 min on 2 cores
    python experiments/rollout_bench.py --settings=small --rounds=3
"""
from __future__ import annotations

import os
import platform
import statistics
import time

from absl import flags

from jaxrl_scale.cli import INF, one_line_errors, quiet_logging, run_main
from jaxrl_scale.numbers import write_json

FLAGS = flags.FLAGS
flags.DEFINE_list("settings", ["rl_cpu", "small", "engine_vs_generate"],
                  "Which settings to run.")
flags.DEFINE_integer("ratio", 2, "gen_batch_ratio k of the partial mode.")
flags.DEFINE_integer("rounds", 3, "Rounds per mode (alternating sync / partial).")
flags.DEFINE_integer("prompts", 32, "rl_cpu: prompts per step P.")
flags.DEFINE_integer("group", 8, "rl_cpu: samples per prompt G.")
flags.DEFINE_integer("steps", 10, "rl_cpu: GRPO steps per round.")
flags.DEFINE_integer("discard", 2, "rl_cpu: leading steps of a round left out (warm-up).")
flags.DEFINE_string("init_checkpoint", "", "rl_cpu: orbax params to start from (SFT).")
flags.DEFINE_integer("small_prompts", 16, "small: prompts per update P.")
flags.DEFINE_integer("small_group", 4, "small: samples per prompt G.")
flags.DEFINE_integer("small_updates", 4, "small: updates per round.")
flags.DEFINE_integer("small_max_new", 128, "small: response cap N.")
flags.DEFINE_float("small_median", 16.0, "small: median response length of the long tail.")
flags.DEFINE_integer("seed", 0, "Seed.")
flags.DEFINE_string("json_out", "results/rollout_bench.json", "Where to write the figures.")

MODES = ("sync", "partial", "partial_rkv")   # partial_rkv: --recompute_kv after every update


def _med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _rl_cpu_round(mode: str) -> dict:
    from jaxrl_scale.experiment.config import TrainConfig
    from jaxrl_scale.experiment.train import Run
    k = 1 if mode == "sync" else FLAGS.ratio
    cfg = TrainConfig.make(prompts_per_step=FLAGS.prompts, group_size=FLAGS.group,
                           init_checkpoint=FLAGS.init_checkpoint, gen_batch_ratio=k,
                           recompute_kv=mode == "partial_rkv",
                           seed=FLAGS.seed, eval_prompts=1, run_dir="/tmp/rollout_bench")
    run = Run(cfg)
    update, _ = run.compile()
    loop = run.initial_state()
    recs, times = [], []
    for step in range(1, FLAGS.steps + 1):
        t0 = time.perf_counter()
        loop, rec = run.train_step(loop, update)
        times.append(time.perf_counter() - t0)
        recs.append(rec)
    kept, kt = recs[FLAGS.discard:], times[FLAGS.discard:]
    live = [r["slot_occupancy"] for r in kept if r.get("decode_steps")]
    return {"responses_per_s": sum(r["retained"] for r in kept) / sum(kt),
            "rollout_s": _med([r["gen_s"] for r in kept]),
            "update_s": _med([r.get("update_s") for r in kept]),
            "response_len": _med([r["response_len"] for r in kept]),
            "decode_steps": _med([r.get("decode_steps") for r in kept]),
            "slot_occupancy": _med(live),
            "staleness_mean": _med([r.get("staleness_mean", 0.0) for r in kept]),
            "staleness_max": max(r.get("staleness_max", 0) for r in kept),
            "off_policy_token_frac": _med([r.get("off_policy_token_frac", 0.0) for r in kept]),
            "batch_gen": cfg.batch_gen, "batch_train": cfg.batch_train}


_SMALL = {}


def _small_round(mode: str, round_index: int) -> dict:
    import jax
    import numpy as np
    from jaxrl_scale.models import get_config, init_params
    from jaxrl_scale.rl.partial import PartialRollout, staleness_metrics
    from jaxrl_scale.sampling.engine import SlotEngine
    if not _SMALL:
        cfg = get_config("small")
        _SMALL.update(cfg=cfg, params=init_params(cfg, FLAGS.seed))
    cfg, params = _SMALL["cfg"], _SMALL["params"]
    P, G, N = FLAGS.small_prompts, FLAGS.small_group, FLAGS.small_max_new
    k = 1 if mode == "sync" else FLAGS.ratio
    rng = np.random.default_rng([FLAGS.seed, round_index])   # same lengths for both modes

    def next_example():
        cap = int(min(N, max(1, round(np.exp(rng.normal(np.log(FLAGS.small_median), 1.0))))))
        prompt = list(map(int, rng.integers(3, cfg.vocab_size, size=16)))
        return {"prompt": prompt, "cap": cap}

    eng = SlotEngine(cfg, slots=k * P * G, prompt_len=16, max_new_tokens=N, eos_id=None,
                     pad_id=0, steps_per_call=8)
    rkv = mode == "partial_rkv"
    eng.warm(params, range(G, k * P * G + 1, G), rebuild=rkv)
    pr = PartialRollout(eng, next_example, lambda p: p, prompts_per_step=P, group_size=G,
                        max_staleness=k - 1, limit_fn=lambda ex: ex["cap"], recompute_kv=rkv)
    pr.next_batch(params, version=0, seed=0)     # warm-up update, not timed
    out, t = [], 0.0
    for v in range(1, FLAGS.small_updates + 1):
        t0 = time.perf_counter()
        b = pr.next_batch(params, version=v, seed=jax.random.PRNGKey(v))
        t += time.perf_counter() - t0
        out.append({"lengths_B": b.lengths_B, "slot_occupancy": b.slot_occupancy,
                    "decode_steps": b.decode_steps,
                    **staleness_metrics(b.versions_BM, b.lengths_B, v)})
    n = sum(len(b["lengths_B"]) for b in out)
    occ = [b["slot_occupancy"] for b in out if b["decode_steps"]]
    return {"responses_per_s": n / t, "rollout_s": t / len(out),
            "response_len": float(np.mean([b["lengths_B"].mean() for b in out])),
            "decode_steps": _med([b["decode_steps"] for b in out]),
            "slot_occupancy": _med(occ),
            "live_rows_per_step": _med(occ) * k * P * G if occ else None,
            "staleness_mean": _med([b["staleness_mean"] for b in out]),
            "staleness_max": max(b["staleness_max"] for b in out),
            "off_policy_token_frac": _med([b["off_policy_token_frac"] for b in out]),
            "batch_gen": k * P * G, "batch_train": P * G}


def _engine_vs_generate() -> dict:
    import jax
    import numpy as np
    from jaxrl_scale.models import get_config, init_params
    from jaxrl_scale.sampling import generate
    from jaxrl_scale.sampling.engine import SlotEngine
    cfg = get_config("small")
    params = init_params(cfg, FLAGS.seed)
    B, N = FLAGS.small_prompts * FLAGS.small_group, FLAGS.small_max_new
    rng = np.random.default_rng(FLAGS.seed)
    prompts = [list(map(int, rng.integers(3, cfg.vocab_size, 16))) for _ in range(B)]
    eng = SlotEngine(cfg, slots=B, prompt_len=16, max_new_tokens=N, eos_id=None, pad_id=0,
                     steps_per_call=N)

    def engine_round():
        eng.reset(0)
        eng.admit(params, prompts, range(B))
        eng.advance(params)
        jax.block_until_ready(eng.state.tokens_BN)

    def generate_round():
        jax.block_until_ready(generate(cfg, params, prompts, max_new_tokens=N, eos_id=None,
                                       pad_id=0).tokens)

    times = {"engine": [], "generate": []}
    for i in range(FLAGS.rounds + 1):          # round 0 compiles: not kept
        for name, fn in (("engine", engine_round), ("generate", generate_round)):
            t0 = time.perf_counter()
            fn()
            if i:
                times[name].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in times.items()}
    out["engine_over_generate"] = out["engine"] / out["generate"]
    print(f"\n== engine_vs_generate: small, B={B}, {N} tokens per row: engine "
          f"{out['engine']:.2f} s, generate {out['generate']:.2f} s per round (medians of "
          f"{FLAGS.rounds}); engine / generate {out['engine_over_generate']:.2f}")
    return {"rounds": times, "summary": out}


def _print(setting: str, rounds: dict) -> dict:
    keys = [k for k in rounds["sync"][0] if k not in ("batch_gen", "batch_train")]
    summary = {m: {key: _med([r[key] for r in rounds[m]]) for key in keys} for m in MODES}
    print(f"\n== {setting}: B_train {rounds['sync'][0]['batch_train']}, B_gen sync "
          f"{rounds['sync'][0]['batch_gen']} / partial {rounds['partial'][0]['batch_gen']} "
          f"(medians over {len(rounds['sync'])} rounds)")
    print(f"{'':26s}" + "".join(f"{m:>12s}" for m in MODES))
    fmt = lambda x: "-" if x is None else f"{x:12.4g}"
    for key in keys:
        print(f"{key:26s}" + "".join(fmt(summary[m][key]) for m in MODES))
    for m in MODES[1:]:
        ratios = [p["responses_per_s"] / s["responses_per_s"]
                  for s, p in zip(rounds["sync"], rounds[m])]
        summary[f"ratio_responses_per_s_{m}"] = {"median": statistics.median(ratios),
                                                 "rounds": ratios}
        print(f"responses/s {m}/sync per round: {', '.join(f'{r:.2f}' for r in ratios)}")
    return summary


SETTINGS = ("rl_cpu", "small", "engine_vs_generate")


def check_flags() -> None:
    """One line and exit 2 for a flag the bench cannot use, before any model or timing."""
    import jaxrl_scale.cli as c
    from jaxrl_scale.experiment.config import ConfigError
    ints = ("ratio", "rounds", "prompts", "group", "steps", "discard", "small_prompts",
            "small_group", "small_updates", "small_max_new", "seed")
    c.check_flag_ranges({"ratio": (2, INF, False), "rounds": (1, INF, False),
                         "prompts": (1, INF, False), "group": (2, INF, False),
                         "steps": (1, INF, False), "discard": (0, INF, False),
                         "small_prompts": (1, INF, False), "small_group": (2, INF, False),
                         "small_updates": (1, INF, False), "small_max_new": (1, INF, False),
                         "small_median": (0, INF, True), "seed": (0, INF, False)},
                        ints=ints)
    if not FLAGS.settings:
        raise ConfigError("settings", "none given", f"pass some of {','.join(SETTINGS)}")
    for s in FLAGS.settings:
        c.check_choice("settings", s, SETTINGS)
    if FLAGS.discard >= FLAGS.steps:
        raise ConfigError("discard", f"{FLAGS.discard} leaves none of --steps={FLAGS.steps}",
                          "set --discard below --steps")
    if FLAGS.init_checkpoint and not os.path.exists(os.path.expanduser(FLAGS.init_checkpoint)):
        raise ConfigError("init_checkpoint", f"{FLAGS.init_checkpoint!r} does not exist",
                          "point it at orbax params (e.g. the SFT warm-start) or leave it empty")
    c.check_json_out()


def main(argv):
    del argv
    quiet_logging()
    with one_line_errors():
        check_flags()
    results = {"host": platform.node(), "argv": " ".join(os.sys.argv), "settings": {}}
    for setting in FLAGS.settings:
        if setting == "engine_vs_generate":
            results["settings"][setting] = _engine_vs_generate()
            continue
        rounds = {m: [] for m in MODES}
        for i in range(FLAGS.rounds):
            for m in MODES[i % 3:] + MODES[:i % 3]:   # rotate the order between rounds
                r = _rl_cpu_round(m) if setting == "rl_cpu" else _small_round(m, i)
                rounds[m].append(r)
                print(f"[{setting} round {i} {m}] {r['responses_per_s']:.1f} responses/s",
                      flush=True)
        results["settings"][setting] = {"rounds": rounds, "summary": _print(setting, rounds)}
    os.makedirs(os.path.dirname(FLAGS.json_out) or ".", exist_ok=True)
    write_json(FLAGS.json_out, results, indent=2, default=float)
    print(f"\nwrote {FLAGS.json_out}")


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
