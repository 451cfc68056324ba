"""Exact eval: the probability that a sampled response earns an exact-match reward, read from
the policy's own token probabilities instead of estimated from samples.

With `data.rewards.exact_match` (the response's first line, stripped, equals the answer) a
response that starts with the answer's characters and then ends (EOS) or breaks the line earns
1. The sampler draws token t with probability softmax(logits / T)[t] (no top-k / top-p), so

    P_exact(prompt) = P(answer EOS) + P(answer "\\n")
                    = prod_i p(a_i | prompt, a_<i) * (p(EOS | ...) + p("\\n" | ...)),

and when the answer fills the response cap exactly, P(answer) (a truncated response "19" earns
1 too). The eval score is the mean of P_exact over the eval prompts: the expectation that an
eval of infinitely many samples per prompt estimates, with no sampling noise. It is a lower
bound of that expectation: other accepted strings (" 19", "19 ", the answer before a stop
string) are left out; their mass on a trained policy is measured in results/exact_eval/.

Every run scores the same prompts, so what distinguishes two evals is the policy alone: the
only noise left in a learning curve is the policy's own step-to-step change (the analysis
estimates it from the curve). One teacher-forced forward pass over one row per prompt (its
answer, then EOS; the newline's probability is read at the same position) replaces the
prompts x samples decode of a sampled eval.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale import distributed as dist
from jaxrl_scale import sharding as shd
from jaxrl_scale.models import forward
from jaxrl_scale.rl.batch import pack_sequences
from jaxrl_scale.rl.losses import token_logprobs
from jaxrl_scale.rl.state import state_shardings

EXACT_REWARDS = ("jaxrl_scale.data.rewards:exact_match",)   # accepted: the rows below


def answer_rows(tokenizer, examples: Sequence[dict], max_new_tokens: int) -> dict[str, Any]:
    """One row per example whose answer fits: the prompt, then the answer, then EOS when there
    is room (the position where EOS or a newline ends a rewarded response; a bare answer that
    fills max_new_tokens is rewarded as it is). Returns {"prompts", "responses_BM",
    "lengths_B", "answer_len_B", "terminated_B", "owner_B"} (owner: the example of each row;
    an example without a row has probability 0)."""
    prompts, resp, alen, term, owner = [], [], [], [], []
    for i, e in enumerate(examples):
        a = tokenizer.encode(str(e["answer"]).strip())
        if len(a) > max_new_tokens:
            continue
        t = len(a) < max_new_tokens
        prompts.append(tokenizer.encode_prompt(e["prompt"]))
        resp.append(a + [tokenizer.eos_id] * t)
        alen.append(len(a))
        term.append(t)
        owner.append(i)
    responses_BM = np.full((len(resp), max_new_tokens), tokenizer.pad_id, np.int32)
    for b, r in enumerate(resp):
        responses_BM[b, :len(r)] = r
    return {"prompts": prompts, "responses_BM": responses_BM,
            "lengths_B": np.array([len(r) for r in resp], np.int32),
            "answer_len_B": np.array(alen, np.int32), "terminated_B": np.array(term, bool),
            "owner_B": np.array(owner, np.int64)}


def answer_logprob(cfg, params: Any, tokens_BT: jax.Array, valid_BT: jax.Array,
                   answer_BT: jax.Array, end_B: jax.Array, terminated_B: jax.Array, *,
                   temperature: float, ends: tuple[int, ...]) -> jax.Array:
    """log P(answer, then one of `ends` where terminated) per row, float32 [B]: the answer
    tokens' log-probs under softmax(logits / temperature), plus the log of the summed
    probability of the `ends` tokens at column end_B (the column after the answer)."""
    logits_BTV = forward(cfg, params, tokens_BT, valid_BT)
    # the answer tokens' log-probs as the update scores them (predicting tokens_BT[:, 1:])
    picked_BT = token_logprobs(logits_BTV[:, :-1], tokens_BT[:, 1:], temperature)
    ans_B = jnp.sum(jnp.where(answer_BT[:, 1:], picked_BT, 0.0), axis=1)
    at_BV = jnp.take_along_axis(logits_BTV, (end_B - 1)[:, None, None], axis=1)[:, 0]
    at_BV = jax.nn.log_softmax(at_BV.astype(jnp.float32) / temperature)   # only where it ends
    end_B_ = jax.nn.logsumexp(at_BV[:, jnp.asarray(ends)], axis=-1)
    return ans_B + jnp.where(terminated_B, end_B_, 0.0)


def make_scorer(model_cfg, temperature: float, ends: tuple[int, ...], mesh=None,
                params: Any = None):
    """The jitted `answer_logprob`: rows sharded over the mesh's data axes and params kept
    where they live (as the update's reference scoring), or plain jit without a mesh."""
    fn = functools.partial(answer_logprob, model_cfg, temperature=float(temperature),
                           ends=tuple(ends))
    if mesh is None:
        return jax.jit(fn)
    rows = shd.batch_sharding(mesh)
    return jax.jit(fn, in_shardings=(state_shardings(mesh, params),) + (rows,) * 5,
                   out_shardings=rows)


def end_tokens(tokenizer) -> tuple[int, ...]:
    """EOS, and the newline where the tokenizer has it as one token."""
    nl = tokenizer.encode("\n")
    return (tokenizer.eos_id,) + (tuple(nl) if len(nl) == 1 else ())


def answer_probability(model_cfg, params: Any, tokenizer, examples: Sequence[dict], *,
                       prompt_len: int, max_new_tokens: int, temperature: float,
                       chunk: int = 1024, mesh=None, scorer=None) -> np.ndarray:
    """P_exact per example, float64 [len(examples)] (the module docstring), in fixed chunks of
    `chunk` rows (the last one padded), so one compile serves every eval. scorer:
    `make_scorer`'s function, built once by the caller (default: built here)."""
    if not temperature > 0:
        raise ValueError("the exact eval needs temperature > 0 (a greedy policy's answer "
                         "probability is 0 or 1: use the greedy score)")
    r = answer_rows(tokenizer, examples, max_new_tokens)
    out = np.zeros(len(examples))
    B = len(r["prompts"])
    if not B:
        return out
    packed = pack_sequences(r["prompts"], r["responses_BM"], r["lengths_B"],
                            prompt_len=prompt_len, pad_id=tokenizer.pad_id)
    cols = np.arange(packed["tokens_BT"].shape[1])
    cols_from = prompt_len + r["answer_len_B"]
    cols_t = {"tokens_BT": packed["tokens_BT"], "valid_BT": packed["valid_BT"],
              "answer_BT": (cols[None] >= prompt_len) & (cols[None] < cols_from[:, None]),
              "end_B": cols_from.astype(np.int32), "terminated_B": r["terminated_B"]}
    if mesh is not None:
        step = shd.data_parallel_size(mesh)
        chunk = -(-chunk // step) * step
    fn = scorer or make_scorer(model_cfg, temperature, end_tokens(tokenizer), mesh, params)
    logp_B = np.zeros(B)
    for s in range(0, B, chunk):
        n = min(s + chunk, B) - s
        args = [np.pad(v[s:s + n], ((0, chunk - n),) + ((0, 0),) * (v.ndim - 1),
                       constant_values=prompt_len if k == "end_B" else 0)
                for k, v in cols_t.items()]
        if mesh is not None:
            args = jax.device_put(args, shd.batch_sharding(mesh))
        logp_B[s:s + n] = np.asarray(dist.to_host(fn(params, *args)), np.float64)[:n]
    np.add.at(out, r["owner_B"], np.exp(logp_B))
    return out


__all__ = ["EXACT_REWARDS", "answer_logprob", "answer_probability", "answer_rows",
           "end_tokens", "make_scorer"]
