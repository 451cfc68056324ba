"""Verifiable rewards, and the `RewardFn` (data/reward_runner.py: timeouts, failures counted) of
each task.

A reward function is `fn(response: str, example: dict) -> float` (example as from load_task).
    exact_match          arithmetic: text before EOS / first newline, stripped, == answer
    chain_final_answer   arith_chain: on that line, the text after the last "=" (all of it
                         without one), stripped, == answer; the shown work is not checked
    countdown_reward     countdown: a + - * ( ) expression over the given numbers (each at most
                         once) equal to the target; parsed, never eval'ed
    math_verify_reward   GSM8K/MATH: math-verify's parse + verify of the response vs the answer

    reward = reward_for_task("arithmetic")
    rewards_N = reward.score_batch(responses, examples)  # float32 [N]; exceptions/timeouts -> 0
"""
from __future__ import annotations

import collections
import functools
import importlib
import importlib.util
import inspect
import logging
import os
import re
import site
import sys
import sysconfig
from typing import Any, Callable, Sequence

from jaxrl_scale.data.expr import ExprError, evaluate
from jaxrl_scale.data.reward_runner import RewardFn

__all__ = [
    "DEFAULT_STOP_STRINGS",
    "RewardFn",
    "chain_final_answer",
    "countdown_reward",
    "cut_at_stop",
    "exact_match",
    "final_line",
    "math_verify_reward",
    "reward_for_task",
    "verify_countdown",
    "REWARDS",
]


# EOS renderings of CharTokenizer and of common HF tokenizers; text after them is not answer.
DEFAULT_STOP_STRINGS: tuple[str, ...] = (
    "<eos>",
    "</s>",
    "<|endoftext|>",
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<end_of_turn>",
)


def cut_at_stop(text: str, stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS) -> str:
    """`text` up to the first stop string."""
    cut = len(text)
    for s in stop_strings:
        i = text.find(s)
        if 0 <= i < cut:
            cut = i
    return text[:cut]


def final_line(text: str, stop_strings: Sequence[str] = DEFAULT_STOP_STRINGS) -> str:
    """Text before the first stop string and the first newline, stripped."""
    return cut_at_stop(text, stop_strings).split("\n", 1)[0].strip()


def exact_match(response: str, example: dict[str, Any]) -> float:
    return float(final_line(response) == str(example["answer"]).strip())


def chain_final_answer(response: str, example: dict[str, Any]) -> float:
    """1 iff the final number of "19-5=14" (after the last "="; the whole line when there is
    none, as for a one-step answer) is the answer. An outcome reward, as in LLM math RL: the
    work before it is neither checked nor required."""
    return float(final_line(response).rsplit("=", 1)[-1].strip() == str(example["answer"]).strip())


# ---------------------------------------------------------------------------------------------
# Countdown.

_COUNTDOWN_PROMPT = re.compile(r"nums\s+([\d\s]+?)\s+target\s+(\d+)")


def verify_countdown(expression: str, numbers: Sequence[int], target: int) -> bool:
    """True iff `expression` (+ - * and parentheses over integer literals, no unary minus)
    equals `target` and uses each of `numbers` at most once (a multiset). An optional trailing
    "=<target>" is accepted."""
    expr = expression.strip()
    if "=" in expr:
        expr, rhs = expr.split("=", 1)
        if rhs.strip() != str(target):
            return False
    try:
        value, used = evaluate(expr)
    except ExprError:
        return False
    available = collections.Counter(int(n) for n in numbers)
    used_count = collections.Counter(used)
    if any(used_count[n] > available[n] for n in used_count):
        return False
    return value == int(target)


def _countdown_numbers(example: dict[str, Any]) -> tuple[list[int], int]:
    if example.get("numbers"):
        return [int(x) for x in str(example["numbers"]).split()], int(example["answer"])
    m = _COUNTDOWN_PROMPT.search(str(example["prompt"]))
    if m is None:
        raise ValueError(f"cannot find 'nums ... target N' in prompt {example['prompt']!r}")
    return [int(x) for x in m.group(1).split()], int(m.group(2))


