r"""GRPO update throughput (tokens/s) and MFU against the matmul peak of this process.

One call = one full GRPO update (forward, backward accumulated over --micro_batches in a
lax.scan, clip, Adam) on --batch sequences of --seq_len tokens, jitted with the state donated.
Reported per micro-batch count: median wall seconds of --repeats timed updates after a
compiling warm-up, tokens/s, achieved FLOP/s and its fraction of the float32 matmul peak
measured in the same process (bench.matmul_peak; the largest of the measurements taken before
and after each setting, so a busy moment on a shared machine cannot inflate the MFU). Then,
per micro-batch count and --remat_memory setting, the update's memory: `temp`, the compiled
update's temporary buffers (XLA's memory analysis of the same program, compiled, not run), and
`kept`, what the decoder's forward of one micro-batch keeps for its backward (the residuals of
jax.vjp, from shapes: models/remat.residual_bytes). XLA:CPU merges a remat's recomputation
back into the forward, so on CPU only `kept` shows what remat saves.

FLOPs per update (printed with the results):
    6 * P_matmul * B * T                      dense matmuls, forward + backward (2 + 4)
  + 12 * L * B * T^2 * N * H                  attention QK^T and PV (4 L B T^2 N H forward, x3)
P_matmul = parameters used as matmul weights (all but the embedding lookup; the LM head
counts), B * T all positions (prompt and padding included: the step computes them).

    python experiments/train_bench.py                       # small, 64 x 80, micro 1,2,4
    python experiments/train_bench.py --micro_batches=1 --batch=8
    python experiments/train_bench.py --repeats=1 --remat_memory=none,full,dots_saveable
"""
from __future__ import annotations

import functools
import os
import platform

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.cli import INF, one_line_errors, run_main, write_json_out
from jaxrl_scale import bench, optim
from jaxrl_scale.models import forward, get_config, init_params
from jaxrl_scale.models import remat as remat_lib
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.batch import RolloutBatch
from jaxrl_scale.rl.state import create_train_state

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "small", "Model preset (jaxrl_scale.models.PRESETS).")
flags.DEFINE_integer("batch", 64, "Sequences per update (B = P * G).")
flags.DEFINE_integer("seq_len", 80, "Tokens per sequence (prompt + response).")
flags.DEFINE_integer("group_size", 8, "Responses per prompt (G): advantages are per group.")
flags.DEFINE_integer("prompt_len", 16, "Prompt tokens per sequence (not in the loss mask).")
flags.DEFINE_list("micro_batches", ["1", "2", "4"], "Micro-batch counts to time.")
flags.DEFINE_integer("repeats", 3, "Timed updates per setting (median); >= 3 for reports.")
flags.DEFINE_bool("remat", False, "Rematerialise each transformer block in the backward.")
flags.DEFINE_list("remat_memory", ["none", "full", "dots_with_no_batch_dims_saveable"],
                  "Remat settings (none, full or a jax.checkpoint_policies name) whose memory "
                  "per update is compared (compiled, not run); empty: none.")
flags.DEFINE_bool("share_prompt", False, "Rows in groups of --group_size share their prompt and "
                  "the update runs it once per group (GRPO's default in training); FLOPs count "
                  "the tokens it runs on.")
flags.DEFINE_string("dtype", "float32", "Param and compute dtype.")
flags.DEFINE_integer("matmul_n", 2048, "Size of the n^3 matmul that measures the FLOP peak.")
flags.DEFINE_string("json_out", "results/train_bench.json", "Where to write the results.")
flags.DEFINE_integer("seed", 0, "Params and batch seed.")

FORMULA = ("FLOPs/update = 6 * P_matmul * B * T + 12 * L * B * T^2 * N * H "
           "(P_matmul: all params but the embedding lookup)")
SHARED_FORMULA = ("shared prompt: 6 * P_trunk * (B/G * Tp + B * R) + 6 * D * V * B * R "
                  "+ 12 * L * N * H * (B/G * Tp^2 + B * R * T) (R = T - Tp; P_trunk = P_matmul "
                  "- D * V)")


def update_flops(cfg, batch: int, seq_len: int, prompt_len: int = 0, group: int = 1) -> float:
    """FLOPs of the update as computed: every row (prompt_len = 0), or each group's prompt once
    and the LM head only where it scores response tokens (shared prompt)."""
    L, NH = cfg.num_layers, cfg.num_heads * cfg.head_dim
    if not prompt_len:
        dense = 6.0 * bench.matmul_params(cfg) * batch * seq_len
        return dense + 12.0 * L * batch * seq_len ** 2 * NH
    head = cfg.hidden_size * cfg.vocab_size
    R, P = seq_len - prompt_len, batch // group
    dense = 6.0 * (bench.matmul_params(cfg) - head) * (P * prompt_len + batch * R)
    dense += 6.0 * head * batch * R
    return dense + 12.0 * L * NH * (P * prompt_len ** 2 + batch * R * seq_len)


