r"""MoE dispatch benchmark: dense vs dropless sparse experts (models/moe.py), one run.

Two shapes, both moe_cpu's trunk (D 192, 3 layers, char vocab) with the same active MLP width
k * F = 512:
  e128k8   128 experts, 8 active, F 64: Qwen3-30B-A3B's routing (E / k = 16) scaled to CPU;
  moe_cpu  8 experts, 2 active, F 256 (E / k = 4).
Per shape and dispatch it times one GRPO update (forward, backward, Adam; --batch x --seq_len
tokens, jitted, state donated) and one greedy decode (--decode_batch prompts, --new_tokens
tokens, KV cache), plus, at e128k8, one MoE MLP forward on the update's tokens with the
grouped matmul as jax.lax.ragged_dot (the kernel the sparse path does not use on CPU; the
module docstring says why). Every timed call runs in interleaved rounds (call 1 of each
contender, then call 2, ...), so each round's dense / sparse ratio compares the same minute
of a shared machine; reported: the median over rounds, its spread (min-max) and the ratio per
round. `auto` (moe.dispatch_mode) is checked against the faster update at each shape, and its
decode (prefill and steps may resolve differently) is timed against the faster forced one.

    python experiments/moe_bench.py                       # ~3 min on 2 loaded CPU cores
    python experiments/moe_bench.py --rounds=7 --batch=16
"""
from __future__ import annotations

import functools
import platform
import statistics
import sys

from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale import bench, optim
from jaxrl_scale.cli import run_main
from jaxrl_scale.models import get_config, moe
from jaxrl_scale.numbers import write_json
from jaxrl_scale.rl import steps
from jaxrl_scale.rl.batch import RolloutBatch
from jaxrl_scale.rl.state import create_train_state
from jaxrl_scale.sampling import generate

FLAGS = flags.FLAGS
flags.DEFINE_integer("batch", 16, "Sequences per update.")
flags.DEFINE_integer("group_size", 4, "Responses per prompt in the update (GRPO groups).")
flags.DEFINE_integer("seq_len", 64, "Tokens per sequence (prompt + response).")
flags.DEFINE_integer("prompt_len", 16, "Prompt tokens per update sequence and decode prompt.")
flags.DEFINE_integer("decode_batch", 16, "Prompts per decode.")
flags.DEFINE_integer("new_tokens", 32, "Tokens generated per decode.")
flags.DEFINE_integer("rounds", 5, "Interleaved timing rounds (median and spread over them).")
flags.DEFINE_list("shapes", ["e128k8", "moe_cpu"], "Shapes to time (module docstring).")
flags.DEFINE_bool("kernel", True, "Also time the MLP forward with jax.lax.ragged_dot.")
flags.DEFINE_string("json_out", "results/moe_dispatch/moe_bench.json", "Where the JSON goes.")
flags.DEFINE_integer("seed", 0, "Params and batch seed.")

KERNEL_ROWS = 4
SHAPES = {"e128k8": dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=64),
          "moe_cpu": {}}


def check_flags() -> None:
    """One-line error and exit 2 before anything compiles."""
    bad = [(n, getattr(FLAGS, n)) for n in ("batch", "seq_len", "decode_batch", "new_tokens",
                                            "rounds") if getattr(FLAGS, n) < 1]
    problems = [f"{n}: {v} must be >= 1. Fix: pass a positive --{n}." for n, v in bad]
    if FLAGS.group_size < 1 or FLAGS.batch % FLAGS.group_size:
        problems.append(f"group_size: {FLAGS.group_size} must be >= 1 and divide --batch="
                        f"{FLAGS.batch}. Fix: pass a divisor of --batch.")
    if not 1 <= FLAGS.prompt_len < FLAGS.seq_len:
        problems.append(f"prompt_len: {FLAGS.prompt_len} must be in 1..seq_len-1 "
                        f"({FLAGS.seq_len - 1}). Fix: lower --prompt_len or raise --seq_len.")
    if FLAGS.prompt_len + FLAGS.new_tokens > 128:
        problems.append(f"new_tokens: prompt_len + new_tokens = "
                        f"{FLAGS.prompt_len + FLAGS.new_tokens} exceeds moe_cpu's max_seq_len "
                        "128. Fix: lower --new_tokens.")
    unknown = [s for s in FLAGS.shapes if s not in SHAPES]
    if unknown or not FLAGS.shapes:
        problems.append(f"shapes: {unknown or 'none'} not in {sorted(SHAPES)}. Fix: pass "
                        f"--shapes={','.join(SHAPES)}.")
    if problems:
        print(f"error: {problems[0]}", file=sys.stderr)
        sys.exit(2)


