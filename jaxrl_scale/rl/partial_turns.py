"""Multi-turn episodes in the slot engine: asynchronous partial rollout of `--env` episodes.

The orchestration of rl/partial.py (whole groups of G admitted into free slots in stream
order, the P oldest groups popped per update once all their rows are done, admission paused
by the staleness bound, in-flight rows continuing under new weights), with each row an
episode of rl/multiturn.py's environment interface instead of one response:

- admission: each row's environment is built and reset (`factory(example)`, `reset()`) on
  its own worker, with the synchronous path's failure and timeout accounting
  (multiturn.EnvRunner); the first message, encoded, is the slot's prompt. A row whose reset
  failed takes no slot: it is done at once, empty, reward 0 (its prompt one of its group's);
- a turn ends when the slot samples EOS or reaches its cap (the episode's budget N, or the
  runner's per-turn cap). `advance` is told to stop as soon as a slot whose episode may go on
  ends its turn (`pause`), so a paused slot consumes no ring column; the host decodes the
  turn's text, runs `step` for every turn that ended in the call (side by side, as the
  synchronous path does), and either finishes the row (done, --env_max_turns, a failure, or
  no room for one more assistant token after the observation) or resumes the slot with the
  observation as forced tokens (sampling/engine.py, `resume`): the slot's KV cache, tokens,
  length and positions are kept; the observation's KV is written by the next decode steps,
  token by token, and nothing is recomputed;
- the row layout is the synchronous path's (multiturn.py): tokens_BM holds the assistant
  turns and observations in order within M = max_new_tokens, log-prob 0 on observation
  tokens, `assistant_BM` marks the sampled tokens (mask_observations drops the rest from the
  loss), versions_BM the policy version of every token (an observation's: the version of the
  call that fed it), rewards_B each episode's summed reward.

Record fields (docs/api.md, Environment fields): env_turns, env_obs_tokens and env_tool_calls
over the batch's episodes; env_s, env_failures and env_timeouts over the environment calls
made during this `next_batch` (calls for groups trained later included, as the decode steps
are); engine_calls, the `advance` calls of the round that decoded (each turn end that may
continue stops one); plus the engine's slot_occupancy, decode_steps and staleness fields. decode_s excludes
env_s, as the synchronous path's does.

An environment that is done after one step (or --env_max_turns = 1) gives exactly the
single-turn slot engine's rollout (tokens, log-probs, versions, lengths): the extra stops
at turn ends change no decode step, and slots are taken in the same order.
"""
from __future__ import annotations

import collections
import dataclasses
import time
import types
from typing import Any, Callable, Sequence

import flax.struct
import numpy as np

from jaxrl_scale.data.reward_runner import reward_problem
from jaxrl_scale.models.tokenizer import decode_response
from jaxrl_scale.rl.multiturn import EnvRollout, EnvRunner, ObservationCodec
from jaxrl_scale.rl.partial import PartialRollout, decode_round
from jaxrl_scale.rl.rollout import Rollout
from jaxrl_scale.sampling.engine import SlotEngine

_KEYS = ("tokens", "logprobs", "versions", "lengths")


@flax.struct.dataclass
class EngineEnvRollout(EnvRollout):
    """An `EnvRollout` made by the slot engine: its record fields are the engine's round
    statistics and staleness (`Rollout.fields`) and the env fields."""

    def fields(self) -> dict[str, Any]:
        return {**Rollout.fields(self), **dict(self.env_stats)}


@dataclasses.dataclass
class _Row:
    ep: Any                           # the runner's episode (environment, reward, turns)
    assistant: np.ndarray             # bool [N]: sampled tokens
    start: int = 0                    # response column where the current turn began
    obs: int = 0                      # observation tokens in the row
    done: dict | None = None          # the finished row (numpy), once it is


@dataclasses.dataclass
class _Group:
    example: dict
    prompts: list                     # [G] encoded first messages
    rows: list                        # [G] _Row
    live: set                         # slots still in their episode
    slot_row: dict                    # slot -> row index in the group


