"""Built-in tools for multi-turn episodes (`--env`, rl/multiturn.py; docs/usage.md, Built-in
tool and retry tasks).

`Calc`: the task's prompt; an assistant turn that is a call `calc(EXPR)` gets EXPR's value as
the observation (reward 0, the episode goes on), a malformed call an error observation, each
ending in a newline (see calc_observation); the
first turn that is not a call is the final answer, scored by the task's own reward and ending
the episode. EXPR is parsed by data/expr.py (integers, + - * and parentheses), never eval'ed,
so a call can compute nothing but arithmetic. `tool_calls` counts the calls (well-formed or
not): rl/multiturn.py reports its mean as env_tool_calls.

`task_reward(example)`: the reward of the built-in task an example row comes from, read off
its fields (an environment is given the row, not the task's name): arith_chain rows carry
"num_ops", countdown rows "numbers"; any other row is scored by exact match.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from jaxrl_scale.data.expr import MAX_EXPR_CHARS, ExprError, evaluate
from jaxrl_scale.data.rewards import (chain_final_answer, countdown_reward, exact_match,
                                      final_line)

__all__ = ["CALL_ERROR", "Calc", "DEMO_FORMAT", "EXPR_ERROR", "MAX_VALUE_CHARS", "VALUE_ERROR",
           "calc_call", "calc_demo", "calc_observation", "calc_value", "task_reward"]

# Fixed texts, short and ASCII: an observation takes tokens of the episode's budget, and any
# tokenizer (the character one included) must encode it. The model's own text is never
# echoed back (it could be long, or hold what the tokenizer refuses).
CALL_ERROR = "error: not calc(EXPR)"
EXPR_ERROR = "error: bad EXPR"
# A value is answered only up to this many characters: 256 characters of products reach
# hundreds of digits, an observation over --env_max_obs_tokens would fail the episode.
MAX_VALUE_CHARS, VALUE_ERROR = 24, "error: too big"
_CALL = re.compile(r"calc\((.*)\)")
# Part of the SFT cache key of a warm-start with tool demonstrations (experiment/sft.py): bump
# it when a text above or the observation's layout changes, or such a cached warm-start would
# be reused with the old format.
DEMO_FORMAT = 1


def task_reward(example: dict[str, Any]) -> Callable[[str, dict[str, Any]], float]:
    """The reward function of the task that wrote `example` (see the module docstring)."""
    if "num_ops" in example:
        return chain_final_answer
    if "numbers" in example:
        return countdown_reward
    return exact_match


def calc_call(text: str) -> str | None:
    """The call the turn `text` makes: its first line (data/rewards.final_line) when that
    starts with "calc", else None (a final answer)."""
    line = final_line(text)
    return line if line.startswith("calc") else None


def calc_value(call: str) -> str:
    """The value of `calc(EXPR)` as text, or an error text; never raises."""
    m = _CALL.fullmatch(call)
    if m is None:
        return CALL_ERROR
    if len(m.group(1)) > MAX_EXPR_CHARS:   # evaluate refuses it too; said here for clarity
        return EXPR_ERROR
    try:
        value, _ = evaluate(m.group(1))
    except (ExprError, RecursionError):   # deep nesting under the length cap
        return EXPR_ERROR
    text = str(value)
    return text if len(text) <= MAX_VALUE_CHARS else VALUE_ERROR


def calc_observation(call: str) -> str:
    """calc_value and a newline. Without a chat template an observation's tokens follow the
    call's EOS directly and the answer's follow the observation's: the newline is where the
    value ends (the answer that follows is a number too, so nothing else marks it)."""
    return calc_value(call) + "\n"


class Calc:
    """One episode of the calculator on `example` (see the module docstring)."""

    def __init__(self, example: dict[str, Any]):
        self.example, self.tool_calls = example, 0
        self.reward = task_reward(example)

    def reset(self) -> str:
        return self.example["prompt"]

    def step(self, text: str) -> tuple[str, float, bool]:
        call = calc_call(text)
        if call is None:
            return "", float(self.reward(text, self.example)), True
        self.tool_calls += 1
        return calc_observation(call), 0.0, False


def calc_demo(example: dict[str, Any]) -> list[tuple[str, str]]:
    """A tool-using solution of an arithmetic or arith_chain row, as (role, text) turns: the
    call on the prompt's expression, the observation `Calc` answers it with, the final answer.
    The SFT warm-start imitates it (experiment/sft.py, tool_demos)."""
    expr = example["prompt"].strip().removesuffix("=").strip()
    call = f"calc({expr})"
    return [("assistant", call), ("observation", calc_observation(call)),
            ("assistant", str(example["answer"]).strip())]
