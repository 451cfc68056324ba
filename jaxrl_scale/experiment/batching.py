"""Host-side text <-> array helpers of the loop (the rollout batch itself: rl/batch.py)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from jaxrl_scale.models.tokenizer import decode_response
from jaxrl_scale.rl.batch import pack_sequences


def pack_texts(tokenizer, prompts: Sequence[str], responses: Sequence[str], *,
               prompt_len: int, max_new_tokens: int):
    """Tokenise (prompt, response + EOS) pairs for supervised warm-starting."""
    prompt_ids = [tokenizer.encode_prompt(p) for p in prompts]   # the chat template's, if any
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
    """Response texts of a generate() output (see `models.tokenizer.decode_response`)."""
    return [decode_response(tokenizer, row[:int(n)])
            for row, n in zip(np.asarray(tokens_BM), np.asarray(lengths_B))]
