"""Orbax checkpoints: a pytree of arrays plus a JSON dict of host-side state (data position...).

What a crash can do to the checkpoint directory, and what this module makes of it:
  - a kill mid-save: orbax writes each step into `<step>.orbax-checkpoint-tmp` and renames it
    when complete, so the previous, finished checkpoint is untouched; the unfinished one is
    invisible to `latest_step` and its temporary directory is removed on the next start.
  - a finished checkpoint that no longer reads (a file truncated or deleted by a disk fault,
    a copy cut short): `restore(None, ...)` warns, moves it aside to `<directory>.corrupt/`
    and resumes from the newest one that does read. If none reads, it raises rather than let
    the caller start over on top of a run's existing metrics.
  - disk full while saving: one `DiskFullError` naming the directory and the fix; the
    partial step is removed and the previous checkpoint stays restorable.
  - a finished checkpoint whose bytes changed (bit flips on disk or in a copy): orbax reads
    them without complaint (flipped exponent bits restore as a silently destroyed model), so
    every save is sealed with the sha256 of each file it wrote, array data included
    (`<step>/sha256.json`, written atomically once the step is complete), and a restore
    checks them first: a mismatch is a corrupt checkpoint, handled as an unreadable one.
    Files, not array values, are hashed: the digest needs no gather of sharded arrays and
    still holds when a run resumes on another mesh or process count.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import json
import os
import shutil
import threading
import time
import warnings
from typing import Any

import jax
import orbax.checkpoint as ocp

from jaxrl_scale import distributed as dist

_TMP_SUFFIX = ".orbax-checkpoint-tmp"
_DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# How tensorstore (orbax's array writer) words the same errors: it raises ValueError, no errno.
_DISK_FULL_TEXT = ("No space left on device", "Disk quota exceeded")


DIGEST_FILE = "sha256.json"   # in each step directory: {"files": {relative path: sha256}}


class CheckpointError(RuntimeError):
    """No checkpoint of a directory that has some can be restored (the run cannot resume)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint's files differ from the digests written when it was saved."""


