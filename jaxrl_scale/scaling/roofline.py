"""Roofline step times for hardware that is not present (docs/science.md, Step-cost model;
the jax-ml scaling book): every kernel takes at least max(FLOPs / peak FLOP/s, bytes / HBM
bandwidth).

What it is for: a planner that must rank batches on a chip the user does not have yet needs
t_gen(B_gen) and t_train(B) there; the roofline gives their lower bounds from the model shape
and the chip's datasheet peaks (bench.CHIPS). Decode at small batch re-reads all weights for
few tokens (memory-bound, d0 ~ W_bytes / HBM_bw); past the ridge batch ~ peak / bw the
matmuls saturate compute and time grows ~ linearly in B. A roofline is a lower bound: real
kernels reach a fraction of both peaks (`flops_efficiency`, `bandwidth_efficiency` scale them;
results/roofline_validation/ measures them on this CPU).

Accounting (bench.py's FLOP and byte counts, the ones decode_bench reports fractions of):
- decode step at context c (keys attended per row): FLOPs = B (2 P_matmul + 4 L N H c),
  bytes = weights once (layers in the compute dtype, LM head in the param dtype, as
  `generate` prepares them) + K and V of c slots per row;
- prefill: all but the last prompt token through every layer (no LM head), causal attention;
- update: forward + backward = 3x a forward of 2 P_matmul FLOPs per token plus causal
  attention, over the padded rows (the jitted step has fixed shape [B, prompt + max response]),
  then Adam streaming float32 params, grads and both moments (read 4, write 3 arrays).
`count` chips divide both FLOPs and bytes evenly (ideal data/tensor parallelism, no
communication): again a lower bound.

Response lengths (how many decode steps run, at which batch):
- "generate" (default; `sampling.generate`): one fixed-shape while_loop; finished rows keep
  computing and reading their cache until every row is done, so all B rows run to the longest;
- "shrink": an engine that drops finished rows without refilling (batch at step t = rows
  still decoding); a lower bound for the same responses;
- "refill": continuous batching in steady state (the slot engine): every slot is busy, B
  responses finish per mean(length) steps, a slot's context is the mean over response tokens.
`response_lens` is one length, the B rows' lengths (a sequence of exactly `batch` values), or
samples of the length distribution (any other size): then "generate" runs step t with the
probability that the longest of B draws exceeds t, and "shrink" at the expected batch
B * P(L > t).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from jaxrl_scale import bench
from jaxrl_scale.models.config import ModelConfig

MODES = ("generate", "shrink", "refill")
ADAM_ARRAYS_READ, ADAM_ARRAYS_WRITTEN = 4, 3   # params, grads, m, v in; params, m, v out


def _itemsize(dtype: str) -> int:
    return int(np.dtype(dtype).itemsize)   # bfloat16 is known once jax (ml_dtypes) is imported


def kv_bytes_per_token(cfg: ModelConfig, dtype: str) -> float:
    """K and V of one cached token, all layers."""
    return 2.0 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * _itemsize(dtype)


def decode_schedule(response_lens, batch: int, mode: str = "generate"
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offset_T, batch_T, weight_T): decode step t runs with weight_T[t] (its expected count)
    at batch batch_T[t] and context prompt_len + offset_T[t] (module docstring: modes)."""
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}; use one of {MODES}")
    lens = np.atleast_1d(np.asarray(response_lens, dtype=float))
    if lens.size == 0 or np.any(lens < 1) or np.any(lens != np.round(lens)):
        raise ValueError(f"response_lens must be positive integers, got {response_lens!r}")
    rows = lens.size == 1 or lens.size == batch   # the rows themselves, else a distribution
    n_max = int(lens.max())
    t = np.arange(n_max, dtype=float)
    surv_T = np.mean(lens[None, :] > t[:, None], axis=1)      # P(L > t)
    if mode == "refill":
        mean_len = float(lens.mean())
        # a slot at a random step holds a response token at offset o with frequency
        # proportional to the responses longer than o: mean offset E[L(L-1)/2] / E[L]
        offset = float(np.mean(lens * (lens - 1) / 2) / mean_len)
        n = math.ceil(mean_len)
        w = np.ones(n)
        w[-1] = mean_len - (n - 1)
        return np.full(n, offset), np.full(n, float(batch)), w
    if mode == "shrink":
        return t, batch * surv_T, np.ones(n_max)
    if rows:                                              # generate: to the longest row
        return t, np.full(n_max, float(batch)), np.ones(n_max)
    return t, np.full(n_max, float(batch)), 1.0 - (1.0 - surv_T) ** batch


