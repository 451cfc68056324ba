"""Timing helpers shared by the benchmarks: median wall time, matmul peak, copy bandwidth,
and the FLOP / byte counts of a decoder step (for roofline fractions).

Everything here measures in the calling process, so a benchmark compares itself against the
peak of the same machine, under the same load, in the same run.
"""
from __future__ import annotations

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

# Published per-chip peaks: dense (no sparsity) matmul FLOP/s by dtype and HBM bandwidth.
# Sources: NVIDIA A100 datasheet (SXM4 80GB), H100 datasheet (SXM5), H200 product brief (SXM);
# Google Cloud TPU system-architecture pages for v5e, v5p and v6e (Trillium).
CHIPS: dict[str, dict] = {
    "A100": dict(flops={"bfloat16": 312e12, "float32": 19.5e12}, hbm_bytes_per_s=2.039e12,
                 hbm_bytes=80e9, source="NVIDIA A100 Tensor Core GPU datasheet, SXM4 80GB"),
    "H100": dict(flops={"bfloat16": 989e12, "float32": 67e12}, hbm_bytes_per_s=3.35e12,
                 hbm_bytes=80e9, source="NVIDIA H100 Tensor Core GPU datasheet, SXM5"),
    "H200": dict(flops={"bfloat16": 989e12, "float32": 67e12}, hbm_bytes_per_s=4.8e12,
                 hbm_bytes=141e9, source="NVIDIA H200 Tensor Core GPU product brief, SXM"),
    "TPU v5e": dict(flops={"bfloat16": 197e12}, hbm_bytes_per_s=819e9, hbm_bytes=16e9,
                    source="cloud.google.com/tpu/docs/v5e"),
    "TPU v5p": dict(flops={"bfloat16": 459e12}, hbm_bytes_per_s=2.765e12, hbm_bytes=95e9,
                    source="cloud.google.com/tpu/docs/v5p"),
    "TPU v6e": dict(flops={"bfloat16": 918e12}, hbm_bytes_per_s=1.64e12, hbm_bytes=32e9,
                    source="cloud.google.com/tpu/docs/v6e"),
}
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
