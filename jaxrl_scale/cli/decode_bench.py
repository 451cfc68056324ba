r"""Decode throughput of `jaxrl_scale.sampling.generate` across batch sizes (docs/science.md,
Step-cost model; the critical generation batch: docs/science.md, Critical batches).

Per batch: generated tokens/s (median of --repeats timed calls after one warm-up call that
compiles), step time, prefill time; then the fit t_step = d0 + d1 * B, the critical generation
batch (smallest B whose doubling adds < 10% throughput), the fraction of the matmul peak and of
the memory roofline, both measured in this process. --compare_hf times HF transformers
`generate` (greedy, KV cache, min_new_tokens = max_new_tokens = --new_tokens) on the same
weights and prompts and prints ours / HF per batch.

Within a batch row, ours, our prefill, HF and the 2048^3 matmul that defines the peak are timed
round-robin (one call each, repeated), so ratios compare the same minutes of a shared machine.
`prepare_s` is what `generate` pays once per new params (the per-layer, fused weight copy it
then reuses across calls with those params; an RL step pays it once per update).

Every row generates exactly --new_tokens tokens: generate runs with eos_id=None (no early stop),
and HF with min_new_tokens = --new_tokens.

    python experiments/decode_bench.py --model=small
    python experiments/decode_bench.py --batch_sizes=1,4 --new_tokens=8 --compare_hf
"""
from __future__ import annotations

import os
import platform
import statistics
import tempfile

from absl import flags, logging
import jax
import numpy as np

from jaxrl_scale.cli import INF, one_line_errors, run_main
from jaxrl_scale import bench
from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.sampling import decode, generate
from jaxrl_scale.scaling.step_cost import fit_linear_time
from jaxrl_scale.scaling.throughput import critical_generation_batch
from jaxrl_scale.numbers import write_json

FLAGS = flags.FLAGS
flags.DEFINE_string("model", "small", "Model preset (jaxrl_scale.models.PRESETS).")
flags.DEFINE_string("hf_checkpoint", None, "HF checkpoint directory; overrides --model.")
flags.DEFINE_list("batch_sizes", ["1", "4", "16", "64", "256", "1024"], "Batch sizes.")
flags.DEFINE_integer("prompt_len", 16, "Prompt tokens per row.")
flags.DEFINE_integer("new_tokens", 64, "Generated tokens per row (no early stop).")
flags.DEFINE_integer("repeats", 3, "Timed calls per batch (median); >= 3 for reported numbers.")
flags.DEFINE_string("dtype", "float32", "Param and compute dtype.")
flags.DEFINE_string("json_out", "results/decode_bench.json", "Where to write the results.")
flags.DEFINE_bool("compare_hf", False, "Also time HF transformers generate on the same weights.")
flags.DEFINE_list("hf_batch_sizes", [], "With --compare_hf: batch sizes HF runs at (default: all).")
flags.DEFINE_bool("hf_warmup", True, "Give HF an untimed warm-up call too (it compiles nothing; "
                  "--nohf_warmup saves one long call at large batches).")
flags.DEFINE_bool("time_prefill", True, "Also time generate with max_new_tokens=1 (prefill).")
flags.DEFINE_integer("matmul_n", 2048, "Size of the n^3 matmul that measures the FLOP peak.")
flags.DEFINE_integer("copy_mib", 256, "Array size for the copy-bandwidth measurement.")
flags.DEFINE_float("min_gain", 0.10, "Critical batch: doubling gains less than this.")
flags.DEFINE_integer("seed", 0, "Params (presets) and prompts seed.")


def load_model():
    if FLAGS.hf_checkpoint:
        from jaxrl_scale.models import load_hf
        return load_hf(FLAGS.hf_checkpoint, dtype=FLAGS.dtype)
    cfg = get_config(FLAGS.model, dtype=FLAGS.dtype, param_dtype=FLAGS.dtype)
    return cfg, init_params(cfg, FLAGS.seed)


def prompts_for(cfg, batch):
    rng = np.random.default_rng(FLAGS.seed + batch)
    return rng.integers(0, cfg.vocab_size, (batch, FLAGS.prompt_len)).tolist()


def ours_fn(cfg, params, batch, max_new):
    prompts = prompts_for(cfg, batch)
    return lambda: generate(cfg, params, prompts, max_new_tokens=max_new, temperature=0.0,
                            eos_id=None, pad_id=0)


def hf_model(cfg, params):
    import torch
    import transformers
    torch.set_num_threads(os.cpu_count())
    dt = {"float32": torch.float32, "bfloat16": torch.bfloat16}[FLAGS.dtype]
    if FLAGS.hf_checkpoint:
        path = FLAGS.hf_checkpoint
    else:
        from jaxrl_scale.models import save_hf
        path = tempfile.mkdtemp(prefix="decode_bench_hf_")
        save_hf(path, cfg, params)
    return transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dt).eval()


