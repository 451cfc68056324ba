"""Conversations decoded turn by turn on one KV cache: the device side of multi-turn rollouts
(rl/multiturn.py).

Shapes: B batch (bucketed as `generate` buckets it), T prompt bucket, N tokens one assistant
turn may sample (the episode's budget, max_new_tokens), W observation block, S cache slots.

`generate` creates its cache inside one jitted call and drops it; a conversation keeps it:
- `Conversation(...)`: prefill the left-padded prompts (all but their last token), exactly as
  `generate` does, into a `StepCache` whose first chunks are `generate`'s phase chunks and
  whose further chunks (`extra_slots`) hold the later turns;
- `Conversation.decode`: one assistant turn for the rows still in their episode: `generate`'s
  loop step (the same `decode_step`, sampling rule and fold_in(rng, step) key, the step
  counter running on across turns), each row stopping at EOS or at its own token limit;
- `Conversation.feed`: append the tokens between two assistant turns (the last sampled
  token, then the observation) to the cache, one `decode_step` per column, the LM head unused.
The next turn starts from the cached prefix: nothing before the observation is recomputed.

Turn 1 runs `generate`'s computation on the same chunk shapes (a phase p step attends to
chunks 0..p only, so the extra chunks are never read in turn 1): a one-turn conversation
returns `generate`'s tokens and log-probs bit for bit (tests/test_env.py checks it).

All rows advance in lockstep on one cache column (`decode_step` writes every row at the same
slot; a row that is not decoding writes an invalid entry), so a turn takes the slots of its
longest row and the feed those of its longest observation: the extra chunks are sized for
the worst case (`conversation_slots`), which is what the cache memory costs. Under a mesh the
params keep their sharding; the rows are not constrained to the data axes (as `generate`
splits them), which a multi-device synchronous run would want next.
"""
from __future__ import annotations

import functools
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import extend, init_cache, rope_table
from jaxrl_scale.sampling.decode import (
    StepCache, _check_int, _validate_prompts, bucket_shape, decode_step, next_pow2, phase_sizes,
    prepared_layers, to_step_cache)
from jaxrl_scale.sampling.rules import SamplingConfig, validate_sampling

_TRACES = [0]
# The later turns' cache slots are split into this many chunks: each chunk is one more
# while_loop (decode_step traced once more, in every compiled function: on CPU a chunk adds
# seconds of compile to each of them) and a step reads the empty rest of its chunk, so more
# chunks trade compile time for fewer wasted reads.
EXTRA_CHUNKS = 1


def compile_count() -> int:
    """How many conversation functions have been traced (== compiled) in this process."""
    return _TRACES[0]


def conversation_slots(max_new_tokens: int, max_turns: int, max_obs_tokens: int) -> int:
    """Cache slots after turn 1's: each later turn feeds at most one token plus an observation
    that fits the episode's budget, then decodes at most the budget N, in lockstep."""
    obs = min(max_obs_tokens, max_new_tokens)
    return (max_turns - 1) * (obs + 1 + max_new_tokens)


@flax.struct.dataclass
class TurnState:
    cache: StepCache
    input_B: jax.Array     # int32: the token each row feeds next (the last one not cached)
    step: jax.Array        # int32 []: sampling steps so far (fold_in counter, all turns)
    rng: jax.Array


def _chunk_loop(cache: StepCache, body, carry, more):
    """Run body(carry, live) while more(carry) holds, one `while_loop` per cache chunk: the
    steps that write chunk p attend to chunks 0..p only (as `generate`'s phases do); chunks
    the cache index already passed run zero steps."""
    starts = cache.chunk_starts
    for p in range(len(starts) - 1):
        def cond(c, lo=starts[p], hi=starts[p + 1]):
            idx = c[0].cache.index
            return (idx >= lo) & (idx < hi) & more(c)
        carry = jax.lax.while_loop(cond, functools.partial(body, live=p + 1), carry)
    return carry


def _start(params, layers, tokens_BT, valid_BT, rng, *, cfg: ModelConfig, chunks):
    _TRACES[0] += 1
    B, T = tokens_BT.shape
    # `generate`'s prefill: all but the last column (left padding: it is real in every row)
    _, prefill = extend(cfg, params, init_cache(cfg, B, T - 1), tokens_BT[:, :-1],
                        valid_BT[:, :-1], layers=layers)
    return TurnState(cache=to_step_cache(prefill, chunks), input_B=tokens_BT[:, -1],
                     step=jnp.zeros((), jnp.int32), rng=rng)