def countdown_reward(response: str, example: dict[str, Any]) -> float:
    numbers, target = _countdown_numbers(example)
    return float(verify_countdown(final_line(response), numbers, target))


# ---------------------------------------------------------------------------------------------
# math-verify. Its own timeouts use signal.alarm (main thread only), so they are switched off
# here and RewardFn enforces the timeout instead.


class _DropTimeoutDisabledWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "Timeout is disabled" not in str(record.msg)


@functools.lru_cache(maxsize=1)
def _math_verify():
    import math_verify

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabledWarning())
    return math_verify


@functools.lru_cache(maxsize=4096)
def _parse_gold(answer: str):
    mv = _math_verify()
    return mv.parse(f"${answer}$", parsing_timeout=None) or mv.parse(answer, parsing_timeout=None)


def math_verify_reward(response: str, example: dict[str, Any]) -> float:
    """1.0 if math-verify finds the response's final answer equal to example["answer"]
    (e.g. "0.5" == "1/2" == "\\frac{1}{2}"). Runs without a timeout: wrap it in a RewardFn."""
    mv = _math_verify()
    gold = _parse_gold(str(example["answer"]))
    if not gold:
        raise ValueError(f"math-verify cannot parse the reference answer {example['answer']!r}")
    pred = mv.parse(cut_at_stop(response), parsing_timeout=None)
    if not pred:
        return 0.0
    return float(mv.verify(gold, pred, timeout_seconds=None))


def _warm_math_verify() -> None:
    math_verify_reward("1/2", {"answer": "0.5"})


REWARDS: dict[str, Callable[[str, dict[str, Any]], float]] = {
    "arithmetic": exact_match,
    "arith_chain": chain_final_answer,
    "countdown": countdown_reward,
    "math_jsonl": math_verify_reward,
}
# Tasks whose reward needs the answer's own text in the response (exact match), so a response
# must have room for every answer's tokens (experiment/common.check_answer_room). Countdown
# answers with an expression and math-verify accepts equivalent forms ("0.5" for "1/2"):
# their answers' lengths bound nothing.
ANSWER_IN_RESPONSE = frozenset({"arithmetic"})


# Reward functions are named code: `--reward_fn` (and a config.json that holds one) picks a
# function the run calls on the model's text. Only the library's own rewards and functions
# defined in the user's own modules qualify; the standard library (builtins:exec, os:system,
# subprocess:run, pickle:loads, ...) and installed packages (site-packages: a function there
# may read, write or unpickle whatever path the response names) are refused before anything
# is imported, and the function must be a plain Python function defined in such a module.
_OWN_REWARDS = {f"{fn.__module__}:{fn.__name__}" for fn in REWARDS.values()}


def _installed_roots() -> list[str]:
    """Directories of the standard library and of installed packages (site-packages)."""
    paths = sysconfig.get_paths()
    roots = [paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:   # a virtualenv's old site.py
        pass
    return sorted({os.path.realpath(r) for r in roots if r})


def _under(path: str, roots: Sequence[str]) -> bool:
    path = os.path.realpath(path)
    return any(path == r or path.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def _check_user_module(module_name: str, spec: str) -> None:
    """ValueError unless the top-level package of `module_name` is the user's own code: not
    built in, not the standard library, not in site-packages, not jaxrl_scale itself (whose
    only rewards are _OWN_REWARDS). Looked up without importing (an import runs code)."""
    top = module_name.split(".", 1)[0]
    fix_hint = "define score(response, example) in your own module"
    if top in sys.builtin_module_names or top in getattr(sys, "stdlib_module_names", ()):
        raise ValueError(f"{spec!r} names the standard-library module {top!r}; a reward "
                         f"function must be your own code ({fix_hint})")
    if top == "jaxrl_scale":
        raise ValueError(f"{spec!r} is not one of the library's rewards "
                         f"{sorted(_OWN_REWARDS)}")
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError) as e:
        raise ValueError(f"cannot import {top!r} ({type(e).__name__}: {e})") from None
    if found is None:
        raise ValueError(f"cannot import {module_name!r} (no module {top!r} on the working "
                         "directory or PYTHONPATH)")
    where = [found.origin] if found.has_location and found.origin else \
        list(found.submodule_search_locations or [])
    if not where:
        raise ValueError(f"{spec!r} names {top!r}, which has no source file (built in or "
                         f"frozen); a reward function must be your own code ({fix_hint})")
    roots = _installed_roots()
    if any(_under(w, roots) for w in where):
        raise ValueError(f"{spec!r} names {top!r}, installed in {os.path.dirname(where[0])} "
                         "(the standard library or site-packages); reward functions come "
                         f"from your own modules only ({fix_hint}, which may call it)")


def import_user_module(module_name: str, spec: str, own: bool):
    """The module of a user's `spec` ("package.module:name"): found on the working directory
    (added to sys.path last, so it never shadows an installed module, and the installed
    commands find it as `python` would) or PYTHONPATH, after `_check_user_module`'s refusals;
    a module of this library (`own`) as it is. ValueError for one that does not import."""
    if not own:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())
        _check_user_module(module_name, spec)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - the user's module: any import error is theirs
        raise ValueError(f"cannot import {module_name!r} ({type(e).__name__}: {e})") from None


