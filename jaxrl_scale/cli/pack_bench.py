r"""GRPO update time, packed to a token budget vs padded, on long-tailed responses.

The batch: P prompts of `--task=arith_chain` (1-6 operations, geometrically fewer long ones),
each with G responses that are its shown-work solution plus EOS: what a warm-started policy
writes, so response lengths have the task's long tail (the same within a group). Padded rows
are max_prompt_len + max_new_tokens long (max_new_tokens covers the longest solution); packed
rows hold --token_budget tokens of whole sequences (rl/packed.py). Three updates on the same
batch from the same state, timed round-robin (bench.time_interleaved: each round of the
comparison in one window of the machine's state) after a compiling call each:

    padded_shared  the padded update running each group's prompt once (training's default)
    padded         the padded update, every row its own prompt
    packed         --token_budget: rows of whole sequences, no padding inside them

Printed: the length distribution, the padding share of each layout, the median seconds per
update, and packed / padded ratios (median over rounds of the per-round ratio).

    python experiments/pack_bench.py                        # rl_cpu, P = 32, G = 8, 7 rounds
    python experiments/pack_bench.py --prompts=64 --token_budget=512
"""
from __future__ import annotations

import dataclasses
import os
import platform

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.cli import INF, one_line_errors, run_main, write_json_out
from jaxrl_scale import bench, optim
from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.models.tokenizer import CharTokenizer
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.batch import rollout_batch
from jaxrl_scale.rl.packed import PackedGRPO, min_budget
from jaxrl_scale.rl.state import create_train_state

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "rl_cpu", "Model preset (jaxrl_scale.models.PRESETS).")
flags.DEFINE_integer("prompts", 32, "Prompts per update (P).")
flags.DEFINE_integer("group_size", 8, "Responses per prompt (G).")
flags.DEFINE_integer("max_ops", 6, "arith_chain: most operations per problem (the tail).")
flags.DEFINE_integer("token_budget", 0, "Tokens per packed row (0: 4 padded rows' worth, "
                     "at least the smallest budget a group fits).")
flags.DEFINE_integer("rounds", 7, "Timed rounds (each: one update of every layout).")
flags.DEFINE_integer("seed", 0, "Params, problems and rewards seed.")
flags.DEFINE_string("json_out", "results/packing/pack_bench.json", "Where to write results.")


def check_flags() -> None:
    """One line and exit 2 for a flag the bench cannot use, before any model or timing."""
    import jaxrl_scale.cli as c
    c.check_flag_ranges({"prompts": (1, INF, False), "group_size": (2, INF, False),
                         "max_ops": (1, 12, False), "token_budget": (0, INF, False),
                         "rounds": (1, INF, False), "seed": (0, INF, False)},
                        ints=("prompts", "group_size", "max_ops", "token_budget", "rounds",
                              "seed"))
    c.check_model_preset()
    c.check_json_out()


def chain_batch(P: int, G: int, max_ops: int, seed: int):
    """(RolloutBatch, prompt_len, max_new_tokens, response lengths): arith_chain problems,
    each group's G responses its solution + EOS (character tokens)."""
    import random
    from jaxrl_scale.data.tasks import ArithChainSpec, arith_chain_problem
    spec = ArithChainSpec(max_ops=max_ops)
    rng = random.Random(seed)
    problems = [arith_chain_problem(rng, spec) for _ in range(P)]
    tok = CharTokenizer()
    prompts = [tok.encode(p["prompt"]) for p in problems for _ in range(G)]
    resp = [tok.encode(p["solution"]) + [tok.eos_id] for p in problems for _ in range(G)]
    Tp, M = max(map(len, prompts)), spec.max_response_chars() + 1
    lengths = np.array([len(r) for r in resp])
    tokens = np.zeros((P * G, M), np.int32)
    for i, r in enumerate(resp):
        tokens[i, :len(r)] = r
    nrng = np.random.default_rng(seed)
    logp = -np.log(64) + 0.1 * nrng.normal(size=tokens.shape)
    batch, _ = rollout_batch(prompts, tokens, logp, lengths, nrng.normal(size=P * G),
                             prompt_len=Tp, pad_id=tok.pad_id, group_size=G)
    return batch, Tp, M, lengths


