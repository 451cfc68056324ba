"""Timing helpers shared by the benchmarks: median wall time, matmul peak, copy bandwidth,
and the FLOP / byte counts of a decoder step (for roofline fractions).

Everything here measures in the calling process, so a benchmark compares itself against the
peak of the same machine, under the same load, in the same run.
"""
from __future__ import annotations

import functools
import statistics
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.models.config import ModelConfig


def block(x: Any) -> Any:
    """Wait for every array in a pytree (host-side values pass through)."""
    return jax.block_until_ready(x)


def time_calls(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> list[float]:
    """Wall seconds of `repeats` calls of fn() after `warmup` untimed calls (compilation)."""
    return time_interleaved({"fn": fn}, repeats, warmup)[0]["fn"]


def time_interleaved(fns: dict[str, Callable[[], Any]], repeats: int = 3, warmup: int = 1,
                     skip_warmup: tuple[str, ...] = ()
                     ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Wall seconds of each fn, timed round-robin: call 1 of every fn, then call 2, ...
    -> (times per name, each fn's last output: results to check without another call).

    On a shared machine throughput drifts over minutes; alternating the contenders puts each
    round of the comparison in the same time window, so a ratio of medians is not a ratio of
    two different machine states. `skip_warmup`: names with nothing to compile (eager code).
    """
    last: dict[str, Any] = {}
    for _ in range(warmup):
        for name, fn in fns.items():
            if name not in skip_warmup:
                last[name] = block(fn())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            last[name] = block(fn())
            times[name].append(time.perf_counter() - t0)
    return times, last


def matmul_fn(n: int = 2048, dtype: str = "float32") -> tuple[Callable[[], Any], float]:
    """(a jitted n x n x n matmul call, its FLOPs): to time next to other work."""
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), jnp.float32).astype(dtype)
    mm = jax.jit(lambda x, y: x @ y)
    return (lambda: mm(a, b)), 2.0 * n ** 3


def median_time(fn: Callable[[], Any], repeats: int = 3, warmup: int = 1) -> float:
    """Median wall seconds of fn() (blocked until ready), warm-up calls excluded."""
    return statistics.median(time_calls(fn, repeats, warmup))


def matmul_peak(n: int = 2048, dtype: str = "float32", repeats: int = 5) -> dict:
    """Achieved FLOP/s of a jitted n x n x n matmul: the practical compute peak."""
    fn, flops = matmul_fn(n, dtype)
    t = median_time(fn, repeats=repeats, warmup=2)
    return {"n": n, "dtype": str(dtype), "seconds": t, "flops_per_s": flops / t}


def copy_bandwidth(nbytes: int = 256 << 20, repeats: int = 5) -> dict:
    """Achieved memory bandwidth (bytes read + written per second) of a jitted array copy."""
    n = nbytes // 4
    # v + 1 forces a real read + write (a bare copy may be elided); donating the input reuses
    # its buffer, so the timing is not dominated by page faults of a fresh output allocation
    cp = jax.jit(lambda v: v + 1.0, donate_argnums=0)
    state = [jnp.arange(n, dtype=jnp.float32)]

    def step():
        state[0] = cp(state[0])
        return state[0]

    t = median_time(step, repeats=repeats, warmup=2)
    return {"bytes": 4 * n, "seconds": t, "bytes_per_s": 2.0 * 4 * n / t}


def matmul_params(cfg: ModelConfig) -> int:
    """Parameters used as matmul weights per token: all but the embedding lookup table
    (a tied table is counted once, as the LM head)."""
    return cfg.num_params() - (0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size)


def decode_step_flops(cfg: ModelConfig, batch: int, context: float) -> float:
    """FLOPs of one decode step: 2 * matmul params * B + attention (QK^T and PV) over
    `context` keys per row."""
    attn = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
    return batch * (2.0 * matmul_params(cfg) + attn)


def prefill_flops(cfg: ModelConfig, batch: int, tokens: int) -> float:
    """FLOPs of `generate`'s prefill: all but the last prompt token through every layer, no LM
    head (its logits are unused), causal attention over the block."""
    lm_head = cfg.vocab_size * cfg.hidden_size
    attn = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * tokens * (tokens + 1) / 2
    return batch * (2.0 * (matmul_params(cfg) - lm_head) * tokens + attn)


def decode_step_bytes(cfg: ModelConfig, batch: int, context: float) -> float:
    """Bytes a decode step must read: the matmul weights once (layers in the compute dtype,
    as `unstack_layers` prepares them; the LM head in the param dtype) + K and V of `context`
    slots per row (in the compute dtype)."""
    head = cfg.vocab_size * cfg.hidden_size
    w = (matmul_params(cfg) - head) * np.dtype(cfg.dtype).itemsize + \
        head * np.dtype(cfg.param_dtype).itemsize
    kv = 2.0 * cfg.num_layers * batch * context * cfg.num_kv_heads * cfg.head_dim \
        * np.dtype(cfg.dtype).itemsize
    return w + kv


# ----------------------------------------------------------------------------- chip peaks

# Published per-chip peaks: dense (no sparsity) matmul FLOP/s by dtype and HBM bandwidth, one
# chip each (the roofline, scaling/roofline.py, multiplies by a chip count). Every entry names
# its public source ("source": the document, "url": where it is published). NVIDIA's headline
# bf16 tensor-core figures are "with sparsity"; the dense figure here is half of that; float32
# is the non-tensor FP32 figure.
CHIPS: dict[str, dict] = {
    "A100": dict(flops={"bfloat16": 312e12, "float32": 19.5e12}, hbm_bytes_per_s=2.039e12,
                 hbm_bytes=80e9, source="NVIDIA A100 Tensor Core GPU datasheet, SXM4 80GB",
                 url="https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
                     "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"),
    "H100": dict(flops={"bfloat16": 989e12, "float32": 67e12}, hbm_bytes_per_s=3.35e12,
                 hbm_bytes=80e9, source="NVIDIA H100 Tensor Core GPU datasheet, SXM5",
                 url="https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-"
                     "datasheet"),
    "H200": dict(flops={"bfloat16": 989e12, "float32": 67e12}, hbm_bytes_per_s=4.8e12,
                 hbm_bytes=141e9, source="NVIDIA H200 Tensor Core GPU product brief, SXM",
                 url="https://www.nvidia.com/en-us/data-center/h200/"),
    "TPU v5e": dict(flops={"bfloat16": 197e12}, hbm_bytes_per_s=819e9, hbm_bytes=16e9,
                    source="Google Cloud TPU v5e system architecture",
                    url="https://cloud.google.com/tpu/docs/v5e"),
    "TPU v5p": dict(flops={"bfloat16": 459e12}, hbm_bytes_per_s=2.765e12, hbm_bytes=95e9,
                    source="Google Cloud TPU v5p system architecture",
                    url="https://cloud.google.com/tpu/docs/v5p"),
    "TPU v6e": dict(flops={"bfloat16": 918e12}, hbm_bytes_per_s=1.64e12, hbm_bytes=32e9,
                    source="Google Cloud TPU v6e (Trillium) system architecture",
                    url="https://cloud.google.com/tpu/docs/v6e"),
}
# Not a datasheet chip: this process's machine, from peaks measured now (`measured_chip`).
CPU_THIS_MACHINE = "cpu-this-machine"
_KIND_ALIASES = (("v5 lite", "TPU v5e"), ("v5e", "TPU v5e"), ("v5p", "TPU v5p"),
                 ("v6 lite", "TPU v6e"), ("v6e", "TPU v6e"), ("h200", "H200"), ("h100", "H100"),
                 ("a100", "A100"))


def chip_peaks(device_kind: str) -> tuple[str, dict] | None:
    """(name, CHIPS entry) for a `jax.Device.device_kind` string, or None (e.g. a CPU)."""
    kind = device_kind.lower()
    for alias, name in _KIND_ALIASES:
        if alias in kind:
            return name, CHIPS[name]
    return None


def measured_chip(flops_per_s: float, hbm_bytes_per_s: float, dtype: str = "float32",
                  hbm_bytes: float | None = None, source: str = "measured") -> dict:
    """A CHIPS-style entry from measured peaks (e.g. decode_bench's `matmul_peak_flops_per_s`
    and `machine.copy.bytes_per_s`), so the roofline can be checked on a machine that has no
    datasheet row: the same formula, fed this machine's achieved matmul and copy rates."""
    return dict(flops={str(dtype): float(flops_per_s)}, hbm_bytes_per_s=float(hbm_bytes_per_s),
                hbm_bytes=hbm_bytes, source=source, url=None)


@functools.lru_cache(maxsize=None)
def _this_machine(dtype: str) -> tuple[float, float]:
    return (matmul_peak(dtype=dtype, repeats=5)["flops_per_s"],
            copy_bandwidth(repeats=5)["bytes_per_s"])


def chip_entry(chip: str | dict, dtype: str = "bfloat16") -> dict:
    """The peaks of `chip`: a CHIPS name (or a device_kind string it matches), a CHIPS-style
    dict (passed through), or CPU_THIS_MACHINE (matmul and copy peaks measured in this process
    once, in `dtype`). Peak FLOP/s for `dtype` must exist: ValueError names what does."""
    if isinstance(chip, dict):
        entry = chip
    elif chip == CPU_THIS_MACHINE:
        flops, bw = _this_machine(str(dtype))
        entry = measured_chip(flops, bw, dtype, source=f"measured in this process ({dtype} "
                              "matmul_peak, copy_bandwidth)")
    elif chip in CHIPS:
        entry = CHIPS[chip]
    elif chip_peaks(chip) is not None:
        entry = chip_peaks(chip)[1]
    else:
        raise ValueError(f"unknown chip {chip!r}; use one of {sorted(CHIPS)}, "
                         f"{CPU_THIS_MACHINE!r} or a dict from measured_chip(...)")
    if str(dtype) not in entry["flops"]:
        raise ValueError(f"chip {chip if isinstance(chip, str) else entry.get('source')!r} has "
                         f"no published {dtype} peak; it has {sorted(entry['flops'])}")
    return entry
