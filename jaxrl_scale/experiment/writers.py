"""Live views of a run: the scalars of metrics.jsonl, under the same keys, in TensorBoard or W&B.

metrics.jsonl stays the record of truth (the analysis reads it); these writers only mirror it,
so the names a user reads in docs/api.md's metrics table are the names on the charts. Each
record is logged at its "step" (the x-axis); a training and an eval record of one step both
land there, under their different keys.
"""
from __future__ import annotations

import os
import secrets
import socket
import time
from typing import Any, Protocol

import numpy as np

from jaxrl_scale.numbers import is_number

WANDB_ID_FILE = "wandb_id"  # in the run dir: a resumed run continues its W&B run


class Writer(Protocol):
    def write(self, record: dict) -> None: ...

    def close(self) -> None: ...


def _number(v: Any) -> int | float | None:
    if isinstance(v, (bool, np.bool_)):
        return int(v)
    if is_number(v):
        return v.item() if isinstance(v, np.generic) else v  # np.float32 is no float
    return None  # None, NaN/inf, strings, dicts: nothing a chart can draw


def scalars(record: dict) -> dict[str, int | float]:
    """The record's finite numbers by key, a list's as `key/i`; bools as 0/1.

    "step" is the x-axis, not a series. None, NaN/inf, strings and nested containers are
    skipped (metrics.jsonl keeps them).
    """
    out: dict[str, int | float] = {}
    for key, v in record.items():
        if key == "step":
            continue
        if hasattr(v, "tolist"):  # numpy / jax arrays and scalars
            v = np.asarray(v).tolist()
        if isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                if (x := _number(x)) is not None:
                    out[f"{key}/{i}"] = x
        elif (x := _number(v)) is not None:
            out[key] = x
    return out


class TensorBoardWriter:
    """Event files in <run_dir>/tensorboard/, each record on disk when write() returns.

    Written with the tensorboard package's own record writer and protos (what
    torch.utils.tensorboard uses; no TensorFlow), synchronously: one event per record, flushed
    and fsynced in write(), as metrics.jsonl is. Not tensorboardX's SummaryWriter: it hands
    events to a background thread and its flush() does not drain that queue (a kill right
    after add_scalar + flush() loses the record), and importing tensorboardX imports torch
    wherever torch is installed, into the JAX process.

    purge_step: the first step this process will (re)write: the checkpoint step + 1 on a
    resume, 0 on a fresh start (the loop restarts at 0 when no checkpoint exists, so anything
    an earlier attempt logged is stale). It writes the SessionLog.START event at that step
    that tensorboardX's SummaryWriter(purge_step=) writes; TensorBoard then drops what earlier
    event files hold at steps >= purge_step, so a step replayed after a crash shows once, with
    its new values. None writes no marker. Files are named by creation time in nanoseconds:
    TensorBoard reads a run's files in name order, and that order must be the order written.
    """

    def __init__(self, run_dir: str, purge_step: int | None = None):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter

        self._Event, self._Summary = Event, Summary
        self.logdir = os.path.join(run_dir, "tensorboard")
        os.makedirs(self.logdir, exist_ok=True)
        name = f"events.out.tfevents.{time.time_ns()}.{socket.gethostname()}"
        self._file = open(os.path.join(self.logdir, name), "xb")
        self._records = RecordWriter(self._file)
        self._put(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            self._put(Event(step=purge_step, wall_time=time.time(),
                            session_log=SessionLog(status=SessionLog.START)))
        # tags logged at the current step: "responses" / "time_s" repeat in the eval record
        # of a step with the train record's value; TensorBoard shows them once
        self._step, self._tags = None, set()

    def _put(self, event: Any) -> None:
        self._records.write(event.SerializeToString())
        self._records.flush()
        os.fsync(self._file.fileno())

    def write(self, record: dict) -> None:
        step = int(record["step"])
        if step != self._step:
            self._step, self._tags = step, set()
        values = {k: v for k, v in scalars(record).items() if k not in self._tags}
        if not values:
            return
        self._tags.update(values)
        summary = self._Summary(value=[self._Summary.Value(tag=k, simple_value=float(v))
                                       for k, v in values.items()])
        self._put(self._Event(step=step, wall_time=time.time(), summary=summary))

    def close(self) -> None:
        self._records.close()


def wandb_run_id(run_dir: str) -> str:
    """The run dir's W&B run id: made once, kept in the run dir, so a resume (which needs the
    run dir for its checkpoints anyway) continues the same W&B run, and two machines' runs
    with the same path never share one (a hash of the path would)."""
    path = os.path.join(run_dir, WANDB_ID_FILE)
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    run_id = secrets.token_hex(8)
    os.makedirs(run_dir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(run_id + "\n")
    os.replace(path + ".tmp", path)
    return run_id


class WandbWriter:
    """A W&B run (files under <run_dir>/wandb/), resumed across kills via `wandb_run_id`.

    mode: "online", "offline" (no network; `wandb sync` uploads later) or "disabled"; None
    leaves it to WANDB_MODE. name: the run's display name, the run dir's basename by default.
    wandb.init raises here, before training starts, when it cannot start (no login, no
    network in online mode). W&B keeps a run's steps increasing: steps replayed after a crash
    (up to the last step the killed attempt logged) keep the killed attempt's values there;
    metrics.jsonl and TensorBoard hold the replayed ones.
    """

    def __init__(self, project: str, run_dir: str, config: dict | None = None,
                 mode: str | None = None, name: str | None = None):
        try:
            import wandb
        except ImportError as e:
            raise ImportError("W&B logging needs wandb: pip install wandb "
                              "(or pip install 'jaxrl_scale[wandb]')") from e
        name = name or os.path.basename(os.path.normpath(run_dir))
        self._run = wandb.init(project=project, dir=run_dir, config=config, mode=mode,
                               name=name, resume="allow", id=wandb_run_id(run_dir))

    def write(self, record: dict) -> None:
        values = scalars(record)
        if values:
            self._run.log(values, step=int(record["step"]))

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def make_writers(run_dir: str, *, tensorboard: bool = True, wandb_project: str = "",
                 wandb_mode: str | None = None, config: dict | None = None,
                 purge_step: int | None = None) -> list[Writer]:
    """The writers a run asked for (W&B when wandb_project is set); see the classes for
    purge_step and wandb_mode. W&B starts first: it is the one that can fail (login,
    network), and then no event file was opened for nothing."""
    writers: list[Writer] = []
    if wandb_project:
        writers.append(WandbWriter(wandb_project, run_dir, config, mode=wandb_mode))
    if tensorboard:
        writers.append(TensorBoardWriter(run_dir, purge_step=purge_step))
    return writers


def write_all(writers: list[Writer], record: dict) -> None:
    for w in writers:
        w.write(record)


def close_all(writers: list[Writer]) -> None:
    for w in writers:
        w.close()
