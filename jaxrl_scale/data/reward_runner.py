"""`RewardFn`: runs a reward function over a batch and never lets a reward crash a run. A call
that raises, returns something that is not a finite real number, or outlives its timeout
scores 0 and is counted (failures, timeouts).

    reward = RewardFn(fn, timeout_s=10.0, isolation="process")
    rewards_N = reward.score_batch(responses, examples)  # float32 [N]; exceptions/timeouts -> 0

The reward functions themselves, and the one of each task, are data/rewards.py.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import math
import multiprocessing
import multiprocessing.connection
import numbers
import queue
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

__all__ = ["MAX_ABS_REWARD", "RewardFn", "reward_problem"]

log = logging.getLogger(__name__)


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
    serve_calls(conn, lambda msg: msg[0](*msg[1]))


def serve_calls(conn: multiprocessing.connection.Connection, call: Callable[[Any], Any]) -> None:
    """A worker process's loop: answer each message with ("ok", call(msg)) or ("error",
    "Type: message") until told to stop (None) or the pipe closes."""
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        try:
            out = ("ok", call(msg))
        except BaseException as e:  # noqa: BLE001 - sent back to the parent
            out = ("error", f"{type(e).__name__}: {e}")
        try:
            conn.send(out)
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable result
            conn.send(("error", f"cannot send the result back: {type(e).__name__}: {e}"))


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
        self.seconds, self._lap_start = 0.0, 0.0   # wall time in score_batch (reward_s)
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
        return self.score_counted(responses, examples)[0]

    def score_counted(
        self, responses: Sequence[str], examples: Sequence[dict[str, Any]]
    ) -> tuple[np.ndarray, int]:
        """(score_batch's rewards, the failures of this call). Calls from several threads
        (rl/scoring.py's worker, an eval on the main thread) run one at a time, so each
        call's failures and `seconds` are its own and the workers are never shared."""
        n, p = len(responses), len(examples)
        if p == 0 or n % p:
            raise ValueError(
                f"score_batch: {n} responses do not match {p} examples (need N == P or N == P*G)"
            )
        group = n // p
        pairs = [(responses[i], examples[i // group]) for i in range(n)]
        with self._lock:
            t0, before = time.perf_counter(), self.failures
            self.calls += n
            if self.timeout_s is None:
                out = [self._inline(r, e) for r, e in pairs]
            elif self.isolation == "thread":
                out = [self._threaded(r, e) for r, e in pairs]
            else:
                out = self._in_processes(pairs)
            self.seconds += time.perf_counter() - t0
            failed = self.failures - before
        return np.asarray(out, dtype=np.float32), failed

    def lap(self) -> float:
        """Seconds in score_batch since the last lap (or the start); a call counts in the lap
        it ends in. Takes no lock: a lap never waits for a call under way on another
        thread."""
        now = self.seconds   # read once: a worker may add to it meanwhile
        dt, self._lap_start = now - self._lap_start, now
        return dt

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
