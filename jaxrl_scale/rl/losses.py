"""Advantage estimators and RL losses for LLM policy optimisation (GRPO, PPO).

Shapes: N responses (= P*G, prompt-major), P prompts, G group size, B batch rows, T time, V vocab.

Every function is pure and jit-able. Arguments that change the graph (estimator names,
aggregation modes, clip settings) are Python values, checked eagerly with clear errors.
Definitions: docs/science.md, Losses and advantages (verl, Tunix and TRL agree on them).
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

Array = jax.Array

ADVANTAGE_ESTIMATORS = ("grpo", "drgrpo", "rloo")
# The scale of the advantages on top of the estimator: "auto" is the estimator's own (grpo:
# "group", drgrpo / rloo: "none"), so a run that does not name one is unchanged.
ADV_NORMS = ("auto", "group", "batch", "none")
AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
             "seq-mean-token-sum-norm", "prompt-mean")
KL_KINDS = ("k1", "k2", "k3")
RATIO_LEVELS = ("token", "sequence")
POLICY_LOSSES = ("ppo-clip", "cispo")

# Log-ratios are clamped before exp(): e^20 is already meaningless as a ratio, e^89 overflows f32.
_LOG_RATIO_BOUND = 20.0


def _f32(x) -> Array:
    return jnp.asarray(x, jnp.float32)


def _masked_mean(x_BT: Array, mask_BT: Array) -> Array:
    """Mean over entries where mask is 1; 0 (not NaN) when nothing is valid."""
    m_BT = _f32(mask_BT)
    return jnp.sum(_f32(x_BT) * m_BT) / jnp.maximum(jnp.sum(m_BT), 1.0)


# ----------------------------------------------------------------------------- advantages


def _pow2_exponent(x: Array) -> Array:
    """k >= 0 with 2^k the smallest power of two >= max(x, 1), elementwise (x >= 0, finite),
    at most 126: 2^-126 is float32's smallest normal number, so 2^-k is never flushed to zero
    (XLA on CPU flushes subnormals), and with k = 126 every finite x / 2^k is <= 4."""
    mant, exp = jnp.frexp(jnp.maximum(x, 1.0))      # x = mant * 2^exp, mant in [0.5, 1)
    exp = jnp.where(mant == 0.5, exp - 1, exp)       # x already a power of two
    return jnp.minimum(exp, 126)


def group_advantages(rewards_N: Array, group_size: int, *, estimator: str = "grpo",
                     eps: float = 1e-6, norm: str = "auto",
                     valid_N: Optional[Array] = None) -> Array:
    """Outcome advantages shared within each prompt's group of G responses.

    Rows are prompt-major: rows i*G .. i*G+G-1 answer prompt i.
      "grpo"   (Shao et al. 2024, DeepSeekMath eq. 3): A_i = (r_i - mean) / (std_{N-1} + eps)
      "drgrpo" (Liu et al. 2025, "Understanding R1-Zero-Like Training"): A_i = r_i - mean
      "rloo"   (Ahmadian et al. 2024; Kool et al. 2019): A_i = r_i - mean_{j != i} r_j
                = G / (G - 1) * (r_i - mean)
    `norm` picks the scale on top of the estimator's centring c_i (r_i - mean, rloo's
    G / (G - 1) times it): "group" c_i / (std_{N-1} of the group's rewards + eps), "batch"
    c_i / (std_{N-1} of c over the batch's rows + eps) (ScaleRL's batch-level normalisation,
    Khatri et al. 2025; the rows where valid_N != 0, default all: a filtered group's rows do
    not shrink it), "none" c_i; "auto" is the estimator's own (grpo: group, else none), so
    drgrpo is grpo with norm="none".
    A group whose rewards are all equal gets exactly 0 under every estimator: it carries no
    signal, and the floating-point residue of r - mean must not leak through.
    """
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"estimator={estimator!r}; valid estimators: {ADVANTAGE_ESTIMATORS}")
    if norm not in ADV_NORMS:
        raise ValueError(f"norm={norm!r}; valid advantage norms: {ADV_NORMS}")
    if norm == "auto":
        norm = "group" if estimator == "grpo" else "none"
    rewards_N = jnp.asarray(rewards_N)
    group_size = int(group_size)
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got group_size={group_size}")
    if (estimator == "rloo" or norm == "group") and group_size < 2:
        raise ValueError(
            f"estimator={estimator!r} with norm={norm!r} needs group_size >= 2 (unbiased std "
            f"/ leave-one-out mean), got group_size={group_size}")
    if rewards_N.ndim != 1 or rewards_N.shape[0] % group_size != 0:
        raise ValueError(
            f"rewards_N must be 1-D with a length divisible by group_size; got shape "
            f"{tuple(rewards_N.shape)} and group_size={group_size}")
    n = rewards_N.shape[0]

    r_PG = _f32(rewards_N).reshape(n // group_size, group_size)

    def estimate(x_PG, eps_P1):
        centered_PG = x_PG - jnp.mean(x_PG, axis=1, keepdims=True)
        if estimator == "rloo":
            centered_PG = centered_PG * (group_size / (group_size - 1))
        if norm == "group":
            return centered_PG / (jnp.std(x_PG, axis=1, keepdims=True, ddof=1) + eps_P1)
        return centered_PG

    # A group with some |r| > 1 is multiplied by 1/s, s a power of two >= max|r|: the sum in the
    # mean and the squares in the std then stay far below the float32 limit for any finite
    # reward (|r| up to 3.4e38; r^2 would overflow from 1.8e19). Scaling by 2^-k is exact and
    # the formulas are unchanged: (r - mean) / (std + eps) = (r/s - mean/s) / (std/s + eps/s);
    # unscaled ones (norm none / batch) scale back by s. Groups with every |r| <= 1 (the usual
    # 0/1 rewards) take the unscaled expression itself, so the update's program for them is
    # the one it was.
    max_P1 = jnp.max(jnp.abs(r_PG), axis=1, keepdims=True)
    k_P1 = _pow2_exponent(max_P1)
    one_P1 = jnp.ones_like(r_PG[:, :1])
    scale_P1, inv_P1 = jnp.ldexp(one_P1, k_P1), jnp.ldexp(one_P1, -k_P1)   # s, 1/s: exact
    scaled_PG = estimate(r_PG * inv_P1, eps * inv_P1)
    if norm != "group":
        scaled_PG = scaled_PG * scale_P1
    adv_PG = jnp.where(max_P1 > 1.0, scaled_PG, estimate(r_PG, eps))
    constant_P1 = jnp.max(r_PG, axis=1, keepdims=True) == jnp.min(r_PG, axis=1, keepdims=True)
    adv_PG = jnp.where(constant_P1, 0.0, adv_PG)
    adv_N = adv_PG.reshape(n)
    return _batch_normalised(adv_N, valid_N, eps) if norm == "batch" else adv_N


def _batch_normalised(c_N: Array, valid_N: Optional[Array], eps: float) -> Array:
    """c / (std_{N-1} of c over the valid rows + eps), computed on c / s with s = 2^k >= max|c|
    (exact, as in group_advantages): the squares stay finite for any finite c. 0 where c is
    (a constant group stays exactly 0); fewer than 2 valid rows: c / (0 + eps)."""
    v_N = jnp.ones_like(c_N) if valid_N is None else _f32(jnp.asarray(valid_N) != 0)
    k = _pow2_exponent(jnp.max(jnp.abs(c_N) * v_N))
    inv = jnp.ldexp(jnp.ones([], jnp.float32), -k)
    x_N = c_N * inv
    count = jnp.sum(v_N)
    mean = jnp.sum(x_N * v_N) / jnp.maximum(count, 1.0)
    var = jnp.sum(jnp.square(x_N - mean) * v_N) / jnp.maximum(count - 1.0, 1.0)
    return x_N / (jnp.sqrt(var) + eps * inv)


def gae(rewards_BT: Array, values_BT: Array, mask_BT: Array, *, gamma: float = 1.0,
        lam: float = 0.95) -> tuple[Array, Array]:
    """Generalised advantage estimation (Schulman et al. 2016, eq. 16), unwhitened.

      delta_t = r_t + gamma V_{t+1} - V_t,   A_t = delta_t + gamma lam A_{t+1},   R_t = A_t + V_t

    Mask-aware, as a reverse `lax.scan` over time: a masked position is skipped (its reward
    and value are ignored and "t+1" means the next *valid* token, as in verl's multi-turn GAE)
    and the value after the last valid token is 0. Advantages and returns are 0 where masked.
    """
    m_BT = _f32(mask_BT)
    r_TB = (_f32(rewards_BT) * m_BT).T
    v_TB = (_f32(values_BT) * m_BT).T
    m_TB = m_BT.T

    def step(carry, xs):
        next_v_B, next_adv_B = carry
        r_B, v_B, m_B = xs
        delta_B = r_B + gamma * next_v_B - v_B
        adv_B = delta_B + gamma * lam * next_adv_B
        valid_B = m_B > 0
        carry = (jnp.where(valid_B, v_B, next_v_B), jnp.where(valid_B, adv_B, next_adv_B))
        return carry, jnp.where(valid_B, adv_B, 0.0)

    zeros_B = jnp.zeros(r_TB.shape[1], jnp.float32)
    _, adv_TB = jax.lax.scan(step, (zeros_B, zeros_B), (r_TB, v_TB, m_TB), reverse=True)
    adv_BT = adv_TB.T
    returns_BT = (adv_BT + v_TB.T) * m_BT
    return adv_BT, returns_BT


def masked_whiten(x_BT: Array, mask_BT: Array, shift_mean: bool = True,
                  eps: float = 1e-8) -> Array:
    """(x - mean) / sqrt(var + eps), mean and unbiased var over valid entries only.

    The PPO advantage whitening of verl/TRL (`masked_whiten`). With shift_mean=False the mean
    is added back, so only the scale changes. Masked entries come out as 0.
    """
    m_BT = _f32(mask_BT)
    x_BT = _f32(x_BT)
    count = jnp.sum(m_BT)
    mean = jnp.sum(x_BT * m_BT) / jnp.maximum(count, 1.0)
    var = jnp.sum(jnp.square(x_BT - mean) * m_BT) / jnp.maximum(count - 1.0, 1.0)
    out_BT = (x_BT - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out_BT = out_BT + mean
    return out_BT * m_BT


# ----------------------------------------------------------------------------- aggregation


def aggregate(x_BT: Array, mask_BT: Array, mode: str, group_size: int = 1) -> Array:
    """Reduce per-token values to a scalar (verl's `agg_loss` modes, and ScaleRL's prompt mean).

      token-mean               sum(x m) / sum(m)                       (DAPO, Yu et al. 2025)
      seq-mean-token-mean      mean, over rows with >= 1 valid token, of per-row token means
                               (original GRPO, Shao et al. 2024)
      seq-mean-token-sum       mean over all rows of per-row token sums
      seq-mean-token-sum-norm  sum(x m) / T, T the padded length    (Dr.GRPO, Liu et al. 2025)
      prompt-mean              mean, over prompt groups (G = group_size consecutive rows) with
                               >= 1 valid token, of the group's sum(x m) / sum(m): every
                               prompt weighs the same, every token within it too (ScaleRL's
                               prompt-level aggregation, Khatri et al. 2025; MiniMax-M1's)

    Denominators are guarded with max(., 1): all-masked rows or batches give 0, never NaN.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"unknown aggregation mode={mode!r}; valid modes: {AGG_MODES}")
    m_BT = _f32(mask_BT)
    xm_BT = _f32(x_BT) * m_BT
    if mode == "prompt-mean":
        B, G = m_BT.shape[0], int(group_size)
        if G < 1 or B % G:
            raise ValueError(f"prompt-mean needs rows in whole groups: {B} rows, "
                             f"group_size={group_size}")
        count_P = jnp.sum(m_BT.reshape(B // G, -1), axis=1)
        mean_P = jnp.sum(xm_BT.reshape(B // G, -1), axis=1) / jnp.maximum(count_P, 1.0)
        has_tokens_P = _f32(count_P > 0)
        return jnp.sum(mean_P * has_tokens_P) / jnp.maximum(jnp.sum(has_tokens_P), 1.0)
    if mode == "token-mean":
        return jnp.sum(xm_BT) / jnp.maximum(jnp.sum(m_BT), 1.0)
    if mode == "seq-mean-token-mean":
        count_B = jnp.sum(m_BT, axis=1)
        row_mean_B = jnp.sum(xm_BT, axis=1) / jnp.maximum(count_B, 1.0)
        has_tokens_B = _f32(count_B > 0)
        return jnp.sum(row_mean_B * has_tokens_B) / jnp.maximum(jnp.sum(has_tokens_B), 1.0)
    if mode == "seq-mean-token-sum":
        return jnp.mean(jnp.sum(xm_BT, axis=1))
    return jnp.sum(xm_BT) / max(x_BT.shape[1], 1)


# ----------------------------------------------------------------------------- policy / value


def kl_penalty(logp_BT: Array, ref_logp_BT: Array, kind: str = "k3") -> Array:
    """Per-token estimators of KL(pi || pi_ref) on samples of pi (Schulman 2020, "Approximating
    KL Divergence").

      x = log pi_ref - log pi:   k1 = -x,   k2 = x^2 / 2,   k3 = exp(x) - x - 1  (unbiased, >= 0)

    For k3, x is clamped to +-20 so exp() cannot overflow.
    """
    if kind not in KL_KINDS:
        raise ValueError(f"unknown kl kind={kind!r}; valid kinds: {KL_KINDS}")
    x_BT = _f32(ref_logp_BT) - _f32(logp_BT)
    if kind == "k1":
        return -x_BT
    if kind == "k2":
        return 0.5 * jnp.square(x_BT)
    x_BT = jnp.clip(x_BT, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    return jnp.exp(x_BT) - x_BT - 1.0


def policy_loss(logp_BT: Array, old_logp_BT: Array, advantages_BT: Array, mask_BT: Array, *,
                clip_low: float = 0.2, clip_high: float = 0.2,
                dual_clip: Optional[float] = None, agg: str = "token-mean",
                prox_logp_BT: Optional[Array] = None, is_cap: Optional[float] = None,
                ratio_level: str = "token", objective: str = "ppo-clip",
                cispo_eps_high: float = 3.0,
                group_size: int = 1) -> tuple[Array, dict[str, Array]]:
    """PPO clipped surrogate (Schulman et al. 2017, eq. 7) with asymmetric and dual clipping,
    or (objective="cispo") CISPO's truncated-IS REINFORCE.

      r = exp(clamp(logp - logp_old, -20, 20))
      L = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))   (clip-higher: DAPO, Yu et al. 2025)
      if A < 0 and dual_clip = c > 1:  L = min(L, -c A)        (dual clip: Ye et al. 2020)

    Decoupled PPO (Hilton, Cobbe & Schulman 2022, "Batch size-invariance for policy
    optimization"): when `prox_logp_BT` is given, `old_logp_BT` is the behaviour policy that
    sampled the tokens and the clip is centred on the proximal policy,
      L = (pi_prox / pi_behav) * max(-A r, -A clip(r, ...)),   r = pi / pi_prox,
    with the importance weight held constant (stop-gradient). prox == behaviour is plain PPO.

    Truncated importance sampling (`is_cap` = C > 0, needs `prox_logp_BT`: the trainer's
    log-probs of the sampled tokens, `old_logp_BT` the sampler's): the weight is
    min(pi_prox / pi_behav, C) (`importance_weights`), TIS of Yao et al. 2025 / verl.

    ratio_level="sequence" (GSPO, Zheng et al. 2025): every token of row i takes the row's
    ratio s_i = exp(mean over its valid tokens of (logp - logp_centre)) (`sequence_log_ratio`),
    gradient through the mean; the clips act on s_i. Valid tokens are where mask_BT != 0.

    objective="cispo" (MiniMax-M1, Chen et al. 2025; the loss of ScaleRL, Khatri et al. 2025):
      L = -sg(min(r, 1 + cispo_eps_high)) * A * logp
    REINFORCE whose importance weight is capped and held constant, so a token whose ratio ran
    past the cap still gets a gradient (PPO's clip would zero it). clip_low / clip_high are
    not used; dual_clip and ratio_level="sequence" are refused. Its clipfrac counts tokens
    with A != 0 whose weight hit the cap (upper: A > 0, lower: A < 0).

    Aggregation `agg` over mask_BT (`aggregate`; group_size for "prompt-mean").

    Metrics (token-mean over valid tokens, no gradient): clipfrac (= upper + lower),
    clipfrac_upper (A > 0, r > 1 + clip_high), clipfrac_lower (A < 0, r < 1 - clip_low),
    dual_clipfrac, approx_kl (k3 of behaviour vs current policy), ratio_mean; with is_cap
    also is_weight_mean (the capped weight) and is_clipped_frac (tokens whose weight was capped).
    """
    if dual_clip is not None and not dual_clip > 1.0:
        raise ValueError(f"dual_clip must be > 1 (or None to disable), got dual_clip={dual_clip}")
    if clip_low < 0 or clip_high < 0:
        raise ValueError(f"clip_low and clip_high must be >= 0, got clip_low={clip_low}, "
                         f"clip_high={clip_high}")
    if ratio_level not in RATIO_LEVELS:
        raise ValueError(f"ratio_level={ratio_level!r}; valid levels: {RATIO_LEVELS}")
    if is_cap is not None and not (is_cap > 0 and prox_logp_BT is not None):
        raise ValueError(f"is_cap must be > 0 (or None to disable) and needs prox_logp_BT "
                         f"(the trainer's log-probs), got is_cap={is_cap}")
    if objective not in POLICY_LOSSES:
        raise ValueError(f"objective={objective!r}; valid policy losses: {POLICY_LOSSES}")
    if objective == "cispo" and not (cispo_eps_high > 0 and dual_clip is None
                                     and ratio_level == "token"):
        raise ValueError(f"cispo needs cispo_eps_high > 0, no dual_clip and token-level "
                         f"ratios; got cispo_eps_high={cispo_eps_high}, dual_clip={dual_clip}, "
                         f"ratio_level={ratio_level!r}")
    logp_BT = _f32(logp_BT)
    old_logp_BT = _f32(old_logp_BT)
    adv_BT = _f32(advantages_BT)
    centre_logp_BT = old_logp_BT if prox_logp_BT is None else _f32(prox_logp_BT)

    log_ratio_BT = jnp.clip(logp_BT - centre_logp_BT, -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    if ratio_level == "sequence":
        log_ratio_BT = sequence_log_ratio(log_ratio_BT, mask_BT)
    ratio_BT = jnp.exp(log_ratio_BT)
    sg = jax.lax.stop_gradient
    if objective == "cispo":
        cap = 1.0 + cispo_eps_high
        loss_BT = -sg(jnp.minimum(ratio_BT, cap)) * adv_BT * logp_BT
        is_clipped_BT = (ratio_BT > cap) & (adv_BT != 0)
    else:
        unclipped_BT = -adv_BT * ratio_BT
        clipped_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - clip_low, 1.0 + clip_high)
        loss_BT = jnp.maximum(unclipped_BT, clipped_BT)
        is_clipped_BT = clipped_BT > unclipped_BT
    if dual_clip is not None:
        floor_BT = -dual_clip * adv_BT
        dual_BT = (adv_BT < 0) & (loss_BT > floor_BT)
        loss_BT = jnp.where(dual_BT, floor_BT, loss_BT)
    else:
        dual_BT = jnp.zeros_like(is_clipped_BT)
    if prox_logp_BT is not None:
        w_BT = sg(importance_weights(centre_logp_BT, old_logp_BT, is_cap))
        loss_BT = loss_BT * w_BT
    loss = aggregate(loss_BT, mask_BT, agg, group_size)

    metrics = {
        "clipfrac": _masked_mean(is_clipped_BT, mask_BT),
        "clipfrac_upper": _masked_mean(is_clipped_BT & (adv_BT > 0), mask_BT),
        "clipfrac_lower": _masked_mean(is_clipped_BT & (adv_BT < 0), mask_BT),
        "dual_clipfrac": _masked_mean(dual_BT, mask_BT),
        "approx_kl": _masked_mean(sg(kl_penalty(logp_BT, old_logp_BT, "k3")), mask_BT),
        "ratio_mean": _masked_mean(sg(ratio_BT), mask_BT),
    }
    if is_cap is not None:
        raw_BT = importance_weights(sg(centre_logp_BT), old_logp_BT)
        metrics["is_weight_mean"] = _masked_mean(w_BT, mask_BT)
        metrics["is_clipped_frac"] = _masked_mean(raw_BT > is_cap, mask_BT)
    return loss, metrics


def sequence_log_ratio(log_ratio_BT: Array, mask_BT: Array) -> Array:
    """GSPO's sequence log-ratio (Zheng et al. 2025, eq. 7) broadcast over each row:
    (1 / |y_i|) sum_t log_ratio[i, t] over the row's valid tokens (mask != 0); 0 for a row
    without any."""
    m_BT = _f32(mask_BT != 0)
    mean_B = jnp.sum(_f32(log_ratio_BT) * m_BT, axis=1) / jnp.maximum(jnp.sum(m_BT, axis=1), 1.0)
    return jnp.broadcast_to(mean_B[:, None], m_BT.shape)


def importance_weights(trainer_logp_BT: Array, rollout_logp_BT: Array,
                       cap: Optional[float] = None) -> Array:
    """Per-token importance weights of the rollout/trainer gap, pi_trainer / pi_rollout =
    exp(clamp(trainer - rollout, -20, 20)), truncated at `cap` when given (TIS: Yao et al.
    2025, "Your efficient RL framework secretly brings you off-policy RL training")."""
    log_w_BT = jnp.clip(_f32(trainer_logp_BT) - _f32(rollout_logp_BT),
                        -_LOG_RATIO_BOUND, _LOG_RATIO_BOUND)
    w_BT = jnp.exp(log_w_BT)
    return w_BT if cap is None else jnp.minimum(w_BT, cap)


def mismatch_kl(trainer_logp_BT: Array, rollout_logp_BT: Array, mask_BT: Array) -> Array:
    """k3 estimate of KL(pi_rollout || pi_trainer) on the rollout's tokens (prime-rl's
    `mismatch_kl`): x = trainer - rollout, exp(x) - x - 1, masked mean; no gradient.
    0 when the two log-probs agree."""
    x_BT = jax.lax.stop_gradient(_f32(trainer_logp_BT))
    return _masked_mean(kl_penalty(rollout_logp_BT, x_BT, "k3"), mask_BT)


def value_loss(values_BT: Array, old_values_BT: Array, returns_BT: Array, mask_BT: Array, *,
               clip: Optional[float] = 0.2,
               agg: str = "token-mean") -> tuple[Array, dict[str, Array]]:
    """Clipped value loss of PPO2 (OpenAI baselines; Andrychowicz et al. 2021, sec. 3.4).

      0.5 * max((v - R)^2, (v_old + clip(v - v_old, -clip, clip) - R)^2);  clip=None: 0.5 (v - R)^2

    Metrics: vf_clipfrac (fraction of valid tokens where the clipped term is the larger one),
    vpred_mean (mean prediction over valid tokens).
    """
    if clip is not None and clip < 0:
        raise ValueError(f"clip must be >= 0 (or None to disable), got clip={clip}")
    v_BT = _f32(values_BT)
    ret_BT = _f32(returns_BT)
    unclipped_BT = jnp.square(v_BT - ret_BT)
    if clip is None:
        loss_BT = 0.5 * unclipped_BT
        clipfrac = jnp.zeros([], jnp.float32)
    else:
        old_BT = _f32(old_values_BT)
        clipped_BT = jnp.square(old_BT + jnp.clip(v_BT - old_BT, -clip, clip) - ret_BT)
        loss_BT = 0.5 * jnp.maximum(unclipped_BT, clipped_BT)
        clipfrac = _masked_mean(clipped_BT > unclipped_BT, mask_BT)
    loss = aggregate(loss_BT, mask_BT, agg)
    metrics = {"vf_clipfrac": clipfrac,
               "vpred_mean": _masked_mean(jax.lax.stop_gradient(v_BT), mask_BT)}
    return loss, metrics


# ----------------------------------------------------------------------------- from logits


def entropy_from_logits(logits_BTV: Array) -> Array:
    """Per-token entropy of softmax(z): H = logsumexp(z) - sum_v softmax(z)_v z_v, float32."""
    z_BTV = _f32(logits_BTV)
    p_BTV = jax.nn.softmax(z_BTV, axis=-1)
    return jax.nn.logsumexp(z_BTV, axis=-1) - jnp.sum(p_BTV * z_BTV, axis=-1)


def token_logprobs(logits_BTV: Array, tokens_BT: Array, temperature: float = 1.0) -> Array:
    """log softmax(logits / temperature) gathered at `tokens_BT`, float32.

    Scoring under the temperature the sampler used makes the trainer's log-probs comparable
    with the behaviour log-probs recorded at generation. temperature 0 (greedy) or 1: no scaling.
    """
    z_BTV = _f32(logits_BTV)
    t = _f32(temperature)
    z_BTV = z_BTV / jnp.where(t > 0, t, 1.0)
    tokens_BT1 = jnp.asarray(tokens_BT, jnp.int32)[..., None]
    picked_BT = jnp.take_along_axis(z_BTV, tokens_BT1, axis=-1)[..., 0]
    return picked_BT - jax.nn.logsumexp(z_BTV, axis=-1)


__all__ = [
    "ADVANTAGE_ESTIMATORS", "ADV_NORMS", "AGG_MODES", "KL_KINDS", "POLICY_LOSSES", "RATIO_LEVELS",
    "group_advantages", "gae", "masked_whiten", "aggregate", "kl_penalty", "policy_loss",
    "sequence_log_ratio", "importance_weights", "mismatch_kl",
    "value_loss", "entropy_from_logits", "token_logprobs",
]
