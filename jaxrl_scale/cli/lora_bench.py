r"""LoRA vs full GRPO update, side by side in one process: step time, optimizer-state bytes,
trained and held parameter bytes, and the cost of merging the adapters for decoding.

Both updates run the same GRPO step (rl/steps.grpo_step: forward, backward, clip, Adam) on
the same random batch, jitted with the state donated. Their timed updates are interleaved
round by round (full, LoRA, full, LoRA, ...), so machine drift lands on both; the table
gives each one's median seconds per update with its min-max over rounds, and the median of
the per-round ratios. Bytes are exact sizes of the pytrees: the optimizer state (Adam's two
moments plus counters), the trained params (full: the model; LoRA: the adapters) and, for
LoRA, the frozen base the state also holds. `merge_s` is one lora.merge (W + (alpha/r) A B
for every target, done once per update before decoding).

    python experiments/lora_bench.py                        # small, 64 x 80, r = 8, all targets
    python experiments/lora_bench.py --lora_rank=16 --lora_targets=q,v
"""
from __future__ import annotations

import os
import platform
import statistics
import time

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.cli import one_line_errors, run_main, write_json_out
from jaxrl_scale.experiment.config import ConfigError
from jaxrl_scale import optim
from jaxrl_scale.models import get_config, init_params, lora
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.batch import RolloutBatch
from jaxrl_scale.rl.state import create_train_state

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "small", "Model preset (jaxrl_scale.models.PRESETS).")
flags.DEFINE_integer("batch", 64, "Sequences per update (B = P * G).")
flags.DEFINE_integer("seq_len", 80, "Tokens per sequence (prompt + response).")
flags.DEFINE_integer("group_size", 8, "Responses per prompt (G).")
flags.DEFINE_integer("prompt_len", 16, "Prompt tokens per sequence (not in the loss mask).")
flags.DEFINE_integer("lora_rank", 8, "Adapter rank r.")
flags.DEFINE_float("lora_alpha", 16.0, "Adapter alpha (scale alpha / r).")
flags.DEFINE_list("lora_targets", list(lora.TARGETS), "Adapted projections.")
flags.DEFINE_integer("rounds", 5, "Timed rounds (one update of each kind per round).")
flags.DEFINE_string("json_out", "results/lora/lora_bench.json", "Where to write the results.")
flags.DEFINE_integer("seed", 0, "Params and batch seed.")


def make_batch(cfg, batch: int, seq_len: int, prompt_len: int, seed: int) -> RolloutBatch:
    """Random tokens, the response (after prompt_len) in the loss, uniform behaviour
    log-probs, normal rewards (train_bench's batch)."""
    rng = np.random.default_rng(seed)
    resp_BT = np.broadcast_to(np.arange(seq_len)[None] >= prompt_len, (batch, seq_len))
    return RolloutBatch(
        tokens_BT=jnp.asarray(rng.integers(0, cfg.vocab_size, (batch, seq_len)), jnp.int32),
        valid_BT=jnp.ones((batch, seq_len), bool), loss_mask_BT=jnp.asarray(resp_BT),
        old_logp_BT=jnp.asarray(np.where(resp_BT, -np.log(cfg.vocab_size), 0.0), jnp.float32),
        rewards_B=jnp.asarray(rng.normal(size=batch), jnp.float32))


def _timed(fn, state, batch):
    t0 = time.perf_counter()
    state, m = fn(state, batch)
    jax.block_until_ready((state, m))
    return state, time.perf_counter() - t0


