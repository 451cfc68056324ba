r"""One prepared accelerator check: the decode, update and RL-loop benchmarks on whatever
device JAX sees, with memory-bandwidth and FLOP utilisation against the chip's published
peaks (jaxrl_scale.bench.CHIPS, sources named there).

Runs the decode, train, RL-loop and MoE-dispatch benchmarks (jaxrl_scale.cli.*_bench) as child
processes (each with its own time limit, so one failure still leaves the others' figures),
reads their JSON and prints one table. On a CPU there is no published peak: the fractions are
of the peaks each benchmark measures in its own process.

    python experiments/device_check.py                      # accelerator-sized shapes
    python experiments/device_check.py --quick              # CPU-sized smoke run
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import flags

from jaxrl_scale.cli import run_main
from jaxrl_scale.numbers import write_json

FLAGS = flags.FLAGS
flags.DEFINE_bool("quick", False, "Small shapes (minutes on a CPU) instead of accelerator ones.")
flags.DEFINE_string("out_dir", "results/device_check", "Where every benchmark's JSON goes.")
flags.DEFINE_integer("timeout_s", 420, "Time limit per benchmark.")

def _plans(quick: bool, out: str) -> dict[str, list[str]]:
    if quick:
        model, dt, dec_b, upd = "rl_cpu", "float32", "1,16,64", ["--batch=64", "--seq_len=16",
                                                                  "--prompt_len=8"]
        rl = ["--prompts=8", "--steps=6", "--rounds=1"]
        moe_ = ["--batch=8", "--seq_len=32", "--new_tokens=8", "--decode_batch=8",
                "--rounds=2", "--kernel=false"]
    else:
        model, dt, dec_b, upd = "qwen2.5-0.5b", "bfloat16", "1,16,64,256", [
            "--batch=32", "--seq_len=512", "--prompt_len=128"]
        rl = ["--prompts=32,128", "--steps=12", "--rounds=2"]
        moe_ = ["--batch=64", "--seq_len=128", "--prompt_len=32", "--new_tokens=64",
                "--decode_batch=64", "--rounds=3"]
    return {
        "decode": ["-m", "jaxrl_scale.cli.decode_bench", f"--model={model}", f"--dtype={dt}",
                   f"--batch_sizes={dec_b}", "--new_tokens=32", f"--json_out={out}/decode.json"],
        "update": ["-m", "jaxrl_scale.cli.train_bench", f"--model={model}", f"--dtype={dt}",
                   "--micro_batches=1", *upd, f"--json_out={out}/update.json"],
        "rl_loop": ["-m", "jaxrl_scale.cli.rl_bench", *rl, f"--json_out={out}/rl_loop.json"],
        "moe": ["-m", "jaxrl_scale.cli.moe_bench", *moe_, f"--json_out={out}/moe.json"],
    }


def _run(name: str, argv: list[str]) -> dict:
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, *argv], capture_output=True, text=True,
                           timeout=FLAGS.timeout_s)
        ok, tail = p.returncode == 0, (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        ok, tail = False, f"timed out after {FLAGS.timeout_s} s"
    print(f"[{name}] {'ok' if ok else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
    if not ok:
        print(tail)
    return {"ok": ok}


def main(argv):
    del argv
    import jax
    from jaxrl_scale import bench

    dev = jax.devices()[0]
    chip = bench.chip_peaks(dev.device_kind)
    print(f"device: {dev.device_kind} x {jax.device_count()} ({jax.default_backend()}); "
          f"published peaks: {chip[0] + ' (' + chip[1]['source'] + ')' if chip else 'none'}")
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    status = {n: _run(n, a) for n, a in _plans(FLAGS.quick, FLAGS.out_dir).items()}

    def load(name):
        path = os.path.join(FLAGS.out_dir, f"{name}.json")
        return json.load(open(path)) if status[name]["ok"] and os.path.exists(path) else None

    print(f"\n{'benchmark':<28} {'figure':>14} {'vs chip peak':>13} {'vs measured':>12}")
    dec, upd, rl, moe_ = load("decode"), load("update"), load("rl_loop"), load("moe")
    if dec:
        for r in dec["results"]:
            bw = r["step_bytes"] / r["step_s"]
            peak = f"{100 * bw / chip[1]['hbm_bytes_per_s']:.1f}% HBM" if chip else "-"
            print(f"{'decode B=' + str(r['batch']):<28} {r['tokens_per_s']:>10.0f} t/s "
                  f"{peak:>13} {100 * r['frac_mem_roofline']:>10.1f}%")
    if upd:
        dt = upd["dtype"]
        for r in upd["rows"]:
            peak = chip[1]["flops"].get(dt) if chip else None
            pk = f"{100 * r['flops_per_s'] / peak:.1f}% MFU" if peak else "-"
            print(f"{'update ' + upd['model'] + ' M=' + str(r['micro_batches']):<28} "
                  f"{r['tokens_per_s']:>10.0f} t/s {pk:>13} {100 * r['mfu']:>10.1f}%")
    if rl:
        for res in rl["results"]:
            r = res["rounds"]["jaxrl_scale"]
            med = sorted(x["responses_per_s"] for x in r)[len(r) // 2]
            print(f"{'RL loop P=' + str(res['P']) + ' G=' + str(res['G']):<28} "
                  f"{med:>7.0f} resp/s {'-':>13} {'-':>12}")
    if moe_:   # MoE dispatch: dense / sparse time ratio per round (median)
        for shape, r in moe_["shapes"].items():
            for step in ("update", "decode"):
                x = r[step]["dense_over_sparse"]["median"]
                print(f"{'moe ' + shape + ' ' + step:<28} {x:>8.2f} d/s {'-':>13} {'-':>12}")
    write_json(os.path.join(FLAGS.out_dir, "device.json"),
               dict(device_kind=dev.device_kind, device_count=jax.device_count(),
                    chip=chip[0] if chip else None, status=status), indent=2)
    if not all(s["ok"] for s in status.values()):
        sys.exit(1)


def run():
    """Console-script entry point."""
    run_main(main, __name__)


if __name__ == "__main__":
    run()