def predict_step_times(model_cfg: ModelConfig, chip: str | dict, batch: int, prompt_len: int,
                       response_lens, dtype: str = "bfloat16", count: int = 1, *,
                       mode: str = "generate", param_dtype: str | None = None,
                       seq_len: int | None = None, ref_forward: bool = False,
                       flops_efficiency: float = 1.0, bandwidth_efficiency: float = 1.0
                       ) -> dict:
    """Roofline rollout and update seconds of one batch on `count` chips of kind `chip`.

    chip: a bench.CHIPS name ("H100", "TPU v5e", ...), bench.CPU_THIS_MACHINE (peaks measured
    now) or a dict from bench.measured_chip. dtype: the matmul / KV-cache dtype whose peak
    applies; param_dtype: the stored weights (LM head read, Adam state; default the model's).
    seq_len: padded update row length (default prompt_len + longest response).
    ref_forward: add the KL reference model's forward pass to the update.

    Returns seconds: "decode_step_s" [steps] (each step's time when it runs),
    "decode_step_weight" [steps] (its expected count), "decode_s" (their weighted sum),
    "prefill_s", "rollout_s" (prefill + decode), "update_s"; "bound" ("memory" | "compute":
    what limits most of the decode time), "step_bound" [steps], "ridge_batch" (batch where a
    decode step at the mean context turns compute-bound), FLOPs and bytes of each part,
    "weight_bytes", "kv_cache_bytes" (at the longest context), "hbm_bytes" and "fits_hbm"
    (weights + KV cache within the chips' HBM; None if unknown), "peak_flops_per_s",
    "hbm_bytes_per_s" (per chip, after the efficiencies), "chip", "assumptions".
    """
    if batch < 1 or prompt_len < 1 or count < 1:
        raise ValueError(f"batch={batch}, prompt_len={prompt_len}, count={count} must be >= 1")
    entry = bench.chip_entry(chip, dtype)
    flops_s = entry["flops"][str(dtype)] * flops_efficiency
    bw = entry["hbm_bytes_per_s"] * bandwidth_efficiency
    F, BW = flops_s * count, bw * count
    cfg = model_cfg.replace(dtype=str(dtype), param_dtype=str(param_dtype or
                                                               model_cfg.param_dtype))

    # ---- decode
    off_T, b_T, w_T = decode_schedule(response_lens, batch, mode)
    ctx_T = prompt_len + off_T
    flops_T = bench.decode_step_flops(cfg, b_T, ctx_T)
    bytes_T = bench.decode_step_bytes(cfg, b_T, ctx_T)
    tc_T, tm_T = flops_T / F, bytes_T / BW
    step_T = np.maximum(tc_T, tm_T)
    decode_s = float(np.sum(w_T * step_T))
    compute_share = float(np.sum(w_T * step_T * (tc_T >= tm_T)) / decode_s)

    # ridge: B (2 P + 4 L N H c) / F = (W + B kv(c)) / BW at the mean context of the steps
    c_mean = float(np.sum(w_T * ctx_T) / np.sum(w_T))
    w_bytes = float(bench.decode_step_bytes(cfg, 0, 0.0))
    per_row_flops = float(bench.decode_step_flops(cfg, 1, c_mean))
    per_row_bytes = float(bench.decode_step_bytes(cfg, 1, c_mean)) - w_bytes
    denom = per_row_flops / F - per_row_bytes / BW
    ridge = (w_bytes / BW) / denom if denom > 0 else math.inf

    # ---- prefill: prompt_len - 1 tokens (the last one is the first decode step)
    n_pre = prompt_len - 1
    head_bytes = cfg.vocab_size * cfg.hidden_size * _itemsize(cfg.param_dtype)
    pre_flops = float(bench.prefill_flops(cfg, batch, n_pre)) if n_pre else 0.0
    pre_bytes = (w_bytes - head_bytes + batch * n_pre * kv_bytes_per_token(cfg, dtype)) \
        if n_pre else 0.0
    prefill_s = max(pre_flops / F, pre_bytes / BW)

    # ---- update
    lens = np.atleast_1d(np.asarray(response_lens))
    T = int(seq_len or prompt_len + int(lens.max()))
    p_mm = bench.matmul_params(cfg)
    attn_fwd = 4.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * T * (T + 1) / 2
    fwd_flops = batch * (2.0 * p_mm * T + attn_fwd)
    upd_flops = (3.0 + (1.0 if ref_forward else 0.0)) * fwd_flops
    opt_bytes = (ADAM_ARRAYS_READ + ADAM_ARRAYS_WRITTEN) * cfg.num_params() * \
        _itemsize(cfg.param_dtype)
    update_s = upd_flops / F + opt_bytes / BW

    # ---- memory: stored params + the prepared compute copy + the cache at the longest row
    weight_bytes = cfg.num_params() * _itemsize(cfg.param_dtype) + w_bytes
    kv_cache = batch * (prompt_len + int(lens.max())) * kv_bytes_per_token(cfg, dtype)
    hbm = entry.get("hbm_bytes")
    return {
        "decode_step_s": step_T, "decode_step_weight": w_T, "decode_s": decode_s,
        "decode_steps": float(np.sum(w_T)), "prefill_s": prefill_s,
        "rollout_s": prefill_s + decode_s, "update_s": update_s,
        "bound": "compute" if compute_share > 0.5 else "memory",
        "step_bound": np.where(tc_T >= tm_T, "compute", "memory"),
        "ridge_batch": ridge, "decode_flops": float(np.sum(w_T * flops_T)),
        "decode_bytes": float(np.sum(w_T * bytes_T)), "prefill_flops": pre_flops,
        "prefill_bytes": pre_bytes, "update_flops": upd_flops, "optimizer_bytes": opt_bytes,
        "weight_bytes": weight_bytes, "kv_cache_bytes": kv_cache,
        "hbm_bytes": None if hbm is None else hbm * count,
        "fits_hbm": None if hbm is None else bool(weight_bytes + kv_cache <= hbm * count),
        "peak_flops_per_s": flops_s, "hbm_bytes_per_s": bw, "count": count,
        "chip": chip if isinstance(chip, str) else entry.get("source"),
        "assumptions": f"mode={mode}; count={count} chips split FLOPs and bytes evenly, no "
                       "communication; kernels at the given fractions of peak",
    }


