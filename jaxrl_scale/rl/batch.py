"""From a rollout to the update batch: the one place where sequences become arrays.

Layout of every training sequence, length T = Tp + M:
    [pad ... pad prompt_0 .. prompt_k | resp_0 .. resp_j EOS pad ... pad]
     <------------- Tp, left-padded -> <--------- M, right-padded ------->
Every [B, T] field is aligned with `tokens_BT`: `valid_BT` marks real tokens, `loss_mask_BT`
the response tokens the update learns from, `old_logp_BT` the behaviour log-prob of each
response token (0 elsewhere). Rows are prompt-major: group i is rows i*G .. i*G + G - 1.

Host-side numpy (the shapes are fixed per run, so nothing recompiles); the update step
(rl/steps.py) turns `rewards_B` into advantages inside the jitted step.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import flax.struct
import jax
import numpy as np

Array = jax.Array


@flax.struct.dataclass
class RolloutBatch:
    """One rollout batch for a GRPO or PPO update (fields aligned with tokens_BT)."""

    tokens_BT: Array       # int32
    valid_BT: Array        # bool: real tokens (prompt + response), False on padding
    loss_mask_BT: Array    # bool: response tokens the loss sees (filtered groups: none)
    old_logp_BT: Array     # float32: behaviour log-probs from the sampler, 0 elsewhere
    rewards_B: Array       # float32: outcome reward of each response
    ref_logp_BT: Optional[Array] = None   # float32: reference policy's log-probs (KL)
    # float32: the proximal policy's log-probs (decoupled PPO, off-policy rollouts): the clip
    # is centred on it and old_logp_BT (behaviour) enters as an importance weight.
    prox_logp_BT: Optional[Array] = None


def pack_sequences(prompts: Sequence[Sequence[int]], responses_BM: np.ndarray,
                   lengths_B: np.ndarray, *, prompt_len: int, pad_id: int) -> dict[str, Any]:
    """-> numpy tokens_BT, valid_BT, response_BT (T = prompt_len + M) in the layout above."""
    B, M = responses_BM.shape
    if len(prompts) != B:
        raise ValueError(f"{len(prompts)} prompts but {B} responses.")
    tokens_BT = np.full((B, prompt_len + M), pad_id, np.int32)
    valid_BT = np.zeros((B, prompt_len + M), bool)
    for i, p in enumerate(prompts):
        if len(p) > prompt_len:
            raise ValueError(f"prompt {i} has {len(p)} tokens > max_prompt_len={prompt_len}; "
                             "raise --max_prompt_len.")
        tokens_BT[i, prompt_len - len(p):prompt_len] = p
        valid_BT[i, prompt_len - len(p):prompt_len] = True
    tokens_BT[:, prompt_len:] = responses_BM
    response_BM = np.arange(M)[None, :] < np.asarray(lengths_B)[:, None]
    valid_BT[:, prompt_len:] = response_BM
    response_BT = np.zeros_like(valid_BT)
    response_BT[:, prompt_len:] = response_BM
    tokens_BT[~valid_BT] = pad_id
    return {"tokens_BT": tokens_BT, "valid_BT": valid_BT, "response_BT": response_BT}


def truncated_rows(tokens_BM: np.ndarray, lengths_B: np.ndarray, eos_id: Optional[int]
                   ) -> np.ndarray:
    """bool [B]: the responses the length cap cut, M = tokens_BM.shape[1] tokens without an
    EOS at the end (a response stops at its EOS, so one that ends in EOS was not cut; with no
    EOS token every response of M tokens was)."""
    tokens_BM, lengths_B = np.asarray(tokens_BM), np.asarray(lengths_B)
    full_B = lengths_B >= tokens_BM.shape[1]
    if eos_id is None:
        return full_B
    return full_B & (tokens_BM[:, -1] != eos_id)


def overlong_reward(lengths_B: np.ndarray, max_len: int, buffer: int, penalty: float
                    ) -> np.ndarray:
    """DAPO's soft overlong punishment (Yu et al. 2025), float32 [B], added to the
    reward of a response of |y| = lengths_B tokens (EOS included) under the cap Lmax = max_len,
    with L = buffer and p = penalty:
        0                                   |y| <= Lmax - L
        -p (|y| - (Lmax - L)) / L           Lmax - L < |y| <= Lmax
        -p                                  |y| > Lmax
    0 everywhere when buffer is 0 (off)."""
    lengths_B = np.asarray(lengths_B, np.float64)
    if not buffer:
        return np.zeros(lengths_B.shape, np.float32)
    over_B = np.clip((lengths_B - (max_len - buffer)) / buffer, 0.0, 1.0)
    return (-penalty * over_B).astype(np.float32)


def rollout_batch(prompts: Sequence[Sequence[int]], tokens_BM: np.ndarray,
                  logprobs_BM: np.ndarray, lengths_B: np.ndarray, rewards_B: np.ndarray, *,
                  prompt_len: int, pad_id: int, group_size: int = 1,
                  filter_zero_variance: bool = False, eos_id: Optional[int] = None,
                  mask_truncated: bool = False, overlong_buffer: int = 0,
                  overlong_penalty: float = 1.0) -> tuple[RolloutBatch, dict[str, Any]]:
    """`sampling.generate` output + rewards -> (the update batch, its accounting).

    filter_zero_variance (GRPO, G > 1): groups whose rewards are all equal carry no learning
    signal; their rows stay in the batch (fixed shapes) with an empty loss mask. Accounting:
    generated = B, retained = rows the loss sees, zero_var_groups = groups with equal rewards
    (counted whether or not they are filtered).

    DAPO's length handling (Yu et al. 2025), the cap being M = tokens_BM.shape[1]:
    mask_truncated (overlong filtering): the rows the cap cut (`truncated_rows`, by eos_id) get
    an empty loss mask too (a cut response's reward judges unfinished work); their rewards
    still enter their group's advantages; accounting adds truncated = their count.
    overlong_buffer = L > 0 (soft overlong punishment): batch.rewards_B gets `overlong_penalty`
    added; the groups are filtered on the rewards as given (the task's, as verl's dynamic
    sampling filters on accuracy); accounting adds overlong_penalty_mean.
    """
    B = len(rewards_B)
    G = int(group_size)
    if B % G:
        raise ValueError(f"{B} responses do not split into groups of group_size={G}.")
    packed = pack_sequences(prompts, np.asarray(tokens_BM), lengths_B, prompt_len=prompt_len,
                            pad_id=pad_id)
    response_BT = packed["response_BT"]
    old_logp_BT = np.zeros(response_BT.shape, np.float32)
    old_logp_BT[:, prompt_len:] = np.where(response_BT[:, prompt_len:], logprobs_BM, 0.0)
    groups_PG = np.asarray(rewards_B).reshape(-1, G)
    zero_var_P = groups_PG.max(1) == groups_PG.min(1)
    keep_B = np.repeat(~zero_var_P, G) if (filter_zero_variance and G > 1) else \
        np.ones((B,), bool)
    truncated_B = truncated_rows(tokens_BM, lengths_B, eos_id)
    if mask_truncated:
        keep_B = keep_B & ~truncated_B
    penalty_B = overlong_reward(lengths_B, np.shape(tokens_BM)[1], overlong_buffer,
                                overlong_penalty)
    batch = RolloutBatch(tokens_BT=packed["tokens_BT"], valid_BT=packed["valid_BT"],
                         loss_mask_BT=response_BT & keep_B[:, None], old_logp_BT=old_logp_BT,
                         rewards_B=np.asarray(rewards_B, np.float32) + penalty_B)
    accounting: dict[str, Any] = {"retained": int(keep_B.sum()), "generated": B,
                                  "zero_var_groups": int(zero_var_P.sum())}
    if mask_truncated:
        accounting["truncated"] = int(truncated_B.sum())
    if overlong_buffer:
        accounting["overlong_penalty_mean"] = float(penalty_B.mean())
    return batch, accounting


def check_shared_prompts(batch: RolloutBatch, prompt_len: int, group_size: int) -> None:
    """Raise unless the G rows of every group carry the same first prompt_len tokens (and
    valid flags): what an update with shared_prompt_len (rl/steps.grpo_step) relies on."""
    G, Tp = int(group_size), int(prompt_len)
    for name in ("tokens_BT", "valid_BT"):
        x_PGT = np.asarray(getattr(batch, name))[:, :Tp].reshape(-1, G, Tp)
        if not (x_PGT == x_PGT[:, :1]).all():
            bad = int(np.flatnonzero((x_PGT != x_PGT[:, :1]).any(axis=(1, 2)))[0])
            raise ValueError(f"group {bad} (rows {bad * G}..{bad * G + G - 1}) has different "
                             f"prompts in its rows' first {Tp} columns ({name}); a shared-"
                             "prompt update needs one prompt per group (--share_prompt=false "
                             "to score every row on its own)")


__all__ = ["RolloutBatch", "check_shared_prompts", "overlong_reward", "pack_sequences",
           "rollout_batch", "truncated_rows"]
