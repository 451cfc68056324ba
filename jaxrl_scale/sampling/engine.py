"""Slot engine: B decode slots, each holding one sequence and its KV cache, refilled as rows finish.

Shapes: B slots, T prompt capacity (a bucket), N max_new_tokens, S = T - 1 + N ring columns,
A rows admitted in one call (a power-of-two bucket <= B).

The generation side of asynchronous partial rollout (rl/partial.py). Jitted pieces, one compile
each per shape (`compile_count` counts them):
- `admit`: prefill A prompts (the decoder's `extend`, as `generate` does) and place them into
  free slots;
- `advance`: every live slot decodes up to K tokens in a `lax.while_loop` (the same
  `decode_step`, sampling rules and log-probs as `generate`), stopping early when the rows the
  host waits for are done or enough slots are free to refill;
- the host harvests the rows that finished in the call and admits new prompts;
- `resume` (multi-turn episodes, rl/partial_turns.py): a slot whose assistant turn ended goes
  on with FORCED tokens (the observation) queued in its response row: each `advance` step
  outputs the next forced token instead of sampling (log-prob 0, the call's version) and
  feeds it as the next input, so the observation's KV is written by the same decode steps
  into the slot's own ring columns (nothing recomputed, no shape per observation length);
  when the queue is empty the slot samples again. A forced token never ends the slot (an
  observation may hold the EOS id). `advance(pause=...)` stops the call as soon as one of the
  given slots finishes, so a turn's end waits for the environment off the ring: a paused
  slot consumes no column, and its span stays within S.

The cache is a ring shared by all slots: every step writes column `index` (mod S) for every
slot (an empty or finished slot writes an invalid entry), so a step is exactly `generate`'s
one-chunk `decode_step`. A slot admitted when the ring is at column c holds its prompt in the
columns just before c; a sequence spans at most T - 1 + N = S columns, so it never overwrites
itself, and attention is order-free over a slot's valid columns (RoPE is applied before keys
are cached). When every slot is admitted at once at column T - 1 the layout is `generate`'s
column for column, so a synchronous round reproduces `generate` bit for bit.

Each token carries the policy version that sampled it (`admit`/`advance` take the version):
the learner needs it for staleness, and the behaviour log-prob for the decoupled objective.
"""
from __future__ import annotations

import functools
import numbers
from typing import Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxrl_scale.models.config import ModelConfig
from jaxrl_scale.models.decoder import extend, init_cache, rope_table
from jaxrl_scale.sampling.decode import (
    MIN_PROMPT_BUCKET, StepCache, _batch_spec_fn, _check_int, _data_axes, decode_step, next_pow2,
    prepared_layers, to_step_cache)
from jaxrl_scale.sampling.rules import SamplingConfig

_TRACES = [0]


def compile_count() -> int:
    """How many engine functions have been traced (== compiled) in this process."""
    return _TRACES[0]


@flax.struct.dataclass
class EngineState:
    cache: StepCache        # one chunk of S ring columns; cache.index is the next column
    input_B: jax.Array      # int32: token each slot feeds next
    tokens_BN: jax.Array    # int32: the slot's response so far (pad_id after it)
    logprobs_BN: jax.Array  # float32: behaviour log-prob of each token, 0 on pads
    versions_BN: jax.Array  # int32: policy version that sampled each token
    lengths_B: jax.Array    # int32: tokens generated (EOS included)
    limit_B: jax.Array      # int32: the slot's own cap on new tokens (<= N)
    forced_B: jax.Array     # int32: response columns below this are forced, not sampled
    live_B: jax.Array       # bool: decoding
    finished_B: jax.Array   # bool: finished during the last `advance` call (host harvests)
    rng: jax.Array
    step: jax.Array         # int32 []: decode steps since the last reseed (sampling key)
    live_sum: jax.Array     # float32 []: sum over steps of the live-slot fraction
    steps_run: jax.Array    # int32 []: steps since the last `take_occupancy`