def model_config(shape: str, dispatch: str):
    return get_config("moe_cpu", moe_dispatch=dispatch, **SHAPES[shape])


def np_params(cfg, seed: int):
    """N(0, 0.02) weights and unit norms drawn with numpy (no init program to compile)."""
    from jaxrl_scale.models import param_shapes
    rng = np.random.default_rng(seed)

    def make(path, shape):
        name = str(path[-1].key)
        return jnp.ones(shape, jnp.float32) if "norm" in name else jnp.asarray(
            0.02 * rng.normal(size=shape), jnp.float32)

    return jax.tree_util.tree_map_with_path(make, param_shapes(cfg),
                                            is_leaf=lambda x: isinstance(x, tuple))


def make_batch(cfg, seed: int) -> RolloutBatch:
    """Random tokens, every group's rows sharing their prompt, loss on the response."""
    rng = np.random.default_rng(seed)
    B, T, Tp, G = FLAGS.batch, FLAGS.seq_len, FLAGS.prompt_len, FLAGS.group_size
    resp = np.broadcast_to(np.arange(T)[None] >= Tp, (B, T))
    tokens = rng.integers(0, cfg.vocab_size, (B, T))
    tokens[:, :Tp] = np.repeat(tokens[::G, :Tp], G, axis=0)
    return RolloutBatch(
        tokens_BT=jnp.asarray(tokens, jnp.int32), valid_BT=jnp.ones((B, T), bool),
        loss_mask_BT=jnp.asarray(resp),
        old_logp_BT=jnp.asarray(np.where(resp, -np.log(cfg.vocab_size), 0.0), jnp.float32),
        rewards_B=jnp.asarray(rng.normal(size=B), jnp.float32))


def update_fn(cfg, params, seed: int):
    hp = optim.AdamHParams(lr=1e-6)
    tx = optim.make_optimizer(hp)
    fn = steps.make_train_step(steps.grpo_step, cfg=cfg, tx=tx, loss_cfg=steps.LossConfig(),
                               group_size=FLAGS.group_size,
                               lr_fn=functools.partial(optim.current_lr, hp, warmup_steps=0))
    batch = make_batch(cfg, seed)
    holder = [create_train_state(jax.tree.map(jnp.copy, params), tx, seed)]

    def one():
        holder[0], metrics = fn(holder[0], batch)   # the state is donated
        return metrics["actor_loss"]

    return one


def decode_fn(cfg, params, seed: int):
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, cfg.vocab_size, (FLAGS.decode_batch, FLAGS.prompt_len)).tolist()
    return lambda: generate(cfg, params, prompts, max_new_tokens=FLAGS.new_tokens,
                            temperature=0.0, eos_id=None, pad_id=0).tokens


