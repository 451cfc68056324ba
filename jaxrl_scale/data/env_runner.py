"""Where a multi-turn episode's environment lives (`--env_isolation`; rl/multiturn.py;
docs/usage.md, Multi-turn environments): on a daemon thread of this process ("thread") or in a
worker process of its own ("process"), which is killed when a call outlives the episode's time.

    hosts = make_hosts("process", factory, max_chars=8192)
    hs = hosts.open(len(examples))                             # one host per episode
    replies = hosts.call(hs, [("reset", ex) for ex in examples], budgets_s)
    replies = hosts.call(hs, [("step", text) ...], budgets_s)  # side by side, each to its budget
    hosts.close(hs)                                             # ends (and reaps) them

A call goes to every episode at once and is waited on until each episode's own budget (what is
left of its `env_timeout_s`) has passed, so B environments answering in 0.1 s cost about 0.1 s
per turn, not B x 0.1 s. A `Reply` carries the value, the seconds of the call itself (timed
where it ran), or what went wrong: an exception, a timeout (the thread is abandoned, the
process killed), or a process that died (segfault, os._exit, the OOM killer).

Worker processes are forked by multiprocessing's fork server, a clean Python started once per
run (never a fork of this JAX process) that has imported this module, the built-in
environments and the factory's module, so a new episode costs a fork, not an interpreter start
and an import (measured in docs/usage.md, Multi-turn environments). Their preparation data
leaves `__main__` alone: a child never re-runs the parent's main script (jaxrl-train's imports
JAX, seconds per child). A worker exits when its episode ends, or on its own when the runner's
end of its pipe closes (the runner died), even in the middle of a stuck call. Each worker leads
a process group of its own, so a kill also ends whatever its environment started.
"""
from __future__ import annotations

import dataclasses
import io
import multiprocessing
import os
import pickle
import select
import signal
import threading
import time
from concurrent.futures import TimeoutError as _FutureTimeout
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, reduction, spawn, util
from multiprocessing.connection import wait as _wait
from typing import Any, Callable, Optional, Sequence

from jaxrl_scale.data.reward_runner import _ThreadWorker, serve_calls

ISOLATIONS = ("thread", "process")
STARTUP_S = 60.0   # a worker process not up within this ends its episode (not a timeout)
CLOSE_S = 2.0      # what a worker gets to exit after its episode ends, before it is killed
_BUILTIN = "jaxrl_scale.data.envs"


@dataclasses.dataclass
class Reply:
    """One call's outcome: `value` (reset's message, step's result with an observation over
    max_chars cut to max_chars + 1 characters: `chars` is its real length) and `seconds` of
    the call itself; or `error` (and `timeout`). tool_calls: the environment's, if an int."""
    value: Any = None
    seconds: float = 0.0
    chars: int = 0
    tool_calls: Optional[int] = None
    error: Optional[str] = None
    timeout: bool = False


class _Env:
    """One episode's environment, on whichever side it lives."""

    def __init__(self, factory: Callable[[dict], Any], max_chars: int):
        self.factory, self.max_chars, self.env = factory, max_chars, None

    def __call__(self, op: str, arg: Any) -> tuple:
        t0 = time.perf_counter()
        chars = 0
        if op == "reset":
            self.env = self.factory(arg)
            v = self.env.reset()
        else:
            v = self.env.step(arg)
            if isinstance(v, (tuple, list)) and len(v) == 3 and isinstance(v[0], str) and \
                    len(v[0]) > self.max_chars:   # never pickle or tokenize a runaway text
                chars, v = len(v[0]), (v[0][:self.max_chars + 1], v[1], v[2])
        dt = time.perf_counter() - t0
        try:
            calls = getattr(self.env, "tool_calls", None)
        except Exception:  # noqa: BLE001 - a property that raises counts as none
            calls = None
        return v, dt, chars, calls if isinstance(calls, int) else None


def _reply(out: tuple) -> Reply:
    v, dt, chars, calls = out
    return Reply(value=v, seconds=dt, chars=chars or (len(v[0]) if _is_step(v) else 0),
                 tool_calls=calls)


def _is_step(v: Any) -> bool:
    return isinstance(v, (tuple, list)) and len(v) == 3 and isinstance(v[0], str)


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


# -- threads ---------------------------------------------------------------------------------


