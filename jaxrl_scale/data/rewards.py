"""Verifiable rewards, and `RewardFn`, which scores a batch and never lets a reward crash a run.

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
import concurrent.futures
import functools
import importlib
import importlib.util
import inspect
import logging
import math
import multiprocessing
import multiprocessing.connection
import numbers
import os
import queue
import re
import site
import sys
import sysconfig
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_scale.data.expr import ExprError, evaluate

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

log = logging.getLogger(__name__)

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


# ---------------------------------------------------------------------------------------------
# Timeouts: a daemon thread (works from any thread; a stuck call is abandoned, not killed) or a
# worker process (killed on timeout).


class _ThreadWorker:
    def __init__(self) -> None:
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="reward-worker")
        self._thread.start()

    def _loop(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - reported through the future
                fut.set_exception(e)

    def submit(self, fn: Callable, *args: Any) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._q.put((fut, fn, args))
        return fut

    def abandon(self) -> None:
        """Let the thread exit once its current (stuck) call returns, if it ever does."""
        self._q.put(None)


def _process_main(conn: multiprocessing.connection.Connection, warmup: Callable | None) -> None:
    try:
        if warmup is not None:
            warmup()
        conn.send(("ready", None))
    except BaseException as e:  # noqa: BLE001
        conn.send(("error", f"warm-up failed: {type(e).__name__}: {e}"))
        return
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        fn, args = msg
        try:
            out = ("ok", fn(*args))
        except BaseException as e:  # noqa: BLE001 - sent back to the parent
            out = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send(("error", f"cannot send the result back: {e}"))


class _ProcessWorker:
    def __init__(self, warmup: Callable | None, startup_timeout_s: float) -> None:
        ctx = multiprocessing.get_context("spawn")  # fork is unsafe once JAX threads exist
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_process_main, args=(child, warmup), daemon=True)
        self.proc.start()
        child.close()
        self.startup_timeout_s = startup_timeout_s
        self.ready = False

    def wait_ready(self) -> None:
        """Block until the worker has imported and warmed up (raises RuntimeError if it fails)."""
        if self.ready:
            return
        try:
            if not self.conn.poll(self.startup_timeout_s):
                raise RuntimeError(f"not ready after {self.startup_timeout_s} s")
            kind, msg = self.conn.recv()
        except (EOFError, OSError) as e:
            kind, msg = "error", f"exited during start-up ({type(e).__name__})"
        except RuntimeError as e:
            kind, msg = "error", str(e)
        if kind != "ready":
            self.kill()
            raise RuntimeError(f"reward worker process failed to start: {msg}")
        self.ready = True

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(5)
        self.conn.close()


# ---------------------------------------------------------------------------------------------


# Rewards are stored as float32 (score_batch), so a reward is a real number float32 can hold:
# beyond MAX_ABS_REWARD it would become inf on the cast, and the advantages (rl/losses.py,
# which rescale each group by a power of two) handle every finite float32 scale. A smaller cap
# (1e6, say) would be a guess about the user's scale, not a property of the arithmetic.
MAX_ABS_REWARD = float(np.finfo(np.float32).max)


def reward_problem(v: Any) -> str | None:
    """Why `v` is not a reward (None if it is one): a reward is a bool or a real number
    (int, float, numpy scalar, Fraction) with |v| <= MAX_ABS_REWARD. Strings are refused even
    when they read as numbers ("1.0"): a reward function that returns text has a bug."""
    if not isinstance(v, (bool, np.bool_, numbers.Real)):
        return f"returned {type(v).__name__} {v!r:.40}, not a real number"
    try:
        f = float(v)
    except (OverflowError, ValueError, TypeError) as e:   # e.g. int(10**400)
        return f"returned {v!r:.40}, not representable as a float ({e})"
    if not math.isfinite(f):
        return f"returned a non-finite value {f}"
    if abs(f) > MAX_ABS_REWARD:
        return f"returned {f:g}, beyond the float32 range (|reward| <= {MAX_ABS_REWARD:.4g})"
    return None


class RewardFn:
    """Scores responses with `fn(response, example) -> float`; never raises for a bad response.

    An exception, a value that is not a finite real number (`reward_problem`: a string such
    as "1.0", None, NaN, inf, |r| beyond float32), or a call longer than `timeout_s` gives
    reward 0 and increments `failures` (and `timeouts`). `isolation`: "thread" runs each call on a daemon
    worker thread (works off the main thread; a call that times out is abandoned, so it may
    keep a CPU busy), "process" runs calls on `num_workers` spawned processes that are killed
    on timeout (`fn` must be picklable: a module-level function). Without `timeout_s` calls run
    inline.
    """

    def __init__(
        self,
        fn: Callable[[str, dict[str, Any]], float],
        *,
        name: str | None = None,
        timeout_s: float | None = None,
        isolation: str = "thread",
        num_workers: int = 1,
        warmup: Callable[[], Any] | None = None,
        startup_timeout_s: float = 300.0,
    ) -> None:
        if isolation not in ("thread", "process"):
            raise ValueError(f"isolation must be 'thread' or 'process', got {isolation!r}")
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be positive or None, got {timeout_s}")
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self.fn = fn
        self.name = name or getattr(fn, "__name__", "reward")
        self.timeout_s = timeout_s
        self.isolation = isolation
        self.num_workers = num_workers
        self.warmup = warmup
        self.startup_timeout_s = startup_timeout_s
        self.calls = 0
        self.failures = 0
        self.timeouts = 0
        self.last_error: str | None = None
        self._thread_worker: _ThreadWorker | None = None
        self._procs: list[_ProcessWorker | None] = [None] * num_workers
        self._lock = threading.Lock()

    # -- bookkeeping ---------------------------------------------------------------------------

    def _fail(self, msg: str, *, timeout: bool = False) -> float:
        self.failures += 1
        if timeout:
            self.timeouts += 1
        self.last_error = msg
        if self.failures <= 5:
            log.warning("reward %s failed (reward 0): %s", self.name, msg)
        return 0.0

    def _value(self, v: Any) -> float:
        problem = reward_problem(v)
        if problem is not None:
            return self._fail(problem)
        return float(v)

    def metrics(self) -> dict[str, int]:
        return {"calls": self.calls, "failures": self.failures, "timeouts": self.timeouts}

    # -- scoring -------------------------------------------------------------------------------

    def __call__(self, response: str, example: dict[str, Any]) -> float:
        return float(self.score_batch([response], [example])[0])

    def score_batch(
        self, responses: Sequence[str], examples: Sequence[dict[str, Any]]
    ) -> np.ndarray:
        """float32 [N] rewards. `examples` has N entries, or P entries with N = P*G responses in
        prompt-major order (responses i*G .. i*G+G-1 answer examples[i])."""
        n, p = len(responses), len(examples)
        if p == 0 or n % p:
            raise ValueError(
                f"score_batch: {n} responses do not match {p} examples (need N == P or N == P*G)"
            )
        group = n // p
        pairs = [(responses[i], examples[i // group]) for i in range(n)]
        with self._lock:
            self.calls += n
            if self.timeout_s is None:
                out = [self._inline(r, e) for r, e in pairs]
            elif self.isolation == "thread":
                out = [self._threaded(r, e) for r, e in pairs]
            else:
                out = self._in_processes(pairs)
        return np.asarray(out, dtype=np.float32)

    def _inline(self, response: str, example: dict[str, Any]) -> float:
        try:
            return self._value(self.fn(response, example))
        except Exception as e:  # noqa: BLE001 - a reward never crashes the run
            return self._fail(f"{type(e).__name__}: {e}")

    def _threaded(self, response: str, example: dict[str, Any]) -> float:
        if self._thread_worker is None:
            self._thread_worker = _ThreadWorker()
        fut = self._thread_worker.submit(self.fn, response, example)
        try:
            v = fut.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            self._thread_worker.abandon()
            self._thread_worker = None
            return self._fail(f"timed out after {self.timeout_s} s", timeout=True)
        except Exception as e:  # noqa: BLE001
            return self._fail(f"{type(e).__name__}: {e}")
        return self._value(v)

    def _worker(self, k: int) -> _ProcessWorker:
        w = self._procs[k]
        if w is None or not w.proc.is_alive():
            if w is not None:
                self._kill(k)
            w = self._procs[k] = _ProcessWorker(self.warmup, self.startup_timeout_s)
        w.wait_ready()
        return w

    def _in_processes(self, pairs: list[tuple[str, dict[str, Any]]]) -> list[float]:
        out: list[float] = [0.0] * len(pairs)
        todo = collections.deque(range(len(pairs)))
        busy: dict[int, tuple[int, float]] = {}  # worker -> (item, deadline)
        for k in range(min(self.num_workers, len(pairs))):  # start them side by side
            w = self._procs[k]
            if w is None or not w.proc.is_alive():
                self._kill(k)
                self._procs[k] = _ProcessWorker(self.warmup, self.startup_timeout_s)
        while todo or busy:
            for k in range(self.num_workers):
                if k in busy or not todo:
                    continue
                try:
                    w = self._worker(k)
                except Exception as e:  # noqa: BLE001 - no worker: every waiting item fails
                    while todo:
                        out[todo.popleft()] = self._fail(f"{type(e).__name__}: {e}")
                    break
                i = todo.popleft()
                try:
                    w.conn.send((self.fn, pairs[i]))
                except Exception as e:  # noqa: BLE001 - e.g. an unpicklable example
                    self._kill(k)
                    out[i] = self._fail(f"{type(e).__name__}: {e}")
                    continue
                busy[k] = (i, time.monotonic() + self.timeout_s)
            if not busy:
                continue
            wait_s = max(0.0, min(d for _, d in busy.values()) - time.monotonic())
            conns = {self._procs[k].conn: k for k in busy}
            ready = multiprocessing.connection.wait(list(conns), timeout=wait_s)
            for conn in ready:
                k = conns[conn]
                i, _ = busy.pop(k)
                try:
                    kind, v = conn.recv()
                except (EOFError, OSError) as e:
                    self._kill(k)
                    out[i] = self._fail(f"worker process died: {type(e).__name__}")
                    continue
                out[i] = self._value(v) if kind == "ok" else self._fail(str(v))
            now = time.monotonic()
            for k, (i, deadline) in list(busy.items()):
                if now >= deadline:
                    busy.pop(k)
                    self._kill(k)
                    out[i] = self._fail(f"timed out after {self.timeout_s} s", timeout=True)
        return out

    def _kill(self, k: int) -> None:
        w = self._procs[k]
        self._procs[k] = None
        if w is not None:
            w.kill()

    def close(self) -> None:
        """Stop worker processes/threads (they are daemons, so exit also ends them)."""
        for k in range(self.num_workers):
            self._kill(k)
        if self._thread_worker is not None:
            self._thread_worker.abandon()
            self._thread_worker = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __repr__(self) -> str:
        return (
            f"RewardFn({self.name}, timeout_s={self.timeout_s}, isolation={self.isolation!r}, "
            f"calls={self.calls}, failures={self.failures}, timeouts={self.timeouts})"
        )


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
    if spec not in _OWN_REWARDS:
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.append(os.getcwd())   # last: the cwd never shadows an installed module
        _check_user_module(module_name, spec)
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - the user's module: any import error is theirs
        raise ValueError(f"cannot import {module_name!r} ({type(e).__name__}: {e})") from None
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
