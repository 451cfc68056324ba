"""Asynchronous partial rollout: B_gen = k * B_train sequences in flight, updates on B_train.

Host-side orchestration of `sampling.engine.SlotEngine` (one update's batch per `next_batch`):
- prompts are admitted as whole groups of G (GRPO's group shares one prompt) into free slots,
  in stream order;
- an update takes the P oldest admitted groups once all their rows are done (oldest-first,
  strictly in admission order): no row is dropped or deferred for being slow, so the trained
  data has exactly the length distribution of the completed rollouts;
- staleness control: a group is admitted only while fewer than (max_staleness + 1) * P groups
  wait for their update. A group admitted with n groups ahead of it is trained n // P updates
  later, so every token it holds was sampled at most max_staleness policy versions before
  the update that learns from it. The bound pauses admission; it never drops work;
- rows still decoding when an update lands continue under the new weights. Their KV cache is
  kept (the cached prefix was computed by the old weights), or, with recompute_kv, rebuilt
  under the new weights before decoding resumes. Either way each token keeps the log-prob of
  the distribution it was actually sampled from and the version that sampled it, which is what
  the decoupled objective needs (rl/losses.policy_loss with prox_logp_BT).

Rewards (`scorer`, rl/scoring.py): a group is submitted for scoring when its last row
finishes, so its reward calls run on the scorer's thread while the engine decodes the other
slots; `next_batch` waits only for its P groups' results (the exposed reward time).

k = 1 with max_staleness = 0 admits one batch, decodes it to the end and trains: the
synchronous rollout, and (engine reset to `generate`'s layout and seed every round) the same
tokens and log-probs as `generate`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
from typing import Callable, Sequence

import numpy as np

from jaxrl_scale.rl.rollout import Rollout, staleness_metrics  # noqa: F401 (re-export)
from jaxrl_scale.rl.scoring import RewardScorer, collect
from jaxrl_scale.sampling.engine import SlotEngine


@dataclasses.dataclass
class _Group:
    example: dict
    prompt: list[int]
    live: set                         # slots still decoding
    rows: dict                        # row index in group -> finished row (dict of numpy)
    slot_row: dict                    # slot -> row index
    scored: concurrent.futures.Future | None = None   # its rewards once every row is done


class PartialRollout:
    """Groups in flight between updates. next_examples() -> the next example of the stream."""

    def __init__(self, engine: SlotEngine, next_example: Callable[[], dict],
                 encode: Callable[[str], Sequence[int]], *, prompts_per_step: int,
                 group_size: int, max_staleness: int, recompute_kv: bool = False,
                 limit_fn: Callable[[dict], int] | None = None,
                 scorer: RewardScorer | None = None):
        self.engine, self.next_example, self.encode = engine, next_example, encode
        self.P, self.G, self.s = int(prompts_per_step), int(group_size), int(max_staleness)
        if engine.B < self.P * self.G:
            raise ValueError(f"PartialRollout: {engine.B} slots cannot hold one batch of "
                             f"{self.P} x {self.G} rows.")
        self.recompute_kv, self.limit_fn, self.scorer = bool(recompute_kv), limit_fn, scorer
        self.pending: collections.deque[_Group] = collections.deque()
        self.slot_group: dict[int, _Group] = {}
        self._params_version = None

    @property
    def waiting(self) -> int:
        """Groups admitted and not yet trained (their examples are re-read after a resume)."""
        return len(self.pending)

    def _can_admit(self) -> bool:
        return len(self.pending) < (self.s + 1) * self.P and \
            self.engine.free_slots().size >= self.G

    def _admit(self, params, version: int) -> None:
        groups, slots = [], []
        free = list(self.engine.free_slots())
        while len(self.pending) + len(groups) < (self.s + 1) * self.P and len(free) >= self.G:
            ex = self.next_example()
            take, free = free[:self.G], free[self.G:]
            g = _Group(example=ex, prompt=list(self.encode(ex["prompt"])), live=set(take),
                       rows={}, slot_row={s: i for i, s in enumerate(take)})
            groups.append(g)
            slots += take
        if not groups:
            return
        prompts = [g.prompt for g in groups for _ in range(self.G)]
        limits = None if self.limit_fn is None else \
            [self.limit_fn(g.example) for g in groups for _ in range(self.G)]
        self.engine.admit(params, prompts, slots, version=version, limits=limits)
        for g in groups:
            self.pending.append(g)
            for s in g.live:
                self.slot_group[s] = g

    def _harvest(self, out: dict) -> None:
        for j, s in enumerate(out["slots"]):
            g = self.slot_group.pop(int(s))
            g.rows[g.slot_row[int(s)]] = {k: out[k][j] for k in
                                          ("tokens", "logprobs", "versions", "lengths")}
            g.live.discard(int(s))
            if not g.live and self.scorer is not None:   # complete: score it while we decode
                rows = [g.rows[i] for i in range(self.G)]
                g.scored = self.scorer.submit(np.stack([r["tokens"] for r in rows]),
                                              np.stack([r["lengths"] for r in rows]),
                                              [g.example])

    def next_batch(self, params, *, version: int, seed) -> Rollout:
        """Decode until the P oldest groups are done; pop them as one prompt-major batch.

        version: the policy version of `params` (updates so far); seed: this round's sampling
        key (applied at step 0 of the round). Returns the `Rollout` (rl/rollout.py) of
        examples [P], prompts [P*G], numpy tokens_BM, logprobs_BM, versions_BM, lengths_B
        (B = P*G rows, M = max_new_tokens), the round's slot_occupancy, decode_steps and
        decode_s (this call's wall seconds up to the end of its decode), trained at
        `version`; with a scorer also the P groups' rewards_B, reward_failures and
        reward_wait_s (seconds waited for them after the decode).
        """
        t0 = time.perf_counter()
        eng = self.engine
        decode_round(self, params, version, seed,
                     slot_prompts=lambda: {s: g.prompt for s, g in self.slot_group.items()},
                     advance=lambda watch, refill: self._harvest(eng.advance(
                         params, version=version, watch=watch, refill_at=refill)))
        groups = [self.pending.popleft() for _ in range(self.P)]
        rows = [g.rows[i] for g in groups for i in range(self.G)]
        occupancy, steps = eng.take_occupancy()
        decode_s, scored = time.perf_counter() - t0, {}
        if self.scorer is not None:
            rewards_B, failed, wait_s = collect([g.scored for g in groups])
            scored = dict(rewards_B=rewards_B, reward_failures=failed, reward_wait_s=wait_s)
        stack = lambda k: np.stack([r[k] for r in rows])
        return Rollout(tokens_BM=stack("tokens"), logprobs_BM=stack("logprobs"),
                       lengths_B=stack("lengths"), versions_BM=stack("versions"),
                       examples=tuple(g.example for g in groups),
                       prompts=[g.prompt for g in groups for _ in range(self.G)],
                       group_size=self.G, decode_s=decode_s, version=version,
                       slot_occupancy=occupancy, decode_steps=steps, **scored)


def decode_round(ro, params, version: int, seed, *, slot_prompts: Callable[[], dict],
                 advance: Callable[[np.ndarray, int | None], None]) -> None:
    """One `next_batch`'s decoding, shared by PartialRollout and the episodes' variant
    (rl/partial_turns.py): reseed (or reset an empty engine to generate's layout), rebuild the
    live slots' KV from `slot_prompts()` when --recompute_kv and the params changed, then
    admit and `advance(watch_B, refill_at)` until the P oldest groups of `ro.pending` are done.
    `ro`: the orchestrator (engine, pending, slot P/G/s, recompute_kv, _can_admit, _admit)."""
    eng = ro.engine
    if not eng.live.any():
        eng.reset(seed)             # an empty engine starts at generate's layout
    else:
        eng.reseed(seed)
        if ro.recompute_kv and ro._params_version not in (None, version):
            eng.rebuild(params, slot_prompts())
    ro._params_version = version
    eng.take_occupancy()
    while True:
        if ro._can_admit():
            ro._admit(params, version)
        head = list(ro.pending)[:ro.P]
        if len(head) == ro.P and not any(g.live for g in head):
            return
        watch = np.zeros((eng.B,), bool)
        for g in head:
            watch[list(g.live)] = True
        refill = ro.G if len(ro.pending) < (ro.s + 1) * ro.P else None
        if not eng.live.any():
            raise RuntimeError(f"{type(ro).__name__}: nothing is decoding and the batch is "
                               "incomplete (admission is blocked).")
        advance(watch, refill)


__all__ = ["PartialRollout", "decode_round", "staleness_metrics"]