def hf_fn(model, cfg, batch):
    import torch
    ids = torch.tensor(prompts_for(cfg, batch), dtype=torch.long)
    n = FLAGS.new_tokens

    def run():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  use_cache=True, max_new_tokens=n, min_new_tokens=n,
                                  pad_token_id=0)
    return run


def time_batch(cfg, params, batch, machine, model) -> dict:
    """Times ours, our prefill, HF and the matmul peak round-robin (bench.time_interleaved):
    every ratio this row reports compares measurements from the same minutes."""
    n = FLAGS.new_tokens
    fns = {"ours": ours_fn(cfg, params, batch, n)}
    if FLAGS.time_prefill and n > 1:
        fns["prefill"] = ours_fn(cfg, params, batch, 1)
    hf = model is not None and (not FLAGS.hf_batch_sizes or
                                str(batch) in FLAGS.hf_batch_sizes)
    if hf:
        fns["hf"] = hf_fn(model, cfg, batch)
    fns["matmul"], matmul_flops = bench.matmul_fn(FLAGS.matmul_n, FLAGS.dtype)
    times, last = bench.time_interleaved(fns, FLAGS.repeats, warmup=1,
                                   skip_warmup=() if FLAGS.hf_warmup else ("hf",))
    t = statistics.median(times["ours"])
    context = FLAGS.prompt_len + (n - 1) / 2  # mean keys a step attends to
    step = t / n
    # The peak is the best the machine showed in this row's window (fastest of the matmuls
    # timed between our calls), like a datasheet peak; a median would move with the noise.
    peak = matmul_flops / min(times["matmul"])
    row = dict(batch=batch, time_s=t, times_s=times["ours"], tokens_per_s=batch * n / t,
               step_s=step, matmul_peak_flops_per_s=peak, matmul_times_s=times["matmul"],
               step_flops=bench.decode_step_flops(cfg, batch, context),
               step_bytes=bench.decode_step_bytes(cfg, batch, context))
    # Whole call: prefill FLOPs + n steps over the call's time; decode steps alone: step FLOPs
    # over (call - prefill-only call) / (n - 1), both against the peak timed alongside.
    row["call_flops"] = (bench.prefill_flops(cfg, batch, FLAGS.prompt_len - 1)
                         + n * row["step_flops"])
    row["frac_matmul_peak"] = row["call_flops"] / t / peak
    row["frac_mem_roofline"] = (row["step_bytes"] / machine["copy"]["bytes_per_s"]) / step
    if "prefill" in times:
        row["prefill_s"] = statistics.median(times["prefill"])
        row["decode_step_s"] = (t - row["prefill_s"]) / (n - 1)
        row["frac_matmul_peak_decode"] = row["step_flops"] / row["decode_step_s"] / peak
        row["frac_mem_roofline_decode"] = (row["step_bytes"] / machine["copy"]["bytes_per_s"]
                                           / row["decode_step_s"])
    if hf:
        t_hf = statistics.median(times["hf"])
        row |= dict(hf_time_s=t_hf, hf_times_s=times["hf"], hf_tokens_per_s=batch * n / t_hf)
        row["speedup_vs_hf"] = row["tokens_per_s"] / row["hf_tokens_per_s"]
        ours_tok = np.asarray(last["ours"].tokens)
        hf_tok = last["hf"][:, FLAGS.prompt_len:].numpy()
        row["same_tokens_as_hf"] = float(np.mean(np.all(hf_tok == ours_tok, axis=1)))
    return row


def summarize(rows) -> dict:
    batches = [r["batch"] for r in rows]
    out = {}
    if len(set(batches)) >= 2:
        d0, d1 = fit_linear_time(batches, [r["step_s"] for r in rows])
        out["fit_step_s"] = {"d0": d0, "d1": d1}
        if all("decode_step_s" in r for r in rows):
            d0, d1 = fit_linear_time(batches, [r["decode_step_s"] for r in rows])
            out["fit_decode_step_s"] = {"d0": d0, "d1": d1}
        out["critical_generation_batch"] = critical_generation_batch(
            batches, [r["tokens_per_s"] for r in rows], FLAGS.min_gain)
    return out


