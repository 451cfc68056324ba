"""Host-side packing of prompts and responses into fixed-shape arrays (no recompiles).

Layout of every training sequence, length T = Tp + M:
    [pad ... pad prompt_0 .. prompt_k | resp_0 .. resp_j EOS pad ... pad]
     <------------- Tp, left-padded -> <--------- M, right-padded ------->
`valid_BT` marks real tokens, `response_BT` marks response tokens (the ones the policy chose).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def pack_sequences(prompts: Sequence[Sequence[int]], responses_BM: np.ndarray,
                   lengths_B: np.ndarray, *, prompt_len: int, pad_id: int):
    """-> dict of numpy arrays tokens_BT, valid_BT, response_BT (T = prompt_len + M)."""
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


def pack_texts(tokenizer, prompts: Sequence[str], responses: Sequence[str], *,
               prompt_len: int, max_new_tokens: int):
    """Tokenise (prompt, response + EOS) pairs for supervised warm-starting."""
    prompt_ids = [tokenizer.encode(p) for p in prompts]
    resp_BM = np.full((len(responses), max_new_tokens), tokenizer.pad_id, np.int32)
    lengths_B = np.zeros((len(responses),), np.int32)
    for i, r in enumerate(responses):
        ids = list(tokenizer.encode(r)) + [tokenizer.eos_id]
        if len(ids) > max_new_tokens:
            raise ValueError(f"response {r!r} needs {len(ids)} tokens > max_new_tokens="
                             f"{max_new_tokens}; raise --max_new_tokens.")
        resp_BM[i, :len(ids)] = ids
        lengths_B[i] = len(ids)
    return pack_sequences(prompt_ids, resp_BM, lengths_B, prompt_len=prompt_len,
                          pad_id=tokenizer.pad_id)


def decode_responses(tokenizer, tokens_BM: np.ndarray, lengths_B: np.ndarray) -> list[str]:
    """Response text without the EOS token and padding.

    Models often have more logits than the tokenizer has ids (padded vocabularies); a sampled
    id the tokenizer cannot decode becomes U+FFFD, so it can never match an answer.
    """
    out = []
    special = (tokenizer.eos_id, tokenizer.pad_id)
    for row, n in zip(np.asarray(tokens_BM), np.asarray(lengths_B)):
        ids = [int(t) for t in row[:int(n)] if int(t) not in special]
        pieces, run = [], []
        for t in ids:
            if t < tokenizer.vocab_size:
                run.append(t)
            else:
                pieces += [tokenizer.decode(run), "\ufffd"]
                run = []
        out.append("".join(pieces) + tokenizer.decode(run))
    return out