class EpisodePartialRollout:
    """Episodes of `runner`'s environment in flight between updates (see the module
    docstring). next_example() -> the next example of the stream."""

    def __init__(self, engine: SlotEngine, next_example: Callable[[], dict], runner: EnvRunner,
                 tokenizer, *, prompts_per_step: int, group_size: int, max_staleness: int,
                 recompute_kv: bool = False):
        self.engine, self.next_example, self.runner, self.tok = \
            engine, next_example, runner, tokenizer
        self.P, self.G, self.s = int(prompts_per_step), int(group_size), int(max_staleness)
        if engine.B < self.P * self.G:
            raise ValueError(f"EpisodePartialRollout: {engine.B} slots cannot hold one batch "
                             f"of {self.P} x {self.G} rows.")
        self.recompute_kv = bool(recompute_kv)
        self.codec = ObservationCodec(tokenizer)
        engine.turns = True          # `warm` compiles `resume` as well
        self.pending: collections.deque[_Group] = collections.deque()
        self.slot_group: dict[int, _Group] = {}
        self._params_version = None
        self.stats = self._fresh_stats()
        self.engine_calls = 0

    @staticmethod
    def _fresh_stats() -> dict:
        return {"env_failures": 0, "env_timeouts": 0, "env_s": 0.0}

    @property
    def waiting(self) -> int:
        """Groups admitted and not yet trained (their examples are re-read after a resume)."""
        return len(self.pending)

    def _turn_cap(self, at: int) -> int:
        cap = self.runner.turn_tokens
        return self.engine.N if cap is None else min(at + int(cap), self.engine.N)

    # -- admission -------------------------------------------------------------------------

    def _can_admit(self) -> bool:
        return len(self.pending) < (self.s + 1) * self.P and \
            self.engine.free_slots().size >= self.G

    def _admit(self, params, version: int) -> None:
        eng, G, N = self.engine, self.G, self.engine.N
        free = list(eng.free_slots())
        examples = []
        while len(self.pending) + len(examples) < (self.s + 1) * self.P and len(free) >= G:
            examples.append(self.next_example())
            free = free[G:]
        if not examples:
            return
        free = list(eng.free_slots())
        rows = [ex for ex in examples for _ in range(G)]
        settings = types.SimpleNamespace(max_new_tokens=N, pad_id=eng.pad_id)
        eps, ids = self.runner._start(eng.cfg, rows, self.tok, settings, self.stats, 0, G)
        prompts, slots, limits = [], [], []
        for k, ex in enumerate(examples):
            g = _Group(example=ex, prompts=ids[k * G:(k + 1) * G], rows=[], live=set(),
                       slot_row={})
            for i in range(G):
                ep = eps[k * G + i]
                r = _Row(ep=ep, assistant=np.zeros((N,), bool))
                g.rows.append(r)
                if ep.failed:   # never decodes: an empty row, reward 0
                    r.done = {"tokens": np.full((N,), eng.pad_id, np.int32),
                              "logprobs": np.zeros((N,), np.float32),
                              "versions": np.full((N,), version, np.int32),
                              "lengths": np.int32(0)}
                    continue
                s = int(free.pop(0))
                g.live.add(s)
                g.slot_row[s] = i
                self.slot_group[s] = g
                prompts.append(g.prompts[i])
                slots.append(s)
                limits.append(self._turn_cap(0))
            self.pending.append(g)
        eng.admit(params, prompts, slots, version=version, limits=limits)

    # -- turn ends -------------------------------------------------------------------------

    def _pause_mask(self) -> np.ndarray:
        """The live slots whose current turn may not be their episode's last."""
        pause = np.zeros((self.engine.B,), bool)
        for s, g in self.slot_group.items():
            if g.rows[g.slot_row[s]].ep.turns + 1 < self.runner.max_turns:
                pause[s] = True
        return pause

    def _turn_ends(self, out: dict) -> None:
        """Every slot that finished in the last `advance`: its turn to the environment, then
        the row finished or the slot resumed with the observation."""
        runner, N = self.runner, self.engine.N
        ends = []
        for j, s in enumerate(out["slots"]):
            s = int(s)
            g = self.slot_group[s]
            r = g.rows[g.slot_row[s]]
            row = {k: out[k][j] for k in _KEYS}
            n = int(row["lengths"])
            r.assistant[r.start:n] = True
            r.ep.turns += 1
            ends.append((s, g, r, row, decode_response(self.tok, row["tokens"][r.start:n])))
        if not ends:
            return
        results = runner._step_all([e[2].ep for e in ends], [e[4] for e in ends], self.stats)
        resume = {}
        for (s, g, r, row, _), res in zip(ends, results):
            n = int(row["lengths"])
            if res is not None and not (res[1] or r.ep.turns >= runner.max_turns):
                o = self._observation(r.ep, res[0])
                if o is not None and n + len(o) < N:   # room for one more assistant token
                    tokens = np.array(row["tokens"], np.int32)
                    tokens[n:n + len(o)] = o
                    r.obs += len(o)
                    r.start = n + len(o)
                    resume[s] = (tokens, r.start, self._turn_cap(r.start))
                    continue
            self._finish(s, g, r, row)
        self.engine.resume(resume)

    def _observation(self, ep, text: str) -> list[int] | None:
        """The observation's ids as the next user turn; None where the episode failed."""
        try:
            o = self.codec.encode(text)
        except Exception as e:  # noqa: BLE001 - e.g. a character the tokenizer lacks
            self.runner._fail(ep, self.stats, f"step() gave an observation the tokenizer "
                              f"refuses: {e}")
            return None
        if len(o) > self.runner.max_obs_tokens:
            self.runner._fail(ep, self.stats, f"step() returned an observation of {len(o)} "
                              f"tokens (--env_max_obs_tokens={self.runner.max_obs_tokens})")
            return None
        return o

    def _finish(self, s: int, g: _Group, r: _Row, row: dict) -> None:
        ep = r.ep
        if not ep.failed and reward_problem(np.float32(ep.reward)) is not None:
            self.runner._fail(ep, self.stats, f"the episode's summed reward {ep.reward!r} is "
                              "not a finite float32")
        self.runner._close(ep)
        r.done = row
        g.live.discard(s)
        del self.slot_group[s]

    def close(self) -> None:
        """End the environments of every episode in flight (their groups are dropped)."""
        for g in self.pending:
            for r in g.rows:
                self.runner._close(r.ep)
        self.pending.clear()
        self.slot_group.clear()

    # -- the batch -------------------------------------------------------------------------

    def next_batch(self, params, *, version: int, seed) -> EngineEnvRollout:
        """Decode and run episodes until the P oldest groups are done; pop them as one
        prompt-major batch (PartialRollout.next_batch's contract, rows being episodes)."""
        t0 = time.perf_counter()
        eng = self.engine
        self.stats, self.engine_calls = self._fresh_stats(), 0
        def advance(watch, refill):
            out = eng.advance(params, version=version, watch=watch, refill_at=refill,
                              pause=self._pause_mask())
            self.engine_calls += out["steps"] > 0
            self._turn_ends(out)

        decode_round(self, params, version, seed, advance=advance,
                     slot_prompts=lambda: {s: g.prompts[g.slot_row[s]]
                                           for s, g in self.slot_group.items()})
        groups = [self.pending.popleft() for _ in range(self.P)]
        return self._batch(groups, version, t0)

    def _batch(self, groups: Sequence[_Group], version: int, t0: float) -> EngineEnvRollout:
        rows = [r for g in groups for r in g.rows]
        occupancy, steps = self.engine.take_occupancy()
        stack = lambda k: np.stack([r.done[k] for r in rows])
        rewards = np.array([0.0 if r.ep.failed else r.ep.reward for r in rows], np.float32)
        stats = dict(self.stats, engine_calls=self.engine_calls,
                     env_turns=float(np.mean([r.ep.turns for r in rows])),
                     env_obs_tokens=float(np.mean([r.obs for r in rows])))
        calls = [_tool_calls(r.ep) for r in rows]
        if any(isinstance(c, int) for c in calls):   # a tool environment (data/tools.py)
            stats["env_tool_calls"] = float(np.mean([c if isinstance(c, int) else 0
                                                     for c in calls]))
        return EngineEnvRollout(
            tokens_BM=stack("tokens"), logprobs_BM=stack("logprobs"), lengths_B=stack("lengths"),
            versions_BM=stack("versions"), examples=tuple(g.example for g in groups),
            prompts=[p for g in groups for p in g.prompts], group_size=self.G,
            decode_s=time.perf_counter() - t0 - stats["env_s"], version=version,
            slot_occupancy=occupancy, decode_steps=steps,
            assistant_BM=np.stack([r.assistant for r in rows]), rewards_B=rewards,
            env_stats=tuple(sorted(stats.items())))


def _tool_calls(ep) -> int | None:
    """The episode's environment's `tool_calls` count, where it keeps one."""
    n = getattr(ep, "tool_calls", None)
    return n if isinstance(n, int) else getattr(getattr(ep, "env", None), "tool_calls", None)


def slot_rollout(engine: SlotEngine, next_example: Callable[[], dict],
                 encode: Callable[[str], Sequence[int]], *, env: EnvRunner | None, tokenizer,
                 **kw):
    """The slot engine's rollout: `PartialRollout`, or with --env (an EnvRunner) its
    episodes' `EpisodePartialRollout` (the environment's reset gives the prompts and its
    steps the rewards: a reward `scorer` in kw is not used)."""
    if env is None:
        return PartialRollout(engine, next_example, encode, **kw)
    kw.pop("scorer", None)
    return EpisodePartialRollout(engine, next_example, env, tokenizer, **kw)


__all__ = ["EngineEnvRollout", "EpisodePartialRollout", "slot_rollout"]