def _decode(params, layers, state: TurnState, active_B, limit_B, *, cfg: ModelConfig,
            max_new_tokens: int, sampling: SamplingConfig, eos_id, pad_id: int, table_len: int):
    """One assistant turn: (state, tokens_BN, logprobs_BN, lengths_B, last_B). Rows not active
    start done; a row stops at EOS or after limit_B tokens; last_B is its last sampled token
    (the token the next feed caches first)."""
    _TRACES[0] += 1
    B, N = active_B.shape[0], max_new_tokens
    table = rope_table(cfg, table_len)

    def body(c, live):
        s, t, tokens_BN, logps_BN, lengths_B, done_B, last_B = c
        logits_BV, cache = decode_step(cfg, params, layers, s.cache, s.input_B, ~done_B,
                                       rope_table=table, live=live)
        tok_B, logp_B = sampling.get_next_tokens(logits_BV, jax.random.fold_in(s.rng, s.step))
        tok_B = jnp.where(done_B, pad_id, tok_B)
        logp_B = jnp.where(done_B, 0.0, logp_B)
        lengths_B = lengths_B + (~done_B).astype(jnp.int32)
        last_B = jnp.where(done_B, last_B, tok_B)
        stop_B = lengths_B >= limit_B
        if eos_id is not None:
            stop_B = stop_B | (tok_B == eos_id)
        new_done = done_B | stop_B
        s = s.replace(cache=cache, input_B=jnp.where(new_done, 0, tok_B), step=s.step + 1)
        return (s, t + 1, jax.lax.dynamic_update_slice(tokens_BN, tok_B[:, None], (0, t)),
                jax.lax.dynamic_update_slice(logps_BN, logp_B[:, None], (0, t)), lengths_B,
                new_done, last_B)

    carry = (state, jnp.zeros((), jnp.int32), jnp.full((B, N), pad_id, jnp.int32),
             jnp.zeros((B, N), jnp.float32), jnp.zeros((B,), jnp.int32), ~active_B,
             jnp.zeros((B,), jnp.int32))
    s, _, tokens_BN, logps_BN, lengths_B, _, last_B = _chunk_loop(
        state.cache, body, carry, lambda c: (c[1] < N) & ~jnp.all(c[5]))
    return s, tokens_BN, logps_BN, lengths_B, last_B


def _feed(params, layers, state: TurnState, tokens_BW, valid_BW, width, next_B, fed_B, *,
          cfg: ModelConfig, table_len: int):
    """Cache columns 0..width-1 of tokens_BW (valid_BW marks each row's real ones), then set
    the next input of the rows in fed_B to next_B."""
    _TRACES[0] += 1
    table = rope_table(cfg, table_len)

    def body(c, live):
        s, j = c
        tok_B = jax.lax.dynamic_index_in_dim(tokens_BW, j, 1, keepdims=False)
        ok_B = jax.lax.dynamic_index_in_dim(valid_BW, j, 1, keepdims=False)
        _, cache = decode_step(cfg, params, layers, s.cache, tok_B, ok_B, rope_table=table,
                               live=live)
        return s.replace(cache=cache), j + 1

    s, _ = _chunk_loop(state.cache, body, (state, jnp.zeros((), jnp.int32)),
                       lambda c: c[1] < width)
    return s.replace(input_B=jnp.where(fed_B, next_B, s.input_B))