def _init_state(cfg: ModelConfig, B: int, S: int, N: int, pad_id: int) -> EngineState:
    L, K, H, dt = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.jnp_dtype
    cache = StepCache(k_BKHS=tuple((jnp.zeros((B, K, H, S), dt),) for _ in range(L)),
                      v_BKSH=tuple((jnp.zeros((B, K, S, H), dt),) for _ in range(L)),
                      valid_BS=jnp.zeros((B, S), bool), next_pos_B=jnp.zeros((B,), jnp.int32),
                      index=jnp.zeros((), jnp.int32))
    zi = lambda: jnp.zeros((B,), jnp.int32)   # distinct buffers: the state is donated
    return EngineState(cache=cache, input_B=zi(), tokens_BN=jnp.full((B, N), pad_id, jnp.int32),
                       logprobs_BN=jnp.zeros((B, N), jnp.float32),
                       versions_BN=jnp.zeros((B, N), jnp.int32), lengths_B=zi(),
                       limit_B=jnp.full((B,), N, jnp.int32), forced_B=zi(),
                       live_B=jnp.zeros((B,), bool),
                       finished_B=jnp.zeros((B,), bool), rng=jax.random.PRNGKey(0),
                       step=jnp.zeros((), jnp.int32), live_sum=jnp.zeros((), jnp.float32),
                       steps_run=jnp.zeros((), jnp.int32))


def _constrain(state: EngineState, spec) -> EngineState:
    """Slots split over the mesh's data axes (every per-slot array is slot-major)."""
    if spec is None:
        return state
    B = state.input_B.shape[0]
    per_slot = lambda x: jax.lax.with_sharding_constraint(x, spec(x.ndim)) \
        if x.ndim and x.shape[0] == B else x
    return state.replace(cache=jax.tree.map(per_slot, state.cache),
                         **{f: per_slot(getattr(state, f)) for f in (
                             "input_B", "tokens_BN", "logprobs_BN", "versions_BN", "lengths_B",
                             "limit_B", "forced_B", "live_B", "finished_B")})


def _row_shards(spec) -> int:
    sharding = spec(1)
    axes = sharding.spec[0]
    axes = (axes,) if isinstance(axes, str) else axes
    return int(np.prod([sharding.mesh.shape[a] for a in axes]))


def _admit(state: EngineState, params, layers, tokens_AL, valid_AL, slot_A, limit_A, version,
           *, cfg: ModelConfig, pad_id: int, reset: bool, spec) -> EngineState:
    """Prefill A left-padded rows (last column real: the token fed next) and place them so that
    their cached tokens end just before the ring's current column. Rows with slot_A = B are
    bucket padding and dropped. reset=False keeps the slots' responses (a KV rebuild)."""
    _TRACES[0] += 1
    A, L = tokens_AL.shape
    S = state.cache.valid_BS.shape[1]
    fresh = init_cache(cfg, A, L - 1)
    if spec is not None and A % _row_shards(spec) == 0:   # prefill split as generate splits it
        c5, c2 = spec(5, 1), spec(2)
        fresh = fresh.replace(k_LBSKH=jax.lax.with_sharding_constraint(fresh.k_LBSKH, c5),
                              v_LBSKH=jax.lax.with_sharding_constraint(fresh.v_LBSKH, c5),
                              valid_BS=jax.lax.with_sharding_constraint(fresh.valid_BS, c2))
        tokens_AL = jax.lax.with_sharding_constraint(tokens_AL, c2)
        valid_AL = jax.lax.with_sharding_constraint(valid_AL, c2)
    _, pre = extend(cfg, params, fresh, tokens_AL[:, :-1], valid_AL[:, :-1], layers=layers)
    new = to_step_cache(pre, (S - (L - 1),))
    shift = (state.cache.index - (L - 1)) % S
    put = lambda old, x, axis: old.at[slot_A].set(jnp.roll(x, shift, axis=axis), mode="drop")
    c = state.cache
    cache = c.replace(
        k_BKHS=tuple((put(c.k_BKHS[i][0], new.k_BKHS[i][0], 3),) for i in range(cfg.num_layers)),
        v_BKSH=tuple((put(c.v_BKSH[i][0], new.v_BKSH[i][0], 2),) for i in range(cfg.num_layers)),
        valid_BS=put(c.valid_BS, new.valid_BS, 1),
        next_pos_B=c.next_pos_B.at[slot_A].set(new.next_pos_B, mode="drop"))
    state = state.replace(cache=cache,
                          input_B=state.input_B.at[slot_A].set(tokens_AL[:, -1], mode="drop"))
    if reset:
        N = state.tokens_BN.shape[1]
        set_ = lambda x, v: x.at[slot_A].set(v, mode="drop")
        state = state.replace(
            tokens_BN=set_(state.tokens_BN, jnp.full((A, N), pad_id, jnp.int32)),
            logprobs_BN=set_(state.logprobs_BN, jnp.zeros((A, N), jnp.float32)),
            versions_BN=set_(state.versions_BN, jnp.full((A, N), version, jnp.int32)),
            lengths_B=set_(state.lengths_B, jnp.zeros((A,), jnp.int32)),
            limit_B=set_(state.limit_B, limit_A), live_B=set_(state.live_B, jnp.ones((A,), bool)),
            forced_B=set_(state.forced_B, jnp.zeros((A,), jnp.int32)),
            finished_B=set_(state.finished_B, jnp.zeros((A,), bool)))
    return _constrain(state, spec)