def main(argv):
    del argv
    with one_line_errors():
        check_flags()
    P, G = FLAGS.prompts, FLAGS.group_size
    batch, Tp, M, lengths = chain_batch(P, G, FLAGS.max_ops, FLAGS.seed)
    T = Tp + M
    L = FLAGS.token_budget or max(4 * T, min_budget(T, G, 1))
    with one_line_errors():
        if L < min_budget(T, G, 1):
            from jaxrl_scale.experiment.config import ConfigError
            raise ConfigError("token_budget", f"{L} < {min_budget(T, G, 1)}: a group of {G} "
                              f"sequences of up to {T} tokens must fit one row",
                              f"use --token_budget >= {min_budget(T, G, 1)}")
    cfg = get_config(FLAGS.model)
    params = jax.jit(lambda: init_params(cfg, FLAGS.seed))()
    hp = optim.AdamHParams(lr=1e-6)
    tx = optim.make_optimizer(hp)
    lc = steps.LossConfig()
    base = steps.StepOptions(cfg, tx, lc, group_size=G)
    state = create_train_state(params, tx, FLAGS.seed)
    dev = jax.tree.map(jnp.asarray, batch)
    padded = {name: steps.make_train_step(steps.grpo_step, donate=False,
                                          options=dataclasses.replace(base, shared_prompt_len=tp))
              for name, tp in (("padded_shared", Tp), ("padded", 0))}
    updates = dict(padded, packed=PackedGRPO(base, L))
    fns = {name: (lambda fn=fn: fn(state, dev)[1]) for name, fn in updates.items()}
    times, last = bench.time_interleaved(fns, repeats=FLAGS.rounds, warmup=1)
    pm = last["packed"]
    valid = np.asarray(batch.valid_BT)
    rows = []
    for name, ts in times.items():
        ratio = [p / t for p, t in zip(times["packed"], ts)]
        rows.append(dict(layout=name, median_s=float(np.median(ts)), seconds=ts,
                         packed_over_this=float(np.median(ratio)),
                         packed_over_this_range=[float(min(ratio)), float(max(ratio))]))
    pct = np.percentile(lengths, [50, 90, 100])
    print(f"model={FLAGS.model} P={P} G={G} B={P * G} task=arith_chain (max_ops "
          f"{FLAGS.max_ops}) backend={jax.default_backend()} cores={os.cpu_count()}")
    print(f"response tokens: median {pct[0]:g}, p90 {pct[1]:g}, max {pct[2]:g} of "
          f"max_new_tokens {M}; prompt_len {Tp}; padded rows T = {T}")
    print(f"padding share: padded {1 - valid.mean():.3f} of {valid.size} token slots; packed "
          f"{pm['pad_frac']:.3f} of {int(pm['packed_microbatches'])} row(s) x {L} tokens")
    print(f"{'layout':>14} {'median s/update':>16} {'packed / this':>14} {'rounds min..max':>16}"
          f"   (rounds: {FLAGS.rounds}, interleaved)")
    for r in rows:
        lo, hi = r["packed_over_this_range"]
        print(f"{r['layout']:>14} {r['median_s']:>16.4f} {r['packed_over_this']:>14.3f} "
              f"{lo:>8.3f}..{hi:.3f}")
    out = dict(model=FLAGS.model, prompts=P, group_size=G, batch=P * G, max_ops=FLAGS.max_ops,
               token_budget=L, prompt_len=Tp, max_new_tokens=M,
               response_len_median=float(pct[0]), response_len_p90=float(pct[1]),
               response_len_max=float(pct[2]), padded_pad_frac=float(1 - valid.mean()),
               packed_pad_frac=float(pm["pad_frac"]),
               packed_rows=int(pm["packed_microbatches"]), rounds=FLAGS.rounds, rows=rows,
               backend=jax.default_backend(), cpu_count=os.cpu_count(),
               machine=platform.machine())
    write_json_out(out)


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
