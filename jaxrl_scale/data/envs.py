"""Environments for multi-turn rollouts (`--env`, rl/multiturn.py; docs/usage.md, Multi-turn
environments): `factory(example)` returns an object with reset() -> first message and
step(assistant_text) -> (observation, reward, done).

`retry`: the task's prompt, then "wrong, try again" after each wrong answer, at most TRIES
answers; reward 1 for the first right one (data/rewards.exact_match, the arithmetic task's
reward). The example of docs/usage.md, Multi-turn environments.
"""
from __future__ import annotations

from jaxrl_scale.data.rewards import exact_match

TRIES = 3


class Retry:
    def __init__(self, example: dict, tries: int = TRIES):
        self.example, self.tries, self.answers = example, tries, 0

    def reset(self) -> str:
        return self.example["prompt"]

    def step(self, text: str) -> tuple[str, float, bool]:
        self.answers += 1
        if exact_match(text, self.example) > 0:
            return "", 1.0, True
        return "wrong, try again", 0.0, self.answers >= self.tries


def retry(example: dict) -> Retry:
    """--env=jaxrl_scale.data.envs:retry"""
    return Retry(example)


__all__ = ["Retry", "TRIES", "retry"]