def _resume(state: EngineState, slot_A, tokens_AN, forced_A, limit_A, *, spec) -> EngineState:
    """Slots slot_A (B: padding, dropped) go on decoding: their response rows become tokens_AN
    (the tokens so far, then the forced ones up to column forced_A), their cap limit_A, their
    next input their last token. Cache, positions, lengths, log-probs and versions are kept."""
    _TRACES[0] += 1
    B = state.input_B.shape[0]
    ok_A = slot_A < B
    at_A = jnp.clip(slot_A, 0, B - 1)
    last_A = jnp.take_along_axis(tokens_AN, jnp.maximum(state.lengths_B[at_A] - 1, 0)[:, None],
                                 axis=1)[:, 0]
    set_ = lambda x, v: x.at[slot_A].set(v, mode="drop")
    state = state.replace(
        tokens_BN=set_(state.tokens_BN, tokens_AN), forced_B=set_(state.forced_B, forced_A),
        limit_B=set_(state.limit_B, limit_A),
        input_B=set_(state.input_B, last_A), live_B=set_(state.live_B, ok_A),
        finished_B=set_(state.finished_B, jnp.zeros_like(ok_A)))
    return _constrain(state, spec)


def _advance(state: EngineState, params, layers, version, watch_B, refill_at, max_steps,
             pause_B, *, cfg: ModelConfig, sampling: SamplingConfig, eos_id: int | None,
             pad_id: int, spec) -> EngineState:
    """Up to max_steps decode steps for every live slot; stops early when no watched slot is
    live, at least `refill_at` slots are not live, or a slot of pause_B finished. finished_B
    marks the rows done here. A slot below its forced column outputs its queued token."""
    _TRACES[0] += 1
    B, N = state.tokens_BN.shape
    S = state.cache.valid_BS.shape[1]
    table = rope_table(cfg, S + 1)   # a sequence's positions stay below T + N = S + 1
    col_N = jnp.arange(N, dtype=jnp.int32)

    def step(carry):
        s, i = carry
        active_B = s.live_B
        logits_BV, cache = decode_step(cfg, params, layers, s.cache, s.input_B, active_B,
                                       rope_table=table)
        tok_B, logp_B = sampling.get_next_tokens(logits_BV, jax.random.fold_in(s.rng, s.step))
        at_BN = active_B[:, None] & (col_N[None, :] == s.lengths_B[:, None])
        force_B = s.lengths_B < s.forced_B   # the slot outputs its queued token
        queued_B = jnp.sum(jnp.where(at_BN, s.tokens_BN, 0), axis=1)
        tok_B = jnp.where(active_B, jnp.where(force_B, queued_B, tok_B), pad_id)
        logp_B = jnp.where(active_B & ~force_B, logp_B, 0.0)
        lengths_B = s.lengths_B + active_B.astype(jnp.int32)
        stop_B = lengths_B >= s.limit_B
        if eos_id is not None:
            stop_B = stop_B | ((tok_B == eos_id) & ~force_B)
        done_B = active_B & stop_B
        live_B = active_B & ~stop_B
        s = s.replace(
            cache=cache.replace(index=cache.index % S),
            input_B=jnp.where(live_B, tok_B, 0),
            tokens_BN=jnp.where(at_BN, tok_B[:, None], s.tokens_BN),
            logprobs_BN=jnp.where(at_BN, logp_B[:, None], s.logprobs_BN),
            versions_BN=jnp.where(at_BN, version, s.versions_BN),
            lengths_B=lengths_B, live_B=live_B, finished_B=s.finished_B | done_B,
            step=s.step + 1, live_sum=s.live_sum + jnp.mean(active_B.astype(jnp.float32)),
            steps_run=s.steps_run + 1)
        return _constrain(s, spec), i + 1

    def cond(carry):
        s, i = carry
        return (i < max_steps) & jnp.any(s.live_B & watch_B) & \
            (jnp.sum(~s.live_B) < refill_at) & ~jnp.any(s.finished_B & pause_B)

    state = state.replace(finished_B=jnp.zeros_like(state.finished_B))
    state, _ = jax.lax.while_loop(cond, step, (state, jnp.zeros((), jnp.int32)))
    return state