def make_batch(cfg, batch: int, seq_len: int, prompt_len: int, seed: int,
               group: int = 0) -> RolloutBatch:
    """Random tokens; with `group`, the rows of each group of that size share their prompt."""
    rng = np.random.default_rng(seed)
    pos = np.arange(seq_len)[None]
    resp = np.broadcast_to(pos >= prompt_len, (batch, seq_len))
    tokens = rng.integers(0, cfg.vocab_size, (batch, seq_len))
    if group:
        tokens[:, :prompt_len] = np.repeat(tokens[::group, :prompt_len], group, axis=0)
    return RolloutBatch(
        tokens_BT=jnp.asarray(tokens, jnp.int32),
        valid_BT=jnp.ones((batch, seq_len), bool),
        loss_mask_BT=jnp.asarray(resp),
        old_logp_BT=jnp.asarray(np.where(resp, -np.log(cfg.vocab_size), 0.0), jnp.float32),
        rewards_B=jnp.asarray(rng.normal(size=batch), jnp.float32))


def _update(cfg, micro_batches: int, remat):
    """(the jitted update, its optimizer)."""
    hp = optim.AdamHParams(lr=1e-6)
    tx = optim.make_optimizer(hp)
    fn = steps.make_train_step(steps.grpo_step, cfg=cfg, tx=tx, loss_cfg=steps.LossConfig(),
                               micro_batches=micro_batches, remat=remat,
                               group_size=FLAGS.group_size,
                               shared_prompt_len=FLAGS.prompt_len if FLAGS.share_prompt else 0,
                               lr_fn=functools.partial(optim.current_lr, hp, warmup_steps=0))
    return fn, tx


def time_updates(cfg, params, batch, micro_batches: int) -> float:
    fn, tx = _update(cfg, micro_batches, FLAGS.remat)
    holder = [create_train_state(jax.tree.map(jnp.copy, params), tx, FLAGS.seed)]

    def one_update():
        holder[0], metrics = fn(holder[0], batch)   # the state is donated
        return metrics["actor_loss"]

    return bench.median_time(one_update, repeats=FLAGS.repeats, warmup=1)


def memory_rows(cfg, params, batch, micro_batches: int) -> list[dict]:
    """Per --remat_memory setting: the compiled update's temp bytes (XLA memory analysis; the
    update is compiled, never run) and the bytes the forward of one micro-batch keeps for its
    backward (remat.residual_bytes), all measured in this process."""
    def shapes(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)

    rows_mb = FLAGS.batch // micro_batches
    tokens, valid = batch.tokens_BT[:rows_mb], batch.valid_BT[:rows_mb]
    out = []
    for remat in FLAGS.remat_memory:
        fn, tx = _update(cfg, micro_batches, remat)
        state = jax.eval_shape(lambda p: create_train_state(p, tx, FLAGS.seed), shapes(params))
        mem = fn.jitted.lower(state, shapes(batch)).compile().memory_analysis()
        kept = remat_lib.residual_bytes(
            lambda p: forward(cfg, p, tokens, valid, remat=remat), shapes(params))
        out.append(dict(micro_batches=micro_batches, remat=remat,
                        temp_bytes=int(mem.temp_size_in_bytes), kept_bytes=kept))
    return out


