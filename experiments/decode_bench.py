r"""Decode throughput of `jaxrl_scale.sampling.generate` across batch sizes (SCIENCE.md §3).

Per batch: generated tokens/s (median of --repeats timed calls after one warm-up call that
compiles), step time, prefill time; then the fit t_step = d0 + d1 * B, the critical generation
batch (smallest B whose doubling adds < 10% throughput), the fraction of the matmul peak and of
the memory roofline, both measured in this process. --compare_hf times HF transformers
`generate` (greedy, KV cache, min_new_tokens = max_new_tokens = --new_tokens) on the same
weights and prompts and prints ours / HF per batch.

Every row generates exactly --new_tokens tokens: generate runs with eos_id=None (no early stop),
and HF with min_new_tokens = --new_tokens.

    python experiments/decode_bench.py --model=small
    python experiments/decode_bench.py --batch_sizes=1,4 --new_tokens=8 --compare_hf
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile

from absl import app, flags, logging
import jax
import numpy as np

from jaxrl_scale import bench
from jaxrl_scale.models import get_config, init_params
from jaxrl_scale.sampling import generate
from jaxrl_scale.scaling.throughput import critical_generation_batch, fit_linear_time

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


def time_ours(cfg, params, batch, machine) -> dict:
    prompts, n = prompts_for(cfg, batch), FLAGS.new_tokens

    def run(max_new):
        return generate(cfg, params, prompts, max_new_tokens=max_new, temperature=0.0,
                        eos_id=None, pad_id=0)

    times = bench.time_calls(lambda: run(n), FLAGS.repeats, warmup=1)
    t = statistics.median(times)
    context = FLAGS.prompt_len + (n - 1) / 2  # mean keys a step attends to
    step = t / n
    row = dict(batch=batch, time_s=t, times_s=times, tokens_per_s=batch * n / t, step_s=step,
               step_flops=bench.decode_step_flops(cfg, batch, context),
               step_bytes=bench.decode_step_bytes(cfg, batch, context))
    row["frac_matmul_peak"] = row["step_flops"] / step / machine["matmul"]["flops_per_s"]
    row["frac_mem_roofline"] = (row["step_bytes"] / machine["copy"]["bytes_per_s"]) / step
    if FLAGS.time_prefill and n > 1:
        row["prefill_s"] = bench.median_time(lambda: run(1), FLAGS.repeats, warmup=1)
        row["decode_step_s"] = (t - row["prefill_s"]) / (n - 1)
    row["tokens"] = np.asarray(run(n).tokens)
    return row


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


def time_hf(model, cfg, batch) -> dict:
    import torch
    ids = torch.tensor(prompts_for(cfg, batch), dtype=torch.long)
    n = FLAGS.new_tokens

    def run():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  use_cache=True, max_new_tokens=n, min_new_tokens=n,
                                  pad_token_id=0)

    t = bench.median_time(run, FLAGS.repeats, warmup=1)
    return dict(hf_time_s=t, hf_tokens_per_s=batch * n / t,
                hf_tokens=run()[:, FLAGS.prompt_len:].numpy())


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
    hf = "hf_tokens_per_s" in rows[0]
    head = (f"{'B':>6} {'tok/s':>10} {'step ms':>9} {'prefill ms':>10} {'%matmul':>8} "
            f"{'%roofline':>9}")
    print("\n" + head + (f" {'HF tok/s':>10} {'ours/HF':>8} {'same tok':>8}" if hf else ""))
    for r in rows:
        line = (f"{r['batch']:>6} {r['tokens_per_s']:>10.1f} {1e3 * r['step_s']:>9.2f} "
                f"{1e3 * r.get('prefill_s', float('nan')):>10.2f} "
                f"{100 * r['frac_matmul_peak']:>7.1f}% {100 * r['frac_mem_roofline']:>8.1f}%")
        if hf:
            line += (f" {r['hf_tokens_per_s']:>10.1f} {r['speedup_vs_hf']:>7.2f}x "
                     f"{100 * r['same_tokens_as_hf']:>7.0f}%")
        print(line)
    for k in ("fit_step_s", "fit_decode_step_s"):
        if k in summary:
            d0, d1 = summary[k]["d0"], summary[k]["d1"]
            print(f"{k}: d0 = {1e3 * d0:.3f} ms, d1 = {1e6 * d1:.3f} us/row")
    if "critical_generation_batch" in summary:
        print(f"critical generation batch (doubling adds < {FLAGS.min_gain:.0%}): "
              f"{summary['critical_generation_batch']}")


def main(argv):
    del argv
    cfg, params = load_model()
    batches = sorted(int(b) for b in FLAGS.batch_sizes)
    machine = dict(matmul=bench.matmul_peak(FLAGS.matmul_n, FLAGS.dtype),
                   copy=bench.copy_bandwidth(FLAGS.copy_mib << 20),
                   backend=jax.default_backend(), devices=len(jax.devices()),
                   cpu_count=os.cpu_count(), processor=platform.processor(),
                   jax=jax.__version__)
    print(f"matmul peak {machine['matmul']['flops_per_s'] / 1e9:.1f} GFLOP/s, "
          f"copy bandwidth {machine['copy']['bytes_per_s'] / 1e9:.2f} GB/s, "
          f"{cfg.num_params() / 1e6:.1f}M params")
    model = hf_model(cfg, params) if FLAGS.compare_hf else None
    rows = []
    for b in batches:
        row = time_ours(cfg, params, b, machine)
        if model is not None:
            row |= time_hf(model, cfg, b)
            row["speedup_vs_hf"] = row["tokens_per_s"] / row["hf_tokens_per_s"]
            row["same_tokens_as_hf"] = float(np.mean(np.all(row.pop("hf_tokens") == row["tokens"],
                                                            axis=1)))
        row.pop("tokens")
        rows.append(row)
        print(f"B={b}: {row['tokens_per_s']:.1f} tok/s"
              + (f", HF {row['hf_tokens_per_s']:.1f} tok/s" if model is not None else ""),
              flush=True)
    summary = summarize(rows)
    print_table(rows, summary)
    if FLAGS.json_out:
        os.makedirs(os.path.dirname(os.path.abspath(FLAGS.json_out)), exist_ok=True)
        flag_values = {k: FLAGS[k].value for k in (
            "model", "hf_checkpoint", "batch_sizes", "prompt_len", "new_tokens", "repeats",
            "dtype", "compare_hf", "min_gain", "seed")}
        with open(FLAGS.json_out, "w") as f:
            json.dump(dict(flags=flag_values, model=cfg.__dict__ | {"num_params": cfg.num_params()},
                           machine=machine, results=rows, **summary), f, indent=2, default=str)
        logging.info("wrote %s", FLAGS.json_out)
        print(f"wrote {FLAGS.json_out}")


if __name__ == "__main__":
    app.run(main)