def compare_decode_bench(record: dict, prompt_len: int | None = None,
                         new_tokens: int | None = None, **kw) -> list[dict]:
    """Roofline vs measured decode step time for each row of a decode_bench JSON record.

    The chip is this machine as the benchmark measured it alongside each row (the row's
    fastest matmul, `matmul_peak_flops_per_s`, and the run's copy bandwidth). Measured: the
    row's median `decode_step_s` ((call - prefill-only call) / (n - 1)); predicted: the mean
    roofline step over the same n steps, all rows to the end (decode_bench never stops early).
    Relative error = predicted / measured - 1 (negative: the machine is slower than the bound).
    kw: predict_step_times options (e.g. flops_efficiency).
    """
    m = {k: v for k, v in record["model"].items() if k != "num_params"}
    if isinstance(m.get("rope_scaling"), list):
        m["rope_scaling"] = tuple(tuple(x) for x in m["rope_scaling"])
    cfg = ModelConfig(**m)
    fl = record["flags"]
    prompt_len = int(prompt_len or fl["prompt_len"])
    n = int(new_tokens or fl["new_tokens"])
    bw = record["machine"]["copy"]["bytes_per_s"]
    out = []
    for row in record["results"]:
        measured = row.get("decode_step_s")
        if measured is None:
            continue
        chip = bench.measured_chip(row["matmul_peak_flops_per_s"], bw, fl["dtype"],
                                   source="decode_bench measurement")
        p = predict_step_times(cfg, chip, row["batch"], prompt_len, n, dtype=fl["dtype"],
                               param_dtype=fl["dtype"], **kw)
        pred = p["decode_s"] / p["decode_steps"]
        pre_meas = row.get("prefill_s")   # generate with one new token: prefill + one step
        pre_pred = p["prefill_s"] + float(p["decode_step_s"][0])
        out.append({"batch": row["batch"], "measured_step_s": measured, "predicted_step_s": pred,
                    "rel_error": pred / measured - 1.0, "bound": p["bound"],
                    "measured_prefill_s": pre_meas, "predicted_prefill_s": pre_pred,
                    "prefill_rel_error": None if pre_meas is None else pre_pred / pre_meas - 1,
                    "peak_flops_per_s": row["matmul_peak_flops_per_s"],
                    "hbm_bytes_per_s": bw})
    return out


def roofline_fit(model_cfg: ModelConfig, chip: str | dict, batches: Sequence[int],
                 prompt_len: int, response_lens, dtype: str = "bfloat16", count: int = 1,
                 **kw) -> dict:
    """The step-cost model (docs/science.md, Step-cost model) fitted to roofline predictions
    at `batches`, in the shape of `step_cost.fit_step_times` (no bootstrap: "boot" is empty,
    so predict_r_q gives NaN intervals), so a planner can rank batches on a chip that is not
    present.

    t_gen(B) = rollout_s (prefill + decode of B sequences), t_train(B) = update_s. The roofline
    is piecewise linear (memory-bound, then compute-bound), so the straight line is exact only
    within one regime; "rollout_s" / "update_s" per batch are returned for the exact values.
    """
    from jaxrl_scale.scaling.step_cost import fit_linear_time
    preds = [predict_step_times(model_cfg, chip, int(b), prompt_len, response_lens, dtype,
                                count, **kw) for b in batches]
    gen = [p["rollout_s"] for p in preds]
    upd = [p["update_s"] for p in preds]
    d0, d1 = fit_linear_time(batches, gen)
    overhead, gamma = fit_linear_time(batches, upd)
    nan2 = [math.nan, math.nan]
    return {"d0": d0, "d1": d1, "gamma": gamma, "overhead": overhead, "d0_ci": nan2,
            "d1_ci": nan2, "gamma_ci": nan2, "overhead_ci": nan2, "boot": np.zeros((0, 4)),
            "n_steps": 0, "batches": [int(b) for b in batches], "rollout_s": gen,
            "update_s": upd, "bound": [p["bound"] for p in preds]}
