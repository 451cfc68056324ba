"""Environments for multi-turn rollouts (`--env`, rl/multiturn.py; docs/usage.md, Multi-turn
environments): `factory(example)` returns an object with reset() -> first message and
step(assistant_text) -> (observation, reward, done).

`retry`: the task's prompt, then "wrong, try again" after each wrong answer, at most TRIES
answers; reward 1 for the first right one, by the reward of the task the example comes from
(data/tools.task_reward: exact match for arithmetic, the final number for arith_chain). The
example of docs/usage.md, Multi-turn environments.

`calc`: the calculator tool of data/tools.py (`calc(EXPR)` calls, then a final answer).
"""
from __future__ import annotations

from jaxrl_scale.data.tools import Calc, task_reward

TRIES = 3


class Retry:
    def __init__(self, example: dict, tries: int = TRIES):
        self.example, self.tries, self.answers = example, tries, 0
        self.reward = task_reward(example)

    def reset(self) -> str:
        return self.example["prompt"]

    def step(self, text: str) -> tuple[str, float, bool]:
        self.answers += 1
        if self.reward(text, self.example) > 0:
            return "", 1.0, True
        return "wrong, try again", 0.0, self.answers >= self.tries


def retry(example: dict) -> Retry:
    """--env=jaxrl_scale.data.envs:retry"""
    return Retry(example)


def calc(example: dict) -> Calc:
    """--env=jaxrl_scale.data.envs:calc"""
    return Calc(example)


__all__ = ["Calc", "Retry", "TRIES", "calc", "retry"]