def check_flags() -> None:
    """One line and exit 2 for a flag the bench cannot use, before any model or timing."""
    import jaxrl_scale.cli as c
    from jaxrl_scale.experiment.config import ConfigError
    c.check_flag_ranges({"batch": (1, INF, False), "seq_len": (2, INF, False),
                         "group_size": (1, INF, False), "prompt_len": (1, INF, False),
                         "repeats": (1, INF, False), "matmul_n": (1, INF, False),
                         "seed": (0, INF, False)},
                        ints=("batch", "seq_len", "group_size", "prompt_len", "repeats",
                              "matmul_n", "seed"))
    if FLAGS.prompt_len >= FLAGS.seq_len:
        raise ConfigError("prompt_len", f"{FLAGS.prompt_len} leaves no response token in "
                          f"--seq_len={FLAGS.seq_len}", "set --prompt_len < --seq_len")
    if FLAGS.batch % FLAGS.group_size:
        raise ConfigError("group_size", f"{FLAGS.group_size} does not divide --batch="
                          f"{FLAGS.batch}", "pass a batch of whole groups (B = P * G)")
    for m in c.int_list_flag("micro_batches"):
        if FLAGS.batch % m or (FLAGS.batch // m) % FLAGS.group_size:
            raise ConfigError("micro_batches", f"{m} does not split --batch={FLAGS.batch} "
                              f"into whole groups of {FLAGS.group_size}", "pass divisors of "
                              "the number of groups")
    c.check_choice("dtype", FLAGS.dtype, ("float32", "bfloat16", "float16"))
    for r in FLAGS.remat_memory:
        c.check_choice("remat_memory", r, remat_lib.CHOICES)
    c.check_model_preset()
    c.check_json_out()


def main(argv):
    del argv
    with one_line_errors():
        check_flags()
    cfg = get_config(FLAGS.model, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
    params = jax.jit(lambda: init_params(cfg, FLAGS.seed))()
    B, T = FLAGS.batch, FLAGS.seq_len
    G = FLAGS.group_size
    batch = make_batch(cfg, B, T, FLAGS.prompt_len, FLAGS.seed, G if FLAGS.share_prompt else 0)
    peak = bench.matmul_peak(FLAGS.matmul_n, FLAGS.dtype)
    flops = update_flops(cfg, B, T, FLAGS.prompt_len if FLAGS.share_prompt else 0, G)

    # The peak is re-measured after every setting and the largest value is the denominator:
    # on a shared machine a single measurement can land in a busy moment (MFU > 100%).
    rows, peaks = [], [peak["flops_per_s"]]
    for m in [int(x) for x in FLAGS.micro_batches]:
        sec = time_updates(cfg, params, batch, m)
        peaks.append(bench.matmul_peak(FLAGS.matmul_n, FLAGS.dtype)["flops_per_s"])
        rows.append(dict(micro_batches=m, seconds=sec, tokens_per_s=B * T / sec,
                         flops_per_s=flops / sec, peak_after_flops_per_s=peaks[-1]))
    peak_flops = max(peaks)
    for r in rows:
        r["mfu"] = r["flops_per_s"] / peak_flops
    memory = [x for m in [int(x) for x in FLAGS.micro_batches]
              for x in memory_rows(cfg, params, batch, m)]

    print(f"model={FLAGS.model} ({cfg.num_params() / 1e6:.1f}M params, "
          f"P_matmul={bench.matmul_params(cfg) / 1e6:.1f}M) batch={B} x seq_len={T} "
          f"dtype={FLAGS.dtype} remat={FLAGS.remat} share_prompt={FLAGS.share_prompt} "
          f"backend={jax.default_backend()} devices={jax.device_count()}")
    print(SHARED_FORMULA if FLAGS.share_prompt else FORMULA)
    if FLAGS.share_prompt:
        print("tokens/s below counts all B * T tokens of the batch (the work it stands for)")
    print(f"FLOPs/update = {flops:.4g}; matmul peak ({FLAGS.matmul_n}^3 {FLAGS.dtype}, max of "
          f"{len(peaks)} measurements) = {peak_flops / 1e9:.1f} GFLOP/s "
          f"(all: {', '.join(f'{p / 1e9:.1f}' for p in peaks)})")
    print(f"{'micro':>5} {'s/update':>9} {'tokens/s':>10} {'GFLOP/s':>9} {'MFU':>6} "
          f"{'peak after':>11}")
    for r in rows:
        print(f"{r['micro_batches']:>5} {r['seconds']:>9.4f} {r['tokens_per_s']:>10.0f} "
              f"{r['flops_per_s'] / 1e9:>9.1f} {100 * r['mfu']:>5.1f}% "
              f"{r['peak_after_flops_per_s'] / 1e9:>10.1f}G")
    if memory:
        print("memory per update by remat (temp: compiled update's XLA temp buffers; kept: "
              "what one micro-batch's forward keeps for the backward)")
        print(f"{'micro':>5} {'remat':<34} {'temp MiB':>9} {'kept MiB':>9}")
        for r in memory:
            print(f"{r['micro_batches']:>5} {r['remat']:<34} {r['temp_bytes'] / 2**20:>9.1f} "
                  f"{r['kept_bytes'] / 2**20:>9.1f}")

    out = dict(model=FLAGS.model, num_params=cfg.num_params(),
               matmul_params=bench.matmul_params(cfg), batch=B, seq_len=T,
               prompt_len=FLAGS.prompt_len, dtype=FLAGS.dtype, remat=FLAGS.remat,
               share_prompt=FLAGS.share_prompt, group_size=G, repeats=FLAGS.repeats,
               flops_per_update=flops,
               flops_formula=SHARED_FORMULA if FLAGS.share_prompt else FORMULA,
               matmul_peak=dict(peak, flops_per_s=peak_flops, measurements=peaks),
               backend=jax.default_backend(), device_count=jax.device_count(),
               cpu_count=os.cpu_count(), machine=platform.machine(), rows=rows,
               memory=memory)
    write_json_out(out)


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
