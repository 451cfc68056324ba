"""A reward model run in-process: an HF `*ForSequenceClassification` checkpoint (the causal
families of models/hf_config.py with the LM head replaced by `score.weight` [1, D]) on the
project's decoder. The score of a text is transformers' logit: the final-normed hidden state
of its last token times the head.

    rm = RewardModel.load(DIR)
    scores_N = rm.score_tokens([[3, 5, 8], [4, 4]])          # float32 [N]
    reward = ModelReward(DIR, tokenizer)                       # a BatchReward over prompt+response
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open

from jaxrl_scale.data.remote_rewards import BatchReward
from jaxrl_scale.models import hf
from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import Params, hidden_states, param_shapes, rms_norm
from jaxrl_scale.models.hf_config import config_from_hf, read_config_json

__all__ = ["ModelReward", "RewardModel", "check_reward_model"]

HEAD = "score.weight"
_SUFFIX = "ForSequenceClassification"


def check_reward_model(path: str) -> tuple[ModelConfig, dict[str, str], list]:
    """(ModelConfig, weight map, tensor spec) of the reward model in `path`, checked from
    config.json and the safetensors headers alone; ValueError / OSError naming the problem."""
    if not os.path.isdir(path):
        raise hf.CheckpointNotFoundError(f"{path} is not a directory")
    d = read_config_json(path)
    classes = d.get("architectures") or []
    seq = [c for c in classes if isinstance(c, str) and c.endswith(_SUFFIX)]
    if not seq:
        raise hf.HFCheckpointError(f"config.json architectures={classes!r} names no "
                                   f"*{_SUFFIX} class")
    # the same body as the causal LM of that family; its LM head is absent (tied: not read)
    causal = dict(d, architectures=[seq[0][:-len(_SUFFIX)] + "ForCausalLM"],
                  tie_word_embeddings=True)
    cfg = config_from_hf(causal, dtype=jnp.float32)
    weight_map = hf._weight_map(path)
    shapes = hf._header_shapes(weight_map)
    spec = hf._spec(cfg)
    for _, name, shape, _, _ in spec:
        for n in hf._names(cfg, name):
            if shapes.get(n) != shape:
                raise hf.HFCheckpointError(f"tensor {n!r} in {path} has shape "
                                           f"{shapes.get(n)}, expected {shape}")
    if shapes.get(HEAD) != (1, cfg.hidden_size):
        raise hf.HFCheckpointError(f"{HEAD!r} in {path} has shape {shapes.get(HEAD)}, expected "
                                   f"(1, {cfg.hidden_size}) (one label: a scalar reward)")
    return cfg, weight_map, spec


def _pow2(n: int, lo: int) -> int:
    """The next power of two >= n (at least lo): a few shapes, a few compiles."""
    return max(lo, 1 << max(0, n - 1).bit_length())


def _score(cfg: ModelConfig, params: Params, head_D, tokens_BT, valid_BT):
    """The logit of each right-padded row at its last valid token (transformers' pooling)."""
    h_BTD = rms_norm(hidden_states(cfg, params, tokens_BT, valid_BT), params["final_norm"],
                     cfg.rms_norm_eps)
    last_B = valid_BT.sum(-1) - 1
    h_BD = jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0]
    return jnp.einsum("bd,d->b", h_BD.astype(jnp.float32), head_D.astype(jnp.float32))