def print_table(rows, summary):
    """%peak: achieved FLOP/s over the matmul peak timed alongside, for the whole call (prefill
    included) and for decode steps alone; %roofline: a decode step's minimum bytes (weights +
    KV) at the measured copy bandwidth, over its time."""
    hf = any("hf_tokens_per_s" in r for r in rows)
    nan = float("nan")
    head = (f"{'B':>6} {'tok/s':>9} {'ms/token':>9} {'step ms':>8} {'prefill ms':>10} "
            f"{'peak GF/s':>9} {'%peak':>6} {'%peak step':>10} {'%roofline':>9}")
    print("\n" + head + (f" {'HF tok/s':>9} {'ours/HF':>8} {'same tok':>8}" if hf else ""))
    for r in rows:
        line = (f"{r['batch']:>6} {r['tokens_per_s']:>9.1f} {1e3 * r['step_s']:>9.2f} "
                f"{1e3 * r.get('decode_step_s', nan):>8.2f} {1e3 * r.get('prefill_s', nan):>10.1f} "
                f"{r['matmul_peak_flops_per_s'] / 1e9:>9.1f} {100 * r['frac_matmul_peak']:>5.1f}% "
                f"{100 * r.get('frac_matmul_peak_decode', nan):>9.1f}% "
                f"{100 * r.get('frac_mem_roofline_decode', nan):>8.1f}%")
        if hf and "hf_tokens_per_s" in r:
            line += (f" {r['hf_tokens_per_s']:>9.1f} {r['speedup_vs_hf']:>7.2f}x "
                     f"{100 * r['same_tokens_as_hf']:>7.0f}%")
        print(line)
    for k in ("fit_step_s", "fit_decode_step_s"):
        if k in summary:
            d0, d1 = summary[k]["d0"], summary[k]["d1"]
            print(f"{k}: d0 = {1e3 * d0:.3f} ms, d1 = {1e6 * d1:.3f} us/row")
    if "critical_generation_batch" in summary:
        print(f"critical generation batch (doubling adds < {FLAGS.min_gain:.0%}): "
              f"{summary['critical_generation_batch']}")


def check_flags() -> None:
    """One line and exit 2 for a flag the bench cannot use, before any model or timing."""
    import jaxrl_scale.cli as c
    c.check_flag_ranges({"prompt_len": (1, INF, False), "new_tokens": (1, INF, False),
                         "repeats": (1, INF, False), "matmul_n": (1, INF, False),
                         "copy_mib": (1, INF, False), "min_gain": (0, INF, True),
                         "seed": (0, INF, False)},
                        ints=("prompt_len", "new_tokens", "repeats", "matmul_n", "copy_mib",
                              "seed"))
    c.int_list_flag("batch_sizes")
    if FLAGS.hf_batch_sizes:
        c.int_list_flag("hf_batch_sizes")
    c.check_choice("dtype", FLAGS.dtype, ("float32", "bfloat16", "float16"))
    if FLAGS.hf_checkpoint:
        from jaxrl_scale.experiment.checks import hf_model_config
        from jaxrl_scale.experiment.errors import ConfigError
        if not os.path.isfile(os.path.join(os.path.expanduser(FLAGS.hf_checkpoint),
                                           "config.json")):
            raise ConfigError("hf_checkpoint", f"no config.json in {FLAGS.hf_checkpoint!r}",
                              "point --hf_checkpoint at a HF checkpoint directory")
        hf_model_config(FLAGS.hf_checkpoint)   # config.json's fields and the weights' headers
    else:
        c.check_model_preset()
    c.check_json_out()


def main(argv):
    del argv
    with one_line_errors():
        check_flags()
    cfg, params = load_model()
    batches = sorted(int(b) for b in FLAGS.batch_sizes)
    machine = dict(matmul=bench.matmul_peak(FLAGS.matmul_n, FLAGS.dtype),
                   copy=bench.copy_bandwidth(FLAGS.copy_mib << 20),
                   backend=jax.default_backend(), devices=len(jax.devices()),
                   cpu_count=os.cpu_count(), processor=platform.processor(),
                   jax=jax.__version__)
    machine["prepare_s"] = bench.median_time(
        lambda: decode._unstack_jit(cfg, params, True), FLAGS.repeats, warmup=1)
    print(f"matmul peak {machine['matmul']['flops_per_s'] / 1e9:.1f} GFLOP/s, "
          f"copy bandwidth {machine['copy']['bytes_per_s'] / 1e9:.2f} GB/s, "
          f"{cfg.num_params() / 1e6:.1f}M params, "
          f"weight preparation per new params {1e3 * machine['prepare_s']:.1f} ms")
    model = hf_model(cfg, params) if FLAGS.compare_hf else None
    rows = []
    for b in batches:
        row = time_batch(cfg, params, b, machine, model)
        rows.append(row)
        print(f"B={b}: {row['tokens_per_s']:.1f} tok/s"
              + (f", HF {row['hf_tokens_per_s']:.1f} tok/s ({row['speedup_vs_hf']:.2f}x)"
                 if "hf_tokens_per_s" in row else "")
              + f", matmul peak {row['matmul_peak_flops_per_s'] / 1e9:.1f} GFLOP/s", flush=True)
    summary = summarize(rows)
    print_table(rows, summary)
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json_out)), exist_ok=True)
        flag_values = {k: FLAGS[k].value for k in (
            "model", "hf_checkpoint", "batch_sizes", "prompt_len", "new_tokens", "repeats",
            "dtype", "compare_hf", "hf_batch_sizes", "min_gain", "seed")}
        write_json(FLAGS.json_out, dict(flags=flag_values, model=cfg.__dict__ | {
            "num_params": cfg.num_params()}, machine=machine, results=rows, **summary),
            indent=2, default=str)
        logging.info("wrote %s", FLAGS.json_out)
        print(f"wrote {FLAGS.json_out}")


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