def load_reward_fn(spec: str) -> Callable[[str, dict[str, Any]], float]:
    """The user function named by "package.module:function": `fn(response: str, example:
    dict) -> float`, where `example` is the task row the prompt came from ("prompt",
    "answer", ...). The module is the user's own, found on the working directory (added to
    sys.path here, so the installed commands find it as `python` would) or PYTHONPATH, or a
    reward of this library (e.g. jaxrl_scale.data.rewards:exact_match); see the note above
    _OWN_REWARDS for what is refused. ValueError, naming what is wrong, for a malformed or
    refused spec, a module that does not import or a missing function."""
    module_name, sep, attr = spec.partition(":")
    if not (sep and module_name and attr):
        raise ValueError(f"{spec!r} is not of the form 'package.module:function'")
    if not attr.isidentifier():
        raise ValueError(f"{attr!r} is not a function name (one identifier, no dots)")
    module = import_user_module(module_name, spec, own=spec in _OWN_REWARDS)
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"{module_name!r} has no function {attr!r}")
    if not inspect.isfunction(fn):
        raise ValueError(f"{spec!r} is a {type(fn).__name__}, not a function defined with def "
                         "in your module")
    defined_in = getattr(fn, "__module__", None) or ""
    if spec not in _OWN_REWARDS and f"{defined_in}:{fn.__name__}" not in _OWN_REWARDS and \
            defined_in.split(".", 1)[0] != module_name.split(".", 1)[0]:
        # imported into the module (`from x import f`): the code that runs is x's
        _check_user_module(defined_in, f"{spec} (defined in {defined_in})")
    return fn


def user_reward(spec: str, *, timeout_s: float | None = 10.0) -> RewardFn:
    """A RewardFn over `load_reward_fn(spec)`: each call on a worker thread with `timeout_s`
    (None: inline), exceptions and non-finite values -> reward 0, counted in `failures`."""
    return RewardFn(load_reward_fn(spec), name=spec, timeout_s=timeout_s, isolation="thread")


def reward_for_task(
    name: str,
    *,
    timeout_s: float | None = None,
    isolation: str | None = None,
    num_workers: int = 1,
) -> RewardFn:
    """The RewardFn of task `name`. Arithmetic and countdown run inline (bounded work); math
    runs in a worker process with a 10 s per-response timeout unless told otherwise."""
    if name not in REWARDS:
        raise ValueError(f"no reward for task {name!r}; known: {sorted(REWARDS)}")
    fn = REWARDS[name]
    if name == "math_jsonl":
        return RewardFn(
            fn,
            name=name,
            timeout_s=10.0 if timeout_s is None else timeout_s,
            isolation=isolation or "process",
            num_workers=num_workers,
            warmup=_warm_math_verify,
        )
    return RewardFn(
        fn, name=name, timeout_s=timeout_s, isolation=isolation or "thread", num_workers=num_workers
    )