class SlotEngine:
    """Host side of the slot engine (see the module docstring).

    slots: B (a multiple of the mesh's data-parallel size); prompt_len: the longest prompt
    the engine takes (rounded up to the prompt bucket T, as `generate` pads); the rest as in
    `generate`. The engine state lives on device between calls; `harvest` data comes back
    as numpy.
    """

    def __init__(self, cfg: ModelConfig, *, slots: int, prompt_len: int, max_new_tokens: int,
                 sampling: SamplingConfig = SamplingConfig(), eos_id: int | None, pad_id: int,
                 mesh: Mesh | None = None, steps_per_call: int = 8):
        _check_int("slots", slots, 1)
        _check_int("prompt_len", prompt_len, 1)
        _check_int("max_new_tokens", max_new_tokens, 1)
        _check_int("steps_per_call", steps_per_call, 1)
        self.cfg, self.B, self.N = cfg, int(slots), int(max_new_tokens)
        self.T = next_pow2(prompt_len, MIN_PROMPT_BUCKET)
        self.prompt_len = int(prompt_len)
        if self.prompt_len + self.N > cfg.max_seq_len:
            raise ValueError(f"SlotEngine: prompt_len {prompt_len} + max_new_tokens "
                             f"{max_new_tokens} exceeds the model context {cfg.max_seq_len}.")
        self.S = self.T - 1 + self.N
        self.mesh, self.spec = mesh, None
        if mesh is not None:
            axes = _data_axes(mesh, None)
            size = int(np.prod([mesh.shape[a] for a in axes]))
            if self.B % size:
                raise ValueError(f"SlotEngine: slots={self.B} do not split over the "
                                 f"{size} data-parallel devices; use a multiple of {size}.")
            self.spec = _batch_spec_fn(mesh, axes)
        self.pad_id, self.steps_per_call = int(pad_id), int(steps_per_call)
        eos = int(eos_id) if eos_id is not None and 0 <= eos_id < cfg.vocab_size else None
        static = dict(cfg=cfg, pad_id=self.pad_id, spec=self.spec)
        self._admit = {r: jax.jit(functools.partial(_admit, reset=r, **static), donate_argnums=0)
                       for r in (True, False)}
        self._advance = jax.jit(functools.partial(_advance, sampling=sampling, eos_id=eos,
                                                  **static), donate_argnums=0)
        self._resume = jax.jit(functools.partial(_resume, spec=self.spec), donate_argnums=0)
        self.turns = False   # slots resume after a turn (multi-turn): `warm` compiles `resume`
        self.state = None
        self._set(_init_state(cfg, self.B, self.S, self.N, self.pad_id))
        self.cache_column = self.T - 1   # host copy of state.cache.index
        self._steps_run = 0              # host copy of state.steps_run
        self.live = np.zeros((self.B,), bool)

    def _set(self, state: EngineState = None, **fields) -> None:
        """Replace state fields from the host, placed as the jitted functions return them
        under a mesh (slots split, the rest replicated): a host-made scalar would otherwise
        change the input shardings and recompile every engine function."""
        state = (self.state if state is None else state).replace(**fields)
        if self.spec is not None:
            rep = NamedSharding(self.mesh, P())
            state = jax.device_put(state, jax.tree.map(
                lambda x: self.spec(x.ndim) if x.ndim and x.shape[0] == self.B else rep, state))
        self.state = state

    def reset(self, seed) -> None:
        """Empty every slot, reseed sampling (step 0) and put the ring at column T - 1, the
        column where `generate` starts decoding: a round that admits all slots at once then
        decodes exactly what `generate` gives for the same seed."""
        self._set(live_B=jnp.zeros_like(self.state.live_B), rng=_key(seed),
                  step=jnp.zeros((), jnp.int32),
                  cache=self.state.cache.replace(index=jnp.asarray(self.T - 1, jnp.int32)))
        self.cache_column, self.live = self.T - 1, np.zeros((self.B,), bool)

    def reseed(self, seed) -> None:
        """A new sampling key (step 0) without touching the slots."""
        self._set(rng=_key(seed), step=jnp.zeros((), jnp.int32))

    def free_slots(self) -> np.ndarray:
        return np.flatnonzero(~self.live)

    def check_prompts(self, prompts: Sequence[Sequence[int]]) -> None:
        for i, p in enumerate(prompts):
            if len(p) == 0:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token.")
            if len(p) > self.prompt_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens, more than the engine's "
                                 f"prompt capacity of {self.prompt_len}; build the SlotEngine "
                                 f"with a larger prompt_len (--max_prompt_len).")

    def _rows(self, seqs: Sequence[Sequence[int]], width: int, slots: Sequence[int]):
        """Left-padded [A, width] block (A a power-of-two bucket, padding rows -> slot B)."""
        A = min(next_pow2(len(seqs)), next_pow2(self.B))
        tokens = np.zeros((A, width), np.int32)
        valid = np.zeros((A, width), bool)
        for i, s in enumerate(seqs):
            tokens[i, width - len(s):] = s
            valid[i, width - len(s):] = True
        slot_A = np.full((A,), self.B, np.int32)
        slot_A[:len(slots)] = slots
        return tokens, valid, slot_A

    def admit(self, params, prompts: Sequence[Sequence[int]], slots: Sequence[int], *,
              version: int = 0, limits: Sequence[int] | None = None) -> None:
        """Prefill `prompts` into the free `slots` (one each); limits: per-row token caps."""
        self.check_prompts(prompts)
        slots = [int(s) for s in slots]
        if len(slots) != len(prompts) or any(self.live[s] for s in slots) or \
                len(set(slots)) != len(slots):
            raise ValueError("admit needs one distinct free slot per prompt.")
        if not prompts:
            return
        tokens, valid, slot_A = self._rows(prompts, self.T, slots)
        limit_A = np.full((len(slot_A),), self.N, np.int32)
        if limits is not None:
            limit_A[:len(slots)] = np.clip(np.asarray(limits, np.int32), 1, self.N)
        self.state = self._admit[True](self.state, params, self._layers(params), tokens, valid,
                                       slot_A, limit_A, np.int32(version))
        self.live[slots] = True

    def rebuild(self, params, prompts: dict[int, Sequence[int]]) -> None:
        """Recompute the KV cache of the live slots under `params` ({slot: its prompt}): the
        prompt and every generated token but the last (which is fed next) are prefilled again;
        responses, behaviour log-probs and versions are kept."""
        slots = np.flatnonzero(self.live)
        if not slots.size:
            return
        toks, lens = jax.device_get((self.state.tokens_BN, self.state.lengths_B))
        seqs = [list(prompts[s]) + list(toks[s, :lens[s]]) for s in slots]
        tokens, valid, slot_A = self._rows(seqs, self.T + self.N - 1, slots)
        self.state = self._admit[False](self.state, params, self._layers(params), tokens, valid,
                                        slot_A, np.full((len(slot_A),), self.N, np.int32),
                                        np.int32(0))

    def resume(self, rows: dict[int, tuple[Sequence[int], int, int]]) -> None:
        """Slots that finished (not yet re-admitted) go on decoding from their KV cache:
        rows[slot] = (its response row of N tokens: the tokens so far, then the tokens to
        force; the column where forcing ends; its new cap on tokens, <= N). The slot first
        feeds its last token, then outputs the forced tokens (log-prob 0), then samples up to
        its cap or EOS."""
        if not rows:
            return
        slots = [int(s) for s in rows]
        if any(self.live[s] for s in slots):
            raise ValueError("resume needs finished slots.")
        slot_A = np.full((self.B,), self.B, np.int32)
        tokens = np.full((self.B, self.N), self.pad_id, np.int32)
        forced = np.zeros((self.B,), np.int32)
        limit = np.full((self.B,), self.N, np.int32)
        for a, s in enumerate(slots):
            row, end, cap = rows[s]
            slot_A[a], tokens[a], forced[a], limit[a] = s, row, end, min(int(cap), self.N)
        self.state = self._resume(self.state, slot_A, tokens, forced, limit)
        self.live[slots] = True

    def advance(self, params, *, version: int = 0, watch: np.ndarray | None = None,
                refill_at: int | None = None, max_steps: int | None = None,
                pause: np.ndarray | None = None) -> dict:
        """Decode until no watched slot is live (default: all), `refill_at` slots are free, a
        slot of `pause` finished (default: none), or max_steps (default steps_per_call) steps
        ran. Returns the rows that finished: {"slots", "tokens" [R, N], "logprobs",
        "versions", "lengths"} as numpy, and "steps", the decode steps this call ran (0 when
        no watched slot was live or a paused slot had already finished)."""
        watch_B = np.ones((self.B,), bool) if watch is None else np.asarray(watch, bool)
        pause_B = np.zeros((self.B,), bool) if pause is None else np.asarray(pause, bool)
        refill = self.B + 1 if refill_at is None else int(refill_at)
        K = self.steps_per_call if max_steps is None else int(max_steps)
        self.state = self._advance(self.state, params, self._layers(params), np.int32(version),
                                   watch_B, np.int32(refill), np.int32(K), pause_B)
        s = self.state
        fin, live, toks, logps, vers, lens, col, ran = jax.device_get(
            (s.finished_B, s.live_B, s.tokens_BN, s.logprobs_BN, s.versions_BN, s.lengths_B,
             s.cache.index, s.steps_run))
        self.live, self.cache_column = np.array(live), int(col)
        steps, self._steps_run = int(ran) - self._steps_run, int(ran)
        idx = np.flatnonzero(fin)
        return {"slots": idx, "tokens": toks[idx], "logprobs": logps[idx],
                "versions": vers[idx], "lengths": lens[idx], "steps": steps}

    def warm(self, params, sizes: Sequence[int], rebuild: bool = False) -> None:
        """Compile admission for every row count in `sizes` (their buckets), the decode call
        and (with `turns`) `resume`, without changing any slot (padding rows only, zero
        steps)."""
        for A in sorted({min(next_pow2(n), next_pow2(self.B)) for n in sizes}):
            widths = (self.T,) + ((self.T + self.N - 1,) if rebuild else ())
            for reset, width in zip((True, False), widths):
                self.state = self._admit[reset](
                    self.state, params, self._layers(params), np.zeros((A, width), np.int32),
                    np.zeros((A, width), bool), np.full((A,), self.B, np.int32),
                    np.full((A,), self.N, np.int32), np.int32(0))
        self.state = self._advance(self.state, params, self._layers(params), np.int32(0),
                                   np.ones((self.B,), bool), np.int32(self.B + 1), np.int32(0),
                                   np.zeros((self.B,), bool))
        if self.turns:   # no slot: every row is padding
            self.state = self._resume(self.state, np.full((self.B,), self.B, np.int32),
                                      np.zeros((self.B, self.N), np.int32),
                                      np.zeros((self.B,), np.int32),
                                      np.zeros((self.B,), np.int32))

    def take_occupancy(self) -> tuple[float, int]:
        """(mean live-slot fraction per decode step, steps) since the last call; resets."""
        total, steps = jax.device_get((self.state.live_sum, self.state.steps_run))
        self._set(live_sum=jnp.zeros((), jnp.float32), steps_run=jnp.zeros((), jnp.int32))
        self._steps_run = 0
        return (float(total) / steps if steps else float("nan")), int(steps)

    def _layers(self, params):
        return prepared_layers(self.cfg, params, self.mesh)


def _key(seed):
    return jax.random.PRNGKey(seed) if isinstance(seed, numbers.Integral) else seed


__all__ = ["EngineState", "SlotEngine", "compile_count"]