def main(argv):
    del argv
    with one_line_errors():     # bad flags: one line and exit 2, before any compile
        why = lora.invalid(FLAGS.lora_rank, FLAGS.lora_alpha, FLAGS.lora_targets)
        if why:
            example = {"lora_rank": "8", "lora_alpha": "16", "lora_targets": "q,v"}[why[0]]
            raise ConfigError(why[0], why[1], f"pass e.g. --{why[0]}={example}")
        if FLAGS.rounds < 1 or FLAGS.batch % FLAGS.group_size or \
                not 0 < FLAGS.prompt_len < FLAGS.seq_len:
            raise ConfigError("rounds" if FLAGS.rounds < 1 else "batch" if FLAGS.batch %
                              FLAGS.group_size else "prompt_len",
                              f"rounds={FLAGS.rounds}, batch={FLAGS.batch}, group_size="
                              f"{FLAGS.group_size}, prompt_len={FLAGS.prompt_len}, seq_len="
                              f"{FLAGS.seq_len}", "use rounds >= 1, a batch that is a multiple "
                              "of group_size and 0 < prompt_len < seq_len")
    cfg = get_config(FLAGS.model)
    lcfg = lora.LoraConfig(FLAGS.lora_rank, FLAGS.lora_alpha, tuple(FLAGS.lora_targets))
    params = jax.jit(lambda: init_params(cfg, FLAGS.seed))()
    batch = make_batch(cfg, FLAGS.batch, FLAGS.seq_len, FLAGS.prompt_len, FLAGS.seed)
    tx = optim.make_optimizer(optim.AdamHParams(lr=1e-6))

    full = create_train_state(jax.tree.map(jnp.copy, params), tx, FLAGS.seed)
    adapters = lora.init_adapters(cfg, lcfg, jax.random.PRNGKey(FLAGS.seed + 1))
    low = create_train_state(adapters, tx, FLAGS.seed, frozen=params)
    sizes = {name: dict(opt_state_bytes=lora.tree_bytes(s.opt_state),
                        trained_param_bytes=lora.tree_bytes(s.params),
                        frozen_param_bytes=lora.tree_bytes(s.frozen),
                        trained_params=lora.tree_size(s.params))
             for name, s in (("full", full), ("lora", low))}
    common = dict(cfg=cfg, tx=tx, group_size=FLAGS.group_size)
    fns = {"full": steps.make_train_step(steps.grpo_step, **common),
           "lora": steps.make_train_step(steps.grpo_step, lora_scale=lcfg.scale, **common)}
    states = {"full": full, "lora": low}
    compile_s = {}
    for name in fns:                      # compile + one warm-up update each
        states[name], compile_s[name] = _timed(fns[name], states[name], batch)
    times = {"full": [], "lora": []}
    for _ in range(FLAGS.rounds):
        for name in fns:
            states[name], sec = _timed(fns[name], states[name], batch)
            times[name].append(sec)
    merge = jax.jit(lambda b, a: lora.merge(b, a, lcfg.scale))
    jax.block_until_ready(merge(states["lora"].frozen, states["lora"].params))
    merge_times = []
    for _ in range(FLAGS.rounds):
        t0 = time.perf_counter()
        jax.block_until_ready(merge(states["lora"].frozen, states["lora"].params))
        merge_times.append(time.perf_counter() - t0)

    ratios = [f / l for f, l in zip(times["full"], times["lora"])]
    rows = {name: dict(sizes[name], seconds_median=statistics.median(times[name]),
                       seconds_min=min(times[name]), seconds_max=max(times[name]),
                       seconds=times[name], compile_and_first_s=compile_s[name])
            for name in fns}
    print(f"model={FLAGS.model} ({cfg.num_params() / 1e6:.1f}M params) batch={FLAGS.batch} x "
          f"seq_len={FLAGS.seq_len} LoRA r={lcfg.rank} alpha={lcfg.alpha:g} "
          f"targets={','.join(lcfg.targets)} rounds={FLAGS.rounds} "
          f"backend={jax.default_backend()} cpus={os.cpu_count()}")
    print(f"{'':>28} {'full':>14} {'lora':>14} {'full/lora':>10}")

    def line(label, key, fmt):
        a, b = rows["full"][key], rows["lora"][key]
        ratio = f"{a / b:>10.1f}" if b else f"{'-':>10}"
        print(f"{label:>28} {fmt(a):>14} {fmt(b):>14} {ratio}")

    line("s/update (median)", "seconds_median", lambda x: f"{x:.3f}")
    print(f"{'s/update (min-max)':>28} "
          + " ".join(f"{rows[n]['seconds_min']:.3f}-{rows[n]['seconds_max']:.3f}".rjust(14)
                     for n in fns))
    line("optimizer-state MiB", "opt_state_bytes", lambda x: f"{x / 2**20:.2f}")
    line("trained-param MiB", "trained_param_bytes", lambda x: f"{x / 2**20:.2f}")
    print(f"{'frozen-param MiB':>28} {'0':>14} {rows['lora']['frozen_param_bytes'] / 2**20:>14.2f}")
    line("trained params", "trained_params", lambda x: f"{x:,}")
    print(f"per-round speed-up full/lora: median {statistics.median(ratios):.2f} "
          f"(min {min(ratios):.2f}, max {max(ratios):.2f}); merge for decoding: "
          f"{statistics.median(merge_times) * 1e3:.1f} ms (median of {FLAGS.rounds})")

    out = dict(model=FLAGS.model, num_params=cfg.num_params(), batch=FLAGS.batch,
               seq_len=FLAGS.seq_len, prompt_len=FLAGS.prompt_len, group_size=FLAGS.group_size,
               lora=dict(rank=lcfg.rank, alpha=lcfg.alpha, targets=list(lcfg.targets)),
               rounds=FLAGS.rounds, full=rows["full"], lora_update=rows["lora"],
               speedup_per_round=ratios, speedup_median=statistics.median(ratios),
               merge_seconds=merge_times, merge_seconds_median=statistics.median(merge_times),
               backend=jax.default_backend(), device_count=jax.device_count(),
               cpu_count=os.cpu_count(), machine=platform.machine())
    write_json_out(out)


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