def mlp_fns(cfg, params, seed: int) -> dict:
    """One MoE MLP forward on KERNEL_ROWS x --seq_len tokens: dense, sparse (tiles) and sparse
    with jax.lax.ragged_dot as the grouped matmul (XLA:CPU runs ragged_dot as a dense masked
    product over all E groups: seconds a call at the update's tokens, so fewer rows here)."""
    lp = jax.tree.map(lambda a: a[0], params["layers"])
    shape = (min(FLAGS.batch, KERNEL_ROWS), FLAGS.seq_len, cfg.hidden_size)
    x = jax.random.normal(jax.random.PRNGKey(seed), shape, jnp.float32)

    def sparse(lp, x, impl):
        logits = moe.router_logits(cfg, lp, x)
        w, idx = moe.route(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
        n = x.shape[0] * x.shape[1]
        return moe.routed_experts(x.reshape(n, -1), w.reshape(n, -1), idx.reshape(n, -1),
                                  moe.gate_up_ED2F(lp), lp["expert_down"], impl=impl)

    dense = jax.jit(lambda lp, x: moe.moe_mlp(cfg.replace(moe_dispatch="dense"), lp, x)[0])
    tiles = jax.jit(functools.partial(sparse, impl="tiles"))
    ragged = jax.jit(functools.partial(sparse, impl="ragged_dot"))
    return {"mlp dense": lambda: dense(lp, x), "mlp sparse tiles": lambda: tiles(lp, x),
            "mlp sparse ragged_dot": lambda: ragged(lp, x)}


def summarize(times: list[float]) -> dict:
    return dict(median_s=statistics.median(times), min_s=min(times), max_s=max(times),
                rounds_s=times)


def ratio_row(dense: list[float], sparse: list[float]) -> dict:
    """dense / sparse per round (paired: same round, same machine state)."""
    r = [d / s for d, s in zip(dense, sparse)]
    return dict(median=statistics.median(r), min=min(r), max=max(r), per_round=r)


def main(argv):
    del argv
    check_flags()
    fns, configs = {}, {}
    for shape in FLAGS.shapes:
        for dispatch in ("dense", "sparse"):
            cfg = model_config(shape, dispatch)
            params = np_params(cfg, FLAGS.seed)
            fns[f"{shape} update {dispatch}"] = update_fn(cfg, params, FLAGS.seed)
            fns[f"{shape} decode {dispatch}"] = decode_fn(cfg, params, FLAGS.seed)
        configs[shape] = model_config(shape, "auto")
        # auto's update is one of the two programs above (every layer sees B * T tokens); its
        # decode mixes them (prefill on B * Tp tokens, steps on B), so it is timed too.
        fns[f"{shape} decode auto"] = decode_fn(configs[shape], params, FLAGS.seed)
        if FLAGS.kernel and shape == "e128k8":
            fns.update({f"{shape} {k}": f for k, f in
                        mlp_fns(configs[shape], np_params(configs[shape], 1), 1).items()})
    print(f"timing {len(fns)} calls x {FLAGS.rounds} rounds, interleaved "
          f"(backend {jax.default_backend()})", flush=True)
    times, _ = bench.time_interleaved(fns, repeats=FLAGS.rounds, warmup=1)

    shapes_out = {}
    print(f"\n{'shape':<9} {'step':<7} {'dense s (min-max)':>22} {'sparse s (min-max)':>22} "
          f"{'dense/sparse (min-max)':>22}  auto")
    for shape in FLAGS.shapes:
        cfg = configs[shape]
        modes = {"update": moe.dispatch_mode(cfg, FLAGS.batch * FLAGS.seq_len),
                 "prefill": moe.dispatch_mode(cfg, FLAGS.decode_batch * FLAGS.prompt_len),
                 "decode step": moe.dispatch_mode(cfg, FLAGS.decode_batch)}
        out = dict(num_experts=cfg.num_experts, top_k=cfg.num_experts_per_tok,
                   moe_intermediate_size=cfg.moe_intermediate_size, auto=modes)
        for step in ("update", "decode"):
            d, s = (times[f"{shape} {step} {disp}"] for disp in ("dense", "sparse"))
            r = ratio_row(d, s)
            faster = "sparse" if statistics.median(s) < statistics.median(d) else "dense"
            out[step] = dict(dense=summarize(d), sparse=summarize(s), dense_over_sparse=r,
                             faster=faster)
            if step == "update":
                out[step]["auto_picks_faster"] = ok = modes["update"] == faster
                note = f"{modes['update']}{'' if ok else ' (NOT the faster)'}"
            else:   # auto vs the faster forced dispatch, per round
                a = times[f"{shape} decode auto"]
                best = d if faster == "dense" else s
                ra = ratio_row(a, best)
                out[step].update(auto=summarize(a), auto_over_faster=ra)
                note = (f"prefill {modes['prefill']}, steps {modes['decode step']}: "
                        f"{statistics.median(a):.3f} s, {ra['median']:.2f}x the faster "
                        f"({ra['min']:.2f}-{ra['max']:.2f})")
            print(f"{shape:<9} {step:<7} "
                  f"{statistics.median(d):>8.3f} ({min(d):.3f}-{max(d):.3f}) "
                  f"{statistics.median(s):>8.3f} ({min(s):.3f}-{max(s):.3f}) "
                  f"{r['median']:>9.2f} ({r['min']:.2f}-{r['max']:.2f})  {note}")
        shapes_out[shape] = out
    kernel = {k.split(" ", 1)[1]: summarize(v) for k, v in times.items() if " mlp " in k}
    if kernel:
        print("\ne128k8 one MoE MLP forward, "
              f"{min(FLAGS.batch, KERNEL_ROWS) * FLAGS.seq_len} tokens (median s, min-max):")
        for k, v in kernel.items():
            print(f"  {k:<24} {v['median_s']:.4f} ({v['min_s']:.4f}-{v['max_s']:.4f})")
    write_json(FLAGS.json_out, dict(
        command=" ".join(["python experiments/moe_bench.py"] + sys.argv[1:]),
        backend=jax.default_backend(), machine=platform.processor() or platform.machine(),
        device_count=jax.device_count(), jax=jax.__version__,
        flags={n: getattr(FLAGS, n) for n in ("batch", "group_size", "seq_len", "prompt_len",
                                              "decode_batch", "new_tokens", "rounds", "seed")},
        sparse_min_expert_ratio=moe.SPARSE_MIN_EXPERT_RATIO,
        sparse_min_rows_per_expert=moe.SPARSE_MIN_ROWS_PER_EXPERT,
        shapes=shapes_out, mlp_forward=kernel), indent=2)
    print(f"\nwrote {FLAGS.json_out}")


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
