"""Any TensorBoard event directory: scalars read with tensorboard's own event reader, their
meaning declared by a tag map (`mapped.TagMap`), e.g.

    --format=tensorboard --tag_map=score=eval/accuracy,time=perf/step_s,samples=rollout/n

Scalars are what ``torch.utils.tensorboard.SummaryWriter.add_scalar(tag, value, step)`` (and
``tf.summary.scalar``) writes: a ``simple_value`` (or a one-element float ``tensor``) per
event, at the event's step; the event step is the optimizer step unless the map's ``step``
names a tag that holds it. verl's and OpenRLHF's event files are recognised by their tags and
read with their own maps (`verl`, `openrlhf`); this module also holds the event reading they
share.
"""

from __future__ import annotations

import glob
import os

from jaxrl_scale.scaling import io as sio
from jaxrl_scale.scaling.readers import mapped
from jaxrl_scale.scaling.readers.common import ReaderError, SkipRun

EVENT_GLOB = "events.out.tfevents.*"
DETECT_EVENTS = 5000    # the tags of a run's first logged steps say whose it is


def event_files(run_dir: str) -> list[str]:
    """TensorBoard event files anywhere under ``run_dir`` (verl's ``_TensorboardAdapter``
    writes them to ``tensorboard_log/<project>/<experiment>/``, OpenRLHF to
    ``<logger.tensorboard_dir>/<run_name>/``)."""
    return sorted(glob.glob(os.path.join(run_dir, "**", EVENT_GLOB), recursive=True))


def _loader():
    try:
        from tensorboard.backend.event_processing.event_file_loader import (
            LegacyEventFileLoader)
    except ImportError:
        raise SkipRun("TensorBoard event files need the tensorboard package (pip install "
                      "tensorboard)") from None
    return LegacyEventFileLoader


def _scalars(ev):
    """(tag, value) of each scalar in one event."""
    for v in ev.summary.value:
        if v.HasField("simple_value"):
            yield v.tag, float(v.simple_value)
        elif v.HasField("tensor") and (v.tensor.float_val or v.tensor.double_val):
            yield v.tag, float((v.tensor.float_val or v.tensor.double_val)[0])


def tags(run_dir: str, max_events: int = DETECT_EVENTS) -> set[str]:
    """Scalar tags among the first ``max_events`` events of the run's event files (empty
    when tensorboard is missing or a file is unreadable: detection never raises)."""
    try:
        loader = _loader()
    except SkipRun:
        return set()
    out: set[str] = set()
    for p in event_files(run_dir):
        try:
            for i, ev in enumerate(loader(p).Load()):
                if i >= max_events:
                    break
                if ev.HasField("summary"):
                    out.update(t for t, _ in _scalars(ev))
        except Exception:      # a corrupt file: read_event_records names it
            continue
    return out


def read_event_records(run_dir: str) -> tuple[list[dict], str]:
    """{step, tag: value} per step from the run's event files (a later value of a tag at the
    same step wins), and a description of the source. SkipRun naming the file for a corrupt
    record."""
    loader = _loader()
    files = event_files(run_dir)
    by_step: dict[float, dict] = {}
    for p in files:
        try:
            for ev in loader(p).Load():
                if ev.HasField("summary"):
                    for tag, x in _scalars(ev):
                        by_step.setdefault(ev.step, {"step": ev.step})[tag] = x
        except Exception as e:     # a corrupt record: the reader's own error types vary
            raise SkipRun(f"{p}: unreadable event file ({type(e).__name__}: {e})") from None
    src = files[0] if len(files) == 1 else f"{len(files)} event files under {run_dir}"
    if not by_step:    # tensorboard's loader reads a file of garbage as no events at all
        raise SkipRun(f"{src}: no scalar events (empty, cut before its first record, or not "
                      "an event file)")
    return [by_step[s] for s in sorted(by_step)], src


def is_run(run_dir: str) -> bool:
    return bool(event_files(run_dir))


def read_run(run_dir: str, name: str | None = None, **overrides) -> sio.Run:
    """Any event directory through the tag map in ``overrides["tag_map"]`` (ReaderError
    naming the missing field when it lacks one the analysis needs)."""
    name = name or os.path.basename(os.path.normpath(run_dir))
    tmap = mapped.parse_tag_map(overrides.get("tag_map"))
    if not tmap:
        raise ReaderError("tag_map", f"run {name}: TensorBoard event files, but no tag map "
                          "says which tags are the eval score, the step time and the responses",
                          "pass --tag_map=score=<tag>,time=<tag>,samples=<tag> (or a JSON/YAML "
                          "file of them)")
    records, src = read_event_records(run_dir)
    rows = [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records]
    return mapped.run_from_rows(name, run_dir, "tensorboard", rows, tmap, source=src,
                                overrides=overrides, step_is_update=True)