class ThreadHosts:
    """Each episode's environment on a daemon thread of its own; a call that outlives its
    budget is abandoned (the thread exits once the call returns, if it ever does)."""

    isolation = "thread"

    def __init__(self, factory: Callable[[dict], Any], max_chars: int):
        self.factory, self.max_chars = factory, max_chars

    def open(self, n: int) -> list:
        return [(_ThreadWorker(), _Env(self.factory, self.max_chars)) for _ in range(n)]

    def call(self, hosts: Sequence, ops: Sequence[tuple], budgets: Sequence[float]) -> list:
        t0 = time.perf_counter()
        futs = [w.submit(env, *op) for (w, env), op in zip(hosts, ops)]
        out = []
        for fut, budget in zip(futs, budgets):
            try:
                e = fut.exception(timeout=max(t0 + budget - time.perf_counter(), 0.0))
            except _FutureTimeout:
                out.append(Reply(timeout=True, error="timeout"))
                continue
            out.append(_reply(fut.result()) if e is None else Reply(error=_error(e)))
        return out

    def close(self, hosts: Sequence) -> None:
        for w, _ in hosts:
            w.abandon()


# -- processes -------------------------------------------------------------------------------


def _watch(fd: int) -> None:
    """End the worker's process group (it, and what its environment started) once the
    runner's end of its pipe is gone (the runner died)."""
    p = select.poll()
    p.register(fd, 0)   # POLLHUP/POLLERR are always reported
    while True:
        for _, ev in p.poll():
            if ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                try:
                    if os.getpgrp() == os.getpid():   # never the runner's own group
                        os.killpg(0, signal.SIGKILL)
                finally:
                    os._exit(0)


