"""Ctrl-C as a request to stop at the next clean point, not an exception at a random one.

Python's default SIGINT handler raises KeyboardInterrupt at whatever bytecode runs next: in
the middle of a metrics write, between an update and its checkpoint, or (the crash of issue
29) while XLA compiles. A compile runs in C++ on XLA's thread pool; the exception unwinds the
main thread and starts interpreter shutdown while those threads still run, and the process
dies with SIGSEGV instead of exiting. `deferred_sigint` replaces the handler by one that only
records the request: the compile finishes, the training loop polls `requested()` between
steps, saves, and raises `Interrupted`, which the commands turn into one line and exit 130.
A second Ctrl-C means "now": the process exits 130 at once, through os._exit, so no Python
teardown races XLA's threads either (a resume repairs whatever that leaves half-written).

The library installs nothing: without `deferred_sigint` (a notebook, a user's own script)
`requested()` stays False and Ctrl-C raises KeyboardInterrupt as usual.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading

EXIT_CODE = 130          # 128 + SIGINT, what shells report for a process stopped by Ctrl-C

_requested = threading.Event()


class Interrupted(KeyboardInterrupt):
    """The run stopped at a clean point after Ctrl-C; str() says what was kept and how to go
    on. A KeyboardInterrupt, so `except Exception` (the sweep's per-run guard) lets it
    through and the whole command stops."""


def requested() -> bool:
    """Whether Ctrl-C was pressed inside `deferred_sigint` (and not yet handled)."""
    return _requested.is_set()


def _handler(signum, frame) -> None:
    if _requested.is_set():
        os.write(2, b"\ninterrupted again: stopping now, without finishing the step; rerun "
                    b"the same command to resume from the last checkpoint\n")
        os._exit(EXIT_CODE)
    _requested.set()
    # os.write, not print: the handler may run while the main thread is inside print()
    os.write(2, b"\ninterrupt: finishing the current step, then stopping (Ctrl-C again to "
                b"stop at once)\n")


@contextlib.contextmanager
def deferred_sigint():
    """Within the block the first SIGINT only sets `requested()`; the second exits 130 at
    once. Outside the main thread (where signal handlers cannot be set), or where SIGINT is
    ignored (a background job of a shell script, nohup), it does nothing."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGINT, _handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        _requested.clear()