class Conversation:
    """A batch of conversations on one KV cache (see the module docstring). Host side: numpy
    in, numpy out; the state stays on device between calls.

        conv = Conversation(cfg, params, prompts, max_new_tokens=N, extra_slots=S_x, ...)
        toks, logps, lens, last = conv.decode(active, limits)   # turn 1 == generate
        conv.feed({row: [last[row]] + observation_ids[:-1]}, {row: observation_ids[-1]})
        toks, logps, lens, last = conv.decode(active2, limits2)  # continues from the cache
    """

    def __init__(self, cfg: ModelConfig, params, prompts: Sequence[Sequence[int]], *,
                 max_new_tokens: int, extra_slots: int, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, eos_id: int | None, pad_id: int,
                 seed=0, mesh=None):
        _check_int("max_new_tokens", max_new_tokens, 1)
        _check_int("extra_slots", extra_slots, 0)
        validate_sampling(temperature, top_k, top_p)
        rows = _validate_prompts(cfg, prompts, max_new_tokens)
        self.cfg, self.params, self.N, self.pad_id = cfg, params, int(max_new_tokens), int(pad_id)
        self.B = len(rows)
        Bb, Tb = bucket_shape(self.B, max(r.size for r in rows))
        self.Bb = Bb
        tokens = np.zeros((Bb, Tb), np.int32)
        valid = np.zeros((Bb, Tb), bool)
        for i, r in enumerate(rows):
            tokens[i, Tb - r.size:] = r
            valid[i, Tb - r.size:] = True
        # generate's phase chunks for turn 1, then the later turns' slots in EXTRA_CHUNKS
        # chunks (a step attends only to chunks that can hold tokens yet)
        phases = phase_sizes(cfg, Bb, Tb, self.N)
        size = -(-extra_slots // EXTRA_CHUNKS)
        chunks = tuple(phases) + tuple(min(size, extra_slots - k)
                                       for k in range(0, extra_slots, max(size, 1)))
        # positions stay below the prompt + N (a row's own tokens), slots do not
        table_len = Tb + self.N + 1
        self.sampling = SamplingConfig(float(temperature), int(top_k), float(top_p))
        eos = int(eos_id) if eos_id is not None and 0 <= eos_id < cfg.vocab_size else None
        self.layers = prepared_layers(cfg, params, mesh)
        rng = jax.random.PRNGKey(seed) if isinstance(seed, int) else seed
        key = (cfg, Bb, Tb, chunks)
        self._decode_fn = _jit(("decode",) + key + (self.N, self.sampling, eos, self.pad_id),
                               _decode, cfg=cfg, max_new_tokens=self.N, sampling=self.sampling,
                               eos_id=eos, pad_id=self.pad_id, table_len=table_len)
        self._feed_fn = _jit(("feed",) + key, _feed, cfg=cfg, table_len=table_len)
        self.state = _jit(("start",) + key, _start, cfg=cfg, chunks=chunks)(
            params, self.layers, tokens, valid, rng)
        self.slots_total = sum(chunks) + Tb - 1

    def _rows(self, x, fill, dtype):
        out = np.full((self.Bb,) + np.shape(x)[1:], fill, dtype)
        out[:self.B] = x
        return out

    def decode(self, active_B: np.ndarray, limit_B: np.ndarray):
        """One assistant turn for the active rows, each at most limit_B tokens: numpy
        (tokens [B, N], logprobs [B, N], lengths [B], last sampled token [B])."""
        self.state, toks, logps, lens, last = self._decode_fn(
            self.params, self.layers, self.state, self._rows(active_B, False, bool),
            self._rows(limit_B, 1, np.int32))
        toks, logps, lens, last = jax.device_get((toks, logps, lens, last))
        B = self.B
        return np.asarray(toks[:B]), np.asarray(logps[:B]), np.asarray(lens[:B]), \
            np.asarray(last[:B])

    def feed(self, cached: dict[int, Sequence[int]], next_token: dict[int, int]) -> None:
        """Cache `cached[row]` (in order) for each row and make next_token[row] the row's next
        input; the other rows are unchanged."""
        width = max((len(v) for v in cached.values()), default=0)
        W = next_pow2(max(width, 1))   # one compile per power of two
        tokens = np.zeros((self.Bb, W), np.int32)
        valid = np.zeros((self.Bb, W), bool)
        for r, ids in cached.items():
            tokens[r, :len(ids)] = ids
            valid[r, :len(ids)] = True
        nxt = np.zeros((self.Bb,), np.int32)
        fed = np.zeros((self.Bb,), bool)
        for r, t in next_token.items():
            nxt[r], fed[r] = t, True
        self.state = self._feed_fn(self.params, self.layers, self.state, tokens, valid,
                                   np.int32(width), nxt, fed)

    @property
    def cache_index(self) -> int:
        """The next cache slot (every row's): the cache is full at slots_total."""
        return int(jax.device_get(self.state.cache.index))


_JIT: dict = {}


def _jit(key, fn, **static):
    f = _JIT.get(key)
    if f is None:
        f = _JIT[key] = jax.jit(functools.partial(fn, **static))
    return f


def clear_cache() -> None:
    _JIT.clear()


__all__ = ["Conversation", "TurnState", "clear_cache", "compile_count", "conversation_slots"]
