"""Verifiable tasks (TFDS builders read through array_record data sources), a resumable prompt
stream, and reward functions.

    src = load_task("arithmetic", "train", data_dir=DIR, num_examples=1000)
    stream = PromptStream(src, batch_size=32, seed=0)
    batch = stream.next_batch()                       # list of {"prompt", "answer", ...}
    rewards_N = reward_for_task("arithmetic").score_batch(responses, batch)

Names load lazily, so importing the rewards does not import TensorFlow Datasets.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "TASKS": "builders",
    "TaskSource": "builders",
    "load_task": "builders",
    "ArithChain": "builders",
    "ArithChainConfig": "builders",
    "Arithmetic": "builders",
    "ArithmeticConfig": "builders",
    "Countdown": "builders",
    "CountdownConfig": "builders",
    "MathJsonl": "builders",
    "MathJsonlConfig": "builders",
    "PromptStream": "stream",
    "RewardFn": "reward_runner",
    "REWARDS": "rewards",
    "reward_for_task": "rewards",
    "load_reward_fn": "rewards",
    "user_reward": "rewards",
    "exact_match": "rewards",
    "chain_final_answer": "rewards",
    "countdown_reward": "rewards",
    "math_verify_reward": "rewards",
    "verify_countdown": "rewards",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