class DiskFullError(OSError):
    """A write failed for lack of space; errno ENOSPC, so `except OSError` callers still work."""

    def __init__(self, message: str):
        super().__init__(errno.ENOSPC, message)

    def __str__(self) -> str:
        return self.strerror


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc` or anything it was raised from is a disk-full / quota error.

    Orbax re-raises errors of its writer threads, sometimes chained or wrapped, and
    tensorstore reports ENOSPC as a ValueError with the OS message, so both are looked for.
    """
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DISK_FULL_ERRNOS:
            return True
        if any(t in str(e) for t in _DISK_FULL_TEXT):
            return True
        todo += [e.__cause__, e.__context__, *getattr(e, "exceptions", ())]
    return False


class Checkpointer:
    """Thin wrapper over `ocp.CheckpointManager` with synchronous saves (deterministic resume)."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self.max_to_keep = max_to_keep
        self._mngr = self._manager()

    def _manager(self) -> ocp.CheckpointManager:
        # cleanup_tmp_directories: a save killed mid-write leaves <step>.orbax-checkpoint-tmp;
        # it is garbage (never restored), so it is removed when the next run opens the directory.
        return ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=self.max_to_keep,
                                                 enable_async_checkpointing=False,
                                                 cleanup_tmp_directories=True))

    def latest_step(self) -> int | None:
        return self._mngr.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._mngr.all_steps())

    def save(self, step: int, state: Any, meta: dict | None = None) -> None:
        """Write checkpoint `step` and return only once it is complete on disk.

        Raises DiskFullError (after removing the partial step) when the disk fills up, and
        CheckpointError when orbax declines to write the step (a step not newer than the
        latest one): a save that silently did not happen would lose work on the next resume.
        """
        before = set(threading.enumerate())
        try:
            saved = self._mngr.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta or {})))
            self._mngr.wait_until_finished()
        except Exception as e:
            if not is_disk_full(e):
                raise
            self._discard_partial(step, before)
            previous = self.latest_step()
            kept = (f"The previous checkpoint (step {previous}) is intact."
                    if previous is not None else "No earlier checkpoint exists.")
            raise DiskFullError(
                f"Disk full while saving checkpoint step {step} in {self.directory} ({e}). "
                f"{kept} Fix: free space on that filesystem (or move the run directory to a "
                f"larger one) and rerun the same command; it resumes from the last "
                f"checkpoint.") from e
        if not saved:
            raise CheckpointError(
                f"Orbax did not save step {step} in {self.directory}: its latest step is "
                f"{self.latest_step()}. Steps must increase; a resumed run continues from the "
                f"latest checkpoint.")
        if dist.is_primary():   # the files of every process are complete and in place
            seal(self._step_dir(step))
        dist.barrier("checkpoint_seal")

    def _discard_partial(self, step: int, threads_before: set) -> None:
        """Remove what a failed save of `step` wrote, once orbax's writer threads are done
        (one may still be writing into the temporary directory; 10 s at most in all)."""
        deadline = time.monotonic() + 10.0
        for t in set(threading.enumerate()) - threads_before:
            while True:
                try:
                    t.join(timeout=max(0.0, deadline - time.monotonic()))
                    break
                except RuntimeError:   # start() called, not running yet: join refuses it
                    if time.monotonic() >= deadline:
                        break
                    time.sleep(0.005)
        for path in glob.glob(os.path.join(self.directory, f"{step}{_TMP_SUFFIX}*")):
            shutil.rmtree(path, ignore_errors=True)
        self._mngr.reload()

    def restore(self, step: int | None, like: Any) -> tuple[Any, dict]:
        """Restore into the structure, shapes, dtypes and shardings of `like`.

        step None: the newest checkpoint that reads. A newer one that does not (truncated,
        a file missing) is reported with a warning and moved to `<directory>.corrupt/`, so
        that the resumed run can save that step again; if none reads, CheckpointError (the
        run must not silently start over). An explicit step is restored or raises.
        """
        if step is not None:
            return self._restore(step, like)
        steps = self.all_steps()[::-1]
        if not steps:
            raise FileNotFoundError(f"No checkpoint in {self.directory}.")
        bad: list[int] = []
        for s in steps:
            try:
                out = self._restore(s, like)
            except Exception as e:  # orbax/tensorstore raise many types for unreadable files
                bad.append(s)
                warnings.warn(f"Checkpoint step {s} at {self._step_dir(s)} cannot be restored "
                              f"({type(e).__name__}: {_short(e)}); falling back to the "
                              f"previous checkpoint.", RuntimeWarning, stacklevel=2)
                last_error = e
                continue
            if bad:
                self._quarantine(bad)
            return out
        raise CheckpointError(
            f"No checkpoint in {self.directory} can be restored (steps {sorted(steps)}; last "
            f"error {type(last_error).__name__}: {_short(last_error)}). If the run's config "
            f"changed (other shapes), restore its config; if the files are damaged, delete "
            f"{self.directory} to start the run over from step 0 (its metrics.jsonl is then "
            f"rewritten from scratch).") from last_error

    def _restore(self, step: int, like: Any) -> tuple[Any, dict]:
        problem = check_sealed(self._step_dir(step))
        if problem == UNSEALED:
            warnings.warn(f"Checkpoint step {step} at {self._step_dir(step)} has no "
                          f"{DIGEST_FILE} (saved before checksums, or killed between the save "
                          f"and its seal); restored unverified.", RuntimeWarning, stacklevel=3)
        elif problem:
            raise CorruptCheckpointError(problem)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self._mngr.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
        return out["state"], dict(out["meta"] or {})

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def _quarantine(self, steps: list[int]) -> None:
        """Move unreadable steps out of orbax's sight (kept for inspection, not deleted).
        In a multi-process run every process found them unreadable; process 0 moves them."""
        if dist.is_primary():
            dest_root = self.directory + ".corrupt"
            os.makedirs(dest_root, exist_ok=True)
            for s in steps:
                dest, n = os.path.join(dest_root, str(s)), 1
                while os.path.exists(dest):
                    dest, n = os.path.join(dest_root, f"{s}-{n}"), n + 1
                shutil.move(self._step_dir(s), dest)
                warnings.warn(f"Moved unreadable checkpoint step {s} to {dest}.",
                              RuntimeWarning, stacklevel=3)
        dist.barrier("checkpoint_quarantine")
        self._mngr.reload()

    def close(self) -> None:
        self._mngr.close()


UNSEALED = "unsealed"   # check_sealed's answer for a step without a digest file


def file_digests(root: str) -> dict[str, str]:
    """sha256 of every file under `root` (relative path -> hex digest), the digest file aside."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if rel == DIGEST_FILE:
                continue
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            out[rel] = h.hexdigest()
    return out


def seal(step_dir: str) -> None:
    """Write `<step_dir>/sha256.json`: the digest of each file of a finished checkpoint
    (through a temporary file and a rename: a kill leaves no half digest file)."""
    from jaxrl_scale.numbers import write_json
    write_json(os.path.join(step_dir, DIGEST_FILE),
               {"algorithm": "sha256", "files": file_digests(step_dir)}, indent=1)


def check_sealed(step_dir: str) -> str | None:
    """None when every file recorded in the step's digest file is there with its digest;
    UNSEALED without a digest file; else what differs (the first files), one line."""
    path = os.path.join(step_dir, DIGEST_FILE)
    if not os.path.exists(path):
        return UNSEALED
    try:
        with open(path) as f:
            want = json.load(f)["files"]
        if not isinstance(want, dict) or not want:
            raise ValueError("no files listed")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"its digest file {path} is unreadable ({type(e).__name__}: {_short(e)})"
    have = file_digests(step_dir)
    bad = sorted(k for k, v in want.items() if have.get(k) != v)
    if not bad:
        return None
    missing = [k for k in bad if k not in have]
    shown = ", ".join(bad[:3]) + (f" and {len(bad) - 3} more" if len(bad) > 3 else "")
    return (f"checksum mismatch in {len(bad)} of {len(want)} files of {step_dir} "
            f"({len(missing)} missing): {shown}")


def _short(e: BaseException, n: int = 300) -> str:
    s = str(e).splitlines()[0] if str(e) else ""
    return s if len(s) <= n else s[:n] + "..."


def save_pytree(directory: str, tree: Any, meta: dict | None = None) -> None:
    """One-off save (e.g. an SFT warm-start) as step 0 of a fresh manager.

    An existing checkpoint there is an error, not kept silently: orbax would skip the save and
    leave the old params in place of the new ones.
    """
    ck = Checkpointer(directory, max_to_keep=1)
    if ck.latest_step() is not None:
        ck.close()
        raise FileExistsError(f"{os.path.abspath(directory)} already holds a checkpoint. "
                              f"Fix: delete it or save to another directory.")
    ck.save(0, tree, meta)
    ck.close()


def check_pytree(directory: str) -> str | None:
    """What is wrong with a `save_pytree` directory (its step 0), or None when its files match
    their digests (or it predates digests). For caches: check before reuse, rebuild if bad."""
    step_dir = os.path.join(os.path.abspath(directory), "0")
    if not os.path.isdir(step_dir):
        return f"{directory} holds no checkpoint"
    problem = check_sealed(step_dir)
    return None if problem == UNSEALED else problem


def load_pytree(directory: str, like: Any) -> tuple[Any, dict]:
    ck = Checkpointer(directory, max_to_keep=1)
    try:
        return ck.restore(None, like)
    finally:
        ck.close()
