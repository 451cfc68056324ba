"""The rollout as a value, and the loop's counters as a value.

`Rollout`: one update's sampled responses, whichever path made them: `generate_rollout` (the
synchronous `generate` over P prompts x G samples) or `rl/partial.PartialRollout.next_batch`
(the slot engine's asynchronous partial rollout). Host numpy arrays, B = P * G rows
(prompt-major), M = max_new_tokens:
  tokens_BM, logprobs_BM   sampled tokens (pad after each row's length) and their behaviour
                           log-probs (0 on pads)
  lengths_B                tokens generated per row (EOS included)
  versions_BM              policy version that sampled each token (engine only, else None)
  examples [P], prompts [B], group_size   the data rows and encoded prompts they came from
  decode_s                 wall seconds of the decode, transfers to host included
  version                  policy version (updates so far) the batch is trained at (engine)
  slot_occupancy, decode_steps   the engine's round statistics (engine only)
  rewards_B, reward_failures, reward_wait_s   the rewards when they were scored during the
                           decode (rl/scoring.py), the reward calls of theirs that failed, and
                           the seconds waited for them after the decode; None otherwise
A flax struct: the arrays are its pytree leaves, the rest static.

`LoopState`: what changes while a run runs (train states and counters), passed to and
returned by each step of the loop (experiment/train.py); nothing is written on the side.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Optional, Sequence

import flax.struct
import jax
import numpy as np

from jaxrl_scale import distributed as dist
from jaxrl_scale.rl.scoring import collect, decode_texts
from jaxrl_scale.sampling import SamplingConfig, generate


def _static(default=None):
    return flax.struct.field(pytree_node=False, default=default)


@flax.struct.dataclass
class Rollout:
    tokens_BM: Any
    logprobs_BM: Any
    lengths_B: Any
    versions_BM: Any = None
    examples: Sequence[dict] = _static(())
    prompts: Sequence[list] = _static(())
    group_size: int = _static(1)
    decode_s: float = _static(0.0)
    version: Optional[int] = _static(None)
    slot_occupancy: Optional[float] = _static(None)
    decode_steps: Optional[int] = _static(None)
    rewards_B: Any = None
    reward_failures: int = _static(0)
    reward_wait_s: Optional[float] = _static(None)

    def row_examples(self) -> list[dict]:
        """The data row of each of the B responses (each example G times)."""
        return [e for e in self.examples for _ in range(self.group_size)]

    def fields(self) -> dict[str, Any]:
        """The rollout fields of the step's record (docs/api.md, Rollout fields): the
        engine's round statistics and staleness (none for `generate`), and reward_wait_s
        where the rewards were scored during the decode."""
        waited = {} if self.reward_wait_s is None else {"reward_wait_s": self.reward_wait_s}
        if self.versions_BM is None:
            return waited
        return {"slot_occupancy": self.slot_occupancy, "decode_steps": self.decode_steps,
                **staleness_metrics(self.versions_BM, self.lengths_B, self.version), **waited}


def staleness_metrics(versions_BM: np.ndarray, lengths_B: np.ndarray, version: int
                      ) -> dict[str, float]:
    """Policy versions between sampling and this update, over the batch's response tokens
    (docs/api.md, Rollout fields)."""
    mask_BM = np.arange(versions_BM.shape[1])[None, :] < np.asarray(lengths_B)[:, None]
    lag = (version - np.asarray(versions_BM))[mask_BM]
    if not lag.size:
        return {"staleness_mean": 0.0, "staleness_max": 0, "off_policy_token_frac": 0.0}
    return {"staleness_mean": float(lag.mean()), "staleness_max": int(lag.max()),
            "off_policy_token_frac": float((lag > 0).mean())}


def _as_key(seed):
    return jax.random.PRNGKey(seed) if isinstance(seed, int) else seed


@dataclasses.dataclass(frozen=True)
class SamplingSettings:
    """How `generate_rollout` samples: the strategy (temperature, top_k, top_p), the response
    cap, the tokenizer's EOS and pad ids, and the rows per `generate` call (`chunk`)."""

    strategy: SamplingConfig
    max_new_tokens: int
    eos_id: Optional[int]
    pad_id: int
    chunk: int

    def with_temperature(self, temperature: float) -> "SamplingSettings":
        """The same settings at another temperature (0.0: greedy)."""
        return dataclasses.replace(self, strategy=dataclasses.replace(
            self.strategy, temperature=temperature))