def _worker_main(conn, factory_bytes: bytes, max_chars: int) -> None:
    """A worker process: load the factory, say "ready", then serve reset/step calls until
    told to stop (None) or the pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)   # ^C is the runner's to handle
    try:   # a group of its own: a kill also ends what the environment started
        os.setpgid(0, 0)
    except OSError:
        pass
    threading.Thread(target=_watch, args=(conn.fileno(),), daemon=True).start()
    try:
        env = _Env(pickle.loads(factory_bytes), max_chars)
    except BaseException as e:  # noqa: BLE001 - sent back to the runner
        conn.send(("error", f"cannot load the factory in the worker process: {_error(e)}"))
        return
    conn.send(("ready", None))
    serve_calls(conn, lambda msg: env(*msg))


class _Popen(popen_forkserver.Popen):
    """popen_forkserver.Popen whose preparation data leaves `__main__` alone: the stock one
    has every child re-run the parent's main script (jaxrl-train's imports JAX)."""

    def _launch(self, process_obj):   # popen_forkserver.Popen._launch, less __main__
        prep = spawn.get_preparation_data(process_obj._name)
        prep.pop("init_main_from_name", None)
        prep.pop("init_main_from_path", None)
        buf = io.BytesIO()
        mp_context.set_spawning_popen(self)
        try:
            reduction.dump(prep, buf)
            reduction.dump(process_obj, buf)
        finally:
            mp_context.set_spawning_popen(None)
        self.sentinel, w = forkserver.connect_to_new_process(self._fds)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = forkserver.read_signed(self.sentinel)


class _Process(mp_context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj):
        return _Popen(process_obj)


@dataclasses.dataclass
class _Proc:
    proc: Any = None
    conn: Any = None
    ready: bool = False
    error: Optional[str] = None


class ProcessHosts:
    """Each episode's environment in a worker process of its own (see the module docstring);
    a call that outlives its budget kills that process alone. `factory` must pickle by name
    (a module-level function or class): ValueError otherwise."""

    isolation = "process"

    def __init__(self, factory: Callable[[dict], Any], max_chars: int):
        mod = getattr(factory, "__module__", None)
        try:
            if mod == "__main__":   # a worker never runs the parent's main script
                raise ValueError("it is defined in __main__")
            self.factory_bytes = pickle.dumps(factory)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"--env_isolation=process needs a factory defined at the top level "
                             f"of an importable module ({_error(e)})") from None
        self.max_chars = max_chars
        self.ctx = multiprocessing.get_context("forkserver")
        # read once, when the server starts; a module it lacks is imported by each child
        self.ctx.set_forkserver_preload([m for m in (__name__, _BUILTIN, mod)
                                         if m and m != "__main__"])

    def open(self, n: int) -> list[_Proc]:
        _fd_room(4 * n)
        out = []
        for _ in range(n):
            h, child = _Proc(), None
            try:
                h.conn, child = self.ctx.Pipe()
                h.proc = _Process(target=_worker_main, daemon=True, name="env-worker",
                                  args=(child, self.factory_bytes, self.max_chars))
                h.proc.start()
            except Exception as e:  # noqa: BLE001 - e.g. out of processes or descriptors
                if h.proc is not None and h.proc.pid is None:   # never started
                    h.proc = None
                self._kill(h)
                h.error = f"cannot start the environment's process ({_error(e)})"
            finally:
                if child is not None:
                    child.close()
            out.append(h)
        return out

    def call(self, hosts: Sequence[_Proc], ops: Sequence[tuple],
             budgets: Sequence[float]) -> list[Reply]:
        t0 = time.monotonic()
        out: list[Optional[Reply]] = [None] * len(hosts)
        deadline: dict[int, float] = {}
        for i, (h, op) in enumerate(zip(hosts, ops)):
            if h.proc is None:
                out[i] = Reply(error=h.error or "the environment's process is gone")
                continue
            try:
                h.conn.send(op)
            except Exception as e:  # noqa: BLE001 - e.g. an unpicklable example, a dead worker
                out[i] = Reply(error=self._died(h) if not h.proc.is_alive() else
                               f"cannot send the call to the environment's process "
                               f"({_error(e)})")
                self._kill(h)
                continue
            deadline[i] = t0 + (budgets[i] if h.ready else STARTUP_S)
        while deadline:
            wait_s = max(min(deadline.values()) - time.monotonic(), 0.0)
            conns = {hosts[i].conn: i for i in deadline}
            for conn in _wait(list(conns), timeout=wait_s):
                i = conns[conn]
                h = hosts[i]
                try:
                    kind, v = conn.recv()
                except (EOFError, OSError):
                    out[i] = Reply(error=self._died(h))
                    del deadline[i]
                    continue
                except Exception as e:  # noqa: BLE001 - e.g. a result this process can't load
                    kind, v = "error", f"cannot read the result ({_error(e)})"
                if kind == "ready":   # the budget starts once the worker is up
                    h.ready, deadline[i] = True, time.monotonic() + budgets[i]
                    continue
                out[i] = _reply(v) if kind == "ok" else Reply(error=v)
                del deadline[i]
            now = time.monotonic()
            for i in [i for i, d in deadline.items() if now >= d]:
                del deadline[i]
                h = hosts[i]
                out[i] = Reply(timeout=h.ready, error="timeout" if h.ready else
                               f"the environment's process was not up in {STARTUP_S:g} s")
                self._kill(h)
        return out

    def _died(self, h: _Proc) -> str:
        try:   # what its environment started goes with it
            os.killpg(h.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        h.proc.join(CLOSE_S)
        code = h.proc.exitcode
        self._kill(h)
        return f"the environment's process died (exit code {code})"

    @staticmethod
    def _kill(h: _Proc) -> None:
        """SIGKILL the worker's process group (it, and what its environment started), then
        reap it. The group is the worker's while the worker is not reaped."""
        if h.proc is not None and h.proc.is_alive():
            try:
                os.killpg(h.proc.pid, signal.SIGKILL)
            except OSError:   # not its group yet (still starting), or gone
                h.proc.kill()
        ProcessHosts._end(h)

    @staticmethod
    def _end(h: _Proc) -> None:
        """Reap the (exited or killed) process and close its pipe."""
        if h.proc is not None:
            h.proc.join(CLOSE_S)
            if h.proc.is_alive():   # not even SIGKILL ended it in time: leave it to exit
                h.error = "not reaped"
            else:
                h.proc.close()
            h.proc = None
        if h.conn is not None:
            h.conn.close()
            h.conn = None

    def close(self, hosts: Sequence[_Proc]) -> None:
        """Tell every live worker to stop, wait up to CLOSE_S for them all, kill the rest;
        every process is reaped."""
        live = [h for h in hosts if h.proc is not None]
        for h in live:
            try:
                h.conn.send(None)
            except Exception:  # noqa: BLE001 - already gone
                pass
        end = time.monotonic() + CLOSE_S
        pending = {h.proc.sentinel: h for h in live}
        while pending and time.monotonic() < end:
            for s in _wait(list(pending), timeout=max(end - time.monotonic(), 0.0)):
                self._end(pending.pop(s))
        for h in pending.values():
            self._kill(h)


def _fd_room(n: int) -> None:
    """Raise the soft limit on open files (toward the hard one) so n more fit."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = len(os.listdir("/proc/self/fd")) + n + 64 if os.path.isdir("/proc/self/fd") \
            else n + 1024
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (
                want if hard == resource.RLIM_INFINITY else min(want, hard), hard))
    except (ImportError, OSError, ValueError):
        pass


def make_hosts(isolation: str, factory: Callable[[dict], Any], max_chars: int):
    """ThreadHosts or ProcessHosts (ValueError for another isolation, or a factory a worker
    process cannot load)."""
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    return (ThreadHosts if isolation == "thread" else ProcessHosts)(factory, max_chars)


__all__ = ["ISOLATIONS", "ProcessHosts", "Reply", "ThreadHosts", "make_hosts"]
