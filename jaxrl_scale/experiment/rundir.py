"""The run directory: made and proven writable before anything expensive, held by one
training at a time, and marked finished (DONE.json) or failed (ERROR.txt).

Both checks run before data, model or compile, so a bad --run_dir costs a second, not the
minute a compile takes. A run directory is shared by every process of a multi-process run;
the lock is taken by process 0 only (the others write their checkpoint shards under it).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
from typing import TYPE_CHECKING, Any

from jaxrl_scale.experiment.errors import ConfigError

if TYPE_CHECKING:
    from jaxrl_scale.experiment.config import TrainConfig

LOCK_FILE = "LOCK"   # holds "pid host" of the training that owns the directory
DONE_FILE = "DONE.json"   # a finished run's final counters

# realpath -> (open lock file, how many holders in this process): a command (jaxrl-train)
# takes the lock before the warm-start, run_training takes it again; both in one process.
_held: dict[str, list] = {}


def prepare_run_dir(run_dir: str, field: str = "run_dir") -> str:
    """Create `run_dir` (and its parents) and prove it writable with a probe file; returns
    its absolute path. ConfigError(field, ...) when it cannot be created or written (a
    parent that is a file, no permission, a read-only filesystem, a full disk)."""
    path = os.path.abspath(os.path.expanduser(run_dir))
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".write_test.{socket.gethostname()}.{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        os.remove(probe)
    except OSError as e:
        raise ConfigError(field, f"cannot write in {path} ({_reason(e)})",
                          _fix_for(e, field)) from e
    return path


def _reason(e: OSError) -> str:
    return f"{e.strerror or type(e).__name__}" + (f": {e.filename}" if e.filename else "")


def _fix_for(e: OSError, field: str) -> str:
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"free space on that filesystem, or choose a --{field} on another one"
    if e.errno in (errno.ENOTDIR, errno.EEXIST):
        return f"a part of that path is a file: choose a --{field} whose parents are directories"
    if e.errno == errno.EROFS:
        return f"the filesystem is read-only: choose a --{field} on a writable one"
    if e.errno == errno.ELOOP:
        return f"a symbolic link in that path loops: choose a --{field} without it"
    return f"choose a --{field} you can write to (or fix the directory's permissions)"


class RunDirLock:
    """An exclusive flock on <run_dir>/LOCK for as long as it is held. The OS releases it
    when the holding process dies (even by SIGKILL), so a crashed run never blocks its
    resume. Reentrant within a process; a second process gets a ConfigError naming the
    holder's pid."""

    def __init__(self, run_dir: str):
        self.run_dir = os.path.realpath(os.path.expanduser(run_dir))
        self.path = os.path.join(self.run_dir, LOCK_FILE)
        self._mine = False

    def acquire(self) -> "RunDirLock":
        if self._mine:
            return self
        held = _held.get(self.run_dir)
        if held is not None:
            held[1] += 1
        else:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise ConfigError(
                    "run_dir", f"{self.run_dir} is in use by another training ({holder} holds "
                    f"{self.path})", "wait until that run finishes or stop it, or use another "
                    "--run_dir; two trainings in one directory would interleave their "
                    "records") from None
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            _held[self.run_dir] = [fd, 1]
        self._mine = True
        return self

    def release(self) -> None:
        if not self._mine:
            return
        self._mine = False
        held = _held[self.run_dir]
        held[1] -= 1
        if held[1] == 0:
            del _held[self.run_dir]
            # the file stays: deleting it would let a third process lock a new inode while a
            # second one still waits on the old
            fcntl.flock(held[0], fcntl.LOCK_UN)
            os.close(held[0])

    def __enter__(self) -> "RunDirLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _read_holder(fd: int) -> str:
    """'process <pid> on <host>' from the lock file ('another process' if not yet written)."""
    try:
        pid, host = os.pread(fd, 200, 0).decode().split()
        return f"process {int(pid)} on {host}"
    except (OSError, ValueError, UnicodeDecodeError):
        return "another process"


def is_finished(run_dir: str) -> bool:
    return os.path.exists(os.path.join(run_dir, DONE_FILE))


def done_counters(run_dir: str) -> dict[str, Any] | None:
    """The final counters a finished run wrote to DONE.json; None when it has none that read
    (then the run is finished again from its last checkpoint, which rewrites the file)."""
    try:
        with open(os.path.join(run_dir, DONE_FILE)) as f:
            done = json.load(f)
    except (OSError, ValueError):
        return None
    return done if isinstance(done, dict) and "step" in done else None


def write_error(run_dir: str, text: str) -> None:
    """<run_dir>/ERROR.txt: why the run (or a step of the sweep) failed, its traceback."""
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "ERROR.txt"), "w") as f:
        f.write(text)


def claim_run_dir(cfg: TrainConfig):
    """Create the run directory, prove it writable and lock it for this process (a context
    manager; process 0 locks, the others only check). ConfigError("run_dir", ...) when it
    cannot be written or another training holds it; cheap, so it runs before data, model and
    compile (and before a warm-start)."""
    from jaxrl_scale import distributed as dist
    prepare_run_dir(cfg.run_dir)
    return RunDirLock(cfg.run_dir) if dist.is_primary() else contextlib.nullcontext()