def generate_rollout(model_cfg, params, examples: Sequence[dict], group: int, encode,
                     settings: SamplingSettings, *, seed, mesh=None, scorer=None) -> Rollout:
    """`generate` over `examples` x `group` samples, in calls of at most settings.chunk rows:
    chunk c samples with fold_in(seed, c); a single chunk with the seed itself.

    scorer (rl/scoring.RewardScorer): with several chunks, every call is dispatched first
    (JAX runs them asynchronously) and each chunk is submitted for scoring as soon as it is
    on the host, so its rewards are scored while later chunks decode; the Rollout then
    carries them. A single chunk has nothing to overlap with: it is scored after, as
    without a scorer (Run.rewards)."""
    s, rule, chunk = settings, settings.strategy, settings.chunk
    prompts = [encode(e["prompt"]) for e in examples for _ in range(group)]
    t0 = time.perf_counter()
    starts = range(0, len(prompts), chunk)
    outs = [generate(model_cfg, params, prompts[i:i + chunk], max_new_tokens=s.max_new_tokens,
                     temperature=rule.temperature, top_k=rule.top_k, top_p=rule.top_p,
                     eos_id=s.eos_id, pad_id=s.pad_id, mesh=mesh,
                     seed=seed if len(prompts) <= chunk else
                     jax.random.fold_in(_as_key(seed), i // chunk))
            for i in starts]
    host, futures = [], []
    for i, o in zip(starts, outs):   # chunk c to the host while chunks > c still decode
        host.append(tuple(dist.to_host(getattr(o, f)) for f in ("tokens", "logprobs",
                                                                  "lengths")))
        if scorer is not None and len(outs) > 1:   # each row's example: chunks split groups
            rows = [examples[k // group] for k in range(i, i + len(host[-1][2]))]
            futures.append(scorer.submit(host[-1][0], host[-1][2], rows))
    tokens, logps, lengths = (np.concatenate([h[j] for h in host]) for j in range(3))
    decode_s = time.perf_counter() - t0
    scored = {}
    if futures:
        rewards_B, failed, wait_s = collect(futures)
        scored = dict(rewards_B=rewards_B, reward_failures=failed, reward_wait_s=wait_s)
    return Rollout(tokens_BM=tokens, logprobs_BM=logps, lengths_B=lengths,
                   examples=tuple(examples), prompts=prompts, group_size=group,
                   decode_s=decode_s, **scored)


def score_rollout(r: Rollout, tokenizer, reward_fn) -> tuple[np.ndarray, int]:
    """(rewards of all B rows float32, reward calls that failed on every process): each
    process scores its `dist.host_rows` share of the responses with `reward_fn`
    (data/rewards.RewardFn, which counts its own failures); the failures are returned, so
    the caller's counters change only where it adds them."""
    B = len(r.lengths_B)
    rows = dist.host_rows(B)
    texts = decode_texts(tokenizer, r.tokens_BM[rows], r.lengths_B[rows])
    # counted inside the call: another thread (rl/scoring.py) may be scoring meanwhile
    rewards, mine = reward_fn.score_counted(texts, r.row_examples()[rows])
    failed = dist.allgather_rows(np.array([mine]), jax.process_count())
    return dist.allgather_rows(np.asarray(rewards, np.float32), B), int(failed.sum())


@dataclasses.dataclass(frozen=True)
class LoopState:
    """The run's changing state: the train state(s) (policy, and PPO's critic) and the loop's
    counters (docs/science.md, Time to target). `counters()` is what checkpoints and DONE.json
    hold."""

    states: tuple
    step: int = 0
    responses: int = 0                 # cumulative retained responses
    response_tokens: int = 0           # ... and their tokens in the loss (observations out)
    responses_generated: int = 0
    time_s: float = 0.0                # generation + rewards + update, eval excluded
    reached_at: Optional[int] = None   # responses when the eval first reached the target
    reached_step: Optional[int] = None  # ... and the step of that eval
    reward_failures: int = 0           # reward calls that raised or timed out, every process
    eval_scores: tuple = ()            # every eval's score so far (the target stop's fit)

    COUNTERS = ("step", "responses", "response_tokens", "responses_generated", "time_s",
                "reached_at", "reached_step")

    def counters(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.COUNTERS}

    def position(self) -> dict[str, Any]:
        """Where the run stands, as every training and eval record after step 0 opens
        (docs/api.md, metrics.jsonl): responses, response_tokens, responses_generated,
        time_s."""
        return {"responses": self.responses, "response_tokens": self.response_tokens,
                "responses_generated": self.responses_generated, "time_s": self.time_s}

    def counted(self, accounting: dict[str, Any]) -> "LoopState":
        """The counters after a step, from its accounting (rl/batch.rollout_batch's, plus
        `retained_tokens`: the sum of the trained batch's loss mask, so retained rows only and
        an episode's assistant tokens only): retained responses, their loss tokens, and the
        responses generated."""
        return self.replace(responses=self.responses + accounting["retained"],
                            response_tokens=self.response_tokens +
                            accounting["retained_tokens"],
                            responses_generated=self.responses_generated +
                            accounting["generated"])

    @property
    def params(self):
        """The policy's trained params (LoRA: its adapters; Run.policy_params merges)."""
        return self.states[0].params

    def replace(self, **kw) -> "LoopState":
        return dataclasses.replace(self, **kw)


__all__ = ["LoopState", "Rollout", "SamplingSettings", "generate_rollout", "score_rollout",
           "staleness_metrics"]
