"""Reward scoring on a background thread while decoding continues (--reward_overlap).

`RewardScorer` holds the tokenizer, the reward function and one worker thread:

    scorer = RewardScorer(tokenizer, reward_fn)
    fut = scorer.submit(tokens_NM, lengths_N, examples)   # returns at once
    ...                                                    # decode more rows meanwhile
    rewards_B, failures, wait_s = collect([fut, ...])

`submit` decodes the responses on the calling thread (the tokenizer is never used from two
threads) and queues their `reward_fn.score_counted` call; one worker, first in first out, so
the reward function sees one call at a time from here (RewardFn and BatchReward also
serialise calls among threads, e.g. an eval scoring on the main thread meanwhile).

Where it is used: the slot engine submits each group when its last row finishes
(rl/partial.py), `generate_rollout` each chunk once it is on the host while later chunks
decode (rl/rollout.py). Not used (`scorer_for_run` is None) by multi-process runs (each
process scores its rows and the rewards are gathered: rollout.score_rollout), by --env
episodes (their rewards are the environment's) or with --reward_overlap=false.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl_scale.data.reward_runner import _ThreadWorker
from jaxrl_scale.models.tokenizer import decode_response


@dataclasses.dataclass(frozen=True)
class Scored:
    """One submission's result: float32 rewards of its N rows, reward calls that failed."""
    rewards_N: np.ndarray
    failures: int


def decode_texts(tokenizer, tokens_NM, lengths_N) -> list[str]:
    """The response text of each row: its first lengths_N[i] tokens, decoded."""
    return [decode_response(tokenizer, row[:int(n)]) for row, n in
            zip(np.asarray(tokens_NM), np.asarray(lengths_N))]


class RewardScorer:
    """A reward function's calls on one daemon worker thread (a stuck call is the reward
    function's own timeout's to end, as when it is called inline)."""

    def __init__(self, tokenizer, reward_fn):
        self.tokenizer, self.reward_fn = tokenizer, reward_fn
        self._worker: _ThreadWorker | None = None

    def submit(self, tokens_NM, lengths_N, examples: Sequence[dict]
               ) -> concurrent.futures.Future:
        """Queue the scoring of N responses; `examples` has N entries, or P with N = P * G
        prompt-major (reward_fn.score_batch's rule). The future gives a `Scored`."""
        texts = decode_texts(self.tokenizer, tokens_NM, lengths_N)
        if self._worker is None:
            self._worker = _ThreadWorker()
        return self._worker.submit(self._score, texts, list(examples))

    def _score(self, texts: list[str], examples: list[dict]) -> Scored:
        rewards, failed = self.reward_fn.score_counted(texts, examples)
        return Scored(np.asarray(rewards, np.float32), int(failed))

    def close(self) -> None:
        """Let the worker exit after what it was given (it is a daemon: exit ends it too)."""
        if self._worker is not None:
            self._worker.abandon()
            self._worker = None


def collect(futures: Sequence[concurrent.futures.Future]) -> tuple[np.ndarray, int, float]:
    """(the submissions' rewards concatenated in order, their failures summed, seconds this
    call blocked): what a rollout waits for once its decode is done (reward_wait_s)."""
    t0 = time.perf_counter()
    done = [f.result() for f in futures]
    return (np.concatenate([d.rewards_N for d in done]).astype(np.float32),
            sum(d.failures for d in done), time.perf_counter() - t0)


def scorer_for_run(cfg: Any, tokenizer, reward_fn) -> RewardScorer | None:
    """The run's scorer, or None where rewards are scored after the rollout as a whole:
    --reward_overlap=false, --env episodes, several processes."""
    if not cfg.reward_overlap or cfg.env or jax.process_count() > 1:
        return None
    return RewardScorer(tokenizer, reward_fn)


__all__ = ["RewardScorer", "Scored", "collect", "decode_texts", "scorer_for_run"]
