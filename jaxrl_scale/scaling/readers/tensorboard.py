"""Any TensorBoard event directory: scalars read with tensorboard's own event reader, their
meaning declared by a tag map (`mapped.TagMap`), e.g.

    --format=tensorboard --tag_map=score=eval/accuracy,time=perf/step_s,samples=rollout/n

Scalars are what ``torch.utils.tensorboard.SummaryWriter.add_scalar(tag, value, step)`` (and
``tf.summary.scalar``) writes: a ``simple_value`` (or a one-element float ``tensor``) per
event, at the event's step; the event step is the optimizer step unless the map's ``step``
names a tag that holds it. verl's and OpenRLHF's event files are recognised by their tags and
read with their own maps (`verl`, `openrlhf`); this module also holds the event reading they
share. tensorboard's loader stops silently at a cut or corrupt record, so each file's TFRecord
framing is also walked here (`frame_records`): a file read only in part is a warning naming
it, the records read and the byte offset.
"""

from __future__ import annotations

import contextlib
import glob
import os
import struct

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


_CRC32C_TABLE: list[int] = []


def _masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C (Castagnoli) of ``data``; pure Python, so only for the
    8-byte length fields (tensorboard's loader checks each record's data CRC itself)."""
    if not _CRC32C_TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _CRC32C_TABLE.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = _CRC32C_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_records(path: str) -> tuple[list[int], int, int, str | None]:
    """Walk the TFRecord framing of an event file (per record: uint64 length, uint32 masked
    CRC of the length, the data, uint32 masked CRC of the data; little-endian), seeking past
    the data. Returns (byte offset of each whole record, byte offset where the walk stopped,
    file size, problem): problem is None when the records end exactly at the end of the file,
    "cut" when the record at the stop offset runs past it (a writer stopped mid-record),
    "header" when its length field fails its CRC (corrupt, or not an event file).
    tensorboard's loader stops silently at either; this says where."""
    size = os.path.getsize(path)
    offsets: list[int] = []
    pos = 0
    with open(path, "rb") as f:
        while pos < size:
            head = f.read(12)
            if len(head) < 12:
                return offsets, pos, size, "cut"
            (length,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
            if _masked_crc32c(head[:8]) != crc:
                return offsets, pos, size, "header"
            end = pos + 12 + length + 4
            if end > size:
                return offsets, pos, size, "cut"
            offsets.append(pos)
            f.seek(end)
            pos = end
    return offsets, pos, size, None


def framing_problem(path: str, loaded: int) -> str | None:
    """One line naming ``path`` and the byte offset where reading stopped, or None when the
    loader read every record of a whole file (``loaded``: the events it yielded, one per
    record)."""
    offsets, stop, size, problem = frame_records(path)
    n = len(offsets)
    if loaded < n:     # a whole record the loader refused: its data failed the CRC check
        return (f"{path}: unreadable record at byte {offsets[loaded]} (its data fails its "
                f"CRC) after {loaded} of {n} records; the rest is not read")
    if problem == "cut":
        return (f"{path}: truncated after {n} records (the record at byte {stop} runs past "
                f"the end of the file at byte {size}: its writer stopped mid-record); what "
                "was logged after it is not read")
    if problem == "header":
        return (f"{path}: corrupt record header at byte {stop} after {n} records (its length "
                "fails its CRC: a damaged file, or not an event file); the rest is not read")
    return None


def read_event_records(run_dir: str) -> tuple[list[dict], str, list[str]]:
    """{step, tag: value} per step from the run's event files (a later value of a tag at the
    same step wins), a description of the source, and one warning per event file read only
    in part (cut mid-record, corrupt; `frame_records`), naming the file and byte offset.
    SkipRun naming the file for an unreadable file, or when no file holds a scalar."""
    loader = _loader()
    files = event_files(run_dir)
    by_step: dict[float, dict] = {}
    problems = []
    for p in files:
        loaded = 0
        try:
            for ev in loader(p).Load():
                loaded += 1
                if ev.HasField("summary"):
                    for tag, x in _scalars(ev):
                        by_step.setdefault(ev.step, {"step": ev.step})[tag] = x
        except Exception as e:     # a corrupt record: the reader's own error types vary
            raise SkipRun(f"{p}: unreadable event file ({type(e).__name__}: {e})") from None
        problem = framing_problem(p, loaded)
        if problem:
            problems.append(problem)
    src = files[0] if len(files) == 1 else f"{len(files)} event files under {run_dir}"
    if not by_step:    # tensorboard's loader reads a file of garbage as no events at all
        raise SkipRun(f"{src}: no scalar events (empty, cut before its first record, or not "
                      "an event file)" + "".join(f"; {x}" for x in problems))
    return [by_step[s] for s in sorted(by_step)], src, problems


@contextlib.contextmanager
def cut_noted(problems: list[str]):
    """A run skipped after reading (no evals, no step times) says which of its event files
    were read only in part: the missing records may be why."""
    try:
        yield
    except SkipRun as e:
        if not problems:
            raise
        raise SkipRun(f"{e}; " + "; ".join(problems)) from None


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
    records, src, cut = read_event_records(run_dir)
    rows = [(r["step"], {k: v for k, v in r.items() if k != "step"}) for r in records]
    with cut_noted(cut):
        return mapped.run_from_rows(name, run_dir, "tensorboard", rows, tmap, source=src,
                                    overrides=overrides, step_is_update=True, warnings=cut)