class RewardModel:
    """A loaded sequence-classification model: `score_tokens(rows) -> float32 [N]`."""

    def __init__(self, cfg: ModelConfig, params: Params, head_D) -> None:
        self.cfg, self.params, self.head_D = cfg, params, head_D
        self._fn = jax.jit(lambda p, w, t, v: _score(cfg, p, w, t, v))

    @classmethod
    def load(cls, path: str) -> "RewardModel":
        cfg, weight_map, spec = check_reward_model(os.fspath(path))
        handles: dict[str, Any] = {}

        def get(name):
            fname = weight_map[name]
            if fname not in handles:
                handles[fname] = safe_open(fname, framework="np")
            return handles[fname].get_tensor(name).astype(np.float32)

        ours = param_shapes(cfg)
        params: Params = {"layers": {}}
        for key, name, _, to_ours, _ in spec:
            target = ours[key[0]] if len(key) == 1 else ours["layers"][key[1]]
            if "{}" in name:
                out = np.empty(target, np.float32)
                for ix in hf._indices(cfg, name):
                    out[ix] = to_ours(get(name.format(*ix)))
            else:
                out = np.ascontiguousarray(to_ours(get(name)))
            if len(key) == 1:
                params[key[0]] = jnp.asarray(out)
            else:
                params["layers"][key[1]] = jnp.asarray(out)
        return cls(cfg, params, jnp.asarray(get(HEAD)[0]))

    def score_tokens(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """float32 [N]: each non-empty row of token ids scored alone (padding never reaches
        a row's own tokens: causal attention, and the score reads the last real token)."""
        n = len(rows)
        if not n:
            return np.zeros(0, np.float32)
        if any(not len(r) for r in rows):
            raise ValueError("an empty row has no last token to score")
        B, T = _pow2(n, 1), _pow2(max(len(r) for r in rows), 16)
        tokens, valid = np.zeros((B, T), np.int32), np.zeros((B, T), bool)
        valid[n:, 0] = True                       # filler rows: one token, discarded
        for i, r in enumerate(rows):
            tokens[i, :len(r)], valid[i, :len(r)] = r, True
        out = self._fn(self.params, self.head_D, jnp.asarray(tokens), jnp.asarray(valid))
        return np.asarray(out, np.float32)[:n]


class ModelReward(BatchReward):
    """The reward model's score of prompt + response (the text the policy saw and wrote),
    tokenized by the model's own tokenizer.json when `path` has one, else by `tokenizer` (the
    run's), in calls of at most `batch_size` responses (0: the whole batch). A response whose
    tokens are out of the model's vocabulary or beyond its max_seq_len scores 0 and counts as
    a failure; a call that raises fails its chunk."""

    def __init__(self, path: str, tokenizer: Any = None, *, batch_size: int = 0) -> None:
        super().__init__(f"reward_model:{path}", concurrency=1, timeout_s=None)
        path = os.path.expanduser(path)
        self.model = RewardModel.load(path)
        if os.path.isfile(os.path.join(path, "tokenizer.json")):
            from jaxrl_scale.models.tokenizer import load_tokenizer
            tokenizer = load_tokenizer(path)
        if tokenizer is None:
            raise ValueError(f"{path} has no tokenizer.json and no tokenizer was given")
        self.tokenizer, self.batch_size = tokenizer, batch_size

    def _score(self, pairs):
        cfg = self.model.cfg
        out: list[float | None] = [None] * len(pairs)
        todo: list[tuple[int, list[int]]] = []
        for i, (response, ex) in enumerate(pairs):
            ids = list(self.tokenizer.encode(str(ex.get("prompt", "")) + response))
            if not ids or len(ids) > cfg.max_seq_len or max(ids) >= cfg.vocab_size:
                self._fail(1, f"{len(ids)} tokens (max_seq_len {cfg.max_seq_len}), ids up "
                           f"to {max(ids, default=-1)} (vocab {cfg.vocab_size})")
            else:
                todo.append((i, ids))
        size = self.batch_size or max(1, len(todo))
        for s in range(0, len(todo), size):
            chunk = todo[s:s + size]
            try:
                scores = self.model.score_tokens([ids for _, ids in chunk])
            except Exception as e:  # noqa: BLE001 - a reward never crashes the run
                self._fail(len(chunk), f"{type(e).__name__}: {e}")
                continue
            for (i, _), v in zip(chunk, scores):
                out[i] = self._value(float(v))
        return out
